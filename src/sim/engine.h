/*
 * engine.h — one simulated engine instance (internal): TP GPUs, its radix
 * index over an hbm pool and the offload pools, its scheduler, and the
 * requests it serves. engine.c holds the picture; sim.c owns the clock.
 */
#ifndef KVT_SIM_ENGINE_H
#define KVT_SIM_ENGINE_H

#include "sim/sim_impl.h"

enum req_state { R_WAIT = 0, R_PREFILL, R_DECODE, R_DONE };

struct sreq {
	struct wl_item it;
	uint64_t id;              /* index ticket, never 0 */
	struct engine *e;
	uint32_t *tok;            /* prompt tokens, while needed */
	int state;                /* enum req_state */
	uint32_t done;            /* prompt tokens in hbm (computed/loaded) */
	uint32_t generated;
	double first_token, finish;
	kvt_sched_req sr;         /* the scheduler's view; .skips persists */
	uint32_t marked;          /* pages under this ticket's marks */
	/* loads */
	uint32_t load_upto;       /* prefix tokens loaded or being loaded */
	uint32_t load_base;       /* hbm prefix when the loads were issued */
	uint32_t load_flows;      /* flows still moving */
	double load_eta;
	uint64_t claim;           /* hbm pages held for it (its whole prompt,
				   * from its first load or its start) */
	uint32_t pinned;          /* prefix tokens pinned (one lease) */
	/* the step it runs in */
	uint32_t step_compute;    /* tokens it computes in the current step */
	uint32_t step_reuse;      /* its reuse when it starts */
	int in_step;
	int counted;              /* hits counted */
	uint32_t loaded[KVT_TIER_COUNT]; /* tokens it loaded, by source */
	uint32_t reused;          /* prefix tokens it did not compute */
	uint32_t priv;            /* private hbm pages (partial page, decode) */
	uint64_t storing;         /* its hbm pages whose copies down are still
				   * moving (counted on the first rank) */
};

struct engine {
	struct sim *sim;
	uint32_t idx, gpu0, tp;
	kvt_geom geom;
	kvt_cost cost;
	kvt_sched *sched;
	kvt_index *index;
	kvt_pool *pool[KVT_TIER_COUNT];
	uint64_t page_bytes;      /* one rank's page */
	uint64_t hbm_pages;
	int hbm_reuse;

	struct sreq **wait;       /* arrival order */
	uint32_t nwait, wait_cap;
	struct sreq **run;        /* prefilling, then decoding */
	uint32_t nrun, run_cap;

	/* the step in progress */
	int busy;                 /* a step is running (or blocked) */
	int blocked;              /* waiting for stores (sync_store) */
	int rekick;               /* loads finished during a plan */
	double t0, compute_s;
	uint32_t pending;         /* running requests whose loads move */
	uint64_t step_gen;
	uint32_t store_flows;     /* sync_store: stores of this step moving */
	int step_stored;          /* this step issued stores */

	/* mover accumulation: pages per (src, dst) tier pair */
	uint64_t mv[KVT_TIER_COUNT][KVT_TIER_COUNT];

	/* scratch for the scheduler */
	kvt_sched_req *sq;
	kvt_sched_item *si;
	struct sreq **sreqs;
	uint32_t scap;
	kvt_page_loc *locs;       /* per-page view of one match */
	uint64_t nlocs;

	uint64_t priv_pages;      /* pages outside the index (decode) */
	uint64_t claimed;         /* sum of the requests' claims */
	uint64_t storing;         /* hbm pages of finished requests (or of
				   * none) whose copies down still move: not
				   * free until they are (store_holds_hbm) */
	struct sreq *flush_owner; /* whose pages the next flush stores */

	/* accounting */
	double busy_s, stall_s;
	uint64_t steps, decode_only, deferred;
};

int kvti_engine_init(struct engine *e, struct sim *s, uint32_t idx);
void kvti_engine_fini(struct engine *e);
/* A request arrives (the engine takes it over). 0 or -ENOMEM. */
int kvti_engine_arrive(struct engine *e, struct sreq *r);
/* Start a step if idle and there is work. */
int kvti_engine_kick(struct engine *e);
/* The step's end event. */
int kvti_engine_step_end(struct engine *e, uint64_t gen);

#endif
