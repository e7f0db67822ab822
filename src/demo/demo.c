/*
 * demo.c — the end-to-end demo (include/kvtier/demo.h): an agentic
 * workload through the real cache, the demo acting as the inference engine
 * and every request's TTFT measured on the wall clock.
 *
 * PICTURE (one policy, one request; everything between arrival and the
 * first token is on the clock)
 *
 *   arrival
 *     |  hash tokens, kvt_cache_lookup(TOUCH)      -> hit pages, in flight
 *     |  blocks from the free list (too few: wait for the oldest pending
 *     |  request's stores, which hold theirs)
 *     |  kvt_cache_load(keys[0..hit) -> blocks)    -> job (async)
 *     |  for l in 0..L-1:                             compute thread = this
 *     |     kvtier: kvt_cache_job_wait_layer(job, l)  (lmcache: wait(job)
 *     |     write layer l of the computed pages       once, before l = 0)
 *     |     spend the rest of layer l's modeled time (sleep, then spin)
 *     |  failed blocks: prefill them again (real time)
 *     |  kvt_cache_store(computed pages)            (lmcache: wait for it)
 *   first token = TTFT
 *        engine check of the loaded blocks (samples), job statistics,
 *        modeled decode, the answer's pages written and stored (lmcache:
 *        waited), blocks freed (kvtier: once its stores are done)
 *
 * Token ids are a hash of (seed, session, position), except the shared
 * system prompt, the same for every session. A page's bytes are a function
 * of the chained hash of every token up to the page's end: chunk (layer,
 * kv) of the page repeats a 32-word splitmix64 pattern seeded by that hash,
 * the layer and kv, so the engine can check any word of a restored block
 * without keeping anything.
 */
#include "core/core.h"
#include "server/server.h"

#include <kvtier/client.h>

#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/wait.h>
#include <signal.h>
#include <time.h>
#include <unistd.h>
#include <xxhash.h>

#define SPIN_NS 50000u  /* spin, not sleep, for the last 50 us of a span */
#define HEADROOM (256ull << 20) /* free disk the ssd tiers leave */

void kvt_demo_config_init(kvt_demo_config *c)
{
	memset(c, 0, sizeof(*c));
	kvti_strlcpy(c->model, "llama-3.2-1b", sizeof(c->model));
	kvti_strlcpy(c->hardware, "testbed-b", sizeof(c->hardware));
	kvti_strlcpy(c->fabric, "memfd", sizeof(c->fabric));
	c->page_tokens = 16;
	c->sessions = 10;
	c->turns = 6;
	c->system_tokens = 2048;
	c->context_tokens = 4096;
	c->turn_tokens = 1024;
	c->output_tokens = 256;
	c->policies = KVT_DEMO_LMCACHE | KVT_DEMO_KVTIER;
	c->background = KVT_DEMO_LMCACHE | KVT_DEMO_KVTIER;
	c->stress_bytes = 256ull << 20;
	c->seed = 1;
}

/* Prompt length of turn @k (before its answer). */
static uint64_t prompt_len(const kvt_demo_config *c, uint32_t k)
{
	return (uint64_t)c->system_tokens + c->context_tokens +
	       (uint64_t)k * (c->turn_tokens + c->output_tokens);
}

/* Tokens a session ever holds: the last prompt and its answer. */
static uint64_t session_tokens(const kvt_demo_config *c)
{
	return prompt_len(c, c->turns - 1) + c->output_tokens;
}

static int demo_geom(const kvt_demo_config *c, kvt_geom *g)
{
	return kvt_geom_preset(g, c->model, c->page_tokens, 1, 0);
}

static int size_check(const kvt_demo_config *c)
{
	if (!c->sessions || c->sessions > KVT_DEMO_MAX_SESSIONS)
		return kvti_fail(-EINVAL, "demo: sessions must be 1..%d",
				 KVT_DEMO_MAX_SESSIONS);
	if (!c->turns || c->turns > KVT_DEMO_MAX_TURNS)
		return kvti_fail(-EINVAL, "demo: turns must be 1..%d",
				 KVT_DEMO_MAX_TURNS);
	if (!c->context_tokens && !c->system_tokens)
		return kvti_fail(-EINVAL, "demo: an empty first prompt");
	if (!c->page_tokens)
		return kvti_fail(-EINVAL, "demo: page_tokens must be > 0");
	if (session_tokens(c) > (1u << 31))
		return kvti_fail(-EINVAL, "demo: a session of %llu tokens is "
				 "too long", (unsigned long long)session_tokens(c));
	if (!c->policies || (c->policies & ~(unsigned)(KVT_DEMO_LMCACHE |
						      KVT_DEMO_KVTIER)))
		return kvti_fail(-EINVAL, "demo: bad policy set");
	if (c->background & ~(unsigned)(KVT_DEMO_LMCACHE | KVT_DEMO_KVTIER))
		return kvti_fail(-EINVAL, "demo: bad background set");
	return 0;
}

int kvt_demo_size(kvt_demo_config *c)
{
	uint64_t sess, page, mem_cap, need_mem, want, avail;
	unsigned np;
	kvt_machine m;
	kvt_hw hw;
	kvt_geom g;
	struct statvfs v;
	const char *d;
	int err;

	if ((err = size_check(c)) || (err = demo_geom(c, &g)) ||
	    (err = kvt_hw_load(&hw, c->hardware)))
		return err;
	np = (unsigned)__builtin_popcount(c->policies);
	page = kvt_geom_page_bytes(&g);
	/* a session's blocks: every page of its last prompt and answer, the
	 * partial last one included */
	sess = (session_tokens(c) + c->page_tokens - 1) / c->page_tokens * page;

	kvt_probe(&m);
	c->gpu = 0; /* engine memory is host memory in this version */
	/* per policy: the engine's memory one and a half sessions (the
	 * running request's blocks, and most of the previous one's while its
	 * store runs); fabric and dram three sessions each; ssd all of them
	 * and a quarter more (a page keeps at most one ssd copy). */
	if (!c->hbm_bytes)
		c->hbm_bytes = KVT_ALIGN_UP(sess + sess / 2 + 4 * page, page);
	if (!c->fabric_bytes)
		c->fabric_bytes = 3 * sess;
	if (!c->dram_bytes)
		c->dram_bytes = 3 * sess;
	if (!c->ssd_bytes)
		c->ssd_bytes = (uint64_t)c->sessions * sess / 4 * 5 + 64 * page;
	if (c->hbm_bytes < sess)
		return kvti_fail(-EINVAL, "demo: engine memory (--hbm) of %llu "
				 "bytes cannot hold one session (%llu bytes)",
				 (unsigned long long)c->hbm_bytes,
				 (unsigned long long)sess);
	if (c->fabric_bytes < sess)
		return kvti_fail(-EINVAL, "demo: fabric (the top tier) of %llu "
				 "bytes cannot hold one session (%llu bytes): a "
				 "store brings the whole prefix into it",
				 (unsigned long long)c->fabric_bytes,
				 (unsigned long long)sess);
	/* the memory of both policies within a third of what is available */
	mem_cap = m.mem_available / 3 / np;
	need_mem = c->hbm_bytes + c->fabric_bytes + c->dram_bytes;
	if (mem_cap && need_mem > mem_cap) {
		uint64_t rest;

		if (mem_cap < c->hbm_bytes + 2 * sess)
			return kvti_fail(-ENOMEM, "demo: needs at least %llu MiB "
					 "of memory, %llu MiB is available; use "
					 "--sessions, --context or a smaller "
					 "--model", (unsigned long long)
					 ((c->hbm_bytes + 2 * sess) * 3 * np >> 20),
					 (unsigned long long)(m.mem_available >> 20));
		rest = mem_cap - c->hbm_bytes;
		c->fabric_bytes = KVT_ALIGN_UP(rest / 2 - page, page);
		c->dram_bytes = c->fabric_bytes;
		kvti_info("demo: fabric and dram cut to %llu MiB each to fit "
			  "in memory", (unsigned long long)(c->dram_bytes >> 20));
	}
	want = c->ssd_bytes * np;
	d = c->dir[0] ? c->dir : (getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
	if (statvfs(d, &v) == 0) {
		avail = (uint64_t)v.f_bavail * v.f_frsize;
		if (avail < want + HEADROOM)
			return kvti_fail(-ENOSPC, "demo: the ssd tier needs %llu "
					 "MiB in %s and %llu MiB of headroom; "
					 "%llu MiB is free",
					 (unsigned long long)(want >> 20), d,
					 (unsigned long long)(HEADROOM >> 20),
					 (unsigned long long)(avail >> 20));
	}
	return 0;
}

/* ---- the workload and its bytes ---------------------------------------- */

struct session {
	uint32_t *tokens;  /* session_tokens() of them */
	uint64_t *seeds;   /* per page: chained hash of all tokens up to it */
};

static uint32_t token_at(uint64_t seed, uint32_t s, uint64_t i,
			 uint32_t system)
{
	uint64_t k[3] = { seed, i < system ? 0xffffffffu : s, i };

	return (uint32_t)XXH3_64bits(k, sizeof(k));
}

static int sessions_make(const kvt_demo_config *c, struct session *ss)
{
	uint64_t n = session_tokens(c), pages = n / c->page_tokens;

	for (uint32_t s = 0; s < c->sessions; s++) {
		uint64_t h = c->seed;

		ss[s].tokens = kvt_malloc(n * sizeof(uint32_t));
		ss[s].seeds = kvt_malloc((pages + 1) * sizeof(uint64_t));
		if (!ss[s].tokens || !ss[s].seeds)
			return -ENOMEM;
		for (uint64_t i = 0; i < n; i++)
			ss[s].tokens[i] = token_at(c->seed, s, i, c->system_tokens);
		for (uint64_t p = 0; p < pages; p++) {
			h = XXH3_64bits_withSeed(ss[s].tokens + p * c->page_tokens,
						 c->page_tokens * sizeof(uint32_t), h);
			ss[s].seeds[p] = h;
		}
	}
	return 0;
}

#define GAMMA 0x9e3779b97f4a7c15ull

static inline uint64_t mix64(uint64_t z)
{
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

static uint64_t chunk_seed(uint64_t page_seed, uint32_t layer, uint32_t kv)
{
	return mix64(page_seed ^ ((2ull * layer + kv + 1) * GAMMA));
}

/* A chunk is a 32-word splitmix64 pattern, word j = mix64(seed + (j + 1) *
 * GAMMA), repeated: distinct for every (prefix, layer, kv), and cheap to
 * write (the emulated GPU writes a layer's KV inside the layer's modeled
 * time: generating every word would cost the CPU more than an H200 takes
 * to compute it). */
#define PATTERN_WORDS 32u

static inline uint64_t chunk_word(uint64_t seed, uint64_t i)
{
	return mix64(seed + (i % PATTERN_WORDS + 1) * GAMMA);
}

static void chunk_fill(uint64_t *p, uint64_t words, uint64_t seed)
{
	uint64_t n = KVT_MIN(words, (uint64_t)PATTERN_WORDS);

	for (uint64_t i = 0; i < n; i++)
		p[i] = chunk_word(seed, i);
	while (n < words) { /* doubling copies of what is written */
		uint64_t k = KVT_MIN(n, words - n);

		memcpy(p + n, p, k * sizeof(*p));
		n += k;
	}
}

/* Check the first and last four words and eight others of a chunk: a
 * block from the wrong page, layer or K/V, or a copy cut short, fails. The
 * cache's per-layer XXH3 covers every byte. 0 or 1 (bad). */
static int chunk_sample_bad(const uint64_t *p, uint64_t words, uint64_t seed)
{
	for (uint64_t j = 0; j < 16; j++) {
		uint64_t i = j < 4 ? j : j < 8 ? words - 8 + j :
			     mix64(seed ^ j) % words;

		if (i < words && p[i] != chunk_word(seed, i))
			return 1;
	}
	return 0;
}

/* ---- the engine: its KV memory and block ids --------------------------- */

struct engine {
	void **base;            /* per layer: [kv][nblocks][P][H][D] */
	uint32_t layers, kv;
	uint64_t nblocks, chunk; /* chunk: one (block, layer, kv), bytes */
	uint32_t *free;         /* free block ids, a stack */
	uint64_t nfree;
	int shared;             /* base[] is the daemon-shared memfd's */
};

/* @shared: per-layer memory the daemon shares (vLLM layout), or NULL to
 * allocate our own. */
static int engine_open(struct engine *e, const kvt_geom *g, uint64_t bytes,
		       void *const *shared)
{
	e->layers = g->layers;
	e->kv = kvt_geom_kv(g);
	e->chunk = kvt_geom_chunk_bytes(g);
	e->nblocks = bytes / kvt_geom_page_bytes(g);
	e->base = kvt_calloc(e->layers, sizeof(*e->base));
	e->free = kvt_malloc(e->nblocks * sizeof(*e->free));
	if (!e->base || !e->free)
		return -ENOMEM;
	e->shared = shared != NULL;
	for (uint32_t l = 0; l < e->layers; l++) {
		size_t n = (size_t)(e->kv * e->nblocks * e->chunk);

		if (shared)
			e->base[l] = shared[l];
		else if (!(e->base[l] = kvti_aligned_alloc(4096, n)))
			return -ENOMEM;
		memset(e->base[l], 0, n); /* fault it in now, not in a request */
	}
	for (uint64_t b = 0; b < e->nblocks; b++)
		e->free[b] = (uint32_t)(e->nblocks - 1 - b);
	e->nfree = e->nblocks;
	return 0;
}

static void engine_close(struct engine *e)
{
	for (uint32_t l = 0; e->base && !e->shared && l < e->layers; l++)
		kvt_free(e->base[l]);
	kvt_free(e->base);
	kvt_free(e->free);
}

static uint64_t *engine_chunk(const struct engine *e, uint32_t block,
			      uint32_t layer, uint32_t kv)
{
	return (uint64_t *)((char *)e->base[layer] +
			    ((uint64_t)kv * e->nblocks + block) * e->chunk);
}

/* Write layer @l of pages [from, to) of session @s into their blocks: what
 * the GPU's prefill writes as it computes the layer. */
static void engine_write_layer(const struct engine *e, const struct session *s,
			       const uint32_t *blocks, uint64_t from,
			       uint64_t to, uint32_t l)
{
	for (uint64_t p = from; p < to; p++)
		for (uint32_t kv = 0; kv < e->kv; kv++)
			chunk_fill(engine_chunk(e, blocks[p], l, kv), e->chunk / 8,
				   chunk_seed(s->seeds[p], l, kv));
}

/* Sample every chunk of pages [0, n) not on the failed list; count them. */
static void engine_check(const struct engine *e, const struct session *s,
			 const uint32_t *blocks, uint64_t n,
			 const uint32_t *failed, long nfailed, kvt_demo_req *r)
{
	for (uint64_t p = 0; p < n; p++) {
		int bad = 0, skip = 0;

		for (long f = 0; f < nfailed; f++)
			skip |= failed[f] == blocks[p];
		if (skip)
			continue;
		for (uint32_t l = 0; l < e->layers && !bad; l++)
			for (uint32_t kv = 0; kv < e->kv && !bad; kv++)
				bad = chunk_sample_bad(engine_chunk(e, blocks[p], l, kv),
						       e->chunk / 8,
						       chunk_seed(s->seeds[p], l, kv));
		r->engine_checked++;
		r->engine_bad += (uint64_t)bad;
	}
}

/* Sleep until @deadline less SPIN_NS, then spin to it. */
static void spend_until(uint64_t deadline)
{
	for (;;) {
		uint64_t now = kvt_now_ns();
		struct timespec ts;

		if (now >= deadline)
			return;
		if (deadline - now > SPIN_NS) {
			uint64_t t = deadline - SPIN_NS;

			ts.tv_sec = (time_t)(t / 1000000000ull);
			ts.tv_nsec = (long)(t % 1000000000ull);
			clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL);
		}
	}
}

static double since(uint64_t t0)
{
	return (double)(kvt_now_ns() - t0) / 1e9;
}

/* ---- one policy --------------------------------------------------------- */

/* A request whose blocks are held until its store jobs are done. */
struct pending {
	uint32_t *blocks;
	uint64_t nblocks;
	struct djob *job[2];
	kvt_demo_req *req;
};

struct pass_ctx {
	const kvt_demo_config *c;
	kvt_demo_pass *out;
	struct session *ss;
	kvt_cache *cache;       /* in process, or: */
	kvt_client *cl;         /* through the daemon (--daemon) */
	kvt_client_mem *cm;
	pid_t dpid;             /* the daemon child, its report pipe */
	int dfd;
	struct engine eng;
	kvt_cost cost;
	int lmcache;
	kvt_page_key *keys;
	uint32_t *failed;       /* a load's failed blocks */
	double *ready, *end, *model; /* per layer, of the running request */
	struct pending *q;      /* FIFO of pending requests */
	size_t qhead, qtail, qcap;
	int err;                /* first job or check failure (not fatal) */
	char msg[256];          /* what it was */
};

/* ---- the cache as the engine reaches it: in this process, or through the
 * node daemon in a child process (--daemon). One job type for both. ---- */

struct djob {
	kvt_cache_job *j;
	kvt_client_job *c;
};

static int dj_wrap(int err, kvt_cache_job *j, kvt_client_job *c,
		   struct djob **out)
{
	if (err)
		return err;
	if (!(*out = kvt_calloc(1, sizeof(**out)))) {
		kvt_cache_job_free(j);
		kvt_client_job_free(c);
		return -ENOMEM;
	}
	(*out)->j = j;
	(*out)->c = c;
	return 0;
}

static int dj_wait(struct djob *j, int64_t t)
{
	return j->j ? kvt_cache_job_wait(j->j, t) : kvt_client_job_wait(j->c, t);
}

static int dj_wait_layer(struct djob *j, uint32_t l, int64_t t)
{
	return j->j ? kvt_cache_job_wait_layer(j->j, l, t) :
	       kvt_client_job_wait_layer(j->c, l, t);
}

static int dj_poll(struct djob *j)
{
	return j->j ? kvt_cache_job_poll(j->j) : kvt_client_job_poll(j->c);
}

static long dj_failed(struct djob *j, uint32_t *b, size_t max)
{
	return j->j ? kvt_cache_job_failed(j->j, b, max) :
	       kvt_client_job_failed(j->c, b, max);
}

static void dj_stat(struct djob *j, kvt_cache_job_stat *st)
{
	if (j->j)
		kvt_cache_job_stat_get(j->j, st);
	else
		kvt_client_job_stat_get(j->c, st);
}

static void dj_free(struct djob *j)
{
	if (!j)
		return;
	kvt_cache_job_free(j->j);
	kvt_client_job_free(j->c);
	kvt_free(j);
}

static int dc_hash(struct pass_ctx *p, const uint32_t *tok, size_t n,
		   kvt_page_key *keys)
{
	return p->cl ? kvt_client_hash_tokens(p->cl, tok, n, keys) :
	       kvt_cache_hash_tokens(p->cache, 0, tok, n, keys);
}

static int dc_lookup(struct pass_ctx *p, size_t n, unsigned flags,
		     kvt_cache_lookup_result *r)
{
	return p->cl ? kvt_client_lookup(p->cl, p->keys, n, flags, r) :
	       kvt_cache_lookup(p->cache, 0, p->keys, n, flags, r);
}

static int dc_job(struct pass_ctx *p, int store, size_t n, size_t first,
		  const uint32_t *blocks, struct djob **out)
{
	kvt_cache_job *j = NULL;
	kvt_client_job *c = NULL;
	int err;

	if (p->cl)
		err = store ? kvt_client_store(p->cl, p->cm, p->keys, n, first,
					       blocks, &c)
			    : kvt_client_load(p->cl, p->cm, p->keys, n, first,
					      blocks, &c);
	else
		err = store ? kvt_cache_store(p->cache, 0, p->keys, n, first,
					      blocks, &j)
			    : kvt_cache_load(p->cache, 0, p->keys, n, first,
					     blocks, &j);
	return dj_wrap(err, j, c, out);
}

/* Record a failure that does not stop the run (a job's, a check's): the
 * first one is the run's answer. */
static void __attribute__((format(printf, 3, 4)))
note_err(struct pass_ctx *p, int err, const char *fmt, ...)
{
	va_list ap;
	size_t n;

	if (!err || p->err)
		return;
	p->err = err;
	va_start(ap, fmt);
	vsnprintf(p->msg, sizeof(p->msg), fmt, ap);
	va_end(ap);
	n = strlen(p->msg);
	snprintf(p->msg + n, sizeof(p->msg) - n, ": %s", kvt_strerror(err));
}

/* Account a finished store job to its request and free it. */
static void store_done(struct pass_ctx *p, struct djob *j, kvt_demo_req *r)
{
	kvt_cache_job_stat st;
	int rc;

	if (!j)
		return;
	rc = dj_wait(j, -1);
	dj_stat(j, &st);
	r->stored_pages += st.copied;
	r->cache_wait_s += st.wait_s;
	if (rc && !r->store_err)
		r->store_err = rc;
	note_err(p, rc, "demo %s: session %u turn %u: a store failed",
		 p->out->policy, r->session, r->turn);
	dj_free(j);
}

static int pending_done(struct pending *pd)
{
	for (int i = 0; i < 2; i++)
		if (pd->job[i] && dj_poll(pd->job[i]) == -EINPROGRESS)
			return 0;
	return 1;
}

/* Retire the oldest pending request: wait for its stores (@block) or only
 * if they are done; its blocks go back to the free list. 1 if retired. */
static int pending_retire(struct pass_ctx *p, int block)
{
	struct pending *pd;

	if (p->qhead == p->qtail)
		return 0;
	pd = &p->q[p->qhead % p->qcap];
	if (!block && !pending_done(pd))
		return 0;
	for (int i = 0; i < 2; i++)
		store_done(p, pd->job[i], pd->req);
	for (uint64_t b = 0; b < pd->nblocks; b++)
		p->eng.free[p->eng.nfree++] = pd->blocks[b];
	kvt_free(pd->blocks);
	memset(pd, 0, sizeof(*pd));
	p->qhead++;
	return 1;
}

/* Let this policy's leftover work finish (before the other policy runs). */
static void pass_drain(struct pass_ctx *p)
{
	uint64_t t0 = kvt_now_ns();

	while (pending_retire(p, 1))
		;
	if (p->cl)
		kvt_client_quiesce(p->cl);
	else
		kvt_cache_quiesce(p->cache);
	p->out->drain_s += since(t0);
}

/* Spend @model_ns from now, writing layer @l of pages [from, to). */
static void compute_layer(struct pass_ctx *p, const struct session *se,
			  const uint32_t *blocks, uint64_t from, uint64_t to,
			  uint32_t l, uint64_t model_ns)
{
	uint64_t start = kvt_now_ns();

	engine_write_layer(&p->eng, se, blocks, from, to, l);
	spend_until(start + model_ns);
}

/* Prefill pages [from, to) again after their load failed: every layer, in
 * real time, after the main pass (their KV was not there when it ran). */
static void recompute(struct pass_ctx *p, const struct session *se,
		      const uint32_t *blocks, uint64_t from, uint64_t to,
		      kvt_demo_req *r)
{
	const uint32_t P = p->c->page_tokens;
	double m = kvt_cost_prefill_s(&p->cost, (uint32_t)((to - from) * P),
				      (uint32_t)(from * P));
	uint64_t t0 = kvt_now_ns(), ns = (uint64_t)(m / p->eng.layers * 1e9);

	for (uint32_t l = 0; l < p->eng.layers; l++)
		compute_layer(p, se, blocks, from, to, l, ns);
	r->computed_tokens += (uint32_t)((to - from) * P);
	r->prefill_model_s += m;
	r->recompute_s = since(t0);
}

/* kvt_cache_store(). A top tier full of pages that earlier requests'
 * stores still hold is no error: the cache places what does not fit there
 * in the next tier down (and fails per block only what fits nowhere,
 * counted as the store's error). */
static int store_submit(struct pass_ctx *p, uint64_t nkeys, uint64_t first,
			const uint32_t *blocks, struct djob **job)
{
	return dc_job(p, 1, nkeys, first, blocks, job);
}

/* The first failed page of pages [0, n), or n. */
static uint64_t first_failed(const uint32_t *blocks, uint64_t n,
			     const uint32_t *failed, long nfailed)
{
	for (uint64_t i = 0; i < n; i++)
		for (long f = 0; f < nfailed; f++)
			if (failed[f] == blocks[i])
				return i;
	return n;
}

static int one_request(struct pass_ctx *p, uint32_t s, uint32_t k,
		       kvt_demo_req *r)
{
	const kvt_demo_config *c = p->c;
	const uint32_t P = c->page_tokens, L = p->eng.layers;
	struct session *se = &p->ss[s];
	uint64_t T = prompt_len(c, k), full = T / P, ans_full, need, hit = 0,
		 t0, t1, model_ns, ff;
	kvt_cache_lookup_result lr;
	struct djob *load = NULL, *store = NULL, *astore = NULL;
	kvt_cache_job_stat st;
	uint32_t *blocks = NULL;
	long nfailed = 0;
	int err = 0, rc;

	memset(r, 0, sizeof(*r));
	r->session = s;
	r->turn = k;
	r->prompt_tokens = (uint32_t)T;
	ans_full = (T + c->output_tokens) / P;
	need = (T + c->output_tokens + P - 1) / P;

	/* ---- arrival ---- */
	t0 = kvt_now_ns();
	while (pending_retire(p, 0)) /* stores already done: free blocks */
		;
	if ((err = dc_hash(p, se->tokens, full * P, p->keys)) ||
	    (err = dc_lookup(p, full, KVT_LOOKUP_TOUCH, &lr)))
		goto out;
	r->lookup_s = since(t0);
	r->inflight_pages = (uint32_t)lr.inflight;
	/* pages of the prefix still being stored by earlier requests (the
	 * shared system prompt, this session's last turn): wait for those
	 * stores rather than compute the pages again */
	while (lr.inflight && p->qhead != p->qtail) {
		t1 = kvt_now_ns();
		pending_retire(p, 1);
		r->block_wait_s += since(t1);
		t1 = kvt_now_ns();
		if ((err = dc_lookup(p, full, 0, &lr)))
			goto out;
		r->lookup_s += since(t1);
	}
	/* at least the last prompt token is computed (it yields the first
	 * output token) */
	hit = KVT_MIN(lr.pages, (T - 1) / P);
	t1 = kvt_now_ns();
	while (p->eng.nfree < need && pending_retire(p, 1))
		;
	r->block_wait_s += since(t1);
	if (p->eng.nfree < need) {
		err = kvti_fail(-ENOMEM, "demo: %llu engine blocks, a request "
				"needs %llu", (unsigned long long)p->eng.nblocks,
				(unsigned long long)need);
		goto out;
	}
	t1 = kvt_now_ns();
	blocks = kvt_malloc(need * sizeof(*blocks));
	if (!blocks) {
		err = -ENOMEM;
		goto out;
	}
	for (uint64_t i = 0; i < need; i++)
		blocks[i] = p->eng.free[--p->eng.nfree];
	if (hit && (err = dc_job(p, 0, hit, 0, blocks, &load)))
		goto out;
	r->lookup_s += since(t1);

	/* ---- prefill, layer by layer ---- */
	r->prefill_model_s = kvt_cost_prefill_s(&p->cost,
						(uint32_t)(T - hit * P),
						(uint32_t)(hit * P));
	model_ns = (uint64_t)(r->prefill_model_s / L * 1e9);
	r->computed_tokens = (uint32_t)(T - hit * P);
	ff = hit;
	if (load && p->lmcache) { /* the whole prefix first */
		t1 = kvt_now_ns();
		rc = dj_wait(load, -1);
		r->load_wait_s += since(t1);
		nfailed = dj_failed(load, p->failed, hit);
		if (rc && !nfailed) { /* a failure with no block to blame */
			err = rc;
			goto out;
		}
		if (nfailed > 0) { /* prefill those pages with the rest */
			ff = first_failed(blocks, hit, p->failed, nfailed);
			r->computed_tokens = (uint32_t)(T - ff * P);
			r->prefill_model_s = kvt_cost_prefill_s(&p->cost,
				r->computed_tokens, (uint32_t)(ff * P));
			model_ns = (uint64_t)(r->prefill_model_s / L * 1e9);
		}
	}
	{
		int broken = 0;

		for (uint32_t l = 0; l < L; l++) {
			uint64_t w0 = kvt_now_ns(), w1;

			if (load && !p->lmcache && !broken &&
			    (rc = dj_wait_layer(load, l, -1)))
				broken = 1; /* every block failed, or cancelled */
			w1 = kvt_now_ns();
			r->load_wait_s += (double)(w1 - w0) / 1e9;
			p->ready[l] = (double)(w1 - t0) / 1e9;
			p->model[l] = (double)model_ns / 1e9;
			compute_layer(p, se, blocks, ff, full, l, model_ns);
			p->end[l] = since(t0);
			r->prefill_s += p->end[l] - p->ready[l];
		}
	}
	r->ready_s = L ? p->ready[L - 1] : 0;
	if (load && !p->lmcache) { /* its end: leases released, failures */
		t1 = kvt_now_ns();
		rc = dj_wait(load, -1);
		r->load_wait_s += since(t1);
		nfailed = dj_failed(load, p->failed, hit);
		if (rc && !nfailed) {
			err = rc;
			goto out;
		}
		if (nfailed > 0) {
			ff = first_failed(blocks, hit, p->failed, nfailed);
			recompute(p, se, blocks, ff, hit, r);
		}
	}

	/* ---- save: lmcache waits for it (wait_for_save) ---- */
	t1 = kvt_now_ns();
	/* the whole prompt's blocks go with the store: the restored pages
	 * are verified copies too, so a parent the top tier lacks is copied
	 * from the engine's memory, not read back up from ssd */
	if (full > ff && (err = store_submit(p, full, 0, blocks, &store)))
		goto out;
	if (store && p->lmcache) {
		store_done(p, store, r);
		store = NULL;
	}
	r->save_s = since(t1);
	r->ttft_s = since(t0);
	/* ---- first token: the rest is off the clock ---- */

	if (load) {
		dj_stat(load, &st);
		r->loaded_pages = st.copied;
		r->verified_pages = st.verified;
		r->failed_pages = st.failed;
		r->restore_bytes = st.bytes;
		r->restore_s = st.total_s;
		r->layer0_s = st.layer0_s;
		r->cache_wait_s += st.wait_s;
		for (int t = 0; t < KVT_TIER_COUNT; t++)
			r->hit_tokens[t] = (uint32_t)(st.from[t] * P);
		rc = dj_wait(load, 0);
		/* evicted since the lookup, or moving between tiers at that
		 * instant: recomputed, not a fault */
		if (rc && rc != KVT_ENOTFOUND && rc != KVT_EBUSY) {
			r->load_err = rc;
			note_err(p, rc, "demo %s: session %u turn %u: %ld of %llu "
				 "restored pages failed", p->out->policy, s, k,
				 nfailed, (unsigned long long)hit);
		}
		engine_check(&p->eng, se, blocks, hit, p->failed,
			     nfailed > 0 ? nfailed : 0, r);
		if (r->engine_bad)
			note_err(p, KVT_ECORRUPT, "demo %s: session %u turn %u: "
				 "%llu restored blocks hold wrong bytes",
				 p->out->policy, s, k,
				 (unsigned long long)r->engine_bad);
	}
	for (uint32_t j = 0; j < c->output_tokens; j++)
		r->decode_s += kvt_cost_step_s(&p->cost, NULL, 0, 1, T + j);

	/* the answer (and the prompt's partial last page) */
	if (ans_full > full && !(p->lmcache && r->store_err)) {
		for (uint32_t l = 0; l < L; l++)
			engine_write_layer(&p->eng, se, blocks, full, ans_full, l);
		if ((err = dc_hash(p, se->tokens, ans_full * P, p->keys)) ||
		    (err = store_submit(p, ans_full, full, blocks + full,
					&astore)))
			goto out;
		if (p->lmcache) {
			store_done(p, astore, r);
			astore = NULL;
		}
	}
	if (store || astore) { /* kvtier: blocks held until the stores end */
		struct pending *pd = &p->q[p->qtail++ % p->qcap];

		pd->blocks = blocks;
		pd->nblocks = need;
		pd->job[0] = store;
		pd->job[1] = astore;
		pd->req = r;
		blocks = NULL;
		store = astore = NULL;
	}
out:
	dj_free(load);
	if (store)
		store_done(p, store, r);
	if (astore)
		store_done(p, astore, r);
	if (blocks)
		for (uint64_t i = 0; i < need; i++)
			p->eng.free[p->eng.nfree++] = blocks[i];
	kvt_free(blocks);
	if (!err && c->layers)
		c->layers(c->layers_arg, p->out->policy, r, L, p->ready, p->end,
			  p->model);
	return err;
}

/* Tiers of the same sizes and backings for both policies; every memory
 * tier faulted in at open, so no restore pays the first touch. */
static void tier_spec(const kvt_demo_config *c, const char *dir, char *buf,
		      size_t len)
{
	snprintf(buf, len, "fabric:%s,%llu,populate,dram:%llu,populate,"
		 "ssd:%s,%llu,temp,fresh", c->fabric[0] ? c->fabric : "memfd",
		 (unsigned long long)c->fabric_bytes,
		 (unsigned long long)c->dram_bytes, dir,
		 (unsigned long long)c->ssd_bytes);
}

/* ---- --daemon: this policy's cache in a kvtierd child process ---------- */

/* What the daemon child reports: once ready (or failed), once drained. */
struct dreport {
	int err;
	char detail[256];
	char where[KVT_PATH_MAX];
	int check_err;
	char check_detail[256];
	kvt_cache_check check;
	kvt_cache_stat cache;
	kvt_index_stat index;
};

static kvtd *demo_daemon;

static void demo_daemon_term(int sig)
{
	(void)sig;
	kvtd_stop(demo_daemon);
}

/* All @n bytes through a pipe (@out: write), or -1. */
static int pipe_all(int fd, void *p, size_t n, int out)
{
	char *b = p;

	while (n) {
		ssize_t k = out ? write(fd, b, n) : read(fd, b, n);

		if (k < 0 && errno == EINTR)
			continue;
		if (k <= 0)
			return -1;
		b += k;
		n -= (size_t)k;
	}
	return 0;
}

/* The child: serve until SIGTERM, then check every copy as the in-process
 * pass does, report, drain. */
static void __attribute__((noreturn))
daemon_child(const kvtd_config *dc, int fd)
{
	struct sigaction sa = { .sa_handler = demo_daemon_term };
	struct dreport *rep = calloc(1, sizeof(*rep));
	kvt_cache *cache;
	kvt_tier_desc d;

	if (!rep)
		_exit(1);
	rep->err = kvtd_open(&demo_daemon, dc);
	if (rep->err) {
		snprintf(rep->detail, sizeof(rep->detail), "%s", kvt_errdetail());
		pipe_all(fd, rep, sizeof(*rep), 1);
		_exit(1);
	}
	cache = kvtd_cache(demo_daemon);
	kvt_tier_info(kvt_cache_tier(cache, KVT_TIER_FABRIC), &d);
	snprintf(rep->where, sizeof(rep->where), "%s%s%s", d.where,
		 d.emulated ? ", EMULATED: " : "",
		 d.emulated ? (d.note[0] ? d.note : "emulated") : "");
	sigaction(SIGTERM, &sa, NULL);
	if (pipe_all(fd, rep, sizeof(*rep), 1))
		_exit(1);
	rep->err = kvtd_run(demo_daemon);
	kvt_cache_quiesce(cache);
	rep->check_err = kvt_cache_verify(cache, &rep->check);
	snprintf(rep->check_detail, sizeof(rep->check_detail), "%s",
		 kvt_errdetail());
	kvt_cache_stat_get(cache, &rep->cache);
	kvt_index_stat_get(kvt_cache_index(cache), &rep->index);
	pipe_all(fd, rep, sizeof(*rep), 1);
	kvtd_close(demo_daemon);
	_exit(0);
}

/* Start this policy's daemon and connect to it as the engine. */
static int daemon_open(struct pass_ctx *p, const kvt_demo_config *c,
		       const kvt_cache_config *cc, char *sock, size_t slen)
{
	kvt_client_config cl = KVT_CLIENT_CONFIG_INIT;
	kvtd_config dc = { 0 };
	struct dreport rep;
	int fds[2], err;

	snprintf(sock, slen, "/tmp/kvtier-demo-%d-%s.sock", (int)getpid(),
		 p->out->policy);
	dc.socket = sock;
	dc.tiers = cc->tiers;
	dc.model = c->model;
	dc.page_tokens = c->page_tokens;
	dc.tp = 1;
	dc.write = cc->write;
	dc.evict = cc->evict;
	dc.cache_flags = cc->flags;
	dc.lease_ms = 3600 * 1000; /* a slow run is not a stuck client */
	if (pipe2(fds, O_CLOEXEC))
		return kvti_fail(-errno, "demo: pipe: %s", strerror(errno));
	p->dpid = fork();
	if (p->dpid < 0) {
		err = -errno;
		close(fds[0]);
		close(fds[1]);
		return kvti_fail(err, "demo: fork: %s", strerror(-err));
	}
	if (p->dpid == 0) {
		close(fds[0]);
		daemon_child(&dc, fds[1]);
	}
	close(fds[1]);
	p->dfd = fds[0];
	if (pipe_all(p->dfd, &rep, sizeof(rep), 0))
		return kvti_fail(-ECHILD, "demo: the %s daemon exited at start",
				 p->out->policy);
	if (rep.err)
		return kvti_fail(rep.err, "demo: the %s daemon: %s",
				 p->out->policy, rep.detail);
	snprintf(p->out->fabric_where, sizeof(p->out->fabric_where), "%s",
		 rep.where);
	cl.socket = sock;
	cl.model = c->model;
	cl.page_tokens = c->page_tokens;
	return kvt_client_connect(&p->cl, &cl);
}

/* Disconnect, stop the daemon, take its final check. */
static void daemon_finish(struct pass_ctx *p)
{
	kvt_demo_pass *out = p->out;
	struct dreport rep;
	int st;

	kvt_client_close(p->cl);
	p->cl = NULL;
	p->cm = NULL;
	kill(p->dpid, SIGTERM);
	if (pipe_all(p->dfd, &rep, sizeof(rep), 0)) {
		out->check_err = kvti_fail(-ECHILD, "demo: the %s daemon died "
					   "before its final check",
					   out->policy);
	} else {
		out->check_err = rep.check_err;
		out->check = rep.check;
		out->cache = rep.cache;
		out->index = rep.index;
		if (rep.check_err)
			kvti_fail(rep.check_err, "%s", rep.check_detail);
	}
	close(p->dfd);
	p->dfd = -1;
	waitpid(p->dpid, &st, 0);
	p->dpid = 0;
}

static int pass_open(struct pass_ctx *p, const kvt_demo_config *c,
		     struct session *ss, const kvt_cost *cost, int lmcache,
		     const char *dir, const kvt_geom *g, kvt_demo_pass *out)
{
	kvt_cache_config cc = KVT_CACHE_CONFIG_INIT;
	char sub[KVT_PATH_MAX + 32];
	uint64_t maxpages = session_tokens(c) / c->page_tokens + 1;
	int err;

	memset(out, 0, sizeof(*out));
	out->check_err = 1;
	kvti_strlcpy(out->policy, lmcache ? "lmcache" : "kvtier",
		     sizeof(out->policy));
	snprintf(sub, sizeof(sub), "%s/%s", dir, out->policy);
	tier_spec(c, sub, out->tiers, sizeof(out->tiers));
	out->nreqs = (size_t)c->sessions * c->turns;
	out->reqs = kvt_calloc(out->nreqs, sizeof(*out->reqs));
	p->keys = kvt_malloc(maxpages * sizeof(*p->keys));
	p->failed = kvt_malloc(maxpages * sizeof(*p->failed));
	p->ready = kvt_calloc(3 * (size_t)g->layers, sizeof(double));
	p->qcap = out->nreqs + 1;
	p->q = kvt_calloc(p->qcap, sizeof(*p->q));
	if (!out->reqs || !p->keys || !p->failed || !p->ready || !p->q)
		return -ENOMEM;
	p->end = p->ready + g->layers;
	p->model = p->end + g->layers;
	p->c = c;
	p->out = out;
	p->ss = ss;
	p->cost = *cost;
	p->lmcache = lmcache;
	cc.tiers = out->tiers;
	cc.geom = g;
	cc.evict = KVT_EVICT_LRU;
	cc.write = lmcache ? KVT_WRITE_THROUGH : KVT_WRITE_BACK;
	if (!(c->background & (lmcache ? KVT_DEMO_LMCACHE : KVT_DEMO_KVTIER)))
		cc.flags |= KVT_CACHE_NO_BACKGROUND;
	if (c->daemon) {
		void **base = kvt_calloc(g->layers, sizeof(*base));
		char sock[108];

		if (!base)
			return -ENOMEM;
		err = daemon_open(p, c, &cc, sock, sizeof(sock));
		if (!err)
			err = kvt_client_mem_alloc(p->cl, c->hbm_bytes /
						   kvt_geom_page_bytes(g), base,
						   NULL, NULL, NULL, &p->cm);
		if (!err)
			err = engine_open(&p->eng, g, c->hbm_bytes, base);
		kvt_free(base);
		out->nblocks = p->eng.nblocks;
		return err;
	}
	if ((err = kvt_cache_open(&p->cache, &cc)))
		return err;
	{
		kvt_tier_desc d;

		kvt_tier_info(kvt_cache_tier(p->cache, KVT_TIER_FABRIC), &d);
		snprintf(out->fabric_where, sizeof(out->fabric_where), "%s%s%s",
			 d.where, d.emulated ? ", EMULATED: " : "",
			 d.emulated ? (d.note[0] ? d.note : "emulated") : "");
	}
	if ((err = engine_open(&p->eng, g, c->hbm_bytes, NULL)))
		return err;
	out->nblocks = p->eng.nblocks;
	/* vLLM's layout: per layer [2][nblocks][P][H][D] */
	return kvt_cache_register(p->cache, p->eng.base, p->eng.layers,
				  p->eng.nblocks, p->eng.chunk,
				  p->eng.nblocks * p->eng.chunk,
				  (uint64_t)g->kv_heads * g->head_dim *
				  g->dtype_bytes, -1);
}

/* What the pass left, taken even after a failure: the counters, and every
 * copy re-read (unless the cache never opened). */
static void pass_finish(struct pass_ctx *p)
{
	kvt_demo_pass *out = p->out;

	if (p->dpid > 0) {
		if (p->cl)
			pass_drain(p);
		daemon_finish(p);
	} else if (!p->cache) {
		return;
	} else {
		pass_drain(p);
		out->check_err = kvt_cache_verify(p->cache, &out->check);
		kvt_cache_stat_get(p->cache, &out->cache);
		kvt_index_stat_get(kvt_cache_index(p->cache), &out->index);
	}
	if (out->cache.corrupt)
		note_err(p, KVT_ECORRUPT, "demo %s: %llu page copies failed "
			 "verification", out->policy,
			 (unsigned long long)out->cache.corrupt);
	if (out->cache.move_errors)
		note_err(p, -EIO, "demo %s: %llu page copies between tiers "
			 "failed with an I/O error", out->policy,
			 (unsigned long long)out->cache.move_errors);
	note_err(p, out->check_err, "demo %s: the final re-read of every "
		 "copy (%s)", out->policy, kvt_errdetail());
}

static void pass_close(struct pass_ctx *p)
{
	kvt_cache_close(p->cache); /* temp: removes the ssd files */
	if (p->dpid > 0) /* failed before its finish */
		daemon_finish(p);
	engine_close(&p->eng);
	for (size_t i = p->qhead; p->q && i < p->qtail; i++)
		kvt_free(p->q[i % p->qcap].blocks);
	kvt_free(p->q);
	kvt_free(p->keys);
	kvt_free(p->failed);
	kvt_free(p->ready);
}

static int demo_tmpdir(const kvt_demo_config *c, char *dir, size_t len,
		       int *made)
{
	const char *tmp = getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp";

	if (c->dir[0]) {
		snprintf(dir, len, "%s", c->dir);
		return 0;
	}
	snprintf(dir, len, "%s/kvtier-demo-XXXXXX", tmp);
	if (!mkdtemp(dir))
		return kvti_fail(-errno, "demo: mkdtemp %s: %s", dir,
				 strerror(errno));
	*made = 1;
	return 0;
}

/* The tamper_after hook: overwrite every ssd file past its header. */
static int tamper_one(const char *path, const struct stat *sb, int type,
		      struct FTW *ftw)
{
	static const char junk[65536] = { [0 ... 65535] = 0x5a };
	off_t end = KVT_MIN(sb->st_size, (off_t)(64 << 20));
	int fd;

	(void)ftw;
	if (type != FTW_F || !S_ISREG(sb->st_mode) || end <= 4096)
		return 0;
	fd = open(path, O_WRONLY | O_CLOEXEC);
	if (fd < 0)
		return 0;
	for (off_t o = 4096; o < end; o += (off_t)sizeof(junk))
		if (pwrite(fd, junk, (size_t)KVT_MIN((off_t)sizeof(junk), end - o),
			   o) < 0)
			break;
	close(fd);
	return 0;
}

/* Turn @k of every session under pass @p, after the other policy's
 * leftover work (@other) is done. */
static int run_turn(struct pass_ctx *p, struct pass_ctx *other, uint32_t k,
		    size_t *done, size_t total, const char *dir)
{
	const kvt_demo_config *c = p->c;
	int err = 0;

	if (other)
		pass_drain(other);
	for (uint32_t s = 0; s < c->sessions && !err; s++) {
		uint64_t q0 = kvt_now_ns();

		err = one_request(p, s, k, &p->out->reqs[(size_t)k * c->sessions + s]);
		p->out->seconds += since(q0);
		if (err) {
			kvti_errctx("demo %s: session %u turn %u",
				    p->out->policy, s, k);
			break;
		}
		p->out->done++;
		if (++*done == c->tamper_after) {
			kvti_warn("demo: overwriting the ssd files in %s (test "
				  "hook)", dir);
			nftw(dir, tamper_one, 8, FTW_PHYS);
		}
		if (c->progress)
			c->progress(c->progress_arg, p->out->policy, *done, total);
	}
	return err;
}

int kvt_demo_run(const kvt_demo_config *cin, kvt_demo_result **out)
{
	kvt_demo_config c = *cin;
	struct pass_ctx px[2];
	kvt_demo_result *r;
	struct session *ss = NULL;
	kvt_stress *stress = NULL;
	kvt_stress_stat s0, s1;
	char dir[KVT_PATH_MAX + 16];
	size_t done = 0, total;
	uint64_t t0 = kvt_now_ns(), t1;
	kvt_cost cost;
	kvt_hw hw;
	int err, made_dir = 0, np = 0;

	kvti_errclear();
	memset(px, 0, sizeof(px));
	*out = NULL;
	if ((err = kvt_demo_size(&c)))
		return err;
	r = kvt_calloc(1, sizeof(*r));
	if (!r)
		return -ENOMEM;
	r->config = c;
	if ((err = demo_geom(&c, &r->geom)) || (err = kvt_hw_load(&hw, c.hardware)) ||
	    (err = kvt_hw_cost(&hw, &r->geom, &cost)))
		goto fail;
	kvti_strlcpy(r->gpu_name, hw.gpu_name, sizeof(r->gpu_name));
	ss = kvt_calloc(c.sessions, sizeof(*ss));
	if (!ss || (err = sessions_make(&c, ss))) {
		err = err ? err : -ENOMEM;
		goto fail;
	}
	if ((err = demo_tmpdir(&c, dir, sizeof(dir), &made_dir)))
		goto fail;

	t1 = kvt_now_ns();
	for (int lm = 1; lm >= 0; lm--) {
		if (!(c.policies & (lm ? KVT_DEMO_LMCACHE : KVT_DEMO_KVTIER)))
			continue;
		r->npasses = ++np;
		err = pass_open(&px[np - 1], &c, ss, &cost, lm, dir, &r->geom,
				&r->pass[np - 1]);
		if (err)
			goto fail;
	}
	kvti_strlcpy(r->tiers, r->pass[0].tiers, sizeof(r->tiers));
	r->setup_s = (double)(kvt_now_ns() - t1) / 1e9;

	if (c.stress && (err = kvt_stress_start(&stress, c.stress,
						c.stress_bytes, 0)))
		goto fail;
	if (stress)
		kvt_stress_sample(stress, &s0);
	total = (size_t)c.sessions * c.turns * (size_t)np;
	/* turn by turn, policy by policy, alternating which goes first */
	for (uint32_t k = 0; k < c.turns && !err; k++)
		for (int i = 0; i < np && !err; i++) {
			int j = (k & 1) ? np - 1 - i : i;

			err = run_turn(&px[j], np == 2 ? &px[1 - j] : NULL, k,
				       &done, total, dir);
		}
	if (stress) {
		kvt_stress_sample(stress, &s1);
		for (int i = 0; i < np; i++)
			r->pass[i].stress_gbps = s1.seconds > s0.seconds ?
				(double)(s1.bytes - s0.bytes) / 1e9 /
				(s1.seconds - s0.seconds) : 0;
	}
fail:
	kvt_stress_stop(stress, NULL);
	if (err)
		snprintf(r->error, sizeof(r->error), "%s", kvt_errdetail()[0] ?
			 kvt_errdetail() : kvt_strerror(err));
	for (int i = 0; i < np; i++)
		pass_finish(&px[i]);
	for (int i = 0; i < np && !err; i++)
		if ((err = px[i].err))
			snprintf(r->error, sizeof(r->error), "%s", px[i].msg);
	for (int i = 0; i < np; i++)
		pass_close(&px[i]);
	if (made_dir) {
		char sub[KVT_PATH_MAX + 32];

		for (int lm = 0; lm < 2; lm++) {
			snprintf(sub, sizeof(sub), "%s/%s", dir,
				 lm ? "lmcache" : "kvtier");
			rmdir(sub);
		}
		rmdir(dir);
	}
	if (ss)
		for (uint32_t s = 0; s < c.sessions; s++) {
			kvt_free(ss[s].tokens);
			kvt_free(ss[s].seeds);
		}
	kvt_free(ss);
	r->seconds = (double)(kvt_now_ns() - t0) / 1e9;
	if (err && !done) {
		kvt_demo_result_free(r);
		return err;
	}
	*out = r;
	return err;
}

void kvt_demo_result_free(kvt_demo_result *r)
{
	if (!r)
		return;
	for (int i = 0; i < 2; i++)
		kvt_free(r->pass[i].reqs);
	kvt_free(r);
}
