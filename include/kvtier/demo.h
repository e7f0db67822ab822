/*
 * kvtier/demo.h — the main job: a serving engine over the real cache, with
 * kvtier's scheduler and faithful baselines, measured end to end. Included
 * by <kvtier.h>; run by `kvtier demo`.
 *
 * THE WORKLOAD. Agent sessions arrive as a Poisson process (@rate sessions
 * per second). Each runs a cold turn and warm turns over one growing
 * context: every turn appends new tokens (tool output, user input) to the
 * previous prompt and answer, and between turns the session idles for its
 * tool call — an exponential think time whose mean is drawn per session
 * (log-normal around @think_s) — while the others run, so its KV is pushed
 * down fabric -> dram -> ssd and must come back. Every session opens with
 * one shared system prompt. Many requests wait, load, prefill and decode at
 * once. (The workload is the simulator's agentic one, src/sim/workload.c,
 * with the same seed: `kvtier sim` runs exactly these requests.)
 *
 *   turn k of session s:   prompt = system + context + k * (turn + answer)
 *
 * THE ENGINE is the serving step loop of src/engine/ — the same one the
 * simulator runs on its virtual clock — on the wall clock over the real
 * cache (src/demo/serve.c):
 *
 *   step:  kvt_sched_plan_step() over the running prefills and the first
 *          64 waiting requests, each seen from the live cache (tier runs of
 *          its prefix: kvt_cache_lookup_runs(); its own loads in flight;
 *          pages another running request is computing right now), the
 *          transfer engine's measured rates per tier (kvt_cache_rates()),
 *          a token budget (8192) with chunked prefill, a decode batch, the
 *          engine's block pool (admission; preemption of the newest request
 *          when decodes run out of blocks);
 *          loads start (kvt_cache_load(): real copies into the engine's
 *          blocks, verified layer by layer);
 *          the step's GPU time comes from the cost model on the hardware
 *          profile (@hardware: an H200 by default) and is SPENT IN REAL
 *          TIME, layer by layer, while the emulated GPU writes each layer of
 *          the KV it computes into the blocks; a layer-wise policy waits for
 *          layer l of its loads before layer l (kvt_cache_job_wait_layer),
 *          the others for the whole load before layer 0;
 *          computed pages are stored (kvt_cache_store(); waited for inside
 *          the step by a synchronous-save policy); decode tokens are
 *          produced one per step and timed.
 *
 * The engine's KV memory is host memory in vLLM's layout, per layer
 * [2][nblocks][P][H][D] (EMULATED hbm), registered once; it keeps no
 * prefix cache of its own: what a request does not load or compute itself
 * is not in hbm for it. With @daemon each policy's cache runs in a node
 * daemon (kvtierd) child process and every call goes through the client
 * library and the socket.
 *
 * POLICIES (docs/PERFORMANCE.md gives the source of each), on tiers of the
 * same sizes and backings, run one after another, in an order that changes
 * with each rate and each repeat (a balanced Latin square: over the repeats
 * every policy runs in every position):
 *
 *   lmcache            LMCache's vLLM v1 connector: the hit, whole 256-token
 *                      chunks only, retrieved before the forward pass that
 *                      uses it (the step waits for it: a blocking retrieve),
 *                      then prefill; the step's computed chunks saved before
 *                      the step ends (wait_for_save); FCFS
 *   lmcache-layerwise  the same with use_layerwise: layer l retrieved while
 *                      layer l-1 computes
 *   vllm               vLLM's offloading connector: loads start when a
 *                      request is first scheduled and run asynchronously; the
 *                      request waits (WAITING_FOR_REMOTE_KVS, not blocking
 *                      the queue) and joins a step once they are home; saves
 *                      asynchronous; FCFS
 *   kvtier             kvtier's scheduler, every policy on: layer-wise
 *                      overlap, prefetch, delay-hit, balanced batches, stall
 *                      hiding, starvation bound, load-or-recompute by
 *                      measured cost
 *
 * Every cache demotes in the background (LMCache writes its disk backend
 * asynchronously too).
 *
 * WHAT IS MEASURED: every TTFT (arrival to first token, wall clock), every
 * decode token, every load, store and demotion and its bytes, throughput
 * (prompt + output tokens over first arrival to last token), the tokens
 * each request loaded from each tier and recomputed; a checksum (XXH3-64
 * per page and layer) verified on every restore and demotion and, at the
 * end, on every page copy in every tier; the engine samples every restored
 * block against the bytes it computed. WHAT IS MODELED: how long the GPU
 * takes for each step (spent in real time; steps that the CPU's emulation
 * of the GPU writes made longer are counted as overruns).
 */
#ifndef KVTIER_DEMO_H
#define KVTIER_DEMO_H

#include <kvtier.h>
#include <kvtier/cache.h>
#include <kvtier/sim.h>

#include <signal.h>

#ifdef __cplusplus
extern "C" {
#endif

#define KVT_DEMO_MAX_TURNS 64
#define KVT_DEMO_MAX_SESSIONS 1024
#define KVT_DEMO_MAX_RATES 16
#define KVT_DEMO_MAX_TARGETS 8

enum kvt_demo_policy {
	KVT_DEMO_LMCACHE = 1u << 0,
	KVT_DEMO_LMCACHE_LW = 1u << 1,
	KVT_DEMO_VLLM = 1u << 2,
	KVT_DEMO_KVTIER = 1u << 3,
	KVT_DEMO_ALL = (1u << 4) - 1,
};

/** "lmcache", "lmcache-layerwise", "vllm", "kvtier" for one bit; NULL. */
KVT_API const char *kvt_demo_policy_name(unsigned bit);
/** A list such as "lmcache,kvtier" or "all" into bits: 0 or -EINVAL. */
KVT_API int kvt_demo_policy_parse(const char *s, unsigned *bits);

typedef struct kvt_demo_req kvt_demo_req;
typedef struct kvt_demo_result kvt_demo_result;

/** Progress: called from the engine thread about every 0.2 s and after
 *  each pass: the pass's label, requests done of total, passes done of
 *  total. */
typedef void (*kvt_demo_progress_fn)(void *arg, const char *label,
				     size_t done, size_t total,
				     size_t pass, size_t passes);

/** After each pass: called on kvt_demo_run()'s thread with the result so
 *  far (@r: every pass finished, r->seconds and r->loadavg_end as of now,
 *  r->error the first failure so far; read it, keep nothing), @err the
 *  run's first error so far, @done passes finished of @total planned.
 *  Also once before the first pass (@done 0). A run stopped by a failure
 *  ends with @done < @total. */
typedef void (*kvt_demo_pass_fn)(void *arg, const kvt_demo_result *r,
				 int err, size_t done, size_t total);

/**
 * struct kvt_demo_config - fill with kvt_demo_config_init(), change what
 * you like, then kvt_demo_size() fills the sizes left at 0.
 */
typedef struct kvt_demo_config {
	char model[KVT_NAME_MAX];  /* geometry preset (llama-3.2-1b) */
	uint32_t page_tokens;      /* 16 */
	uint32_t sessions;         /* 8 */
	uint32_t turns;            /* 4: one cold, three warm */
	uint32_t system_tokens;    /* shared system prompt (2048) */
	uint32_t context_tokens;   /* a session's own context at turn 0 (4096) */
	uint32_t turn_tokens;      /* new tokens per turn (1024) */
	uint32_t output_tokens;    /* answer tokens per turn (64) */
	double rate;               /* sessions arriving per second (2) */
	double think_s;            /* median of the sessions' mean think
				      times (1.5 s) */
	double think_sigma;        /* log-sd of those means (0.5) */
	char hardware[KVT_NAME_MAX]; /* GPU profile for the modeled compute */
	unsigned policies;         /* enum kvt_demo_policy bits (all) */
	uint32_t token_budget;     /* tokens per step (8192) */
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
	int daemon;                /* 1: each policy's cache in a kvtierd child
				      process, reached through the client */
	unsigned stress;           /* memory stressor threads during the runs */
	uint64_t stress_bytes;     /* each stressor's two buffers (256 MiB) */
	uint64_t seed;             /* (1) */
	/* the sweep: these session rates (nrates > 0), every policy at
	 * each, for the throughput each reaches at equal TTFT targets. The
	 * sessions arrive over the same window at every rate (@sessions /
	 * @rate seconds), so the offered load grows with the rate: at rate r,
	 * kvt_demo_sessions_at(c, r) sessions. */
	double rates[KVT_DEMO_MAX_RATES];
	uint32_t nrates;
	double targets_ms[KVT_DEMO_MAX_TARGETS]; /* p90 TTFT targets; 0 of
				      them: chosen from the curves */
	uint32_t ntargets;
	int ablation;              /* also kvtier with each of its policies
				      switched off alone, at @rate */
	uint32_t repeat;           /* runs of each (policy, rate) (1) */
	char predict[KVT_PATH_MAX]; /* a hardware profile of this machine
				      (scripts/demo-profile): every pass is
				      also simulated (kvt_sim_run() of
				      kvt_demo_sim_config()), predicted next
				      to measured; "": not */
	kvt_demo_progress_fn progress;
	void *progress_arg;
	kvt_demo_pass_fn pass_done; /* NULL: none */
	void *pass_arg;
	/* set non-zero (a signal handler may): the pass running ends at its
	 * next loop turn with -EINTR ("interrupted"), its tiers are closed
	 * and its temporary files removed as after any failure, and no pass
	 * follows. NULL: none */
	const volatile sig_atomic_t *stop;
	/* fault injection for tests (`kvtier demo` reads KVT_DEMO_TAMPER):
	 * after this many requests of the first pass, overwrite its ssd
	 * files past their 4 KiB header (at most 64 MiB) with a constant
	 * byte, as a careless operator might. 0: never. */
	uint64_t tamper_after;
	/* fault injection for tests (KVT_DEMO_TAMPER_ENGINE): after this
	 * many requests of the first pass, the next block a load lands in
	 * engine memory is spoiled there before the engine's deferred check
	 * reads it — the cache's copies were right, only that check can
	 * catch it, and the pass fails (KVT_ECORRUPT). 0: never. */
	uint64_t tamper_engine_after;
} kvt_demo_config;

KVT_API void kvt_demo_config_init(kvt_demo_config *c);

/**
 * kvt_demo_size() - check the configuration and fill the sizes left at 0
 * from the workload and the machine, per policy (one policy's tiers are
 * open at a time): engine memory for about four of the largest requests,
 * fabric and dram three sessions' contexts each, ssd every session and a
 * quarter more; the memory stays under a third of what is available.
 * Returns 0, -EINVAL naming a bad field (zero counts, too many turns,
 * contexts over 2^31 tokens, engine memory under one request, rates not
 * positive and increasing), KVT_EPRESET, KVT_ECONFIG (hardware profile),
 * -ENOMEM when the machine cannot hold even a reduced set of tiers,
 * -ENOSPC when the ssd directory's file system lacks room.
 */
KVT_API int kvt_demo_size(kvt_demo_config *c);

/** Sessions at rate @rate: @c->sessions at @c->rate, and as many more or
 *  fewer as arrive in the same window at another rate (at least one). */
KVT_API uint32_t kvt_demo_sessions_at(const kvt_demo_config *c, double rate);

/** The simulator configuration of this workload (the same requests, the
 *  same engine and policy: kvt_sim_run() predicts a pass), for policy bit
 *  @policy at session rate @rate, with the profile @hw (this machine's,
 *  for the tiers). 0 or the errors of the profile and preset. */
KVT_API int kvt_demo_sim_config(const kvt_demo_config *c, unsigned policy,
				double rate, const kvt_hw *hw,
				kvt_sim_config *out);

/** One request. Times are measured wall-clock seconds from the pass's
 *  start unless they say modeled. */
struct kvt_demo_req {
	uint32_t session, turn;
	uint32_t prompt_tokens, output_tokens;
	double arrival, start, first_token, finish;
	double loads_home;         /* its last load job done (0: none) */
	double ttft_s;             /* first_token - arrival */
	double tpot_s;             /* (finish - first_token) / (output - 1) */
	uint32_t loaded_tokens[KVT_TIER_COUNT];     /* cached prefix loaded */
	uint32_t recomputed_tokens[KVT_TIER_COUNT]; /* cached, computed */
	uint32_t computed_tokens;  /* prompt tokens prefilled */
	uint64_t failed_pages;     /* loaded blocks on a failed list */
	uint64_t failed_busy;      /* of them, being stored or moved when
				      the load began (kvt_cache_job_stat) */
	uint64_t failed_absent;    /* of them, no copy when it began */
	uint64_t engine_checked;   /* loaded blocks the engine sampled */
	uint64_t engine_bad;       /* of them, wrong bytes */
	uint32_t preempted;
	int done;
};

/** Measured statistics of one pass (milliseconds where it says _ms). */
typedef struct kvt_demo_stat {
	kvt_dist ttft_ms;          /* every request */
	kvt_dist warm_ttft_ms;     /* turns after the first */
	kvt_dist tpot_ms;
	double tokens_per_s;       /* (prompt + output) / (first arrival ->
				      last token) */
	double output_per_s;
	double makespan_s;
	uint64_t prompt_tokens, output_tokens, computed_tokens;
	uint64_t loaded_tokens[KVT_TIER_COUNT];
	uint64_t recomputed_tokens[KVT_TIER_COUNT];
	uint64_t steps, decode_only_steps, deferred, preemptions;
	double gpu_busy;           /* modeled GPU time / makespan */
	double gpu_overrun_s;      /* steps longer than modeled: the CPU's
				      emulation of the GPU's writes */
	double load_wait_s;        /* steps waiting for loads, in all */
	double plan_ms_mean;       /* the engine's own time planning a step
				      (after a step: finishing it too; at an
				      idle engine: the arrivals that woke
				      it), views, lookups, submissions, mean */
	double host_us_per_step;   /* the engine's own host time per step
				      beyond the modeled GPU time and the
				      loads it waited for: its work between
				      steps, the clock's late wake-ups (the
				      profile's engine.host_us) */
	double host_us_prefill_step; /* the same, over the steps with
				      prefills (the ones a TTFT waits for:
				      sixteen layers' wake-ups and page
				      writes, copies in flight beside them;
				      engine.host_prefill_us) */
	double host_us_decode_step; /* over the decode-only steps */
	double load_stretch;       /* the loads' submit-to-done time over
				      their bytes at the transfer engine's
				      measured rates of the moment: the time
				      a load waits behind other jobs and for
				      a core, beyond its copy (1: none) */
	uint64_t store_skipped_pages; /* pages a store found no room for (or
				      whose parent had gone): not cached */
	double load_gbps[KVT_TIER_COUNT]; /* measured rate into engine memory
				      at the end (kvt_cache_rates()) */
	double load_gbps_mean[KVT_TIER_COUNT]; /* the same rate's mean over
				      the pass (time-weighted, from the first
				      measurement on; 0: none) */
	double load_job_kib[KVT_TIER_COUNT]; /* the mean size of the
				      transfer jobs behind that rate (its
				      bytes over its jobs; 0: none) */
} kvt_demo_stat;

typedef struct kvt_demo_pass {
	char policy[24];           /* "kvtier", ... */
	char variant[32];          /* ablation: "-delay-hit"; "" otherwise */
	double rate;               /* sessions per second */
	uint32_t sessions;         /* sessions of this pass */
	uint32_t repeat;           /* which run of (policy, rate) */
	uint32_t order;            /* position in its group (0 first) */
	char tiers[512];           /* the tier spec used */
	char fabric_where[KVT_PATH_MAX];
	kvt_demo_req *reqs;        /* sessions * turns, session-major */
	size_t nreqs, done;
	kvt_demo_stat st;
	kvt_cache_stat cache;      /* taken at the end, even after a failure */
	kvt_index_stat index;
	kvt_cache_check check;     /* every copy re-read at the end */
	int check_err;             /* kvt_cache_verify()'s answer; 1: not run */
	uint64_t nblocks;          /* engine blocks */
	double setup_s;            /* opening the tiers, faulting them in */
	double seconds;            /* wall time of its requests */
	double loadavg;            /* 1-minute load average when it ended */
	double stress_gbps;
	int err;                   /* its first failure (0: none) */
	char error[256];
	/* with config.predict: what the simulator predicted for this pass */
	int predicted;             /* 1: the fields below are set */
	kvt_dist pred_ttft_ms, pred_tpot_ms;
	double pred_tokens_per_s;
	uint64_t pred_recomputed, pred_loaded;
	/* the same prediction on the data plane this pass measured: the
	 * profile's CPU-copy rates scaled to the pass's mean fabric/dram load
	 * rate, its ssd rates to its ssd load rate, and engine.host_us / engine.host_prefill_us its host time per
	 * decode-only / prefill step (the environment measured, not fitted:
	 * what the model predicts when it knows the machine's load of the
	 * moment) */
	int predicted_env;         /* 1: set */
	kvt_dist penv_ttft_ms;
	double penv_tokens_per_s;
	double penv_cpu_f, penv_ssd_f; /* the factors applied */
} kvt_demo_pass;

struct kvt_demo_result {
	kvt_demo_config config;    /* as run (sizes filled) */
	kvt_geom geom;
	char gpu_name[KVT_NAME_MAX];
	int npasses;
	kvt_demo_pass *pass;       /* in the order they ran */
	char error[256];           /* the first failure, "" if none */
	double seconds;
	double loadavg_start, loadavg_end;
};

/**
 * kvt_demo_run() - every pass the configuration asks for: each policy at
 * @rate (or, with a sweep, at each rate), @repeat times, then the
 * ablation. Returns 0 and *@out (free with kvt_demo_result_free()) when
 * every request ran, every load and store succeeded and every checksum
 * matched. After a failure it still returns what ran with the error:
 * KVT_ECORRUPT when a page failed verification, -EIO/-ENOSPC/... for an
 * I/O error, the errors of the cache calls otherwise.
 */
KVT_API int kvt_demo_run(const kvt_demo_config *c, kvt_demo_result **out);
KVT_API void kvt_demo_result_free(kvt_demo_result *r);

/**
 * kvt_demo_throughput_at() - along @r's passes of @policy (no variant,
 * repeat @repeat), by increasing rate: the throughput reached at p90 TTFT
 * @target_ms, interpolated (kvt_curve_throughput_at()). 0, 1 (every rate
 * met it: a lower bound), -ERANGE (none did), -ENOENT (no such passes).
 */
KVT_API int kvt_demo_throughput_at(const kvt_demo_result *r,
				   const char *policy, uint32_t repeat,
				   double target_ms, double *thr);

/** The 1-minute load average (/proc/loadavg; 0 if unreadable): every
 *  figure the demo prints comes with it. */
KVT_API double kvt_demo_loadavg(void);

#ifdef __cplusplus
}
#endif

#endif /* KVTIER_DEMO_H */
