/*
 * engine.h — one simulated engine instance (internal): the step loop of
 * src/engine/ on the simulator's virtual clock, over its own radix index
 * (an hbm pool and the offload pools) and modelled links. engine.c holds
 * the data plane and the GPU model; sim.c owns the clock.
 */
#ifndef KVT_SIM_ENGINE_H
#define KVT_SIM_ENGINE_H

#include "sim/sim_impl.h"
#include "engine/engine.h"

struct sreq {
	struct kvti_ereq er;      /* the engine's view (first member) */
	struct wl_item it;
	struct engine *e;
	uint32_t *tok;            /* prompt tokens, while needed */
	uint32_t pinned;          /* prefix tokens pinned (one lease) */
	uint32_t stored;          /* store_top: pages stored down */
	/* KVT_ENG_BREAKDOWN: the load in flight (from its first flow) */
	double ld_t0, ld_l0, ld_bytes;
};

static inline struct sreq *sreq_of(struct kvti_ereq *r)
{
	return (struct sreq *)r;
}

struct engine {
	struct kvti_eng eng;      /* the step loop (first member) */
	struct sim *sim;
	uint32_t idx, gpu0, tp;
	kvt_geom geom;
	kvt_cost cost;
	kvt_index *index;
	kvt_pool *pool[KVT_TIER_COUNT];
	uint64_t page_bytes;      /* one rank's page */
	uint64_t hbm_pages;
	int hbm_reuse;

	/* mover accumulation: pages per (src, dst) tier pair */
	uint64_t mv[KVT_TIER_COUNT][KVT_TIER_COUNT];
	struct sreq *flush_owner; /* whose pages the next flush stores */

	kvt_page_loc *locs;       /* per-page view of one match */
	size_t nlocs;
	kvt_page_info *info;      /* per-page records (hbm_share off) */
	uint64_t ninfo;
	double step_host_s;       /* the step's host time (engine.host_us,
				   * engine.host_prefill_us): serial, before
				   * and after its GPU work, never hidden
				   * behind the loads the GPU waits for */
	double step_run_at;       /* the latest first move of a load the
				   * step waits for (0: none) */
	/* measured_rates: what loads from each tier reached (bytes/s) */
	double tier_rate[KVT_TIER_COUNT];
	/* KVT_ENG_BREAKDOWN: loads (as the demo's "demo loads" line) and the
	 * steps that waited for them */
	uint64_t bd_loads, bd_wait_steps;
	uint64_t bg_passes;       /* background demotion passes (bg_high) */
	uint64_t stage_hops;      /* ssd loads' second hops (ssd_stage_pages) */
	int room;                 /* flush_moves(): tier-to-tier copies make
				   * room for a store (store_room_wait) */
	int bg;                   /* flush_moves(): the background pass's */
	/* store_room_wait: the background pass's copies in flight, by the
	 * tier they read (the slots they free are the next stores' — a store
	 * writes one only once no copy reads it: kvti_cache_slot_settle()),
	 * and the room tag of the step waiting for each (0: none) */
	struct bg_flow {
		uint64_t id, waiter;
		uint8_t src;
	} *bgf;
	size_t nbgf, bgf_cap;
	uint64_t bg_seq;
	double bd_ld_bytes, bd_ld_actual, bd_ld_l0, bd_wait_s;
};

int kvti_engine_init(struct engine *e, struct sim *s, uint32_t idx);
void kvti_engine_fini(struct engine *e);
/* A request arrives (the engine takes it over). 0 or -ENOMEM. */
int kvti_engine_arrive(struct engine *e, struct sreq *r);
/* The step's end event. */
int kvti_engine_step_end(struct engine *e, uint64_t gen);

#endif
