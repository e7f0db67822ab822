/*
 * demo_impl.h — the demo's insides (internal), shared by its files:
 *
 *   demo.c    configuration, sizing, the passes in order, statistics, the
 *             simulator's view of the same workload
 *   serve.c   one pass: the engine step loop (src/engine) on the wall clock
 *             over the real cache: the engine's ops, blocks, arrivals, the
 *             event loop (serve_impl.h: its insides; serve_view.c: what
 *             the scheduler sees of the live cache; serve_gpu.c: the
 *             emulated GPU and the jobs it reaps)
 *   dplane.c  the cache as the engine reaches it: in this process or in a
 *             kvtierd child through the client; one job type for both
 *   bytes.c   the engine's KV memory and the bytes of every page (a
 *             function of its key, so any block can be checked)
 */
#ifndef KVT_DEMO_IMPL_H
#define KVT_DEMO_IMPL_H

#include "core/core.h"

#include <kvtier/client.h>
#include <kvtier/demo.h>

#include <sys/types.h>

/* ---- engine memory and page bytes (bytes.c) ------------------------------ */

struct dmem {
	void **base;            /* per layer: [kv][nblocks][P][H][D] */
	uint32_t layers, kv;
	uint64_t nblocks, chunk; /* chunk: one (block, layer, kv), bytes */
	int shared;             /* base[] is the daemon-shared memfd's */
};

/* @shared: per-layer memory a daemon shares (vLLM layout), or NULL to
 * allocate our own. Faulted in (zeroed) here, not in a request. */
int kvti_dmem_open(struct dmem *m, const kvt_geom *g, uint64_t nblocks,
		   void *const *shared);
void kvti_dmem_close(struct dmem *m);
/* The seed of a page's bytes: a function of its (chained) key. */
static inline uint64_t kvti_page_seed(kvt_page_key k)
{
	return k.lo ^ (k.hi * 0x9e3779b97f4a7c15ull);
}
/* Write layer @l of the page with seed @seed into @block, as the GPU's
 * prefill writes it computing the layer: the words the engine checks
 * (bytes.c says why not all). */
void kvti_dmem_write_layer(const struct dmem *m, uint32_t block, uint32_t l,
			   uint64_t seed);
/* Sample every chunk of @block against @seed: 0 good, 1 wrong bytes. */
int kvti_dmem_check(const struct dmem *m, uint32_t block, uint64_t seed);
/* Spoil @block as a bad copy would (the engine-memory tamper hook): every
 * word kvti_dmem_check() samples of its first layer's K chunk. */
void kvti_dmem_spoil(const struct dmem *m, uint32_t block);

/* ---- the cache, in process or through the daemon (dplane.c) --------------- */

struct djob {
	kvt_cache_job *j;
	kvt_client_job *c;
};

struct dplane {
	kvt_cache *cache;        /* in process, or: */
	kvt_client *cl;          /* through the daemon */
	kvt_client_mem *cm;
	pid_t dpid;              /* the daemon child, its report pipe */
	int dfd;
	int efd;                 /* in process: done jobs tick it */
	char sock[108];
};

/* Open the cache of @tiers (@c for backing and geometry): in this process
 * (and register @m's memory: opened here over @nblocks) or in a daemon
 * child (and share its memory). @where gets the fabric tier's description. */
int kvti_dplane_open(struct dplane *d, const kvt_demo_config *c,
		     const kvt_cache_config *cc, const kvt_geom *g,
		     uint64_t nblocks, struct dmem *m, char *where,
		     size_t wlen);
/* Wait for everything, verify every copy, take the counters, close. */
void kvti_dplane_finish(struct dplane *d, kvt_demo_pass *out);
void kvti_dplane_close(struct dplane *d);
/* An fd that becomes readable when a job is done (in process: ours). */
int kvti_dplane_fd(const struct dplane *d);
void kvti_dplane_drain_fd(const struct dplane *d);

int kvti_dp_hash(struct dplane *d, const uint32_t *tok, size_t n,
		 kvt_page_key *keys);
int kvti_dp_lookup(struct dplane *d, const kvt_page_key *keys, size_t n,
		   unsigned flags, kvt_cache_lookup_result *r,
		   kvt_cache_run *runs, size_t *nruns);
int kvti_dp_job(struct dplane *d, int store, const kvt_page_key *keys,
		size_t n, size_t first, const uint32_t *blocks,
		struct djob **out);
int kvti_dp_rates(struct dplane *d,
		  kvt_xfer_rate rates[KVT_TIER_COUNT][KVT_TIER_COUNT]);
void kvti_dp_quiesce(struct dplane *d);

int kvti_dj_wait(struct djob *j, int64_t timeout_ns);
int kvti_dj_wait_layer(struct djob *j, uint32_t l, int64_t timeout_ns);
uint64_t kvti_dj_layer_ns(struct djob *j, uint32_t l);
int kvti_dj_poll(struct djob *j);
long kvti_dj_failed(struct djob *j, uint32_t *blocks, size_t max);
void kvti_dj_stat(struct djob *j, kvt_cache_job_stat *st);
void kvti_dj_free(struct djob *j);

/* Overwrite every ssd file under @dir past its header, reached through
 * the descriptors of the process that holds @d's cache (the tamper hook):
 * how many, or a negative error. */
int kvti_demo_tamper(const struct dplane *d, const char *dir);

/* ---- policies ------------------------------------------------------------- */

struct kvti_demo_policy {
	unsigned bit;
	const char *name;
	kvt_sched_policy preset;
	uint32_t add, remove;    /* features on top of the preset */
	int sync_store;          /* the step waits for its stores */
	int wait_loads;          /* join only once the loads are home */
	uint32_t store_align;    /* stores whole chunks of this many tokens */
	const char *what;        /* one line for people */
};

const struct kvti_demo_policy *kvti_demo_policy_of(unsigned bit);
/* The index of the @j-th of @n policies to run in group @row of passes
 * (group: repeat + rate index): a balanced Latin square, so over the
 * repeats every policy runs in every position (demo.c says how). */
uint32_t kvti_demo_order(uint32_t n, uint32_t row, uint32_t j);
/* The scheduler's configuration of @p with features @off switched off. */
void kvti_demo_sched(const struct kvti_demo_policy *p, uint32_t off,
		     uint32_t budget, kvt_sched_config *out);

/* ---- one pass (serve.c) ----------------------------------------------------- */

struct kvti_demo_pass_cfg {
	const kvt_demo_config *c;
	const struct kvti_demo_policy *pol;
	uint32_t off;            /* ablation: features switched off */
	double rate;
	uint32_t sessions;       /* kvt_demo_sessions_at(c, rate) */
	const kvt_geom *g;
	const kvt_hw *hw;
	const char *dir;         /* the ssd directory of this pass */
	int tamper;              /* this pass gets the tamper hook */
	size_t pass, passes;     /* for progress */
};

/* Run one pass into @out (reqs allocated here): 0, or the first error
 * (out->err / out->error say what failed; what ran is in @out). */
int kvti_demo_pass(const struct kvti_demo_pass_cfg *pc, kvt_demo_pass *out);

/* The workload's simulator configuration (demo.c). */
int kvti_demo_wl_config(const kvt_demo_config *c, double rate,
			kvt_sim_config *s);

#endif
