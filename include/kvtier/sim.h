/*
 * kvtier/sim.h — the serving simulator and capacity planner. Included by
 * <kvtier.h>.
 *
 * A deterministic discrete-event model of one serving node on a virtual
 * clock. It drives the same code an engine would — the radix index
 * (kvt_index), the page pools (kvt_pool) and the scheduler (kvt_sched) —
 * and models only what it cannot run here: GPU time (the scheduler's cost
 * model), and bytes on links and memories (a fluid model with contention).
 *
 *                 +----------------- node ------------------+
 *   requests      |  engine 0 (TP GPUs)      engine 1 ...    |
 *   (workload) -->|  queue -> kvt_sched -> step (cost model) |
 *                 |     ^  kvt_index (hbm + offload pools)    |
 *                 |     |  loads / stores = flows            |
 *                 |  +--+-------------------------------+    |
 *                 |  | GPU link x16 (per GPU) -- uplink |    |  fluid network:
 *                 |  |  (shared switch port, optional)  |    |  max-min fair
 *                 |  |         |                        |    |  shares, and a
 *                 |  |     host DRAM  <-- stressors     |    |  loaded-latency
 *                 |  |  fabric link + device (per GPU)  |    |  model for DRAM
 *                 |  |  SSD                             |    |
 *                 |  +----------------------------------+    |
 *                 +------------------------------------------+
 *
 * HARDWARE PROFILES are text files (profiles/NAME.prof): one "key = value"
 * per line, '#' starts the comment that names the number's source. The
 * built-in names (testbed-a, testbed-b, gh200) are looked up in
 * $KVT_PROFILE_DIR, the source tree's profiles/ and the installed
 * share/kvtier/profiles/. Every key is listed in docs/FORMATS.md.
 *
 * MODELS come from the geometry presets (or a config.json) with the TP
 * degree: KV bytes per token and rank, parameters, layers, heads.
 *
 * WORKLOADS (docs/SIMULATOR.md says why each distribution):
 *   agentic      N sessions; a cold turn computes a long context, then warm
 *                turns append tokens and restore the cached prefix from
 *                the offload tier (hbm reuse off by default), with think
 *                time between turns
 *   loogle, narrativeqa, reviewmt   questions over shared long documents,
 *                Poisson arrivals, a controllable cache distance
 *   sharegpt     short independent prompts, Poisson arrivals
 *   trace        replay of a Mooncake-format trace (kvt_trace)
 *
 * DETERMINISM: the same configuration and seed give the same result, bit
 * for bit: the event queue breaks time ties by insertion order and every
 * random draw comes from the run's own generator.
 *
 * THREADS: kvt_sim_run() uses only its own objects; runs in different
 * threads are independent.
 */
#ifndef KVTIER_SIM_H
#define KVTIER_SIM_H

#include <kvtier.h>
#include <kvtier/geom.h>
#include <kvtier/tier.h>
#include <kvtier/sched.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ------------------------------------------------------------------------
 * Hardware profiles
 * ------------------------------------------------------------------------ */

/**
 * struct kvt_hw - one node's hardware, as a profile file describes it.
 * A plain value. Units: bytes, GB/s (1e9 bytes/s), FLOP/s, ns, us. The
 * profile key of each field is given in brackets.
 */
typedef struct kvt_hw {
	char name[KVT_NAME_MAX];     /* [name] */
	char gpu_name[KVT_NAME_MAX]; /* [gpu.name] */
	uint32_t gpus;               /* [gpus] GPUs in the node */

	double gpu_flops;      /* [gpu.flops] dense bf16 FLOP/s */
	double gemm_eff;       /* [gpu.gemm_eff] fraction in prefill GEMMs */
	double attn_eff;       /* [gpu.attn_eff] fraction in prefill attention */
	double hbm_bytes;      /* [gpu.hbm_bytes] HBM capacity */
	double hbm_gbps;       /* [gpu.hbm_gbps] */
	double hbm_eff;        /* [gpu.hbm_eff] fraction streaming weights/KV */
	double mem_util;       /* [gpu.mem_util] share of HBM the engine takes */
	double reserve_bytes;  /* [gpu.reserve_bytes] activations, graphs */
	double step_us;        /* [engine.step_us] fixed cost per step */
	double step_mem_frac;  /* [engine.step_mem_frac] share of step_us that
				* stalls on host DRAM: that part grows with
				* the socket's loaded DRAM latency (0: none) */
	double host_us;        /* [engine.host_us] the engine's own host time
				* per step beyond the GPU's (its scheduler,
				* cache lookups, job polling, the clock's
				* wake-ups), measured on the machine (the
				* demo's); 0: none */
	double host_prefill_us; /* [engine.host_prefill_us] the same, of a
				* step with prefills, where it differs (the
				* demo's emulated GPU: a wake-up per layer,
				* its page writes, the copies in flight
				* beside it); 0: engine.host_us */
	double ar_gbps;        /* [tp.ar_gbps] all-reduce bus bandwidth */
	double ar_us;          /* [tp.ar_us] all-reduce latency */

	double link_gbps;      /* [link.gbps] GPU host link, per direction,
				* contiguous copies (the practical limit) */
	double link_raw_gbps;  /* [link.raw_gbps] its raw rate (reports) */
	double link_latency_ns;/* [link.latency_ns] DMA read round trip
				* without DRAM */
	uint32_t gpus_per_uplink; /* [link.gpus_per_uplink] GPUs behind one
				* switch port to the CPU; 0: none (each GPU
				* has its own path) */
	double uplink_gbps;    /* [link.uplink_gbps] that port, per direction */
	kvt_copy_curve copy[KVT_COPY_COUNT]; /* [copy.<method>] and
				* [copy.<method>_call_us] */

	uint32_t sockets;      /* [host.sockets] GPUs split evenly over them */
	double dram_gbps;      /* [host.dram_gbps] peak per socket */
	double dram_eff;       /* [host.dram_eff] sustainable fraction */
	double dram_latency_ns;/* [host.dram_latency_ns] idle load latency */
	double dram_bytes;     /* [host.dram_bytes] for the dram tier */
	double dma_window;     /* [host.dma_window] DMA bytes in flight, in
				* units of (rate x idle round trip) */
	double stress_gbps;    /* [host.stress_gbps] one stressor thread's
				* copy rate on an idle machine */
	double copy_gbps;      /* [host.copy_gbps] a machine whose every copy
				* is the CPU's (no DMA engine: the demo's
				* host): the CPU's total copy rate, shared by
				* every load, store and demotion; 0: none */

	double fabric_bytes;   /* [fabric.bytes] per GPU; 0: no fabric tier */
	double fabric_link_gbps;   /* [fabric.link_gbps] per GPU */
	double fabric_device_gbps; /* [fabric.device_gbps] per controller */

	double ssd_bytes;      /* [ssd.bytes]; 0: no ssd tier */
	double ssd_read_gbps;  /* [ssd.read_gbps] */
	double ssd_write_gbps; /* [ssd.write_gbps] */

	uint64_t assumed;      /* bit i: key i (kvt_hw_key_name(i)) was read
				* with a source comment starting "assumed" */
} kvt_hw;

/**
 * kvt_hw_load() - read a profile: @name is a file path (it contains '/' or
 * ends in ".prof") or a built-in name searched as described above.
 * Returns 0; -errno for an unreadable file; KVT_ENOTFOUND for an unknown
 * name (detail: the names and where they were looked for); KVT_ECONFIG
 * naming file, line and key for a malformed, unknown, duplicate or missing
 * key or an impossible value. @hw is untouched on failure.
 */
KVT_API int kvt_hw_load(kvt_hw *hw, const char *name);
/** The same from profile text; @label names it in messages. */
KVT_API int kvt_hw_parse(kvt_hw *hw, const char *text, const char *label);
/** The i-th built-in profile name, NULL past the end. */
KVT_API const char *kvt_hw_builtin_name(size_t i);

/** The i-th profile key ("gpu.flops", ...), NULL past the end. */
KVT_API const char *kvt_hw_key_name(size_t i);
/** 1 if key i of @hw came from the file marked as an assumption. */
KVT_API int kvt_hw_key_assumed(const kvt_hw *hw, size_t i);

/**
 * kvt_hw_set() - override one key of @hw with @value written as in a
 * profile file ("link.gpus_per_uplink", "0"; "copy.gather", "64K:48").
 * The key then no longer counts as assumed. Returns 0, or KVT_ECONFIG
 * naming an unknown key, a bad value or a broken cross-field rule; @hw is
 * untouched on failure.
 */
KVT_API int kvt_hw_set(kvt_hw *hw, const char *key, const char *value);

/**
 * kvt_hw_key_scale() - multiply numeric key i of @hw by @f (clamped to the
 * key's range; a copy curve's rates scale as a whole, reported as factor
 * 1 -> @f). *@from and *@to get the old and new value. Returns 0, or
 * -EINVAL for a key that cannot be scaled (a name, a count, a zero that
 * means "off", a curve the profile lacks, no change after clamping). For
 * one-at-a-time sensitivity (kvtier sim --explain).
 */
KVT_API int kvt_hw_key_scale(kvt_hw *hw, size_t i, double f, double *from,
			     double *to);

/**
 * kvt_hw_apply_xfer() - replace @hw's host -> GPU copy curves by figures
 * measured with `kvtier bench xfer --json` (issue 4's JSON: "model",
 * "results":[{"method","direction","page_tokens","gbps","limit_gbps"}]).
 * Load results of cuda-chunk, cuda-batch and cuda-kernel become the
 * memcpy, batch and gather curves (at the chunk size of the bench's model
 * and page size, TP 1; the measured rate includes the per-call cost, so
 * those methods' call costs become 0); the largest limit_gbps becomes the
 * contiguous rate and link.gbps. @label names the file in messages.
 * Returns 0; KVT_ECONFIG naming the problem (not JSON, no CUDA load
 * results — e.g. measured on a machine without a GPU —, an unknown model);
 * @hw is untouched on failure.
 */
KVT_API int kvt_hw_apply_xfer(kvt_hw *hw, const char *json, const char *label);

/**
 * kvt_hw_cost() - the scheduler's cost model for model @g (its TP degree
 * included) on @hw. Returns 0, KVT_EGEOM (see kvt_cost_set_model()), or
 * KVT_ECONFIG when the TP degree exceeds the node's GPUs.
 */
KVT_API int kvt_hw_cost(const kvt_hw *hw, const kvt_geom *g, kvt_cost *out);

/* ------------------------------------------------------------------------
 * Workloads
 * ------------------------------------------------------------------------ */

typedef enum kvt_workload {
	KVT_WL_AGENTIC = 0,
	KVT_WL_LOOGLE,
	KVT_WL_NARRATIVEQA,
	KVT_WL_REVIEWMT,
	KVT_WL_SHAREGPT,
	KVT_WL_TRACE,
	KVT_WL_COUNT
} kvt_workload;

KVT_API const char *kvt_workload_name(kvt_workload w);
/** "agentic", ..., or "trace:FILE" (the path goes to @path, which holds
 *  @len bytes). 0, or -EINVAL naming the known workloads. */
KVT_API int kvt_workload_parse(const char *s, kvt_workload *w, char *path,
			       size_t len);

/* ------------------------------------------------------------------------
 * One simulation
 * ------------------------------------------------------------------------ */

#define KVT_SIM_MAX_OFFLOAD 3

/**
 * struct kvt_sim_config - one run. Fill with kvt_sim_config_init() (which
 * sets every default), then change what you need. Zero in a field marked
 * "0: auto" picks the workload's or profile's default.
 */
typedef struct kvt_sim_config {
	kvt_hw hw;
	char model[4096];         /* preset name or config.json path */
	uint32_t tp;              /* tensor-parallel degree (1) */
	uint32_t page_tokens;     /* P (16; the hicache-kernel preset: 64) */
	uint32_t engines;         /* engine instances, each tp GPUs (1) */

	kvt_sched_policy policy;  /* lmcache, hicache, kvtier */
	kvt_sched_config sched;   /* preset of the policy (set by init and by
				   * kvt_sim_config_policy()); edit to ablate */
	kvt_copy_method store_method; /* how GPU -> host copies move */
	int page_contig;          /* the GPU pool keeps a page's layers
				   * contiguous (vLLM >= 0.12): a copy chunk
				   * is the whole page, not one layer's K|V */
	int store_holds_hbm;      /* an hbm page copied down stays taken until
				   * its copy is done, so a slow offload path
				   * frees hbm later; 1 by default */
	int cpu_mem_latency;      /* engine CPU time per step grows with the
				   * socket's loaded DRAM latency
				   * (hw.step_mem_frac); 1 by default */
	int write_policy;         /* enum kvt_write_policy (write-through) */
	int evict_policy;         /* enum kvt_evict_policy (lru) */

	kvt_tier_kind offload[KVT_SIM_MAX_OFFLOAD]; /* tiers below hbm, fastest
				   * first (dram) */
	uint32_t noffload;        /* 1 */
	double offload_bytes[KVT_SIM_MAX_OFFLOAD]; /* 0: the profile's */
	double bg_high, bg_low;   /* the cache's background demotion (its
				   * @high, @low): after every store, each
				   * offload tier above bg_high of its slots
				   * demotes its least recently used pages to
				   * bg_low (0: none; the index fills a tier
				   * and demotes on demand only) */
	uint32_t ssd_stage_pages; /* on a host that copies with the CPU (the
				   * transfer engine's lanes): an ssd -> hbm
				   * load goes through a host bounce of this
				   * many pages, read in rounds of half of it,
				   * and its last round is then copied into
				   * hbm on the cpu lane (the cache's
				   * KVT_CACHE_STAGE_SLOTS; 0: the read lands
				   * in hbm directly) */
	int store_room_wait;      /* with store_top: a store waits, on the
				   * engine's thread, for the copies making
				   * its room — the demotions its insert
				   * caused, and the background pass's copies
				   * still reading the tier it writes (their
				   * freed slots are the ones it gets) — as
				   * kvt_cache_store() did before it
				   * returned, until its room moved to the
				   * cache's room thread: the step's end and
				   * its first tokens wait for them (0: they
				   * move in the background, the store at
				   * once; the demo's prediction: 0) */
	uint32_t stress;          /* CPU stressor threads (0) */
	int hbm_reuse;            /* -1: auto (off for agentic), 0, 1 */

	kvt_workload workload;
	char trace_path[4096];    /* KVT_WL_TRACE */
	double trace_speed;       /* replay speed (1: real time) */
	uint64_t seed;            /* (1) */
	uint32_t requests;        /* open loop: requests (0: auto) */
	double rate;              /* open loop: arrivals per second (0: auto) */
	uint32_t sessions;        /* agentic (10) */
	uint32_t turns;           /* agentic: 1 cold + turns-1 warm (6) */
	uint32_t context;         /* agentic: last turn's prompt (32768);
				   * documents: median length (0: auto) */
	uint32_t append;          /* agentic: new tokens per warm turn (1024) */
	uint32_t output;          /* output tokens (0: auto) */
	double think_s;           /* agentic: mean think/tool time (5 s) */
	uint32_t cache_distance;  /* documents: other documents between two
				   * questions on one document (64) */
	uint32_t questions;       /* documents: questions per document (0:
				   * auto) */
	uint32_t system;          /* agentic: a system prompt of this many
				   * tokens opens every session's context
				   * (shared by all; 0: none) */
	double session_rate;      /* agentic: sessions start as a Poisson
				   * process at this rate (per second; 0: all
				   * at once) */
	double think_sigma;       /* agentic: each session's own mean think
				   * time is log-normal around think_s with
				   * this log-sd (0: think_s for all) */
	int hbm_share;            /* a request may use another request's
				   * pages in hbm (1, the default); 0: an
				   * engine with no prefix cache of its own
				   * (the demo's): only what a request loads
				   * or computes itself is in hbm for it */
	int store_top;            /* computed pages are stored into the
				   * fastest offload tier as each step ends
				   * (the demo's engine: a store per step),
				   * whatever the write policy does below */
	uint32_t store_align;     /* with store_top: whole chunks of this
				   * many tokens only (LMCache: 256; 0: pages) */
	int measured_rates;       /* the scheduler prices loads per tier at
				   * the rates the engine's own loads reached
				   * (the demo's kvt_cache_rates()), not on
				   * one link at the copy method's rate */
	double kv_bytes;          /* hbm for KV per engine (and TP rank),
				   * bytes; 0: what the profile's HBM leaves
				   * after weights and reserve */
	double max_sim_s;         /* stop the virtual clock here (0: none) */
	int check;                /* verify every index's invariants
				   * (kvt_index_check) after each step: slow,
				   * for tests */
} kvt_sim_config;

/** Fill @c with every default (testbed-a is NOT loaded: @c->hw is zero;
 *  load a profile into it). */
KVT_API void kvt_sim_config_init(kvt_sim_config *c);
/** Set the policy and its scheduler preset, store method, page size and
 *  GPU layout (page_tokens, page_contig: set them again afterwards to
 *  override). 0/-EINVAL. */
KVT_API int kvt_sim_config_policy(kvt_sim_config *c, kvt_sched_policy p);

/** Mean, percentiles and count of one measure. */
typedef struct kvt_dist {
	uint64_t n;
	double mean, p50, p90, p99, max;
} kvt_dist;

#define KVT_SIM_MAX_LINKS 64

/** Bytes through one modelled resource (a link direction or a device). */
typedef struct kvt_sim_link {
	char name[32];        /* "gpu0.h2d", "uplink0.h2d", "dram0", ... */
	double bytes_in;      /* bytes of flows that started on it */
	double bytes_out;     /* bytes of flows that finished on it */
	double busy_s;        /* time it carried at least one flow */
	double capacity_gbps; /* its capacity (DRAM: sustainable rate) */
} kvt_sim_link;

typedef struct kvt_sim_result {
	uint64_t requests;       /* generated */
	uint64_t finished;       /* completed (= requests unless cut short) */
	uint64_t measured;       /* in the statistics below: finished minus
				  * the documents' warm-up requests */
	kvt_dist ttft_ms;        /* time to first token, all requests */
	kvt_dist warm_ttft_ms;   /* requests with a cached prefix somewhere
				  * (agentic: turns after the first) */
	kvt_dist tpot_ms;        /* time per output token after the first */
	kvt_dist e2e_ms;         /* arrival to last token */
	double makespan_s;       /* first measured arrival to last measured
				  * completion */
	double throughput_tok_s; /* measured (prompt + output) / makespan */
	double output_tok_s;
	double request_s;
	double gpu_busy;         /* computing share of engine time, whole run
				  * (first arrival to last completion) */
	double stall_s;          /* engine time spent waiting for loads */
	uint64_t steps, decode_only_steps;
	/* tokens by where the prefix came from */
	uint64_t prompt_tokens;
	uint64_t hit_tokens[KVT_TIER_COUNT]; /* reused from each tier */
	uint64_t computed_tokens;            /* prefill tokens computed */
	uint64_t deferred;       /* scheduler deferrals (delay-hit) */
	uint64_t bg_passes;      /* background demotion passes that moved
				  * pages (bg_high) */
	uint64_t stage_hops;     /* ssd loads' second hops through the
				  * bounce (ssd_stage_pages) */
	uint64_t room_waits;     /* step ends that waited for the copies
				  * making room for their stores
				  * (store_room_wait) */
	double room_wait_s;      /* how long, all of them */
	/* bytes */
	double load_bytes[KVT_TIER_COUNT];   /* tier -> hbm */
	double store_bytes[KVT_TIER_COUNT];  /* -> tier */
	uint32_t nlinks;
	kvt_sim_link links[KVT_SIM_MAX_LINKS];
	double stress_gbps;      /* copy rate one stressor kept, mean */
	/* the run itself */
	uint64_t events;
	double wall_s;           /* host seconds the simulation took */
} kvt_sim_result;

/**
 * kvt_sim_run() - simulate @c; fill @r.
 * Returns 0; KVT_ECONFIG naming the bad field (no profile loaded, a TP
 * degree the node cannot hold, an offload tier the profile lacks, a zero
 * rate for an open-loop workload...); KVT_EPRESET / KVT_EGEOM for the
 * model; -errno / KVT_ECONFIG from reading a trace; -ENOMEM. A run never
 * half-fills @r: on failure it is untouched.
 */
KVT_API int kvt_sim_run(const kvt_sim_config *c, kvt_sim_result *r);

/* ------------------------------------------------------------------------
 * Sweeps and the TTFT target
 * ------------------------------------------------------------------------ */

#define KVT_SWEEP_MAX 64

typedef struct kvt_sweep_point {
	double rate;             /* offered arrivals per second */
	kvt_sim_result r;
} kvt_sweep_point;

typedef struct kvt_sweep {
	uint32_t n;              /* points, by increasing rate */
	kvt_sweep_point pt[KVT_SWEEP_MAX];
	int have_target;         /* a target was given */
	int met;                 /* some rate met it */
	double target_ms;
	double at_rate;          /* highest rate whose mean TTFT <= target */
	double at_throughput;    /* its throughput_tok_s */
	double at_ttft_ms;       /* its mean TTFT */
	int at_top;              /* the highest rate swept still met it: the
				  * real limit lies above the range */
} kvt_sweep;

/**
 * kvt_sim_sweep() - run @c at each of @nrates arrival rates (0: choose:
 * 12 rates from 5% to 150% of the node's estimated capacity), then, with
 * @target_ms > 0, refine between the last rate that met the target and the
 * first that did not by bisection (4 more runs) and report the highest
 * throughput whose mean TTFT meets the target. Open-loop workloads only
 * (KVT_ECONFIG for agentic and traces). Returns 0 or as kvt_sim_run().
 */
KVT_API int kvt_sim_sweep(const kvt_sim_config *c, const double *rates,
			  uint32_t nrates, double target_ms, kvt_sweep *out);

/**
 * kvt_sweep_throughput_at() - the throughput @w reaches at mean TTFT
 * @ttft_ms: along the curve by increasing rate, up to its first crossing
 * of @ttft_ms, interpolated linearly in throughput against log TTFT
 * between the two points around it. Two policies compared at one target
 * give "the throughput ratio at equal TTFT" papers report.
 * Returns 0 and *@thr; 1 when every point meets @ttft_ms (*@thr is the
 * top point's throughput: a lower bound); -ERANGE when even the lowest
 * rate misses it; -EINVAL for bad arguments.
 */
KVT_API int kvt_sweep_throughput_at(const kvt_sweep *w, double ttft_ms,
				    double *thr);

/**
 * kvt_curve_throughput_at() - the same along any measured curve: @n points
 * by increasing offered load, throughput @thr_v[i] at TTFT @ttft_v[i] (any
 * statistic: mean, p90), interpolated at @ttft_ms as above. For curves
 * measured elsewhere (`kvtier demo --sweep`). Returns as above.
 */
KVT_API int kvt_curve_throughput_at(const double *thr_v, const double *ttft_v,
				    uint32_t n, double ttft_ms, double *thr);

#ifdef __cplusplus
}
#endif

#endif /* KVTIER_SIM_H */
