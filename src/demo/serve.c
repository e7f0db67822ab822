/*
 * serve.c — one pass of the demo: the serving engine's step loop
 * (src/engine/engine.c, the one the simulator runs) on the wall clock, over
 * the real cache. This file is its platform:
 *
 *   clock       kvt_now_ns() since the pass started
 *   data plane  the cache (dplane.c: in process or through the daemon)
 *     view      what the scheduler sees of the live cache: tier runs,
 *               loads in flight, pages other requests compute or store,
 *               measured rates (serve_view.c)
 *     load      kvt_cache_load() of pages [from, upto) into its blocks
 *     computed  kvt_cache_store() of the pages its prefill completed
 *               (first store of a request: the whole prefix, so a parent
 *               the top tier lacks is copied from the engine's memory)
 *   GPU         emulated, in this thread: a step takes the cost model's
 *               time, spent in real time layer by layer (serve_gpu.c)

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
 * Single-threaded: the cache's own threads do the copies.
 */
#include "demo/serve_impl.h"

#include <errno.h>
#include <math.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define CHECK_SLICE_NS 50000u /* idle: checks run 50 us at a time */
#define KVTI_DEMO_THREAD_NICE 10 /* the cache's threads (kvt_cache_config) */

int kvti_sv_fail(struct serve *s, int err, const char *what)
{
	if (err && !s->err) {
		s->err = err;
		snprintf(s->out->error, sizeof(s->out->error), "%s: %s", what,
			 kvt_errdetail()[0] ? kvt_errdetail() :
			 kvt_strerror(err));
	}
	return err;
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

void kvti_sv_block_put(struct serve *s, uint32_t b)
{
	kvti_sv_check_block(s, b); /* before anything is written into it */
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
			kvti_sv_block_put(s, b);
	}
	r->nblk = 0;
}

/* ---- the data plane ops ----------------------------------------------------- */

static double op_now(struct kvti_eng *e)
{
	return kvti_sv_now(kvti_sv(e));
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
	struct serve *s = kvti_sv(e);
	struct dreq *r = kvti_dq(er);
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
		return kvti_sv_fail(s, err, "blocks");
	err = kvti_dp_job(&s->dp, 0, r->keys, pu, pf, r->blk + pf, &j);
	if (err)
		return kvti_sv_fail(s, err, "load");
	if ((err = add_job(s, r, 0, pf, pu, j, &x)))
		return kvti_sv_fail(s, err, "load");
	for (struct pjob *y = s->jobs; y; y = y->next)
		s->bd_ld_stores += y->store;
	for (uint32_t p = pf; p < pu; p++) {
		uint32_t t = kvti_sv_tier_at(r, p);

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
	struct serve *s = kvti_sv(e);
	struct dreq *r = kvti_dq(er);
	uint32_t full = er->prompt / s->P;
	double ready = kvti_sv_now(s) + kvt_cost_prefill_s(&s->cost,
				er->prompt - it->reuse, it->reuse);
	int err;

	if ((err = hold_prompt(s, r)))
		return kvti_sv_fail(s, err, "blocks");
	if (!r->out->start) /* a preempted request keeps its first start */
		r->out->start = kvti_sv_now(s);
	/* the context it computes, until its store of it commits */
	r->marked_from = it->reuse / s->P;
	r->marked_to = full;
	for (uint32_t p = r->marked_from; p < full; p++)
		if (kvti_tt_put(s, r->keys[p], er->id, ready))
			return kvti_sv_fail(s, -ENOMEM, "transient table");
	return 0;
}

static int op_step_begin(struct kvti_eng *e)
{
	struct serve *s = kvti_sv(e);

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
	uint64_t t0;
	int err;

	if (upto <= first)
		return 0;
	/* the first store takes the whole prefix: a parent the top tier
	 * lacks is copied from the engine's memory, not read back up */
	if (r->stored == 0 && r->er.reused)
		first = 0;
	t0 = kvt_now_ns();
	err = kvti_dp_job(&s->dp, 1, r->keys, upto, first, r->blk + first, &j);
	if (err == KVT_ENOTFOUND && first) { /* a parent left meanwhile */
		first = 0;
		err = kvti_dp_job(&s->dp, 1, r->keys, upto, 0, r->blk, &j);
	}
	s->bd_st_call += (double)(kvt_now_ns() - t0) / 1e9;
	s->bd_st_calls++;
	kvti_debug("demo: req %llu store call: pages %u..%u, %.3f ms",
		   (unsigned long long)r->er.id, first, upto,
		   (double)(kvt_now_ns() - t0) / 1e6);
	if (err == KVT_EFULL || err == KVT_ENOTFOUND) {
		/* nowhere to put it now (the top tier is full of pages other
		 * jobs hold): these pages are not cached; counted */
		s->store_skipped += upto - first;
		kvti_debug("demo: store of %u pages skipped: %s", upto - first,
			   kvt_strerror(err));
		kvti_tt_drop(s, r, r->stored, upto);
		r->stored = upto;
		return 0;
	}
	if (err)
		return kvti_sv_fail(s, err, "store");
	if ((err = add_job(s, r, 1, first, upto, j, &x)))
		return kvti_sv_fail(s, err, "store");
	x->blocks = kvt_malloc((upto - first) * sizeof(*x->blocks));
	if (!x->blocks)
		return kvti_sv_fail(s, -ENOMEM, "store");
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
	struct serve *s = kvti_sv(e);
	struct dreq *r = kvti_dq(er);
	uint32_t align = s->pc->pol->store_align, upto;

	(void)last;
	/* whole pages; whole chunks for a policy that saves chunks */
	upto = align ? er->done / align * align / s->P : er->done / s->P;
	upto = KVT_MIN(upto, er->prompt / s->P);
	return store_pages(s, r, upto);
}

static int op_prompt_done(struct kvti_eng *e, struct kvti_ereq *er)
{
	struct serve *s = kvti_sv(e);
	struct dreq *r = kvti_dq(er);

	/* pages it will never store are no longer coming */
	kvti_tt_drop(s, r, r->stored, r->marked_to);
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
	struct serve *s = kvti_sv(e);
	struct dreq *r = kvti_dq(er);

	cancel_loads(s, r); /* a running request's loads are done already */
	kvti_tt_drop(s, r, r->stored, r->marked_to);
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
	struct serve *s = kvti_sv(e);
	struct dreq *r = kvti_dq(er);

	drop_blocks(s, r);
	r->landed = 0;
	return 0;
}

static void op_first_token(struct kvti_eng *e, struct kvti_ereq *er)
{
	struct dreq *r = kvti_dq(er);

	(void)e;
	r->out->first_token = er->first_token;
}

static int arrival_push(struct serve *s, const struct wl_item *it);

static int op_finished(struct kvti_eng *e, struct kvti_ereq *er)
{
	struct serve *s = kvti_sv(e);
	struct dreq *r = kvti_dq(er);
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
	return kvti_sv(e)->njobs != 0;
}

static const struct kvti_eng_ops serve_ops = {
	.now = op_now,
	.view = kvti_sv_view,
	.load = op_load,
	.load_eta = kvti_sv_load_eta,
	.start = op_start,
	.step_begin = op_step_begin,
	.computed = op_computed,
	.prompt_done = op_prompt_done,
	.release = op_release,
	.unclaim = op_unclaim,
	.finished = op_finished,
	.first_token = op_first_token,
	.busy_io = op_busy_io,
	.sched_state = kvti_sv_sched_state,
};

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
	/* (the prediction logs the same line: ids follow arrivals, which
	 * differ between the two clocks; source and turn match them up) */
	kvti_debug("demo: req %llu is source %u turn %u (arrival %.6f)",
		   (unsigned long long)r->er.id, it->source, it->turn,
		   it->arrival);
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
	return kvti_sv_fail(s, err, "arrival");
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

/* Every turn whose arrival time has come joins the engine's queue. */
static void arrivals_due(struct serve *s)
{
	double now = kvti_sv_now(s);

	while (s->narr && s->arr[0].arrival <= now && !s->err) {
		struct wl_item it = arrival_pop(s);

		arrive(s, &it);
	}
}

/* Host time since @t0 spent planning (and, after a step, ending it): the
 * engine's host time per step (host_us_*_step), charged to a step with
 * prefills when the plan made one. */
static void plan_spent(struct serve *s, uint64_t t0)
{
	double dt = (double)(kvt_now_ns() - t0) / 1e9;

	s->plan_s += dt;
	if (s->eng.busy && s->eng.step_prefills) /* the step planned */
		s->plan_pf_s += dt;
	s->plans++;
}

static int serve_loop(struct serve *s)
{
	struct kvti_eng *e = &s->eng;
	int tampered = 0;

	while (!s->err && !e->error) {
		if (s->c->stop && *s->c->stop) {
			kvti_sv_fail(s, -EINTR, "interrupted");
			break;
		}
		kvti_sv_reap(s);
		{
			/* turns arriving at an idle engine are planned here
			 * (their arrival's kick): that host time belongs to
			 * the step it plans, as after a step below */
			uint64_t t2 = kvt_now_ns();
			int idle = !e->busy;

			arrivals_due(s);
			if (idle && !e->busy && (e->nwait || e->nrun))
				kvti_eng_kick(e);
			if (idle && e->busy)
				plan_spent(s, t2);
		}
		if (s->step_due) {
			uint64_t t1;

			kvti_sv_gpu_step(s);
			t1 = kvt_now_ns();
			kvti_sv_reap(s);
			/* the turns that arrived during the step are in the
			 * queue the next step is planned from, as an engine's
			 * scheduler sees every request added before it runs
			 * (and as the simulator's engine does): taken after
			 * the plan, each waited one step more than it had to */
			arrivals_due(s);
			kvti_eng_step_end(e, s->step_gen); /* plans the next */
			plan_spent(s, t1);
		}
		if (s->pc->tamper && !tampered && s->c->tamper_after &&
		    s->finished >= s->c->tamper_after) {
			kvti_demo_tamper(&s->dp, s->pc->dir);
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
							     kvti_sv_now(s));
			if (e->nwait && !e->busy)
				wait = KVT_MIN(wait, 0.005); /* plan again soon:
						   deferred requests */
			if (e->busy && !e->blocked)
				wait = 0; /* a step planned: nothing to wait */
			/* to the microsecond: poll()'s whole milliseconds,
			 * rounded up, made every turn arriving at an idle
			 * engine wait up to 1 ms more (0.5-1 ms of each
			 * TTFT), which no engine's request socket does */
			if (wait > 0 && s->chk_head != s->chk_tail &&
			    !s->njobs) {
				/* checks pending and no copy running: a
				 * slice of them, then round again (a turn
				 * may have arrived) */
				uint64_t now = kvt_now_ns(), w =
					(uint64_t)(wait * 1e9);

				kvti_sv_check_run(s, now + KVT_MIN(w,
							CHECK_SLICE_NS));
				continue;
			}
			if (wait > 0) {
				struct timespec ts = {
					.tv_sec = (time_t)wait,
					.tv_nsec = (long)((wait - floor(wait)) *
							  1e9),
				};

				ppoll(&pfd, 1, &ts, NULL);
			}
		}
	}
	kvti_sv_check_run(s, 0); /* every restored block checked */
	if (e->error && !s->err)
		kvti_sv_fail(s, e->error, "engine");
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
	/* the step thread is the engine's thread and the emulated GPU: a
	 * copy thread that takes its core delays the GPU's layers, which on
	 * a GPU host no CPU copy does (measured: docs/SIMULATOR.md §7, point
	 * 23) — the cache's threads run below it, in every policy alike */
	cc.thread_nice = KVTI_DEMO_THREAD_NICE;
	if ((err = kvti_dplane_open(&s->dp, c, &cc, pc->g, nblocks, &s->mem,
				    s->out->fabric_where,
				    sizeof(s->out->fabric_where))))
		return kvti_sv_fail(s, err, "opening the cache");
	s->out->nblocks = nblocks;
	s->freel = kvt_malloc(nblocks * sizeof(*s->freel));
	s->bref = kvt_calloc(nblocks, 1);
	s->borphan = kvt_calloc(nblocks, 1);
	s->chk_pending = kvt_calloc(nblocks, 1);
	s->chk_seed = kvt_calloc(nblocks, sizeof(*s->chk_seed));
	s->chk_out = kvt_calloc(nblocks, sizeof(*s->chk_out));
	s->chk_cap = 2 * nblocks;
	s->chk_q = kvt_calloc(s->chk_cap, sizeof(*s->chk_q));
	s->failed = kvt_malloc((nblocks + 1) * sizeof(*s->failed));
	s->tt_cap = 4096;
	s->tt = kvt_calloc(s->tt_cap, sizeof(*s->tt));
	if (!s->freel || !s->bref || !s->borphan || !s->failed || !s->tt ||
	    !s->chk_pending || !s->chk_seed || !s->chk_out || !s->chk_q)
		return kvti_sv_fail(s, -ENOMEM, "demo");
	for (uint64_t b = 0; b < nblocks; b++)
		s->freel[b] = (uint32_t)(nblocks - 1 - b);
	s->nfree = nblocks;
	if ((err = kvt_hw_cost(pc->hw, pc->g, &s->cost)))
		return kvti_sv_fail(s, err, "cost model");
	kvti_demo_sched(pc->pol, pc->off, c->token_budget, &s->scfg);
	ec.sched = &s->scfg;
	ec.cost = &s->cost;
	ec.hbm_pages = nblocks;
	ec.store_holds_hbm = 1;
	ec.preempt = 1;
	if ((err = kvti_eng_init(&s->eng, &ec, &serve_ops, s)))
		return kvti_sv_fail(s, err, "engine");
	if ((err = kvti_demo_wl_config(c, pc->rate, &sc)) ||
	    (err = kvti_wl_init(&s->wl, &sc, 1)))
		return kvti_sv_fail(s, err, "workload");
	return 0;
}

static void serve_close(struct serve *s)
{
	struct kvti_eng *e = &s->eng;

	if (getenv("KVT_ENG_BREAKDOWN") && s->bd_loads)
		fprintf(stderr, "demo loads: %llu, per load: %.1f MB, %.2f ms "
			"actual (layer 0 %.2f, waiting for room %.2f), %.2f "
			"ms at the measured rates; stores in flight at a "
			"load's start %.2f\n",
			(unsigned long long)s->bd_loads,
			s->bd_ld_bytes / s->bd_loads / 1e6,
			s->bd_ld_actual / s->bd_loads * 1e3,
			s->bd_ld_l0 / s->bd_loads * 1e3,
			s->bd_ld_room / s->bd_loads * 1e3,
			s->bd_ld_expect / s->bd_loads * 1e3,
			(double)s->bd_ld_stores / s->bd_loads);
	if (getenv("KVT_ENG_BREAKDOWN") && s->bd_stores)
		fprintf(stderr, "demo stores: %llu calls, %.2f ms each on "
			"the step thread; %llu jobs, per job: waiting for room "
			"%.2f ms, %.2f ms to done\n",
			(unsigned long long)s->bd_st_calls,
			s->bd_st_calls ? s->bd_st_call / s->bd_st_calls * 1e3 :
			0, (unsigned long long)s->bd_stores,
			s->bd_st_room / s->bd_stores * 1e3,
			s->bd_st_total / s->bd_stores * 1e3);
	for (int b = 0; b < 2 && getenv("KVT_ENG_BREAKDOWN"); b++)
		if (s->bd_steps[b])
			fprintf(stderr, "demo steps %s: %llu, per step ms: pre "
				"%.3f model %.3f wall %.3f (load wait %.3f, "
				"writes over %.3f, late sleep %.3f)\n",
				b ? "jobs in flight" : "no jobs",
				(unsigned long long)s->bd_steps[b],
				s->bd_pre[b] / s->bd_steps[b] * 1e3,
				s->bd_model[b] / s->bd_steps[b] * 1e3,
				s->bd_wall[b] / s->bd_steps[b] * 1e3,
				s->bd_wait[b] / s->bd_steps[b] * 1e3,
				s->bd_write[b] / s->bd_steps[b] * 1e3,
				s->bd_sleep[b] / s->bd_steps[b] * 1e3);

	if (getenv("KVT_ENG_BREAKDOWN") && s->bd_wakes)
		fprintf(stderr, "demo layer waits that blocked: %llu, the step "
			"thread woke %.3f ms after the copies landed on average "
			"(not GPU time: the layer starts when they landed)\n",
			(unsigned long long)s->bd_wakes,
			s->bd_wake_s / (double)s->bd_wakes * 1e3);

	while (s->jobs) { /* after a failure: finish what runs */
		struct pjob *x = s->jobs;

		kvti_dj_wait(x->j, -1);
		s->jobs = x->next;
		kvti_dj_free(x->j);
		kvt_free(x->blocks);
		kvt_free(x);
	}
	for (uint32_t i = 0; i < e->nwait; i++) {
		kvt_free(kvti_dq(e->wait[i])->tok);
		kvt_free(kvti_dq(e->wait[i])->keys);
		kvt_free(kvti_dq(e->wait[i])->blk);
		kvt_free(e->wait[i]);
	}
	for (uint32_t i = 0; i < e->nrun; i++) {
		kvt_free(kvti_dq(e->run[i])->tok);
		kvt_free(kvti_dq(e->run[i])->keys);
		kvt_free(kvti_dq(e->run[i])->blk);
		kvt_free(e->run[i]);
	}
	kvti_eng_fini(e);
	kvti_wl_fini(&s->wl);
	kvti_dplane_close(&s->dp);
	kvti_dmem_close(&s->mem);
	kvt_free(s->freel);
	kvt_free(s->bref);
	kvt_free(s->borphan);
	kvt_free(s->chk_pending);
	kvt_free(s->chk_seed);
	kvt_free(s->chk_out);
	kvt_free(s->chk_q);
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
	out->seconds = kvti_sv_now(s);
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
		if (e->steps > e->decode_only)
			st->host_us_prefill_step = (s->plan_pf_s +
				s->late_pf_s) / (double)(e->steps -
				e->decode_only) * 1e6;
		if (e->decode_only)
			st->host_us_decode_step = (s->plan_s - s->plan_pf_s +
				s->late_s - s->late_pf_s) /
				(double)e->decode_only * 1e6;
		st->load_stretch = s->bd_ld_expect > 0 ?
			s->bd_ld_actual / s->bd_ld_expect : 0;
		kvti_sv_rates(s);
		for (int t = 0; t < KVT_TIER_COUNT; t++)
			st->load_gbps[t] = s->gbps[t];
		for (int t = 0; t < KVT_TIER_COUNT; t++)
			st->load_gbps_mean[t] = s->gbps_s[t] > 0 ?
				s->gbps_sum[t] / s->gbps_s[t] : 0;
		for (int t = 0; t < KVT_TIER_COUNT; t++)
			st->load_job_kib[t] = s->job_kib[t];
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

