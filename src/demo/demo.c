/*
 * demo.c — the end-to-end demo (include/kvtier/demo.h): an agentic
 * workload through the real cache, with GPU compute time modeled.
 *
 * PICTURE (one pass)
 *
 *   for turn k = 0 .. turns-1:            (turn-major: every session takes
 *     for session s = 0 .. sessions-1:     its turn, then idles on a tool)
 *
 *       prompt = tokens[s][0 .. L(k))      L(k) = sys + ctx + k*(new + out)
 *       match           -> where the prefix is (before anything moves)
 *       acquire(prompt) -> loads from lower tiers, verified; evictions
 *       put             -> the pages nobody had: computed bytes into hbm
 *       modeled prefill of the uncached tokens, modeled decode of the answer
 *       release(prompt); acquire(prompt + answer); put the answer's pages;
 *       release
 *
 * Token ids are a hash of (seed, session, position), except the shared
 * system prompt, which is the same for every session. A page's bytes are a
 * pseudo-random stream seeded by the chained hash of every token up to the
 * page's end: the same prefix always holds the same bytes, different
 * prefixes different bytes, and nothing needs storing to check them.
 *
 * Nothing here is timed but the cache's own loads and copies (wall clock);
 * prefill and decode come from the scheduler's cost model for a hardware
 * profile (kvt_hw_cost()). The modeled figures never wait: the demo runs as
 * fast as the real data movement allows.
 */
#include "core/core.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>
#include <xxhash.h>

void kvt_demo_config_init(kvt_demo_config *c)
{
	memset(c, 0, sizeof(*c));
	kvti_strlcpy(c->model, "llama-3.2-1b", sizeof(c->model));
	kvti_strlcpy(c->hardware, "testbed-b", sizeof(c->hardware));
	c->page_tokens = 16;
	c->sessions = 10;
	c->turns = 6;
	c->system_tokens = 2048;
	c->context_tokens = 4096;
	c->turn_tokens = 1024;
	c->output_tokens = 256;
	c->policies = KVT_DEMO_LMCACHE | KVT_DEMO_KVTIER;
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

int kvt_demo_size(kvt_demo_config *c)
{
	uint64_t token_bytes, sess, page, mem_cap, need_mem, want;
	kvt_machine m;
	kvt_hw hw;
	kvt_geom g;
	int err;

	if (!c->sessions || c->sessions > KVT_DEMO_MAX_SESSIONS)
		return kvti_fail(-EINVAL, "demo: sessions must be 1..%d",
				 KVT_DEMO_MAX_SESSIONS);
	if (!c->turns || c->turns > KVT_DEMO_MAX_TURNS)
		return kvti_fail(-EINVAL, "demo: turns must be 1..%d",
				 KVT_DEMO_MAX_TURNS);
	if (!c->context_tokens && !c->system_tokens)
		return kvti_fail(-EINVAL, "demo: an empty first prompt");
	if (session_tokens(c) > (1u << 31))
		return kvti_fail(-EINVAL, "demo: a session of %llu tokens is "
				 "too long", (unsigned long long)session_tokens(c));
	if (!c->policies || (c->policies & ~(unsigned)(KVT_DEMO_LMCACHE |
						      KVT_DEMO_KVTIER)))
		return kvti_fail(-EINVAL, "demo: bad policy set");
	if ((err = demo_geom(c, &g)))
		return err;
	if ((err = kvt_hw_load(&hw, c->hardware)))
		return err;
	token_bytes = kvt_geom_token_bytes(&g);
	page = kvt_geom_page_bytes(&g);
	sess = KVT_ALIGN_UP(session_tokens(c), c->page_tokens) * token_bytes;

	kvt_probe(&m);
	c->gpu = m.cuda_built && m.ngpus > 0;
	/* per policy (both run side by side): hbm one and a half sessions (a
	 * session's pages are all pinned while it runs); fabric and dram three
	 * sessions each; ssd all of them and a quarter more (a page keeps at
	 * most one ssd copy: loads leave it there, evictions reuse it). */
	if (!c->hbm_bytes)
		c->hbm_bytes = KVT_ALIGN_UP(sess + sess / 2 + 4 * page, page);
	if (!c->fabric_bytes)
		c->fabric_bytes = 3 * sess;
	if (!c->dram_bytes)
		c->dram_bytes = 3 * sess;
	if (!c->ssd_bytes) /* one copy of every page fits, with a quarter spare */
		c->ssd_bytes = (uint64_t)c->sessions * sess / 4 * 5 + 64 * page;
	if (c->hbm_bytes < sess + 2 * page)
		return kvti_fail(-EINVAL, "demo: hbm of %llu bytes cannot hold "
				 "one session (%llu bytes)",
				 (unsigned long long)c->hbm_bytes,
				 (unsigned long long)sess);
	/* memory tiers of both policies within a third of what is available */
	mem_cap = m.mem_available / 3 / (uint64_t)__builtin_popcount(c->policies);
	need_mem = (c->gpu ? 0 : c->hbm_bytes) + c->fabric_bytes + c->dram_bytes;
	if (mem_cap && need_mem > mem_cap) {
		uint64_t hbm = c->gpu ? 0 : c->hbm_bytes, rest;

		if (mem_cap < hbm + 2 * sess)
			return kvti_fail(-ENOMEM, "demo: needs at least %llu MiB "
					 "of memory, %llu MiB is available; use "
					 "--sessions, --context or a smaller "
					 "--model", (unsigned long long)
					 ((hbm + 2 * sess) * 3 * (uint64_t)
					  __builtin_popcount(c->policies) >> 20),
					 (unsigned long long)(m.mem_available >> 20));
		rest = mem_cap - hbm;
		c->fabric_bytes = KVT_ALIGN_UP(rest / 2 - page, page);
		c->dram_bytes = c->fabric_bytes;
		kvti_info("demo: fabric and dram cut to %llu MiB each to fit "
			  "in memory", (unsigned long long)(c->dram_bytes >> 20));
	}
	want = c->ssd_bytes * (uint64_t)__builtin_popcount(c->policies);
	{
		struct statvfs v;
		const char *d = c->dir[0] ? c->dir : (getenv("TMPDIR") ?
						      getenv("TMPDIR") : "/tmp");
		if (statvfs(d, &v) == 0 &&
		    (uint64_t)v.f_bavail * v.f_frsize < want + (256ull << 20))
			return kvti_fail(-ENOSPC, "demo: the ssd tier needs %llu "
					 "MiB in %s, %llu MiB is free",
					 (unsigned long long)(want >> 20), d,
					 (unsigned long long)((uint64_t)v.f_bavail *
							      v.f_frsize >> 20));
	}
	return 0;
}

/* ---- the workload ------------------------------------------------------ */

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

/* The bytes of the page whose prefix hashes to @seed. */
static void page_fill(uint64_t *p, uint64_t bytes, uint64_t seed)
{
	uint64_t x = seed | 1;

	for (uint64_t i = 0; i < bytes / 8; i++) {
		x += 0x9e3779b97f4a7c15ull; /* splitmix64 */
		uint64_t z = x;
		z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
		z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
		p[i] = z ^ (z >> 31);
	}
}

/* ---- one pass ---------------------------------------------------------- */

struct pass_ctx {
	const kvt_demo_config *c;
	kvt_demo_pass *out;
	struct session *ss;
	kvt_cache *cache;
	kvt_cost cost;
	kvt_page_loc *locs;
	void *page;
	int lmcache;
	size_t done, total;
};

static int put_fresh(struct pass_ctx *p, const struct session *s,
		     size_t first, size_t npages)
{
	uint64_t page_bytes = kvt_geom_page_bytes(kvt_cache_geom(p->cache));
	int err;

	for (size_t i = first; i < npages; i++) {
		kvt_page_loc *l = &p->locs[i];

		if (!l->fresh || l->src_tier < KVT_TIER_COUNT)
			continue;
		page_fill(p->page, page_bytes, s->seeds[i]);
		if ((err = kvt_cache_put(p->cache, l->slot, p->page)))
			return err;
	}
	return 0;
}

static int one_request(struct pass_ctx *p, uint32_t s, uint32_t k,
		       kvt_demo_req *r)
{
	const kvt_demo_config *c = p->c;
	const uint32_t P = c->page_tokens;
	struct session *se = &p->ss[s];
	uint64_t L = prompt_len(c, k), hit = 0;
	kvt_prefix px = { .tenant = 0, .tokens = se->tokens, .ntokens = L };
	kvt_prefix ans = px;
	kvt_index_stat st0, st1;
	kvt_cache_fill f, f2;
	kvt_match m;
	int err;

	memset(r, 0, sizeof(*r));
	r->session = s;
	r->turn = k;
	r->prompt_tokens = (uint32_t)L;
	kvt_index_stat_get(kvt_cache_index(p->cache), &st0);

	err = kvt_index_match(kvt_cache_index(p->cache), &px, 0, 0, &m, NULL, 0);
	if (err)
		return err;
	err = kvt_cache_acquire(p->cache, &px, kvt_now_ns(), &f, p->locs, L / P);
	if (err)
		return err;
	for (int t = 0; t < KVT_TIER_COUNT; t++) {
		r->hit_tokens[t] = (uint32_t)(f.from[t] * P);
		hit += f.from[t] * P;
		if (f.from[t] * P != m.tier_tokens[t]) /* the walk and the
							  insert must agree */
			err = kvti_fail(KVT_ECORRUPT, "demo: session %u turn %u: "
					"match saw %llu tokens in %s, acquire "
					"found %llu", s, k,
					(unsigned long long)m.tier_tokens[t],
					kvt_tier_kind_name((kvt_tier_kind)t),
					(unsigned long long)(f.from[t] * P));
	}
	r->transient_tokens = (uint32_t)(m.queued_tokens + m.inflight_tokens);
	r->computed_tokens = (uint32_t)(L - hit);
	r->restore_bytes = f.bytes_loaded;
	r->verified_pages = f.verified;
	r->restore_s = f.load_s;
	r->evict_s = f.evict_s;
	if (!err)
		err = put_fresh(p, se, 0, L / P);
	if (err) {
		kvt_cache_release(p->cache, &px);
		return err;
	}
	r->prefill_s = kvt_cost_prefill_s(&p->cost, r->computed_tokens,
					  (uint32_t)hit);
	r->ttft_s = p->lmcache ? r->restore_s + r->prefill_s :
		    kvt_cost_overlap_s(&p->cost, r->prefill_s, r->restore_s, 1);
	for (uint32_t j = 0; j < c->output_tokens; j++)
		r->decode_s += kvt_cost_step_s(&p->cost, NULL, 0, 1, L + j);

	/* the answer joins the context: its pages are computed in decode */
	if ((err = kvt_cache_release(p->cache, &px)))
		return err;
	ans.ntokens = L + c->output_tokens;
	err = kvt_cache_acquire(p->cache, &ans, kvt_now_ns(), &f2, p->locs,
				ans.ntokens / P);
	if (err)
		return err;
	r->evict_s += f2.evict_s;
	err = put_fresh(p, se, L / P, ans.ntokens / P);
	if (f2.bytes_loaded && !err) /* the prompt was just in hbm, pinned */
		err = kvti_fail(KVT_ECORRUPT, "demo: session %u turn %u: the "
				"answer's acquire loaded %llu bytes", s, k,
				(unsigned long long)f2.bytes_loaded);
	kvt_cache_release(p->cache, &ans);
	kvt_index_stat_get(kvt_cache_index(p->cache), &st1);
	for (int t = 0; t < KVT_TIER_COUNT; t++) {
		r->evicted += st1.evicted[t] - st0.evicted[t];
		r->demoted += st1.demoted[t] - st0.demoted[t];
	}
	return err;
}

/* Both policies run on tiers of the same sizes and backings, side by side:
 * request (k, s) goes to one and then the other (which first alternates),
 * so a slower moment of a shared machine weighs on both alike. Every tier
 * is faulted in at open, so no restore pays the first touch of memory. */
static void tier_spec(const kvt_demo_config *c, const char *dir, char *buf,
		      size_t len)
{
	const char *pin = c->gpu ? ",pin" : "";

	snprintf(buf, len, "%s:%llu%s,fabric:memfd,%llu,populate%s,"
		 "dram:%llu,populate%s,ssd:%s,%llu,temp,fresh",
		 c->gpu ? "hbm" : "hostdev", (unsigned long long)c->hbm_bytes,
		 c->gpu ? "" : ",populate",
		 (unsigned long long)c->fabric_bytes, pin,
		 (unsigned long long)c->dram_bytes, pin, dir,
		 (unsigned long long)c->ssd_bytes);
}

static int pass_open(struct pass_ctx *p, const kvt_demo_config *c,
		     struct session *ss, const kvt_cost *cost, int lmcache,
		     const char *dir, const kvt_geom *g, kvt_demo_pass *out)
{
	kvt_cache_config cc = { 0 };
	char sub[KVT_PATH_MAX + 32];

	memset(out, 0, sizeof(*out));
	kvti_strlcpy(out->policy, lmcache ? "lmcache" : "kvtier",
		     sizeof(out->policy));
	snprintf(sub, sizeof(sub), "%s/%s", dir, out->policy);
	tier_spec(c, sub, out->tiers, sizeof(out->tiers));
	out->nreqs = (size_t)c->sessions * c->turns;
	out->reqs = kvt_calloc(out->nreqs, sizeof(*out->reqs));
	p->locs = kvt_malloc((session_tokens(c) / c->page_tokens + 1) *
			     sizeof(*p->locs));
	p->page = kvti_aligned_alloc(4096, kvt_geom_page_bytes(g));
	if (!out->reqs || !p->locs || !p->page)
		return -ENOMEM;
	p->c = c;
	p->out = out;
	p->ss = ss;
	p->cost = *cost;
	p->lmcache = lmcache;
	cc.tiers = out->tiers;
	cc.geom = *g;
	cc.evict = KVT_EVICT_LRU;
	cc.write = lmcache ? KVT_WRITE_THROUGH : KVT_WRITE_BACK;
	return kvt_cache_open(&p->cache, &cc);
}

/* Check what the pass left: the index's invariants, every copy's bytes. */
static int pass_finish(struct pass_ctx *p)
{
	kvt_demo_pass *out = p->out;
	int err;

	kvt_cache_stat_get(p->cache, &out->cache);
	kvt_index_stat_get(kvt_cache_index(p->cache), &out->index);
	if ((err = kvt_index_check(kvt_cache_index(p->cache)))) {
		kvti_errctx("demo %s: index check", out->policy);
		return err;
	}
	if ((err = kvt_cache_verify(p->cache, &out->check)))
		return err;
	if (out->cache.move_errors || out->cache.corrupt)
		return kvti_fail(KVT_ECORRUPT, "demo %s: %llu page copies failed",
				 out->policy,
				 (unsigned long long)out->cache.move_errors);
	return 0;
}

static void pass_close(struct pass_ctx *p)
{
	kvt_cache_close(p->cache); /* temp: removes the ssd files */
	kvt_free(p->locs);
	kvt_free(p->page);
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
	if (c.dir[0]) {
		snprintf(dir, sizeof(dir), "%s", c.dir);
	} else {
		const char *tmp = getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp";
		snprintf(dir, sizeof(dir), "%s/kvtier-demo-XXXXXX", tmp);
		if (!mkdtemp(dir)) {
			err = kvti_fail(-errno, "demo: mkdtemp %s: %s", dir,
					strerror(errno));
			goto fail;
		}
		made_dir = 1;
	}

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
	for (uint32_t k = 0; k < c.turns && !err; k++)
		for (uint32_t s = 0; s < c.sessions && !err; s++)
			for (int i = 0; i < np && !err; i++) {
				/* alternate which policy goes first */
				int j = ((k * c.sessions + s) & 1) ? np - 1 - i : i;
				struct pass_ctx *p = &px[j];
				uint64_t q0 = kvt_now_ns();

				err = one_request(p, s, k, &p->out->reqs[
					(size_t)k * c.sessions + s]);
				p->out->seconds += (double)(kvt_now_ns() - q0) / 1e9;
				if (err)
					kvti_errctx("demo %s: session %u turn %u",
						    p->out->policy, s, k);
				++done;
				if (c.progress)
					c.progress(c.progress_arg, p->out->policy,
						   done, total);
			}
	if (stress) {
		kvt_stress_sample(stress, &s1);
		for (int i = 0; i < np; i++)
			r->pass[i].stress_gbps = s1.seconds > s0.seconds ?
				(double)(s1.bytes - s0.bytes) / 1e9 /
				(s1.seconds - s0.seconds) : 0;
	}
	for (int i = 0; i < np && !err; i++)
		err = pass_finish(&px[i]);
fail:
	kvt_stress_stop(stress, NULL);
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
