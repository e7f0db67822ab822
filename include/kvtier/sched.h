/*
 * kvtier/sched.h — the cache-aware batch scheduler and its cost model.
 * Included by <kvtier.h>.
 *
 * An inference engine calls the scheduler once per step to form the next
 * batch. It hands over plain values — no handles into the engine, the index
 * or the transfer engine — and gets a plan back:
 *
 *     waiting queue   per request: its prefix as the index sees it
 *     (+ running      (the part in hbm, the part loadable from each tier,
 *      prefills)       loads already in flight and when they are ready, the
 *                      part some other request is computing right now
 *                      (transient), the rest to compute)
 *     running decodes how many, and their total context
 *     transfer queue  when the host link frees up
 *     capacity        free hbm pages, token budget per step
 *                         |
 *                         v
 *                  kvt_sched_plan_step()
 *                         |
 *                         v
 *     plan            per request: run (how many tokens to compute, how
 *                      many to load now), prefetch (load only), wait
 *                      (why), or defer; whether decodes run; estimates
 *
 * A request's prompt, as the scheduler sees it, is four spans in order:
 *
 *     0            hbm        hbm+tier         +transient          prompt
 *     |--- in hbm ---|--- loadable ---|--- transient ---|--- compute ---|
 *                     fabric,dram,ssd  being computed    nobody has it
 *                     (some in flight) by another request
 *
 * THE COST MODEL (struct kvt_cost) prices a plan: moving chunks over the
 * host link by copy method and chunk size (per-call overhead plus a
 * measured rate curve), a forward pass as GEMM FLOPs (linear in tokens) +
 * attention FLOPs (linear in context) or, when the batch is small, the time
 * to stream the weights and KV from HBM (a roofline), plus the
 * tensor-parallel all-reduces and a fixed per-step cost. Every figure comes
 * from a hardware profile (the simulator's files under profiles/) or from
 * `kvtier bench` measurements. One topology choice of one profile was
 * fitted to a published end-to-end result; docs/SIMULATOR.md says which,
 * and how the model fares against results it was not fitted to.
 *
 * POLICIES, each a bit in kvt_sched_config.features, switchable alone:
 *
 *   OVERLAP    layer-wise load/compute overlap: layer i computes while
 *              layer i+1 loads, so a step costs max(load, compute) plus one
 *              layer of the other, not load + compute.
 *   PREFETCH   start loads for waiting requests as soon as they are seen
 *              (up to `lookahead` requests and the free hbm pages), so the
 *              bytes are home before the request's turn.
 *   DELAYHIT   a request whose prefix overlaps a transient span by more
 *              than `delay_hit_tokens` (100) is deferred and kept at the
 *              head instead of computing the same context twice, as long
 *              as that context is expected (transient_ready) sooner than
 *              the request could compute it itself; two
 *              requests of one step that share an uncached context are
 *              bundled: the first computes it, the others wait for it.
 *   BALANCE    a batch's remaining load time must fit under
 *              `balance_ratio` x its compute time; cache-heavy requests
 *              (much to load, little to compute) are paired with
 *              compute-heavy ones found further down the queue, and a
 *              cache-heavy request that cannot be hidden waits while its
 *              loads proceed.
 *   STALLHIDE  when no prefill can run without stalling on I/O, run a
 *              decode-only step while the loads finish.
 *   STARVE     deferred requests keep their order, every round starts at
 *              the head, and a request passed over `max_skips` times runs
 *              next whatever the other policies say.
 *   RECOMPUTE  load or recompute, by cost: of a waiting request's loadable
 *              span, only the part that lands in time is loaded; the rest
 *              is computed with the new tokens. The cut x (whole pages,
 *              never inside loads already issued) minimises
 *                  overlap(compute(prompt - hbm - x after hbm + x),
 *                          load(x))
 *                  + others * (compute(x) - compute(all loaded))
 *              the request's ready time plus the GPU time its extra
 *              compute takes from the `others` sequences sharing its steps
 *              (running decodes and prefills), where load(x) lands the
 *              span's first x tokens tier run by
 *              tier run (kvt_sched_req.run_*) at each tier's rate (the
 *              caller's measured kvt_sched_state.tier_gbps, else the cost
 *              model's copy rate) behind that tier's queue, tiers in
 *              parallel. So a slow tier's run is recomputed and a fast
 *              one's loaded; the plan says how many cached tokens of each
 *              tier it computes (kvt_sched_item.recompute_tier).
 *
 * The presets (kvt_sched_config_preset(); docs/SIMULATOR.md gives the
 * source of each):
 *
 *   policy   loads                                  order       features
 *   lmcache  whole matched prefix (256-token         FCFS        none
 *            objects), then compute; stores finish
 *            before the step ends
 *   hicache  layer-wise, one cudaMemcpyAsync per     FCFS        OVERLAP
 *            chunk (the hierarchical-cache baseline
 *            as SPEC.md's study describes it)
 *   hicache-kernel  layer-wise, SGLang's GPU I/O     FCFS        OVERLAP
 *            kernel (method GATHER); the simulator
 *            adds its 64-token pages and page-first
 *            host layout (SGLang's best practices)
 *   vllm     vLLM's offloading connector: one        FCFS        PREFETCH,
 *            cudaMemcpyAsync per block, loads run    (requests   BALANCE
 *            ahead and a request joins a step when   wait for
 *            they are home by its end; the simulator their
 *            adds the page-contiguous GPU layout     loads)
 *            (vLLM >= 0.12)
 *   kvtier   layer-wise, GPU gather kernel           cache-aware all
 *
 * kvt_sched_config.wait_loads (vLLM's WAITING_FOR_REMOTE_KVS: a request
 * whose loads are not all home never runs; it is skipped, not blocking the
 * queue, and its loads start by PREFETCH) is set by none of the presets
 * above; the demo's vllm policy sets it (src/engine/policy.c).
 *
 * CAPACITY: a request is admitted only when its whole prompt fits — no
 * preemption, so a prefill once started always has the pages for its next
 * chunk. Running it, or starting its loads, takes
 *     pages(prompt) - pages(hbm + loading) - reserved
 * of st->free_pages, where `reserved` are pages the caller already holds for
 * it (a running prefill's whole remainder, a prefetched request's claim).
 *
 * THREADS: a kvt_sched is used by one thread at a time; distinct schedulers
 * are independent. The cost functions are pure and thread-safe.
 */
#ifndef KVTIER_SCHED_H
#define KVTIER_SCHED_H

#include <kvtier.h>
#include <kvtier/geom.h>
#include <kvtier/tier.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ------------------------------------------------------------------------
 * Cost model
 * ------------------------------------------------------------------------ */

/** How KV chunks cross the host link (host <-> GPU). */
typedef enum kvt_copy_method {
	KVT_COPY_CONTIG = 0, /* one large copy-engine transfer: the limit */
	KVT_COPY_MEMCPY,     /* one cudaMemcpyAsync per chunk (vLLM swap_blocks) */
	KVT_COPY_BATCH,      /* cudaMemcpyBatchAsync: copy engines, one call */
	KVT_COPY_GATHER,     /* GPU gather/scatter kernel on registered memory */
	KVT_COPY_OBJECT,     /* whole contiguous objects (LMCache 256-token
			      * chunks), then an on-GPU scatter */
	KVT_COPY_COUNT
} kvt_copy_method;

/** "contig", "memcpy", "batch", "gather", "object" (NULL if out of range). */
KVT_API const char *kvt_copy_method_name(kvt_copy_method m);
/** Parse such a name: 0 or -EINVAL. */
KVT_API int kvt_copy_method_parse(const char *s, kvt_copy_method *out);

#define KVT_CURVE_MAX 8

/**
 * struct kvt_copy_curve - measured rate of one copy method by chunk size.
 * @n:           points used (1..KVT_CURVE_MAX); 0 means "not available".
 * @chunk_bytes: chunk sizes, strictly increasing.
 * @gbps:        data rate the copy engine or kernel reaches while moving
 *               chunks of that size (GB/s = 1e9 bytes/s), call cost apart.
 *               Between points the rate is interpolated in log-log space;
 *               outside, the nearest point holds.
 * @call_us:     CPU cost of one call: per chunk for KVT_COPY_MEMCPY and
 *               KVT_COPY_OBJECT (one call per chunk/object), per job for
 *               the others (one batched call or one kernel launch).
 */
typedef struct kvt_copy_curve {
	uint32_t n;
	double chunk_bytes[KVT_CURVE_MAX];
	double gbps[KVT_CURVE_MAX];
	double call_us;
} kvt_copy_curve;

/**
 * struct kvt_cost - everything the scheduler prices a step with. A plain
 * value: fill the model part with kvt_cost_set_model() and the hardware
 * part from a profile (kvt_hw_cost() in <kvtier/sim.h>) or by hand.
 *
 * Units: seconds, bytes, FLOP/s; GB/s means 1e9 bytes per second.
 */
typedef struct kvt_cost {
	/* hardware: one GPU */
	double gpu_flops;     /* dense bf16 FLOP/s */
	double gemm_eff;      /* fraction of gpu_flops reached by prefill GEMMs */
	double attn_eff;      /* fraction reached by prefill attention */
	double hbm_gbps;      /* HBM bandwidth */
	double hbm_eff;       /* fraction of it reached streaming weights/KV */
	double step_us;       /* fixed cost of one engine step (CPU, launches) */
	double ar_gbps;       /* tensor-parallel all-reduce bus bandwidth */
	double ar_us;         /* latency of one all-reduce */
	double link_gbps;     /* host link, one direction, contiguous copies */
	kvt_copy_curve copy[KVT_COPY_COUNT];

	/* model, on one TP rank (kvt_cost_set_model) */
	uint32_t layers;
	uint32_t tp;
	uint32_t q_heads;        /* whole model */
	uint32_t head_dim;
	uint32_t hidden;
	uint32_t page_tokens;
	uint64_t active_params;  /* whole model, per token */
	uint64_t token_bytes;    /* KV bytes per token on one rank */
	uint64_t chunk_bytes;    /* one (page, layer, k|v) chunk on one rank */
	uint64_t weight_bytes;   /* model weights on one rank */
} kvt_cost;

/**
 * kvt_cost_set_model() - copy a geometry's figures into @c (the hardware
 * fields are left alone). Weights on one rank: every parameter (MoE experts
 * included: they are all resident) at the geometry's dtype bytes, split
 * evenly over the TP ranks; GEMM FLOPs use active_params.
 * Returns 0, or KVT_EGEOM when @g lacks the compute figures (params,
 * q_heads, hidden) that a preset or config.json provides.
 */
KVT_API int kvt_cost_set_model(kvt_cost *c, const kvt_geom *g);

/**
 * kvt_cost_check() - 0 if every field the functions below read is set and
 * sane (positive rates, efficiencies in (0, 1], at least the CONTIG curve),
 * else KVT_ECONFIG naming the first bad field.
 */
KVT_API int kvt_cost_check(const kvt_cost *c);

/**
 * kvt_cost_copy_gbps() - uncontended rate (GB/s) of a long stream of
 * @chunk_bytes chunks moved with @m: the curve's rate, lowered by the
 * per-call cost for per-chunk methods, and never above link_gbps.
 * Returns 0 when the method has no curve (unavailable on this hardware).
 */
KVT_API double kvt_cost_copy_gbps(const kvt_cost *c, kvt_copy_method m,
				  uint64_t chunk_bytes);

/**
 * kvt_cost_copy_s() - seconds to move @bytes in chunks of @chunk_bytes
 * with @m on an idle link: per-job call cost + bytes / kvt_cost_copy_gbps().
 * Returns a huge value (1e30) when the method is unavailable.
 */
KVT_API double kvt_cost_copy_s(const kvt_cost *c, kvt_copy_method m,
			       uint64_t chunk_bytes, uint64_t bytes);

/**
 * kvt_cost_method_chunk() - the chunk size method @m moves for this model:
 * the page's (layer, k|v) chunk for MEMCPY, BATCH and GATHER (a layer-first
 * GPU pool scatters a page into 2L chunks; the gather kernel reads the
 * page-first page as one run but writes chunks), @object_tokens tokens of
 * KV for OBJECT, and 64 MiB for CONTIG.
 */
KVT_API uint64_t kvt_cost_method_chunk(const kvt_cost *c, kvt_copy_method m,
				       uint32_t object_tokens);

/** One prefill in a batch: @tokens computed after @context cached ones. */
typedef struct kvt_cost_prefill {
	uint32_t tokens;
	uint32_t context;
} kvt_cost_prefill;

/**
 * kvt_cost_step_s() - seconds one forward pass takes: @n prefills and
 * @decodes decode sequences whose contexts add up to @decode_ctx tokens.
 *
 *   gemm  = max(2 * active_params * T / tp / (flops * gemm_eff),
 *               weight_bytes / (hbm * hbm_eff))         T = all tokens
 *   attn  = 4 * L * q_heads * D * pairs / tp / (flops * attn_eff)
 *           pairs = sum over prefills of tokens*context + tokens^2/2
 *         + decode_ctx * token_bytes / (hbm * hbm_eff)  (decode KV reads)
 *   ar    = 2 * L * (ar_us + 2(tp-1)/tp * T * hidden * 2 / ar_gbps), tp > 1
 *   step  = gemm + attn + ar + step_us
 *
 * An empty step (no tokens) costs 0.
 */
KVT_API double kvt_cost_step_s(const kvt_cost *c, const kvt_cost_prefill *p,
			       size_t n, uint32_t decodes, uint64_t decode_ctx);

/** Shorthand: one prefill alone. */
KVT_API double kvt_cost_prefill_s(const kvt_cost *c, uint32_t tokens,
				  uint32_t context);

/**
 * kvt_cost_overlap_s() - duration of a step computing for @compute_s while
 * @load_s of its KV arrives layer by layer: with @overlap, layer i computes
 * once layer i has arrived, so max(compute + load/L, load + compute/L);
 * without, load + compute.
 */
KVT_API double kvt_cost_overlap_s(const kvt_cost *c, double compute_s,
				  double load_s, int overlap);

/* ------------------------------------------------------------------------
 * Scheduler
 * ------------------------------------------------------------------------ */

enum kvt_sched_feature {
	KVT_SCHED_OVERLAP = 1u << 0,
	KVT_SCHED_PREFETCH = 1u << 1,
	KVT_SCHED_DELAYHIT = 1u << 2,
	KVT_SCHED_BALANCE = 1u << 3,
	KVT_SCHED_STALLHIDE = 1u << 4,
	KVT_SCHED_STARVE = 1u << 5,
	KVT_SCHED_RECOMPUTE = 1u << 6,
	KVT_SCHED_ALL = (1u << 7) - 1,
};

/** Name of one feature bit ("overlap", "prefetch", "delay-hit", "balance",
 *  "stall-hide", "starve", "recompute"), NULL for anything else. */
KVT_API const char *kvt_sched_feature_name(uint32_t bit);

/**
 * kvt_sched_features_parse() - apply a list such as "-balance,+prefetch" or
 * "delay-hit,starve" to *@features: "+name" or "name" sets, "-name"
 * clears, "all" and "none" set or clear everything. 0, or KVT_ECONFIG
 * naming the unknown item (*@features is then unchanged).
 */
KVT_API int kvt_sched_features_parse(const char *s, uint32_t *features);

typedef enum kvt_sched_policy {
	KVT_POLICY_LMCACHE = 0,
	KVT_POLICY_HICACHE = 1,
	KVT_POLICY_KVTIER = 2,
	KVT_POLICY_HICACHE_KERNEL = 3, /* SGLang HiCache as its docs
				   * recommend today */
	KVT_POLICY_VLLM = 4,      /* vLLM's native offloading connector */
	KVT_POLICY_COUNT
} kvt_sched_policy;

KVT_API const char *kvt_sched_policy_name(kvt_sched_policy p);
/** 0 or -EINVAL. */
KVT_API int kvt_sched_policy_parse(const char *s, kvt_sched_policy *out);

typedef struct kvt_sched_config {
	uint32_t features;        /* KVT_SCHED_* bits */
	kvt_copy_method method;   /* how loads move */
	int sync_store;           /* stores of a step's KV finish before the
				   * step ends (LMCache's wait_for_save) */
	uint32_t object_tokens;   /* KVT_COPY_OBJECT object size (256) */
	uint32_t hit_align;       /* loadable prefix rounded down to this many
				   * tokens (LMCache: whole objects; else 0) */
	uint32_t token_budget;    /* tokens computed per step, decodes
				   * included (vLLM max_num_batched_tokens) */
	uint32_t max_batch;       /* sequences per step (max_num_seqs) */
	uint32_t delay_hit_tokens;/* DELAYHIT threshold (100) */
	double balance_ratio;     /* BALANCE: load <= ratio * compute (1.0) */
	uint32_t max_skips;       /* STARVE: passes over before forced (8) */
	uint32_t lookahead;       /* PREFETCH: waiting requests looked at (64) */
	uint32_t wait_loads;      /* a waiting request runs only once its
				   * loads are home; until then it is passed
				   * over, never blocking those behind it
				   * (vLLM's asynchronous connector API) */
} kvt_sched_config;

/**
 * kvt_sched_config_preset() - fill @c with policy @p's settings (table in
 * the header comment) and the shared defaults: token_budget 8192,
 * max_batch 256, delay_hit_tokens 100, balance_ratio 1.0, max_skips 8,
 * lookahead 64, object_tokens 256. Returns 0 or -EINVAL for a bad @p.
 */
KVT_API int kvt_sched_config_preset(kvt_sched_config *c, kvt_sched_policy p);

#define KVT_SCHED_RUNS 8 /* tier runs a request's loadable span may have */

/** State of a request as the caller hands it over. */
enum kvt_sreq_state {
	KVT_SREQ_WAITING = 0,  /* not started */
	KVT_SREQ_PREFILL = 1,  /* started: part of its prompt is computed */
};

/**
 * struct kvt_sched_req - one request of the waiting queue (or a running
 * prefill), in the caller's queue order: running prefills first, then the
 * waiting requests by arrival. Token counts are of this request's prompt,
 * spans as drawn in the header comment; all times are the caller's clock.
 */
typedef struct kvt_sched_req {
	uint64_t id;               /* caller's id, never read */
	uint32_t state;            /* enum kvt_sreq_state */
	uint32_t prompt;           /* prompt tokens */
	uint32_t done;             /* PREFILL: tokens already in hbm (computed
				    * or loaded); WAITING: 0 */
	uint32_t hbm;              /* WAITING: prefix tokens resident in hbm */
	uint32_t tier[KVT_TIER_COUNT]; /* after the hbm span: tokens loadable
				    * from each tier (tier[KVT_TIER_HBM]
				    * unused), fastest tier first */
	uint32_t loading;          /* of the loadable span, tokens whose loads
				    * are already in flight or done */
	double loading_ready;      /* when those are all home (0: now) */
	uint32_t transient;        /* tokens right after the loadable span
				    * that another request is computing */
	double transient_ready;    /* when they are expected in hbm; DELAYHIT
				    * waits for them only while waiting is
				    * shorter than computing them (0: now) */
	uint32_t reserved;         /* hbm pages the caller already holds for
				    * this request (see "capacity" above) */
	uint64_t group;            /* requests with one uncached shared
				    * context carry one group id (0: none) */
	uint32_t group_tokens;     /* length of that shared context */
	double arrival;
	uint32_t skips;            /* in/out: times passed over; the caller
				    * keeps it between calls */
	/* optional: the loadable span as tier runs in prefix order (their
	 * tokens add up to the sum of tier[]); nruns 0: tier[] fastest
	 * first. Used by RECOMPUTE and by measured tier rates. */
	uint32_t nruns;
	uint32_t run_tier[KVT_SCHED_RUNS];
	uint32_t run_tokens[KVT_SCHED_RUNS];
} kvt_sched_req;

/** Engine-wide state for one step. */
typedef struct kvt_sched_state {
	double now;
	uint32_t decodes;          /* running decode sequences */
	uint64_t decode_ctx;       /* their total context, tokens */
	uint64_t free_pages;       /* free hbm KV pages */
	double link_free_at;       /* when loads already queued on the host
				    * link are done (<= now: idle) */
	/* optional: measured rates (GB/s) of loads from each tier into hbm
	 * and when the loads queued from it are done. With any rate set,
	 * loads are priced per tier (tiers move in parallel, each behind
	 * its own queue; a tier without a rate gets the cost model's copy
	 * rate) instead of on the one link. */
	double tier_gbps[KVT_TIER_COUNT];
	double tier_free_at[KVT_TIER_COUNT];
} kvt_sched_state;

enum kvt_sched_action {
	KVT_SACT_WAIT = 0,     /* not this step */
	KVT_SACT_RUN = 1,      /* compute .compute tokens this step */
	KVT_SACT_PREFETCH = 2, /* only start loading .load tokens */
	KVT_SACT_DEFER = 3,    /* passed over on purpose, stays at the head */
};

enum kvt_sched_reason {
	KVT_SWHY_NONE = 0,
	KVT_SWHY_BUDGET,       /* token budget or batch size used up */
	KVT_SWHY_CAPACITY,     /* not enough free hbm pages */
	KVT_SWHY_TRANSIENT,    /* waits for context another request computes */
	KVT_SWHY_IO,           /* its loads cannot be hidden yet */
	KVT_SWHY_ORDER,        /* FCFS: a request ahead of it could not run */
};

/** What the plan says about one request (same index as the input). */
typedef struct kvt_sched_item {
	uint32_t action;   /* enum kvt_sched_action */
	uint32_t reason;   /* enum kvt_sched_reason, for WAIT and DEFER */
	uint32_t compute;  /* RUN: tokens to compute this step */
	uint32_t load;     /* loadable tokens whose loads start now (not
			    * counting those already in flight): RUN,
			    * PREFETCH, and DEFER while PREFETCH is on */
	uint32_t reuse;    /* RUN of a WAITING request: tokens of its prefix
			    * used as they are (hbm + loaded), so the first
			    * computed token is at position reuse */
	uint32_t recompute;/* RECOMPUTE: cached tokens after reuse that it
			    * computes rather than loads ... */
	uint32_t recompute_tier[KVT_TIER_COUNT]; /* ... by the tier they
			    * are cached in */
} kvt_sched_item;

typedef struct kvt_sched_plan {
	kvt_sched_item *items;  /* the caller's array, one per request */
	uint32_t nrun;          /* requests computing this step */
	uint32_t nprefetch;     /* requests only loading */
	uint32_t ndefer;
	uint32_t decodes;       /* decode sequences in this step */
	uint32_t compute_tokens;/* prefill tokens this step */
	uint64_t load_tokens;   /* tokens whose loads start now */
	uint64_t recompute_tokens; /* RECOMPUTE: cached tokens the running
				  * requests compute rather than load */
	uint64_t pages;         /* hbm pages the plan takes */
	int decode_only;        /* STALLHIDE chose decodes alone */
	double est_compute_s;   /* forward pass */
	double est_load_s;      /* remaining loads the step waits for */
	double est_step_s;      /* the step, loads and overlap included */
} kvt_sched_plan;

typedef struct kvt_sched kvt_sched;

/**
 * kvt_sched_create() - a scheduler with configuration @cfg pricing with
 * @cost (both copied). Returns 0, KVT_ECONFIG naming a bad field (a zero
 * budget, a ratio <= 0, a copy method the cost model has no curve for, a
 * cost model kvt_cost_check() rejects), -ENOMEM.
 * Free with kvt_sched_destroy().
 */
KVT_API int kvt_sched_create(kvt_sched **out, const kvt_sched_config *cfg,
			     const kvt_cost *cost);
KVT_API void kvt_sched_destroy(kvt_sched *s);
KVT_API const kvt_sched_config *kvt_sched_get_config(const kvt_sched *s);
KVT_API const kvt_cost *kvt_sched_get_cost(const kvt_sched *s);

/**
 * kvt_sched_plan_step() - plan the next step.
 * @s:     the scheduler.
 * @st:    engine state now.
 * @reqs:  @n requests in queue order (running prefills first). The
 *         scheduler updates only reqs[i].skips (incremented for every
 *         request passed over while one behind it runs or prefetches,
 *         reset to 0 when it runs).
 * @items: room for @n items; filled, and referenced by @plan->items.
 * @plan:  filled.
 *
 * The plan never exceeds the token budget, max_batch or free_pages, never
 * runs a request twice, and never reorders: among requests that could run,
 * a later one runs ahead of an earlier one only by a policy that says so
 * (BALANCE pairing, DELAYHIT deferral), and every such pass is counted in
 * skips. With STARVE, a request with skips >= max_skips is planned first.
 *
 * Returns 0; -EINVAL for NULL arguments or a request whose spans exceed
 * its prompt (kvt_errdetail() names its index). The scheduler keeps no
 * per-request state: calling twice with the same input gives the same
 * plan.
 */
KVT_API int kvt_sched_plan_step(kvt_sched *s, const kvt_sched_state *st,
				kvt_sched_req *reqs, size_t n,
				kvt_sched_item *items, kvt_sched_plan *plan);

/**
 * kvt_sched_open() - kvt_sched_create() priced from a hardware profile:
 * @profile as kvt_hw_load() (<kvtier/sim.h>) reads it (NULL: "h100"),
 * the cost model kvt_hw_cost() builds for model @g on it, @policy's preset
 * (NULL: "kvtier") and then @features applied as
 * kvt_sched_features_parse() reads them (NULL: the preset's). For engine
 * connectors (python/kvtier/decide.py), which hold no cost model of their
 * own: the prefill times they are priced with are the profile's MODEL of
 * that GPU, not measurements. Returns what those calls return (KVT_ECONFIG
 * for an unknown policy or feature, KVT_ENOTFOUND for an unknown profile,
 * KVT_EGEOM for a geometry without compute figures).
 */
KVT_API int kvt_sched_open(kvt_sched **out, const char *policy,
			   const char *features, const char *profile,
			   const kvt_geom *g);

/**
 * struct kvt_sched_hit - what kvt_sched_decide() says about one request's
 * cache hit. Tokens are of the request's prompt; times in seconds from
 * st->now.
 * @load:      of the loadable span (after the hbm span), the leading tokens
 *             worth loading: the request should reuse hbm + load tokens
 *             and compute the rest. The whole span without RECOMPUTE.
 * @recompute: cached tokens after them that it computes instead ...
 * @recompute_tier: ... by the tier they are cached in.
 * @wait:      1 when the request should wait (DELAYHIT) for its transient
 *             span — longer than delay_hit_tokens and expected
 *             (transient_ready) sooner than the request would compute it;
 *             0 otherwise.
 * @load_s:    when the @load tokens would be home if issued now.
 * @compute_s: the prefill of the prompt after hbm + load (the cost
 *             model's).
 * @wait_s:    until the transient span is expected (0: none, or now).
 */
typedef struct kvt_sched_hit {
	uint32_t load;
	uint32_t recompute;
	uint32_t recompute_tier[KVT_TIER_COUNT];
	uint32_t wait;
	double load_s;
	double compute_s;
	double wait_s;
} kvt_sched_hit;

/**
 * kvt_sched_decide() - the scheduler's per-request decisions for one
 * waiting request @r, for an engine that forms its batches itself and asks
 * only how much of a hit to take (vLLM's get_num_new_matched_tokens,
 * SGLang's batch_exists): the same code kvt_sched_plan_step() decides
 * RECOMPUTE (the cut, tier run by tier run, at @st's measured tier rates
 * and queues) and DELAYHIT (waiting for a transient span) with, for @r
 * sharing its steps with @others sequences (running decodes and
 * prefills). Budget, capacity, batching and order are not decided here:
 * the engine's own scheduler does those. Reads @s, @st and @r only.
 * Returns 0; -EINVAL for NULL arguments, a request not WAITING, or the
 * spans kvt_sched_plan_step() rejects (kvt_errdetail() says which).
 */
KVT_API int kvt_sched_decide(const kvt_sched *s, const kvt_sched_state *st,
			     const kvt_sched_req *r, uint32_t others,
			     kvt_sched_hit *out);

#ifdef __cplusplus
}
#endif

#endif /* KVTIER_SCHED_H */
