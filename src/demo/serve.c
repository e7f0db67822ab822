/*
 * serve.c — one pass of the demo: the serving engine's step loop
 * (src/engine/engine.c, the one the simulator runs) on the wall clock, over
 * the real cache. This file is its platform:
 *
 *   clock       kvt_now_ns() since the pass started
 *   data plane  the cache (dplane.c: in process or through the daemon)
 *     view      kvt_cache_lookup_runs() of the prompt's pages: tier runs in
 *               prefix order; the request's own loads (landed, in flight);
 *               pages another running request is computing right now (the
 *               transient table below) or storing (the lookup's in-flight
 *               pages); the transfer engine's measured rates per tier
 *               (kvt_cache_rates()) and the queues of loads in flight
 *     load      kvt_cache_load() of pages [from, upto) into its blocks
 *     computed  kvt_cache_store() of the pages its prefill completed
 *               (first store of a request: the whole prefix, so a parent
 *               the top tier lacks is copied from the engine's memory)
 *   GPU         emulated, in this thread: a step takes the cost model's
 *               time, spent layer by layer (sleep, then spin the last
 *               50 us); before layer l it waits for layer l of every load
 *               of its requests (layer-wise policies) or for whole loads
 *               (before layer 0); during layer l it writes layer l of every
 *               page the step completes
 *
 *   event loop (one thread):
 *
 *     +--> arrivals due -> kvti_eng_arrive()       (Poisson sessions; a
 *     |    jobs done    -> loads: kvti_eng_loads_done(), engine check;  next
 *     |                    stores: kvti_eng_store_done(), blocks free   turn
 *     |    a step due   -> GPU step, jobs done, kvti_eng_step_end()     after
 *     |    nothing      -> poll(job fd, until the next arrival)         think)
 *     +----------------------------------------------------------------+
 *
 * BLOCKS. The engine's block pool: a free list; a request takes blocks for
 * its whole prompt when it is claimed (its first load or its start) and one
 * more per page its decode fills; a store job reads blocks until it is done
 * (bref), so a request's blocks go back to the free list when it is done
 * AND no store reads them. The engine's accounting (claims, private pages,
 * pages held by stores) is the same, page for page.
 *
 * TRANSIENT TABLE: page key -> (ticket, expected ready time) for every page
 * a running request computes from its start until its store of the page
 * commits (or it gives up on storing it); a waiting request whose prefix
 * runs into such pages is told how many and when (DELAYHIT waits for them
 * instead of computing them twice).
 *
 * Single-threaded: the cache's own threads do the copies.
 */
#include "demo/demo_impl.h"
#include "engine/engine.h"
#include "sim/sim_impl.h"

#include <errno.h>
#include <math.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define SPIN_NS 50000u  /* spin, not sleep, for the last 50 us of a span */
#define RATES_EVERY_NS 20000000ull /* measured rates refreshed every 20 ms */
#define STORE_GUESS_S 0.005 /* a page being stored: expected home soon */
#define LOOKUP_EVERY_NS 20000000ull /* a waiting request's lookup: 20 ms */

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
	uint64_t plans;
	/* measured rates */
	double gbps[KVT_TIER_COUNT];
	uint64_t rates_at;
	/* transient table */
	struct tent *tt;
	uint32_t tt_cap, tt_used;
	/* progress */
	uint64_t progress_at;
	int err;
};

static struct serve *sv_of(struct kvti_eng *e)
{
	return e->arg;
}

static struct dreq *dq(struct kvti_ereq *r)
{
	return (struct dreq *)r;
}

static double sv_now(const struct serve *s)
{
	return (double)(kvt_now_ns() - s->t0) / 1e9;
}

static int sv_fail(struct serve *s, int err, const char *what)
{
	if (err && !s->err) {
		s->err = err;
		snprintf(s->out->error, sizeof(s->out->error), "%s: %s", what,
			 kvt_errdetail()[0] ? kvt_errdetail() :
			 kvt_strerror(err));
	}
	return err;
}

/* ---- the transient table ------------------------------------------------ */

static uint32_t th(kvt_page_key k, uint32_t cap)
{
	return (uint32_t)((k.lo ^ (k.hi * 0x9e3779b97f4a7c15ull)) >> 17) &
	       (cap - 1);
}

static struct tent *tt_find(struct serve *s, kvt_page_key k)
{
	for (uint32_t i = th(k, s->tt_cap), n = 0; n < s->tt_cap;
	     i = (i + 1) & (s->tt_cap - 1), n++) {
		struct tent *t = &s->tt[i];

		if (!t->ticket)
			return NULL;
		if (t->ticket != UINT64_MAX && t->k.lo == k.lo && t->k.hi == k.hi)
			return t;
	}
	return NULL;
}

static int tt_grow(struct serve *s);

static int tt_put(struct serve *s, kvt_page_key k, uint64_t ticket,
		  double ready)
{
	struct tent *t = tt_find(s, k);
	uint32_t i;

	if (t) { /* another request computes it too: the first mark stays */
		return 0;
	}
	if ((s->tt_used + 1) * 2 > s->tt_cap && tt_grow(s))
		return -ENOMEM;
	for (i = th(k, s->tt_cap);; i = (i + 1) & (s->tt_cap - 1))
		if (!s->tt[i].ticket || s->tt[i].ticket == UINT64_MAX)
			break;
	if (!s->tt[i].ticket)
		s->tt_used++;
	s->tt[i] = (struct tent){ k, ticket, ready };
	return 0;
}

static int tt_grow(struct serve *s)
{
	struct tent *old = s->tt;
	uint32_t n = s->tt_cap;

	s->tt = kvt_calloc(2 * n, sizeof(*s->tt));
	if (!s->tt) {
		s->tt = old;
		return -ENOMEM;
	}
	s->tt_cap = 2 * n;
	s->tt_used = 0;
	for (uint32_t i = 0; i < n; i++)
		if (old[i].ticket && old[i].ticket != UINT64_MAX)
			tt_put(s, old[i].k, old[i].ticket, old[i].ready);
	kvt_free(old);
	return 0;
}

/* Drop @r's marks on pages [from, to). */
static void tt_drop(struct serve *s, const struct dreq *r, uint32_t from,
		    uint32_t to)
{
	for (uint32_t p = from; p < to && p < r->nkeys; p++) {
		struct tent *t = tt_find(s, r->keys[p]);

		if (t && t->ticket == r->er.id)
			t->ticket = UINT64_MAX;
	}
}

/* ---- blocks ----------------------------------------------------------------- */

/* @r holds blocks for its first @n pages (or as many as are free). */
static int take_blocks(struct serve *s, struct dreq *r, uint32_t n)
{
	if (n > r->blk_cap) {
		uint32_t *b = kvt_realloc(r->blk, n * sizeof(*b));

		if (!b)
			return -ENOMEM;
		r->blk = b;
		r->blk_cap = n;
	}
	while (r->nblk < n) {
		if (!s->nfree)
			return kvti_fail(-ENOSPC, "demo engine: no free block "
					 "(%u held by the request, %u wanted)",
					 r->nblk, n);
		r->blk[r->nblk++] = s->freel[--s->nfree];
	}
	return 0;
}

static void block_put(struct serve *s, uint32_t b)
{
	s->borphan[b] = 0;
	s->freel[s->nfree++] = b;
}

/* @r lets go of its blocks; those a store still reads go back later. */
static void drop_blocks(struct serve *s, struct dreq *r)
{
	for (uint32_t i = 0; i < r->nblk; i++) {
		uint32_t b = r->blk[i];

		if (s->bref[b])
			s->borphan[b] = 1;
		else
			block_put(s, b);
	}
	r->nblk = 0;
}

/* ---- measured rates and queues ------------------------------------------- */

static void refresh_rates(struct serve *s)
{
	static kvt_xfer_rate rt[KVT_TIER_COUNT][KVT_TIER_COUNT];
	uint64_t now = kvt_now_ns();

	if (now - s->rates_at < RATES_EVERY_NS && s->rates_at)
		return;
	s->rates_at = now;
	if (kvti_dp_rates(&s->dp, rt))
		return;
	for (int t = KVT_TIER_FABRIC; t < KVT_TIER_REMOTE; t++)
		if (rt[t][KVT_TIER_HBM].gbps > 0)
			s->gbps[t] = rt[t][KVT_TIER_HBM].gbps;
}

/* When the loads in flight from each tier are expected done. */
static void tier_queues(struct serve *s, double *free_at)
{
	double now = sv_now(s);

	for (int t = 0; t < KVT_TIER_COUNT; t++)
		free_at[t] = now;
	for (struct pjob *j = s->jobs; j; j = j->next) {
		double age = (double)(kvt_now_ns() - j->t0) / 1e9;

		if (j->store)
			continue;
		for (int t = KVT_TIER_FABRIC; t < KVT_TIER_REMOTE; t++)
			if (j->bytes[t] > 0 && s->gbps[t] > 0)
				free_at[t] += KVT_MAX(0.0, j->bytes[t] /
						      (s->gbps[t] * 1e9) - age);
	}
}

static void op_sched_state(struct kvti_eng *e, kvt_sched_state *st)
{
	struct serve *s = sv_of(e);

	refresh_rates(s);
	for (int t = KVT_TIER_FABRIC; t < KVT_TIER_REMOTE; t++)
		st->tier_gbps[t] = s->gbps[t];
	tier_queues(s, st->tier_free_at);
}

/* ---- the data plane ops ----------------------------------------------------- */

static double op_now(struct kvti_eng *e)
{
	return sv_now(sv_of(e));
}

/* The tier of the loadable page @p (runs from page 0), or the last run's. */
static uint32_t tier_at(const struct dreq *r, uint32_t p)
{
	uint32_t at = 0;

	for (size_t i = 0; i < r->nruns; i++) {
		if (p < at + r->runs[i].pages)
			return r->runs[i].tier;
		at += r->runs[i].pages;
	}
	return r->nruns ? r->runs[r->nruns - 1].tier : KVT_TIER_SSD;
}

static int op_view(struct kvti_eng *e, struct kvti_ereq *er)
{
	struct serve *s = sv_of(e);
	struct dreq *r = dq(er);
	kvt_sched_req *q = &er->sr;
	uint32_t P = s->P, full = er->prompt / P, H, U, Lp, E, p;
	kvt_cache_lookup_result lr;
	double now = sv_now(s), ready = 0;
	uint64_t tn = kvt_now_ns();
	int err;

	/* one lookup per request per LOOKUP_EVERY_NS, as engines cache a
	 * request's lookup (vLLM's connectors are asked when it is first
	 * scheduled; LMCache keeps the answer per request id): a page that
	 * moved since fails alone at the load and is computed */
	if (!r->lr_ns || tn - r->lr_ns >= LOOKUP_EVERY_NS) {
		err = kvti_dp_lookup(&s->dp, r->keys, full,
				     r->touched ? 0 : KVT_LOOKUP_TOUCH, &r->lr,
				     r->runs, &r->nruns);
		if (err)
			return sv_fail(s, err, "lookup");
		r->touched = 1;
		r->lr_ns = tn;
	}
	lr = r->lr;
	H = r->landed / P;                 /* pages it holds, checked */
	U = er->load_upto / P;             /* pages loaded or loading */
	Lp = (uint32_t)KVT_MIN(lr.pages, (uint64_t)full);
	E = KVT_MAX(KVT_MAX(U, Lp), H);
	q->hbm = H * P;
	q->nruns = 0;
	for (p = H; p < E; p++) { /* the loadable span as runs */
		uint32_t t = tier_at(r, p);

		q->tier[t] += P;
		if (q->nruns && q->run_tier[q->nruns - 1] == t)
			q->run_tokens[q->nruns - 1] += P;
		else if (q->nruns < KVT_SCHED_RUNS) {
			q->run_tier[q->nruns] = t;
			q->run_tokens[q->nruns++] = P;
		} else { /* more runs than the scheduler takes: merge */
			q->run_tokens[q->nruns - 1] += P;
			q->tier[q->run_tier[q->nruns - 1]] += P;
			q->tier[t] -= P;
		}
	}
	if (er->load_flows || U > H) {
		q->loading = (U - H) * P;
		q->loading_ready = er->load_flows ?
			KVT_MAX(er->load_eta, now + 1e-6) : now;
	}
	/* right after: pages being stored, then pages being computed */
	for (p = E; p < full; p++) {
		struct tent *t;

		if (p < lr.pages + lr.inflight && E == Lp) {
			ready = KVT_MAX(ready, now + STORE_GUESS_S);
		} else if ((t = tt_find(s, r->keys[p])) &&
			   t->ticket != er->id) {
			ready = KVT_MAX(ready, t->ready);
		} else {
			break;
		}
		q->transient += P;
	}
	if (q->hbm + (E - H) * P + q->transient > er->prompt)
		q->transient = er->prompt - q->hbm - (E - H) * P;
	q->transient_ready = ready;
	return 0;
}

static double op_load_eta(struct kvti_eng *e, struct kvti_ereq *er)
{
	struct serve *s = sv_of(e);
	double free_at[KVT_TIER_COUNT], eta = sv_now(s);

	tier_queues(s, free_at);
	for (struct pjob *j = s->jobs; j; j = j->next)
		if (!j->store && j->r == dq(er))
			for (int t = 0; t < KVT_TIER_COUNT; t++)
				if (j->bytes[t] > 0)
					eta = KVT_MAX(eta, free_at[t]);
	return eta;
}

static int add_job(struct serve *s, struct dreq *r, int store, uint32_t first,
		   uint32_t end, struct djob *j, struct pjob **out)
{
	struct pjob *x = kvt_calloc(1, sizeof(*x));

	if (!x) {
		kvti_dj_free(j);
		return -ENOMEM;
	}
	x->j = j;
	x->r = r;
	x->owner = r->er.id;
	x->store = store;
	x->first = first;
	x->end = end;
	x->t0 = kvt_now_ns();
	x->next = s->jobs;
	s->jobs = x;
	s->njobs++;
	*out = x;
	return 0;
}

/* The request's blocks for its whole prompt: from its first load or its
 * start (the engine's claim). */
static int hold_prompt(struct serve *s, struct dreq *r)
{
	uint32_t n = (r->er.prompt + s->P - 1) / s->P;

	kvti_eng_claim(&s->eng, &r->er);
	return take_blocks(s, r, n);
}

static int op_load(struct kvti_eng *e, struct kvti_ereq *er, uint32_t tokens)
{
	struct serve *s = sv_of(e);
	struct dreq *r = dq(er);
	uint32_t P = s->P, from = er->load_flows || er->load_upto > er->sr.hbm ?
					  er->load_upto : er->sr.hbm;
	uint32_t upto = (from + tokens) / P * P, pf, pu;
	uint64_t tb = kvt_geom_token_bytes(&s->pc->g[0]);
	struct djob *j = NULL;
	struct pjob *x;
	int err;

	if (upto <= from)
		return 0;
	pf = from / P;
	pu = upto / P;
	if ((err = hold_prompt(s, r)))
		return sv_fail(s, err, "blocks");
	err = kvti_dp_job(&s->dp, 0, r->keys, pu, pf, r->blk + pf, &j);
	if (err)
		return sv_fail(s, err, "load");
	if ((err = add_job(s, r, 0, pf, pu, j, &x)))
		return sv_fail(s, err, "load");
	for (uint32_t p = pf; p < pu; p++) {
		uint32_t t = tier_at(r, p);

		x->bytes[t] += (double)P * (double)tb;
		er->loaded[t] += P;
	}
	if (!er->load_flows)
		er->load_base = from;
	er->load_upto = upto;
	er->load_flows++;
	r->nloads++;
	return 0;
}

static int op_start(struct kvti_eng *e, struct kvti_ereq *er,
		    const kvt_sched_item *it)
{
	struct serve *s = sv_of(e);
	struct dreq *r = dq(er);
	uint32_t full = er->prompt / s->P;
	double ready = sv_now(s) + kvt_cost_prefill_s(&s->cost,
				er->prompt - it->reuse, it->reuse);
	int err;

	if ((err = hold_prompt(s, r)))
		return sv_fail(s, err, "blocks");
	if (!r->out->start) /* a preempted request keeps its first start */
		r->out->start = sv_now(s);
	/* the context it computes, until its store of it commits */
	r->marked_from = it->reuse / s->P;
	r->marked_to = full;
	for (uint32_t p = r->marked_from; p < full; p++)
		if (tt_put(s, r->keys[p], er->id, ready))
			return sv_fail(s, -ENOMEM, "transient table");
	return 0;
}

static int op_step_begin(struct kvti_eng *e)
{
	struct serve *s = sv_of(e);

	s->step_due = 1;
	s->step_gen = e->step_gen;
	return 0;
}

/* Pages [r->stored, upto) of r's prefix go into the cache. */
static int store_pages(struct serve *s, struct dreq *r, uint32_t upto)
{
	uint32_t first = r->stored;
	struct djob *j = NULL;
	struct pjob *x;
	int err;

	if (upto <= first)
		return 0;
	/* the first store takes the whole prefix: a parent the top tier
	 * lacks is copied from the engine's memory, not read back up */
	if (r->stored == 0 && r->er.reused)
		first = 0;
	err = kvti_dp_job(&s->dp, 1, r->keys, upto, first, r->blk + first, &j);
	if (err == KVT_ENOTFOUND && first) { /* a parent left meanwhile */
		first = 0;
		err = kvti_dp_job(&s->dp, 1, r->keys, upto, 0, r->blk, &j);
	}
	if (err == KVT_EFULL || err == KVT_ENOTFOUND) {
		/* nowhere to put it now (the top tier is full of pages other
		 * jobs hold): these pages are not cached; counted */
		s->store_skipped += upto - first;
		kvti_debug("demo: store of %u pages skipped: %s", upto - first,
			   kvt_strerror(err));
		tt_drop(s, r, r->stored, upto);
		r->stored = upto;
		return 0;
	}
	if (err)
		return sv_fail(s, err, "store");
	if ((err = add_job(s, r, 1, first, upto, j, &x)))
		return sv_fail(s, err, "store");
	x->blocks = kvt_malloc((upto - first) * sizeof(*x->blocks));
	if (!x->blocks)
		return sv_fail(s, -ENOMEM, "store");
	for (uint32_t p = first; p < upto; p++) {
		x->blocks[p - first] = r->blk[p];
		s->bref[r->blk[p]]++;
	}
	x->tag = kvti_eng_store_tag(&s->eng);
	kvti_eng_storing_add(&s->eng, &r->er, upto - first);
	r->stored = upto;
	return 0;
}

static int op_computed(struct kvti_eng *e, struct kvti_ereq *er, int last)
{
	struct serve *s = sv_of(e);
	struct dreq *r = dq(er);
	uint32_t align = s->pc->pol->store_align, upto;

	(void)last;
	/* whole pages; whole chunks for a policy that saves chunks */
	upto = align ? er->done / align * align / s->P : er->done / s->P;
	upto = KVT_MIN(upto, er->prompt / s->P);
	return store_pages(s, r, upto);
}

static int op_prompt_done(struct kvti_eng *e, struct kvti_ereq *er)
{
	struct serve *s = sv_of(e);
	struct dreq *r = dq(er);

	/* pages it will never store are no longer coming */
	tt_drop(s, r, r->stored, r->marked_to);
	return 0;
}

static void cancel_loads(struct serve *s, struct dreq *r)
{
	for (struct pjob *j = s->jobs; j; j = j->next)
		if (!j->store && j->r == r)
			kvti_dj_wait(j->j, -1);
}

static int op_release(struct kvti_eng *e, struct kvti_ereq *er, int preempt)
{
	struct serve *s = sv_of(e);
	struct dreq *r = dq(er);

	cancel_loads(s, r); /* a running request's loads are done already */
	tt_drop(s, r, r->stored, r->marked_to);
	drop_blocks(s, r);
	r->landed = 0;
	if (preempt) {
		r->out->preempted++;
		r->touched = 0;
		r->lr_ns = 0;
	}
	return 0;
}

static int op_unclaim(struct kvti_eng *e, struct kvti_ereq *er)
{
	struct serve *s = sv_of(e);
	struct dreq *r = dq(er);

	drop_blocks(s, r);
	r->landed = 0;
	return 0;
}

static void op_first_token(struct kvti_eng *e, struct kvti_ereq *er)
{
	struct dreq *r = dq(er);

	(void)e;
	r->out->first_token = er->first_token;
}

static int arrival_push(struct serve *s, const struct wl_item *it);

static int op_finished(struct kvti_eng *e, struct kvti_ereq *er)
{
	struct serve *s = sv_of(e);
	struct dreq *r = dq(er);
	kvt_demo_req *o = r->out;
	struct wl_item next;
	int err = 0;

	o->finish = er->finish;
	o->first_token = er->first_token;
	o->ttft_s = er->first_token - er->arrival;
	o->tpot_s = er->generated > 1 ? (er->finish - er->first_token) /
						(er->generated - 1) : 0;
	{
		uint32_t rest = er->reused; /* as the engine counts hits */

		for (int t = KVT_TIER_FABRIC; t < KVT_TIER_COUNT; t++) {
			o->loaded_tokens[t] = KVT_MIN(rest, er->loaded[t]);
			rest -= o->loaded_tokens[t];
		}
		for (int t = 0; t < KVT_TIER_COUNT; t++)
			o->recomputed_tokens[t] = er->recomputed[t];
	}
	o->computed_tokens = er->computed;
	o->done = 1;
	s->out->done++;
	s->finished++;
	if (kvti_wl_next(&s->wl, &r->it, er->finish, &next))
		err = arrival_push(s, &next);
	/* its blocks went back in release (stores hold theirs) */
	kvt_free(r->tok);
	kvt_free(r->keys);
	kvt_free(r->blk);
	for (struct pjob *j = s->jobs; j; j = j->next)
		if (j->r == r)
			j->r = NULL;
	kvt_free(r);
	return err;
}

static int op_busy_io(struct kvti_eng *e)
{
	return sv_of(e)->njobs != 0;
}

static const struct kvti_eng_ops serve_ops = {
	.now = op_now,
	.view = op_view,
	.load = op_load,
	.load_eta = op_load_eta,
	.start = op_start,
	.step_begin = op_step_begin,
	.computed = op_computed,
	.prompt_done = op_prompt_done,
	.release = op_release,
	.unclaim = op_unclaim,
	.finished = op_finished,
	.first_token = op_first_token,
	.busy_io = op_busy_io,
	.sched_state = op_sched_state,
};

/* ---- jobs done -------------------------------------------------------------- */

static void job_unlink(struct serve *s, struct pjob *x)
{
	for (struct pjob **pp = &s->jobs; *pp; pp = &(*pp)->next)
		if (*pp == x) {
			*pp = x->next;
			s->njobs--;
			return;
		}
}

/* A load job is done: which pages came, checked by the engine too. */
static void load_end(struct serve *s, struct pjob *x, int rc)
{
	struct dreq *r = x->r;
	kvt_demo_req *o;
	long nf;
	uint32_t ok = x->end;

	if (!r)
		return;
	o = r->out;
	nf = kvti_dj_failed(x->j, s->failed, x->end - x->first);
	if (nf > 0) {
		/* the first failed page: the request computes from there */
		for (uint32_t p = x->first; p < x->end && ok == x->end; p++)
			for (long f = 0; f < nf; f++)
				if (s->failed[f] == r->blk[p]) {
					ok = p;
					break;
				}
		o->failed_pages += (uint64_t)nf;
	} else if (rc && rc != -ECANCELED) {
		ok = x->first;
	}
	if (rc && rc != KVT_ENOTFOUND && rc != KVT_EBUSY && rc != -ECANCELED &&
	    !(nf > 0 && rc == KVT_ECORRUPT))
		sv_fail(s, rc, "load");
	for (uint32_t p = x->first; p < ok; p++) {
		o->engine_checked++;
		if (kvti_dmem_check(&s->mem, r->blk[p],
				    kvti_page_seed(r->keys[p]))) {
			o->engine_bad++;
			if (!s->err) {
				s->err = KVT_ECORRUPT;
				snprintf(s->out->error, sizeof(s->out->error),
					 "demo %s: session %u turn %u: a "
					 "restored block holds wrong bytes",
					 s->out->policy, r->session,
					 r->it.turn);
			}
		}
	}
	if (ok < x->end)
		r->fail_at = KVT_MIN(r->fail_at, ok);
	r->nloads--;
	if (--r->er.load_flows)
		return;
	/* every load home: the prefix up to the first failure is good */
	o->loads_home = sv_now(s);
	r->landed = KVT_MIN(r->er.load_upto, r->fail_at * s->P);
	r->fail_at = UINT32_MAX;
	kvti_eng_loads_done(&s->eng, &r->er, r->landed);
}

static void store_end(struct serve *s, struct pjob *x, int rc)
{
	if (rc == KVT_EFULL || rc == KVT_ENOTFOUND) {
		/* no room for some pages (every tier full of leased pages), or
		 * a parent gone: those pages are not cached; counted */
		long nf = kvti_dj_failed(x->j, s->failed, x->end - x->first);

		s->store_skipped += nf > 0 ? (uint64_t)nf : x->end - x->first;
	} else if (rc && rc != -ECANCELED) {
		sv_fail(s, rc, "store");
	}
	for (uint32_t i = 0; i < x->end - x->first; i++) {
		uint32_t b = x->blocks[i];

		if (--s->bref[b] == 0 && s->borphan[b])
			block_put(s, b);
	}
	if (x->r) /* committed: no longer transient */
		tt_drop(s, x->r, x->first, x->end);
	kvti_eng_storing_sub(&s->eng, x->owner, x->end - x->first);
	kvti_eng_store_done(&s->eng, x->tag);
}

/* Collect every job that is done. @block: wait for one first. */
static void reap(struct serve *s)
{
	struct pjob *x, *next;

	kvti_dplane_drain_fd(&s->dp);
	for (x = s->jobs; x; x = next) {
		int rc;

		next = x->next;
		if ((rc = kvti_dj_poll(x->j)) == -EINPROGRESS)
			continue;
		job_unlink(s, x);
		if (x->store)
			store_end(s, x, rc);
		else
			load_end(s, x, rc);
		kvti_dj_free(x->j);
		kvt_free(x->blocks);
		kvt_free(x);
		next = s->jobs; /* the lists moved under us: start over */
	}
}

/* ---- the emulated GPU ------------------------------------------------------- */

static void spend_until(uint64_t deadline)
{
	for (;;) {
		uint64_t now = kvt_now_ns();
		struct timespec ts;

		if (now >= deadline)
			return;
		if (deadline - now > SPIN_NS) {
			uint64_t t = deadline - SPIN_NS;

			ts.tv_sec = (time_t)(t / 1000000000ull);
			ts.tv_nsec = (long)(t % 1000000000ull);
			clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL);
		}
	}
}

/* Wait for layer @l of every load of the step's requests (@whole: for the
 * whole loads, before layer 0). */
static void wait_loads(struct serve *s, uint32_t l, int whole)
{
	for (struct pjob *x = s->jobs; x; x = x->next) {
		if (x->store || !x->r || !x->r->er.in_step)
			continue;
		if (whole)
			kvti_dj_wait(x->j, -1);
		else
			kvti_dj_wait_layer(x->j, l, -1); /* failed: go on */
	}
}

static void gpu_step(struct serve *s)
{
	struct kvti_eng *e = &s->eng;
	int overlap = e->overlap;
	uint64_t t = kvt_now_ns(), t0 = t;
	uint64_t per = (uint64_t)(e->compute_s / s->L * 1e9);
	double wait0 = s->load_wait_s;

	s->step_due = 0;
	if (!e->step_prefills) { /* decodes only */
		spend_until(t + (uint64_t)(e->compute_s * 1e9));
		s->late_s += KVT_MAX(0.0, (double)(kvt_now_ns() - t) / 1e9 -
					   e->compute_s);
		return;
	}
	for (uint32_t l = 0; l < s->L; l++) {
		uint64_t w0 = kvt_now_ns(), w1, end;

		if (!overlap && l == 0)
			wait_loads(s, 0, 1);
		else if (overlap)
			wait_loads(s, l, 0);
		w1 = kvt_now_ns();
		s->load_wait_s += (double)(w1 - w0) / 1e9;
		end = KVT_MAX(t, w1) + per;
		for (uint32_t i = 0; i < e->nrun; i++) {
			struct dreq *r = dq(e->run[i]);
			uint32_t a, b;

			if (!r->er.in_step || r->er.state != ER_PREFILL)
				continue;
			/* pages whose last token this step computes */
			a = r->er.done / s->P;
			b = KVT_MIN((r->er.done + r->er.step_compute) / s->P,
				    r->er.prompt / s->P);
			for (uint32_t p = a; p < b; p++)
				kvti_dmem_write_layer(&s->mem, r->blk[p], l,
						      kvti_page_seed(r->keys[p]));
		}
		w1 = kvt_now_ns();
		if (w1 > end) {
			s->overrun_s += (double)(w1 - end) / 1e9;
			end = w1;
		}
		spend_until(end);
		t = end;
	}
	s->late_s += KVT_MAX(0.0, (double)(kvt_now_ns() - t0) / 1e9 -
				   e->compute_s - (s->load_wait_s - wait0));
}

/* ---- arrivals --------------------------------------------------------------- */

static int arr_less(const struct wl_item *a, const struct wl_item *b)
{
	return a->arrival < b->arrival ||
	       (a->arrival == b->arrival && a->source < b->source);
}

static int arrival_push(struct serve *s, const struct wl_item *it)
{
	uint32_t i;

	if (s->narr == s->arr_cap) {
		uint32_t c = s->arr_cap ? 2 * s->arr_cap : 64;
		struct wl_item *x = kvt_realloc(s->arr, c * sizeof(*x));

		if (!x)
			return -ENOMEM;
		s->arr = x;
		s->arr_cap = c;
	}
	i = s->narr++;
	s->arr[i] = *it;
	while (i && arr_less(&s->arr[i], &s->arr[(i - 1) / 2])) {
		struct wl_item x = s->arr[i];

		s->arr[i] = s->arr[(i - 1) / 2];
		s->arr[(i - 1) / 2] = x;
		i = (i - 1) / 2;
	}
	return 0;
}

static struct wl_item arrival_pop(struct serve *s)
{
	struct wl_item top = s->arr[0];
	uint32_t i = 0;

	s->arr[0] = s->arr[--s->narr];
	for (;;) {
		uint32_t l = 2 * i + 1, r = l + 1, m = i;
		struct wl_item x;

		if (l < s->narr && arr_less(&s->arr[l], &s->arr[m]))
			m = l;
		if (r < s->narr && arr_less(&s->arr[r], &s->arr[m]))
			m = r;
		if (m == i)
			break;
		x = s->arr[i];
		s->arr[i] = s->arr[m];
		s->arr[m] = x;
		i = m;
	}
	return top;
}

/* A turn arrives: its tokens and page keys, into the engine. */
static int arrive(struct serve *s, const struct wl_item *it)
{
	const kvt_demo_config *c = s->c;
	struct dreq *r = kvt_calloc(1, sizeof(*r));
	uint32_t n = it->prompt + it->output;
	struct wl_item all = *it;
	int err;

	if (!r)
		return -ENOMEM;
	r->it = *it;
	r->session = it->source;
	all.prompt = n; /* the answer's tokens too (a resumed prefill) */
	r->tok = kvt_malloc((size_t)n * sizeof(*r->tok));
	r->nkeys = n / s->P;
	r->keys = kvt_malloc(((size_t)r->nkeys + 1) * sizeof(*r->keys));
	if (!r->tok || !r->keys) {
		err = -ENOMEM;
		goto fail;
	}
	kvti_wl_tokens(&s->wl, &all, r->tok);
	if ((err = kvti_dp_hash(&s->dp, r->tok, n, r->keys)))
		goto fail;
	r->out = &s->out->reqs[(size_t)it->source * c->turns + it->turn];
	memset(r->out, 0, sizeof(*r->out));
	r->out->session = it->source;
	r->out->turn = it->turn;
	r->out->prompt_tokens = it->prompt;
	r->out->output_tokens = it->output;
	r->out->arrival = it->arrival;
	r->fail_at = UINT32_MAX;
	r->er.id = ++s->next_id;
	r->er.prompt = it->prompt;
	r->er.output = it->output;
	r->er.arrival = it->arrival;
	if ((err = kvti_eng_enqueue(&s->eng, &r->er)))
		goto fail;
	return kvti_eng_kick(&s->eng);
fail:
	kvt_free(r->tok);
	kvt_free(r->keys);
	kvt_free(r);
	return sv_fail(s, err, "arrival");
}

/* ---- the loop ----------------------------------------------------------------- */

static void progress(struct serve *s, int force)
{
	const kvt_demo_config *c = s->c;
	uint64_t now = kvt_now_ns();
	char label[64];

	if (!c->progress || (!force && now - s->progress_at < 200000000ull))
		return;
	s->progress_at = now;
	snprintf(label, sizeof(label), "%s%s @%.2g/s", s->out->policy,
		 s->out->variant, s->out->rate);
	c->progress(c->progress_arg, label, s->finished, s->total,
		    s->pc->pass, s->pc->passes);
}

static int serve_loop(struct serve *s)
{
	struct kvti_eng *e = &s->eng;
	int tampered = 0;

	while (!s->err && !e->error) {
		double now = sv_now(s);

		reap(s);
		while (s->narr && s->arr[0].arrival <= now && !s->err) {
			struct wl_item it = arrival_pop(s);

			arrive(s, &it);
		}
		if (s->step_due) {
			uint64_t t1;

			gpu_step(s);
			t1 = kvt_now_ns();
			reap(s);
			kvti_eng_step_end(e, s->step_gen); /* plans the next */
			s->plan_s += (double)(kvt_now_ns() - t1) / 1e9;
			s->plans++;
		} else if (!e->busy && (e->nwait || e->nrun)) {
			kvti_eng_kick(e);
		}
		if (s->pc->tamper && !tampered && s->c->tamper_after &&
		    s->finished >= s->c->tamper_after) {
			kvti_demo_tamper(s->pc->dir);
			tampered = 1;
		}
		progress(s, 0);
		if (s->finished == s->total && !s->njobs)
			break;
		if (!s->step_due) {
			/* idle: sleep until a job ends, an arrival is due or
			 * (a stall guard) 50 ms pass */
			double wait = 0.05;
			struct pollfd pfd = { .fd = kvti_dplane_fd(&s->dp),
					      .events = POLLIN };

			if (s->narr)
				wait = KVT_MIN(wait, s->arr[0].arrival -
							     sv_now(s));
			if (e->nwait && !e->busy)
				wait = KVT_MIN(wait, 0.005); /* plan again soon:
						   deferred requests */
			if (e->busy && !e->blocked)
				wait = 0; /* a step planned: nothing to wait */
			if (wait > 0)
				poll(&pfd, 1, (int)ceil(wait * 1e3));
		}
	}
	if (e->error && !s->err)
		sv_fail(s, e->error, "engine");
	progress(s, 1);
	return s->err;
}

/* ---- one pass ------------------------------------------------------------------ */

static void tier_spec(const kvt_demo_config *c, const char *dir, char *buf,
		      size_t len)
{
	snprintf(buf, len, "fabric:%s,%llu,populate,dram:%llu,populate,"
		 "ssd:%s,%llu,temp,fresh", c->fabric[0] ? c->fabric : "memfd",
		 (unsigned long long)c->fabric_bytes,
		 (unsigned long long)c->dram_bytes, dir,
		 (unsigned long long)c->ssd_bytes);
}

static int serve_open(struct serve *s)
{
	const struct kvti_demo_pass_cfg *pc = s->pc;
	const kvt_demo_config *c = pc->c;
	kvt_cache_config cc = KVT_CACHE_CONFIG_INIT;
	struct kvti_eng_config ec = { 0 };
	kvt_sim_config sc;
	uint64_t nblocks;
	int err;

	s->P = c->page_tokens;
	s->L = pc->g->layers;
	nblocks = c->hbm_bytes / kvt_geom_page_bytes(pc->g);
	tier_spec(c, pc->dir, s->out->tiers, sizeof(s->out->tiers));
	cc.tiers = s->out->tiers;
	cc.geom = pc->g;
	cc.evict = KVT_EVICT_LRU;
	cc.write = KVT_WRITE_BACK;
	if ((err = kvti_dplane_open(&s->dp, c, &cc, pc->g, nblocks, &s->mem,
				    s->out->fabric_where,
				    sizeof(s->out->fabric_where))))
		return sv_fail(s, err, "opening the cache");
	s->out->nblocks = nblocks;
	s->freel = kvt_malloc(nblocks * sizeof(*s->freel));
	s->bref = kvt_calloc(nblocks, 1);
	s->borphan = kvt_calloc(nblocks, 1);
	s->failed = kvt_malloc((nblocks + 1) * sizeof(*s->failed));
	s->tt_cap = 4096;
	s->tt = kvt_calloc(s->tt_cap, sizeof(*s->tt));
	if (!s->freel || !s->bref || !s->borphan || !s->failed || !s->tt)
		return sv_fail(s, -ENOMEM, "demo");
	for (uint64_t b = 0; b < nblocks; b++)
		s->freel[b] = (uint32_t)(nblocks - 1 - b);
	s->nfree = nblocks;
	if ((err = kvt_hw_cost(pc->hw, pc->g, &s->cost)))
		return sv_fail(s, err, "cost model");
	kvti_demo_sched(pc->pol, pc->off, c->token_budget, &s->scfg);
	ec.sched = &s->scfg;
	ec.cost = &s->cost;
	ec.hbm_pages = nblocks;
	ec.store_holds_hbm = 1;
	ec.preempt = 1;
	if ((err = kvti_eng_init(&s->eng, &ec, &serve_ops, s)))
		return sv_fail(s, err, "engine");
	if ((err = kvti_demo_wl_config(c, pc->rate, &sc)) ||
	    (err = kvti_wl_init(&s->wl, &sc, 1)))
		return sv_fail(s, err, "workload");
	return 0;
}

static void serve_close(struct serve *s)
{
	struct kvti_eng *e = &s->eng;

	while (s->jobs) { /* after a failure: finish what runs */
		struct pjob *x = s->jobs;

		kvti_dj_wait(x->j, -1);
		s->jobs = x->next;
		kvti_dj_free(x->j);
		kvt_free(x->blocks);
		kvt_free(x);
	}
	for (uint32_t i = 0; i < e->nwait; i++) {
		kvt_free(dq(e->wait[i])->tok);
		kvt_free(dq(e->wait[i])->keys);
		kvt_free(dq(e->wait[i])->blk);
		kvt_free(e->wait[i]);
	}
	for (uint32_t i = 0; i < e->nrun; i++) {
		kvt_free(dq(e->run[i])->tok);
		kvt_free(dq(e->run[i])->keys);
		kvt_free(dq(e->run[i])->blk);
		kvt_free(e->run[i]);
	}
	kvti_eng_fini(e);
	kvti_wl_fini(&s->wl);
	kvti_dplane_close(&s->dp);
	kvti_dmem_close(&s->mem);
	kvt_free(s->freel);
	kvt_free(s->bref);
	kvt_free(s->borphan);
	kvt_free(s->failed);
	kvt_free(s->tt);
	kvt_free(s->arr);
}

int kvti_demo_pass(const struct kvti_demo_pass_cfg *pc, kvt_demo_pass *out)
{
	const kvt_demo_config *c = pc->c;
	struct serve *s = kvt_calloc(1, sizeof(*s));
	struct wl_item *items = NULL;
	kvt_stress *stress = NULL;
	kvt_stress_stat s0, s1;
	uint32_t n = 0;
	uint64_t t_open = kvt_now_ns();
	int err;

	if (!s)
		return -ENOMEM;
	s->pc = pc;
	s->c = c;
	s->out = out;
	out->check_err = 1;
	snprintf(out->policy, sizeof(out->policy), "%s", pc->pol->name);
	out->rate = pc->rate;
	out->sessions = pc->sessions;
	out->nreqs = (size_t)pc->sessions * c->turns;
	out->reqs = kvt_calloc(out->nreqs, sizeof(*out->reqs));
	s->total = out->nreqs;
	if (!out->reqs) {
		err = -ENOMEM;
		goto out;
	}
	if ((err = serve_open(s)))
		goto out;
	out->setup_s = (double)(kvt_now_ns() - t_open) / 1e9;
	if ((err = kvti_wl_initial(&s->wl, &items, &n)))
		goto out;
	for (uint32_t i = 0; i < n && !err; i++)
		err = arrival_push(s, &items[i]);
	kvt_free(items);
	if (err)
		goto out;
	if (c->stress && (err = kvt_stress_start(&stress, c->stress,
						 c->stress_bytes, 0)))
		goto out;
	if (stress)
		kvt_stress_sample(stress, &s0);
	s->t0 = kvt_now_ns();
	err = serve_loop(s);
	out->seconds = sv_now(s);
	if (stress) {
		kvt_stress_sample(stress, &s1);
		out->stress_gbps = s1.seconds > s0.seconds ?
			(double)(s1.bytes - s0.bytes) / 1e9 /
			(s1.seconds - s0.seconds) : 0;
	}
	kvt_stress_stop(stress, NULL);
	{
		kvt_demo_stat *st = &out->st;
		struct kvti_eng *e = &s->eng;

		st->steps = e->steps;
		st->decode_only_steps = e->decode_only;
		st->deferred = e->deferred;
		st->preemptions = e->preemptions;
		st->gpu_busy = out->seconds > 0 ? e->busy_s / out->seconds : 0;
		st->gpu_overrun_s = s->overrun_s;
		st->load_wait_s = s->load_wait_s;
		st->store_skipped_pages = s->store_skipped;
		st->plan_ms_mean = s->plans ? s->plan_s / s->plans * 1e3 : 0;
		st->host_us_per_step = e->steps ? (s->plan_s + s->late_s) /
						  e->steps * 1e6 : 0;
		refresh_rates(s);
		for (int t = 0; t < KVT_TIER_COUNT; t++)
			st->load_gbps[t] = s->gbps[t];
	}
out:
	if (err && !out->err) {
		out->err = err;
		if (!out->error[0])
			snprintf(out->error, sizeof(out->error), "%s",
				 kvt_errdetail()[0] ? kvt_errdetail() :
				 kvt_strerror(err));
	}
	if (s->dp.cache || s->dp.cl)
		kvti_dplane_finish(&s->dp, out);
	serve_close(s);
	kvt_free(s);
	return out->err;
}
