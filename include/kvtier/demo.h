/*
 * kvtier/demo.h — the end-to-end demo: an agentic workload through the real
 * cache, with the demo acting as the inference engine. Included by
 * <kvtier.h>; run by `kvtier demo`.
 *
 * N sessions (agents) each run one cold turn and then warm turns. Every
 * turn appends new tokens (tool output, user input) to the session's
 * growing context, computes the answer, and appends that too; between turns
 * the session idles (a tool call) while the other sessions run, so its KV
 * is pushed down the tiers and must come back for its next turn.
 *
 *   turn k of session s:   prompt = context(k-1) + answer(k-1) + new tokens
 *
 * THE ENGINE. The demo owns its KV memory the way vLLM does: per layer one
 * buffer [2][nblocks][P][H][D] (K/V outer), registered once with
 * kvt_cache_register(), and its own block ids (a free list). It keeps no
 * prefix cache of its own between requests: a warm turn gets its cached
 * prefix back from kvtier's tiers (fabric, dram, ssd) and computes the
 * rest. The memory is host memory (EMULATED hbm; no GPU memory in this
 * version, see the README).
 *
 * ONE REQUEST, all of it on the wall clock, from its arrival (the moment
 * the demo starts handling it):
 *
 *   hash its tokens, kvt_cache_lookup()                     lookup
 *   pages still being stored by its own earlier requests:
 *   wait for those stores (pages that background demotion
 *   is moving at that instant are computed instead)         block wait
 *   take blocks from the free list; when there are too few,
 *   wait for earlier requests' store jobs to free theirs     block wait
 *   kvt_cache_load(cached pages -> blocks)                  restore (async)
 *     (a page evicted or moving when the load starts fails
 *      alone and is recomputed: kvtier after the last layer, redo
 *      lmcache within its prefill)
 *   for layer l = 0 .. L-1:                                  the compute thread
 *       wait until layer l is ready                          load wait
 *         (kvtier: kvt_cache_job_wait_layer(l);
 *          lmcache: kvt_cache_job_wait() before layer 0)
 *       spend layer l's modeled prefill time IN REAL TIME,   prefill
 *       writing layer l of the computed pages into the blocks
 *   kvt_cache_store(computed pages)                          save
 *       (lmcache: and wait for it, as LMCache's wait_for_save)
 *   = TTFT
 *
 * Layer l's modeled time is kvt_cost_prefill_s() of the computed tokens
 * after the cached ones, on the hardware profile's GPU, divided by L;
 * the compute thread sleeps through it (spinning the last 50 us) and the
 * time it actually took is what counts. Then the answer is decoded (modeled
 * only: kvt_cost_step_s() per token, never slept), its pages are written
 * into the blocks and stored too. The blocks go back to the free list when
 * every job on them is done.
 *
 * POLICIES, each on tiers of its own of the same sizes and backings:
 *
 *   lmcache   write-through (every stored page is copied to the tier below
 *             at once), the whole prefix restored before the prefill, and a
 *             synchronous save inside TTFT
 *   kvtier    write-back with background demotion, layer-wise overlap of
 *             restore and prefill, asynchronous save (its blocks are held
 *             until the store is done; a later request that runs out of
 *             blocks waits for it, and that wait is in its TTFT)
 *
 * Both have the cache's background demotion (LMCache writes to its disk
 * backend asynchronously too). The turns run policy by policy: turn k of
 * every session under one policy, then under the other, alternating which
 * goes first; the policy that is about to run never shares the machine
 * with the other's leftover work (it is waited for first, and that drain is
 * counted apart, in no TTFT). A request is paired with the same session's
 * same turn under the other policy.
 *
 * Every session shares one system prompt. A page's bytes are a
 * deterministic function of its prefix, so identical prefixes hold
 * identical bytes and every restored block can be checked by the engine
 * too (a sample of every chunk), beside the cache's own per-layer sums.
 */
#ifndef KVTIER_DEMO_H
#define KVTIER_DEMO_H

#include <kvtier.h>
#include <kvtier/cache.h>

#ifdef __cplusplus
extern "C" {
#endif

#define KVT_DEMO_MAX_TURNS 64
#define KVT_DEMO_MAX_SESSIONS 1024

enum kvt_demo_policy {
	KVT_DEMO_LMCACHE = 1u << 0,
	KVT_DEMO_KVTIER = 1u << 1,
};

typedef struct kvt_demo_req kvt_demo_req;

/** Called after every request (from the thread running the demo). */
typedef void (*kvt_demo_progress_fn)(void *arg, const char *policy,
				     size_t done, size_t total);

/**
 * kvt_demo_layers_fn - the per-layer timeline of one request, after it
 * ended (outside its measured time): for layer l, @ready[l] is when the
 * compute thread had layer l's data (its wait ended), @end[l] when layer l's
 * prefill ended, @model[l] the modeled seconds it was to spend; times in
 * seconds from the request's arrival. For tests and tracing.
 */
typedef void (*kvt_demo_layers_fn)(void *arg, const char *policy,
				   const kvt_demo_req *r, uint32_t nlayers,
				   const double *ready, const double *end,
				   const double *model);

/**
 * struct kvt_demo_config - fill with kvt_demo_config_init(), change what
 * you like, then kvt_demo_size() fills the sizes left at 0.
 */
typedef struct kvt_demo_config {
	char model[KVT_NAME_MAX];  /* geometry preset (llama-3.2-1b) */
	uint32_t page_tokens;      /* 16 */
	uint32_t sessions;         /* 10 */
	uint32_t turns;            /* 6: one cold, five warm */
	uint32_t system_tokens;    /* shared system prompt (2048) */
	uint32_t context_tokens;   /* a session's own context at turn 0 (4096) */
	uint32_t turn_tokens;      /* new tokens per turn: tool output, user (1024) */
	uint32_t output_tokens;    /* answer tokens per turn (256) */
	char hardware[KVT_NAME_MAX]; /* GPU profile for the modeled compute */
	unsigned policies;         /* enum kvt_demo_policy bits (both) */
	unsigned background;       /* policies whose cache demotes in the
				      background (both); the others evict
				      synchronously in their stores
				      (KVT_CACHE_NO_BACKGROUND) */
	/* sizes in bytes; 0 = sized by kvt_demo_size(). hbm_bytes is the
	 * engine's own KV memory (its blocks), the rest kvtier's tiers. */
	uint64_t hbm_bytes, fabric_bytes, dram_bytes, ssd_bytes;
	char fabric[KVT_PATH_MAX]; /* the fabric tier's backing, a tier-spec
				      option: "memfd" (default, EMULATED),
				      "numa=N" (a CPU-less NUMA node: CXL
				      onlined as memory), "/dev/daxX.Y" (a
				      devdax device), "file=PATH". A devdax
				      device has one owner: run one policy */
	char dir[KVT_PATH_MAX];    /* ssd directory (a fresh temp dir if "") */
	int gpu;                   /* 1: engine memory on a CUDA GPU; always 0
				      in this version (host memory) */
	int daemon;                /* 1: each policy's cache runs in a node
				      daemon child process (kvtierd) and the
				      engine reaches it through the client
				      library, its KV memory shared as a
				      memfd; 0: in this process */
	unsigned stress;           /* memory stressor threads during the runs */
	uint64_t stress_bytes;     /* each stressor's two buffers (256 MiB) */
	uint64_t seed;
	kvt_demo_progress_fn progress;
	void *progress_arg;
	kvt_demo_layers_fn layers; /* NULL: no per-layer timeline */
	void *layers_arg;
	/* fault injection for tests (`kvtier demo` reads KVT_DEMO_TAMPER):
	 * after this many requests, overwrite every ssd file of both policies
	 * past its 4 KiB header (at most 64 MiB of it) with a constant byte,
	 * as a careless operator might. 0: never. */
	uint64_t tamper_after;
} kvt_demo_config;

KVT_API void kvt_demo_config_init(kvt_demo_config *c);

/**
 * kvt_demo_size() - check the configuration and fill the sizes left at 0
 * from the workload and the machine, per policy: engine memory about 1.5
 * sessions' context (one running request and most of the previous one's
 * blocks, held until its store is done), fabric and dram three sessions
 * each, ssd every session and a quarter more; the memory of both policies
 * together stays under a third of the memory available now. Returns 0,
 * -EINVAL naming a bad field (zero counts, too many turns, contexts over
 * 2^31 tokens, engine memory under one session), KVT_EPRESET, KVT_ECONFIG
 * (hardware profile), -ENOMEM when the machine cannot hold even a reduced
 * set of tiers, -ENOSPC when the ssd directory's file system lacks room.
 */
KVT_API int kvt_demo_size(kvt_demo_config *c);

/** One request: session @session's turn @turn under one policy. Times are
 *  measured wall-clock seconds unless they say modeled. */
struct kvt_demo_req {
	uint32_t session, turn;
	uint32_t prompt_tokens;
	uint32_t hit_tokens[KVT_TIER_COUNT]; /* cached prefix loaded, by the
						tier it came from */
	uint32_t computed_tokens;  /* prompt tokens prefilled (misses, the
				      partial last page, failed blocks) */
	uint32_t inflight_pages;   /* lookup: pages still being stored */
	uint64_t restore_bytes;
	uint64_t loaded_pages;     /* pages the load copied */
	uint64_t verified_pages;   /* of them, every layer sum matched */
	uint64_t failed_pages;     /* blocks on the load's failed list */
	uint64_t engine_checked;   /* loaded blocks the engine sampled */
	uint64_t engine_bad;       /* of them, wrong bytes */
	uint64_t stored_pages;     /* pages its store jobs copied */
	int load_err, store_err;   /* the jobs' first error (0: none) */
	/* the TTFT and what it is made of (they add up to it) */
	double ttft_s;             /* arrival -> first token could go out */
	double lookup_s;           /* hashing, lookup, block ids, submits */
	double block_wait_s;       /* waiting for earlier requests' stores
				      (to free blocks, or to commit this
				      session's pages) */
	double load_wait_s;        /* compute thread stalled on the restore */
	double prefill_s;          /* the layers' compute, as spent */
	double recompute_s;        /* prefilling failed blocks again */
	double save_s;             /* store submitted (lmcache: and done) */
	/* beside it */
	double restore_s;          /* the load job: submit -> done */
	double layer0_s;           /* the load job: submit -> layer 0 ready */
	double ready_s;            /* arrival -> the last layer's data ready */
	double cache_wait_s;       /* the cache's own waits for room in this
				      request's jobs (kvt_cache_job_stat) */
	double prefill_model_s;    /* modeled: the prefill */
	double decode_s;           /* modeled: the whole answer (not slept) */
};

typedef struct kvt_demo_pass {
	char policy[16];
	char tiers[512];           /* the tier spec used */
	char fabric_where[KVT_PATH_MAX]; /* the fabric tier as opened: where
				      it lives, and "EMULATED: why" when it
				      stands in for hardware */
	kvt_demo_req *reqs;        /* sessions * turns, turn-major */
	size_t nreqs, done;        /* requests that ran */
	kvt_cache_stat cache;      /* taken at the end, even after a failure */
	kvt_index_stat index;
	kvt_cache_check check;     /* every copy re-read at the end */
	int check_err;             /* kvt_cache_verify()'s answer; 1: not run */
	uint64_t nblocks;          /* engine blocks */
	double drain_s;            /* waiting for this policy's leftover work
				      before the other ran (in no TTFT) */
	double stress_gbps;        /* stressors' copy rate during the run */
	double seconds;            /* wall time of its requests */
} kvt_demo_pass;

typedef struct kvt_demo_result {
	kvt_demo_config config;    /* as run (sizes filled) */
	kvt_geom geom;
	char gpu_name[KVT_NAME_MAX];
	char tiers[512];           /* the tier spec of both policies */
	double setup_s;            /* opening the tiers, faulting them in */
	int npasses;
	kvt_demo_pass pass[2];     /* lmcache first when both ran */
	char error[256];           /* the first failure, "" if none */
	double seconds;
} kvt_demo_result;

/**
 * kvt_demo_run() - run the workload under every policy asked for. Returns
 * 0 and *@out (free with kvt_demo_result_free()) when every request ran,
 * every load and store succeeded and every checksum matched. On a failure
 * after the first request it still returns the result (what ran, and the
 * counters of each cache taken at the end) with the error: KVT_ECORRUPT
 * when a page failed verification (in a load, a demotion, the engine's
 * check or the final re-read), -EIO/-ENOSPC/... for an I/O error, the
 * errors of the cache calls otherwise. The ssd directory is created and
 * removed again.
 */
KVT_API int kvt_demo_run(const kvt_demo_config *c, kvt_demo_result **out);
KVT_API void kvt_demo_result_free(kvt_demo_result *r);

#ifdef __cplusplus
}
#endif

#endif /* KVTIER_DEMO_H */
