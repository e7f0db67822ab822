/*
 * serve_impl.h — the insides of one demo pass (internal), shared by:
 *
 *   serve.c       the engine's platform: its ops (loads, starts, stores,
 *                 releases, finishes), the block pool, arrivals, the event
 *                 loop, opening and closing a pass
 *   serve_view.c  what the scheduler sees of the live cache: a request's
 *                 tier runs and loads, the transient table (pages another
 *                 request is computing), measured rates and load queues
 *   serve_gpu.c   the emulated GPU (a step spent in real time, layer by
 *                 layer, waiting for loads) and the jobs it reaps
 *
 * Single-threaded: everything here runs on the pass's one thread; the
 * cache's own threads do the copies.
 */
#ifndef KVT_DEMO_SERVE_IMPL_H
#define KVT_DEMO_SERVE_IMPL_H

#include "demo/demo_impl.h"
#include "engine/engine.h"
#include "sim/sim_impl.h"

struct dreq;

/* A job in flight: a request's load or store. */
struct pjob {
	struct djob *j;
	struct dreq *r;          /* NULL once its request is gone (store) */
	uint64_t owner;          /* the request's id */
	int store;
	uint32_t first, end;     /* pages [first, end) of the prefix */
	uint32_t *blocks;        /* store: the blocks it reads */
	uint64_t tag;            /* store: kvti_eng_store_tag() */
	double bytes[KVT_TIER_COUNT]; /* load: bytes by source tier */
	uint64_t t0;
	struct pjob *next;
};

struct dreq {
	struct kvti_ereq er;     /* first member */
	struct wl_item it;
	uint32_t session;
	uint32_t *tok;           /* prompt + output tokens */
	kvt_page_key *keys;      /* every full page of prompt + output */
	uint32_t nkeys;
	uint32_t *blk;           /* blocks held, in page order */
	uint32_t nblk, blk_cap;
	uint32_t landed;         /* prompt tokens its loads brought, checked */
	uint32_t fail_at;        /* pages from here failed (UINT32_MAX: none) */
	uint32_t nloads;         /* load jobs in flight */
	uint32_t stored;         /* pages its stores have taken */
	uint32_t marked_from;    /* transient marks: pages [from, to) */
	uint32_t marked_to;
	int touched;
	kvt_cache_run runs[KVT_CACHE_MAX_RUNS];
	size_t nruns;
	kvt_cache_lookup_result lr; /* the last lookup, and when */
	uint64_t lr_ns;
	kvt_demo_req *out;
};

struct tent {
	kvt_page_key k;
	uint64_t ticket;         /* 0: empty; UINT64_MAX: deleted */
	double ready;
};

struct serve {
	const struct kvti_demo_pass_cfg *pc;
	const kvt_demo_config *c;
	kvt_demo_pass *out;
	struct kvti_eng eng;
	struct dplane dp;
	struct dmem mem;
	kvt_sched_config scfg;
	kvt_cost cost;
	uint32_t P, L;
	uint64_t t0;
	/* blocks */
	uint32_t *freel;
	uint64_t nfree;
	/* the engine's checks of restored blocks, run in the step thread's
	 * slack (serve_gpu.c): per block a pending check's page seed and the
	 * request it answers to, and a FIFO of the blocks pending */
	uint8_t *chk_pending;
	uint64_t *chk_seed;
	kvt_demo_req **chk_out;
	uint32_t *chk_q;
	uint64_t chk_head, chk_tail, chk_cap;
	int tampered_engine;     /* the engine-memory hook has fired */
	uint8_t *bref;           /* store jobs reading the block */
	uint8_t *borphan;        /* its request is gone */
	/* jobs */
	struct pjob *jobs;
	uint32_t njobs;
	uint32_t *failed;        /* scratch for failed lists */
	/* arrivals */
	struct wl wl;
	struct wl_item *arr;     /* a min-heap by arrival */
	uint32_t narr, arr_cap;
	uint64_t next_id;
	size_t finished, total;
	/* the GPU */
	int step_due;
	uint64_t step_gen;
	double overrun_s, load_wait_s;
	uint64_t store_skipped;  /* pages a store could not place */
	double plan_s;           /* the engine's own work between steps */
	double late_s;           /* steps longer than modeled + their waits */
	double plan_pf_s, late_pf_s; /* the same, of the steps with prefills */
	uint64_t plans;
	/* where a step's time goes, [0] no job in flight, [1] some */
	double bd_pre[2], bd_sleep[2], bd_wall[2], bd_model[2], bd_wait[2];
	double bd_wake_s;       /* blocked layer waits: landed -> woke */
	uint64_t bd_wakes;      /*  and how many (the GPU does not pay it) */
	double bd_write[2];
	uint64_t bd_steps[2];
	double bd_ld_bytes, bd_ld_actual, bd_ld_expect, bd_ld_room, bd_ld_l0;
	uint64_t bd_loads, bd_ld_stores;
	/* stores: calls and their time on the step thread; of the jobs that
	 * ended, their waits for room (wait_s) and submission to done */
	double bd_st_call, bd_st_room, bd_st_total;
	uint64_t bd_st_calls, bd_stores;
	/* measured rates */
	double gbps[KVT_TIER_COUNT];
	double job_kib[KVT_TIER_COUNT]; /* mean load job size, per tier */
	double gbps_sum[KVT_TIER_COUNT], gbps_s[KVT_TIER_COUNT]; /* the
				   * measured rates' time integral, and over
				   * how long (the pass's mean rate) */
	uint64_t rates_at;
	/* transient table */
	struct tent *tt;
	uint32_t tt_cap, tt_used;
	/* progress */
	uint64_t progress_at;
	int err;
};

static inline struct serve *kvti_sv(struct kvti_eng *e)
{
	return e->arg;
}

static inline struct dreq *kvti_dq(struct kvti_ereq *r)
{
	return (struct dreq *)r;
}

/* Seconds since the pass started (the engine's wall clock). */
static inline double kvti_sv_now(const struct serve *s)
{
	return (double)(kvt_now_ns() - s->t0) / 1e9;
}

/* ---- serve.c ---------------------------------------------------------------- */

/* Record the pass's first error (out->error: "@what: detail"); returns @err. */
int kvti_sv_fail(struct serve *s, int err, const char *what);
/* Block @b back to the free list. */
void kvti_sv_block_put(struct serve *s, uint32_t b);

/* ---- serve_view.c ----------------------------------------------------------- */

/* Mark page @k computed by request @ticket, expected ready at @ready (the
 * first mark of a page stays). */
int kvti_tt_put(struct serve *s, kvt_page_key k, uint64_t ticket,
		double ready);
/* Drop @r's marks on pages [from, to). */
void kvti_tt_drop(struct serve *s, const struct dreq *r, uint32_t from,
		  uint32_t to);
/* Refresh the measured per-tier load rates (at most every 20 ms). */
void kvti_sv_rates(struct serve *s);
/* The tier of the loadable page @p of @r's last lookup. */
uint32_t kvti_sv_tier_at(const struct dreq *r, uint32_t p);
/* The engine's view, load_eta and sched_state ops. */
int kvti_sv_view(struct kvti_eng *e, struct kvti_ereq *er);
double kvti_sv_load_eta(struct kvti_eng *e, struct kvti_ereq *er);
void kvti_sv_sched_state(struct kvti_eng *e, kvt_sched_state *st);

/* ---- serve_gpu.c ------------------------------------------------------------ */

/* Collect every job that is done (loads checked, stores committed). */
void kvti_sv_reap(struct serve *s);
/* The engine's checks of restored blocks: queue one (load_end), run those
 * pending while the thread has until @deadline_ns to spare (0: all now),
 * run @b's now if pending (before the block is reused). */
void kvti_sv_check_defer(struct serve *s, uint32_t b, uint64_t seed,
			 kvt_demo_req *o);
void kvti_sv_check_run(struct serve *s, uint64_t deadline_ns);
void kvti_sv_check_block(struct serve *s, uint32_t b);
/* Run the planned step on the emulated GPU, in real time. */
void kvti_sv_gpu_step(struct serve *s);

#endif
