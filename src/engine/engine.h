/*
 * engine.h — one serving engine's step loop (internal), behind a clock and
 * a data plane. The simulator runs it on a virtual clock over modelled
 * links (src/sim/plane.c); the demo runs it on the wall clock over the real
 * cache (src/demo/serve.c). Everything a continuous-batching engine decides
 * is here, once; what differs between the two is only what must:
 *
 *                        +-------------------- kvti_eng -----------------+
 *   arrivals ----------> | wait queue -> kvt_sched_plan_step() -> step   |
 *                        |   ^ view (ops)        | loads (ops)    |      |
 *                        |   |                   v                v      |
 *                        |  data plane: what is cached where, loads,  GPU |
 *                        |  transient context, stores (ops)      (ops)   |
 *                        +-----------------------------------------------+
 *
 *   kvti_eng_kick()      if no step runs: view the running prefills and the
 *                        first WINDOW waiting requests (ops->view fills each
 *                        one's kvt_sched_req from the cache), plan, apply:
 *                        loads start (ops->load), requests start
 *                        (ops->start), the step's forward pass is priced
 *                        with the cost model and handed to the GPU
 *                        (ops->step_begin); nothing to run: idle, or a
 *                        stall is reported.
 *   kvti_eng_loads_done() the data plane says a request's loads are home
 *                        (or failed from some token on): a waiting request
 *                        may now run; a running one's step may end
 *                        (ops->step_loads_home).
 *   kvti_eng_step_end()  the GPU says the step is over: prefills advance
 *                        (ops->computed: pages committed, stores started),
 *                        finished prefills emit their first token (with a
 *                        synchronous save, once the step's stores are done:
 *                        kvti_eng_store_end()), decodes advance, finished
 *                        requests are released (ops->finish) and handed to
 *                        the platform (ops->finished), and the next step
 *                        is planned.
 *
 * CAPACITY. From its first load or its start a request claims hbm pages for
 * its whole prompt; decode tokens take private pages as they grow; pages
 * copied down that hold hbm until their copy is done are "storing". The
 * scheduler sees hbm_pages - claims - private - storing as free and admits
 * a request only when its whole prompt fits. With @preempt, a step whose
 * decodes need pages that are not free preempts the running request that
 * arrived last (vLLM's recompute preemption): its pages are released, it
 * goes back to the head of the queue and later recomputes (or reloads) its
 * prompt and the tokens it had generated. Without it decode pages are
 * granted beyond the pool (the simulator's historical behaviour).
 *
 * TIME. All times are the platform's clock in seconds (ops->now).
 *
 * BREAKDOWN. The engine sums where its requests' TTFT went (e->bd: arrival
 * to first start, first start to first token, the wall and priced time of
 * the steps each prefilled in) on either clock; with KVT_ENG_BREAKDOWN=LABEL
 * in the environment kvti_eng_fini() prints them to stderr, one line per
 * engine (the demo's pass, then its --predict run): the diagnostic that
 * docs/SIMULATOR.md section 7 reads.
 *
 * THREADS. An engine is driven by one thread at a time; ops are called
 * from that thread, inside the engine's calls.
 */
#ifndef KVT_ENGINE_ENGINE_H
#define KVT_ENGINE_ENGINE_H

#include "core/core.h"

#include <kvtier/sched.h>

#define KVTI_ENG_WINDOW 64 /* waiting requests the scheduler sees per step */

enum kvti_ereq_state { ER_WAIT = 0, ER_PREFILL, ER_DECODE, ER_DONE };

/* One request. The platform embeds it in its own request (container_of)
 * and fills the "in" fields before kvti_eng_arrive(). */
struct kvti_ereq {
	/* in */
	uint64_t id;              /* non-zero, unique */
	uint32_t prompt;          /* tokens */
	uint32_t output;          /* tokens to generate (>= 1) */
	double arrival;
	uint64_t group;           /* an uncached context shared with others */
	uint32_t group_tokens;
	/* engine state */
	int state;                /* enum kvti_ereq_state */
	uint32_t done;            /* prompt tokens in hbm (computed/loaded) */
	uint32_t generated;
	double first_token, finish;
	kvt_sched_req sr;         /* the scheduler's view; .skips persists */
	/* loads (kept by the data plane through kvti_eng_* and ops) */
	uint32_t load_upto;       /* prefix tokens loaded or being loaded */
	uint32_t load_base;       /* hbm prefix when the loads were issued */
	uint32_t load_flows;      /* loads (flows, jobs) still moving */
	double load_eta;          /* when they are expected home */
	uint64_t claim;           /* hbm pages held for it */
	/* the step it runs in */
	uint32_t step_compute;    /* tokens it computes in the current step */
	int in_step;
	int counted;              /* hits counted */
	uint32_t loaded[KVT_TIER_COUNT]; /* tokens it loaded, by source */
	uint32_t recomputed[KVT_TIER_COUNT]; /* cached tokens it chose to
				   * compute (load-or-recompute), by tier */
	uint32_t reused;          /* prefix tokens it did not compute */
	uint32_t computed;        /* tokens it prefilled, all runs (after a
				   * preemption too) */
	uint32_t priv;            /* private hbm pages (partial page, decode) */
	uint64_t storing;         /* its hbm pages whose copies down still
				   * move (store_holds_hbm) */
	uint32_t preempted;       /* times preempted */
	uint32_t resume;          /* after a preemption: tokens generated
				   * before it (the prompt now includes them) */
	double started;           /* its first start (clock; 0: not yet) */
	double bd_wall, bd_model; /* steps it prefilled in: wall, priced */
	uint32_t bd_steps;
};

struct kvti_eng;

/* The platform: clock, data plane, GPU. Members marked optional may be
 * NULL. Every call returns 0 or a negative error (the engine stops). */
struct kvti_eng_ops {
	double (*now)(struct kvti_eng *e);
	/* Fill r->sr for a waiting request: hbm, tier[], runs, loading,
	 * loading_ready, transient, transient_ready (the rest the engine
	 * sets). */
	int (*view)(struct kvti_eng *e, struct kvti_ereq *r);
	/* Start loading @tokens more of r's loadable prefix (after what it
	 * holds or loads): update r->load_upto / load_base / load_flows /
	 * loaded[]; kvti_eng_loads_done() once they are all home. */
	int (*load)(struct kvti_eng *e, struct kvti_ereq *r, uint32_t tokens);
	/* optional: r's loads in flight are expected home at (clock) */
	double (*load_eta)(struct kvti_eng *e, struct kvti_ereq *r);
	/* A waiting request starts computing after its first it->reuse
	 * tokens (mark what it computes as transient). */
	int (*start)(struct kvti_eng *e, struct kvti_ereq *r,
		     const kvt_sched_item *it);
	/* The step is planned: e->compute_s of GPU time, e->pending running
	 * requests still waiting for loads. The GPU ends it with
	 * kvti_eng_step_end(e, e->step_gen). */
	int (*step_begin)(struct kvti_eng *e);
	/* optional: the last load the step waited for is home at @t */
	void (*step_loads_home)(struct kvti_eng *e, double t);
	/* optional: extra seconds of engine time this step (simulator: CPU
	 * time stretched by memory latency) */
	double (*step_extra_s)(struct kvti_eng *e);
	/* r's prefill advanced to r->done (whole pages committed, copies or
	 * stores started; set r->priv-independent state only); @last: the
	 * prompt is done. */
	int (*computed)(struct kvti_eng *e, struct kvti_ereq *r, int last);
	/* optional: the prompt's pages are no longer being computed */
	int (*prompt_done)(struct kvti_eng *e, struct kvti_ereq *r);
	/* r releases what it holds (pins, marks, claims on the data
	 * plane); @preempt: it goes back to the queue, else it finished */
	int (*release)(struct kvti_eng *e, struct kvti_ereq *r, int preempt);
	/* optional: the claims of prefetched requests were given back */
	int (*unclaim)(struct kvti_eng *e, struct kvti_ereq *r);
	/* r is over (its last token): the platform's statistics; the
	 * engine no longer references r. */
	int (*finished)(struct kvti_eng *e, struct kvti_ereq *r);
	/* optional: r got its first token */
	void (*first_token)(struct kvti_eng *e, struct kvti_ereq *r);
	/* optional: a step is idle with work waiting: is anything moving
	 * that will wake the engine (loads, stores)? 1 yes, 0 no */
	int (*busy_io)(struct kvti_eng *e);
	/* optional: fill the parts of the scheduler's state the engine does
	 * not know (tier rates and queues) before each plan */
	void (*sched_state)(struct kvti_eng *e, kvt_sched_state *st);
	/* optional: an invariant check after a step that changed state */
	int (*check)(struct kvti_eng *e);
};

struct kvti_eng_config {
	const kvt_sched_config *sched;
	const kvt_cost *cost;
	uint64_t hbm_pages;
	int store_holds_hbm;     /* copies down hold hbm until they land */
	int preempt;             /* see CAPACITY */
	uint32_t idx;            /* the engine's number, for messages */
};

struct kvti_eng {
	const struct kvti_eng_ops *ops;
	void *arg;                /* the platform's */
	kvt_cost cost;
	kvt_sched *sched;
	uint32_t P;               /* tokens per page */
	uint32_t idx;
	uint64_t hbm_pages;
	int store_holds_hbm, preempt, sync_store, overlap;

	struct kvti_ereq **wait;  /* arrival order (preempted at the head) */
	uint32_t nwait, wait_cap;
	struct kvti_ereq **run;   /* prefilling, then decoding */
	uint32_t nrun, run_cap;

	/* the step in progress */
	int busy;                 /* a step is running (or blocked) */
	int blocked;              /* waiting for its stores (sync_store) */
	int rekick;               /* loads finished during a plan */
	double t0, compute_s;
	uint32_t pending;         /* running requests whose loads move */
	uint64_t step_gen;
	uint32_t store_flows;     /* sync_store: this step's stores moving */
	uint32_t room_flows;      /* copies making room for this step's
				   * stores, which its end waits for (the
				   * store call makes room before it returns:
				   * kvti_eng_room_tag()) */
	uint64_t room_waits;      /* steps whose end waited for room */
	int room_held;            /* blocked with room copies moving */
	double room_t0, room_wait_s; /* since when; how long, all of them */
	uint32_t step_prefills, step_decodes;
	uint32_t step_tokens;     /* prefill tokens of the step */

	/* scratch for the scheduler */
	kvt_sched_req *sq;
	kvt_sched_item *si;
	struct kvti_ereq **sreqs;
	uint32_t scap;
	kvt_sched_state st;       /* the last plan's state (the platform's
				   * view fills tier rates before kick) */

	uint64_t priv_pages;      /* pages outside the index (decode) */
	uint64_t claimed;         /* sum of the requests' claims */
	uint64_t storing;         /* hbm pages of finished requests (or of
				   * none) whose copies down still move */

	/* accounting */
	double busy_s, stall_s;
	uint64_t steps, decode_only, deferred, preemptions;
	uint64_t hit[KVT_TIER_COUNT];       /* reused tokens by source */
	uint64_t recomputed[KVT_TIER_COUNT];/* cached tokens computed */
	uint64_t computed;                  /* prefill tokens computed */
	/* where TTFT goes (kvti_eng_breakdown()) */
	struct kvti_eng_breakdown {
		uint64_t n;           /* requests with a first token */
		double queue_s;       /* arrival -> first start, summed */
		double run_s;         /* first start -> first token, summed */
		double step_wall_s;   /* steps: plan to end, summed */
		double step_model_s;  /* their priced time (compute_s) */
		double idle_s;        /* no step running, work waiting */
		double run_wall_s;    /* the steps a request prefilled in */
		double run_model_s;
		uint64_t run_steps;
		uint64_t steps_waiting; /* steps planned with requests waiting */
		uint64_t waiting_sum; /* waiting requests at each plan, summed */
	} bd;
	double last_end;          /* when the last step ended */
	int error;                /* first error; the engine stops */
};

int kvti_eng_init(struct kvti_eng *e, const struct kvti_eng_config *c,
		  const struct kvti_eng_ops *ops, void *arg);
void kvti_eng_fini(struct kvti_eng *e);

/* A request arrives; the engine holds it until ops->finished:
 * kvti_eng_enqueue() (-ENOMEM: the engine does not hold it) then
 * kvti_eng_kick(), which kvti_eng_arrive() does both. */
int kvti_eng_enqueue(struct kvti_eng *e, struct kvti_ereq *r);
int kvti_eng_arrive(struct kvti_eng *e, struct kvti_ereq *r);
/* Start a step if idle and there is work. */
int kvti_eng_kick(struct kvti_eng *e);
/* All of r's loads are home (ok: 1), or some failed: the first @ok_upto
 * prompt tokens are good (r computes the rest again). */
void kvti_eng_loads_done(struct kvti_eng *e, struct kvti_ereq *r,
			 uint32_t ok_upto);
/* The step of generation @gen ended. */
int kvti_eng_step_end(struct kvti_eng *e, uint64_t gen);

/* Copies out of hbm (stores, copies down). Pages that hold hbm until their
 * copy is done (store_holds_hbm) are added to @r's (or, r NULL, the
 * engine's) storing count; a synchronous save blocks its step until every
 * copy tagged with the step is done. */
void kvti_eng_storing_add(struct kvti_eng *e, struct kvti_ereq *r,
			  uint64_t pages);
/* The request with id @owner (0 or a finished one: the engine) has @pages
 * fewer pages held by copies down. */
void kvti_eng_storing_sub(struct kvti_eng *e, uint64_t owner, uint64_t pages);
/* One copy out of hbm starts: its tag (the step's generation while a step
 * runs, else 0); kvti_eng_store_done(tag) when it is done. */
uint64_t kvti_eng_store_tag(struct kvti_eng *e);
/* One copy that makes room for a store of this step starts (a demotion the
 * store's insert caused: kvt_cache_store() runs that batch before it
 * returns, on the engine's thread): the step's end — and the first tokens
 * of its finished prefills — wait for it whatever the save policy; its tag
 * (0 while no step runs) goes to kvti_eng_store_done() too. */
uint64_t kvti_eng_room_tag(struct kvti_eng *e);
int kvti_eng_store_done(struct kvti_eng *e, uint64_t tag);

/* From now on r holds hbm pages for its whole prompt (a data plane's load
 * op calls it when it issues a request's first load). */
void kvti_eng_claim(struct kvti_eng *e, struct kvti_ereq *r);
/* Free hbm pages as the scheduler sees them. */
uint64_t kvti_eng_free_pages(const struct kvti_eng *e);
/* Record the engine's first error (returns it). */
int kvti_eng_fail(struct kvti_eng *e, int err);

#endif
