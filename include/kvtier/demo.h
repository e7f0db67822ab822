/*
 * kvtier/demo.h — the end-to-end demo: an agentic workload through the real
 * cache on any machine. Included by <kvtier.h>; run by `kvtier demo`.
 *
 * N sessions (agents) each run one cold turn and then warm turns. Every
 * turn appends new tokens (tool output, user input) to the session's
 * growing context, computes the answer, and appends that too; between turns
 * the session idles (a tool call) while the other sessions run, so its KV
 * is pushed down the tiers and must come back for the next turn.
 *
 *   turn k of session s:   prompt = context(k-1) + answer(k-1) + new tokens
 *
 *     lookup   kvt_index_match        which pages are where        REAL
 *     restore  kvt_cache_acquire      loads from fabric/dram/ssd,  REAL,
 *                                     evictions + demotions,       measured
 *                                     checksums verified
 *     prefill  the uncached tokens    kvt_cost_prefill_s() on the  MODELED
 *                                     GPU profile (H200)
 *     compute  the new pages' bytes   generated and put into hbm   REAL bytes
 *     decode   the answer             kvt_cost_step_s() per token  MODELED
 *
 * Every session shares one system prompt (a common prefix the radix index
 * stores once). Page contents are a deterministic function of the prefix,
 * so identical prefixes hold identical bytes.
 *
 * The workload runs once per policy, each on fresh tiers of the same sizes
 * and backings (hbm, fabric, dram, ssd), so the passes differ in policy
 * alone:
 *
 *   lmcache   as an LMCache-style connector: every computed page is written
 *             through to the tier below at once, and TTFT = restore the
 *             whole prefix, then prefill
 *   kvtier    write-back (pages move down only when evicted), and TTFT =
 *             the layer-wise overlap of restore and prefill
 *             (kvt_cost_overlap_s())
 *
 * Both TTFTs are measured restore time combined with modeled compute;
 * neither includes the demotion copies that made room (shown apart).
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

/** Called after every request (from the thread running the demo). */
typedef void (*kvt_demo_progress_fn)(void *arg, const char *policy,
				     size_t done, size_t total);

/**
 * struct kvt_demo_config - fill with kvt_demo_config_init(), change what
 * you like, then kvt_demo_size() fills the tier sizes left at 0.
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
	/* tiers: sizes in bytes; 0 = sized by kvt_demo_size() */
	uint64_t hbm_bytes, fabric_bytes, dram_bytes, ssd_bytes;
	char dir[KVT_PATH_MAX];    /* ssd directory (a fresh temp dir if "") */
	int gpu;                   /* 1: a real hbm pool (CUDA GPU), set by
				      kvt_demo_size() when one is present */
	unsigned stress;           /* memory stressor threads during the runs */
	uint64_t stress_bytes;     /* each stressor's two buffers (256 MiB) */
	uint64_t seed;
	kvt_demo_progress_fn progress;
	void *progress_arg;
} kvt_demo_config;

KVT_API void kvt_demo_config_init(kvt_demo_config *c);

/**
 * kvt_demo_size() - check the configuration and size the tiers left at 0
 * from the workload and the machine, per policy: hbm holds about 1.5
 * sessions' context, fabric and dram three sessions each, ssd every session
 * and a quarter more; the memory tiers of both policies together stay under
 * a third of the memory available now. Returns 0, -EINVAL naming a bad field (zero counts, too many turns,
 * contexts over 2^31 tokens), KVT_EPRESET, KVT_ECONFIG (hardware profile),
 * -ENOMEM when the machine cannot hold even a reduced set of tiers.
 */
KVT_API int kvt_demo_size(kvt_demo_config *c);

/** One request: session @session's turn @turn, in one pass. */
typedef struct kvt_demo_req {
	uint32_t session, turn;
	uint32_t prompt_tokens;
	uint32_t hit_tokens[KVT_TIER_COUNT]; /* cached prefix, by the tier it
						was found in (hbm: in place) */
	uint32_t transient_tokens; /* found in flight (0 here: one engine) */
	uint32_t computed_tokens;  /* prompt tokens prefilled */
	uint64_t restore_bytes;
	uint64_t verified_pages;   /* loaded pages whose checksum matched */
	double restore_s;          /* measured: loads into hbm */
	double evict_s;            /* measured: demotions that made room */
	double prefill_s;          /* modeled */
	double decode_s;           /* modeled: the whole answer */
	double ttft_s;             /* the policy's TTFT */
	uint64_t evicted, demoted; /* pages that left / moved down a tier */
} kvt_demo_req;

typedef struct kvt_demo_pass {
	char policy[16];
	char tiers[512];           /* the tier spec used (the result's) */
	kvt_demo_req *reqs;        /* sessions * turns, turn-major */
	size_t nreqs;
	kvt_cache_stat cache;
	kvt_index_stat index;
	kvt_cache_check check;     /* every copy re-read at the end */
	double stress_gbps;        /* stressors' copy rate during the pass */
	double seconds;            /* wall time of the pass */
} kvt_demo_pass;

typedef struct kvt_demo_result {
	kvt_demo_config config;    /* as run (sizes filled) */
	kvt_geom geom;
	char gpu_name[KVT_NAME_MAX];
	char tiers[512];           /* the tier spec of both passes */
	double setup_s;            /* opening the tiers, faulting them in */
	int npasses;
	kvt_demo_pass pass[2];
	double seconds;
} kvt_demo_result;

/**
 * kvt_demo_run() - run the workload once per policy. Returns 0 and *@out
 * (free with kvt_demo_result_free()) when every request ran and every
 * checksum matched; KVT_ECORRUPT if any page failed verification (the
 * result is still returned, to show it); the errors of the cache, the
 * index and the transfer engine otherwise. The ssd directory is created
 * and removed again.
 */
KVT_API int kvt_demo_run(const kvt_demo_config *c, kvt_demo_result **out);
KVT_API void kvt_demo_result_free(kvt_demo_result *r);

#ifdef __cplusplus
}
#endif

#endif /* KVTIER_DEMO_H */
