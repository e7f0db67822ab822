/*
 * engine.c — the serving engine's step loop (engine.h has the picture).
 *
 * One step, as a continuous-batching engine runs it:
 *
 *   kick:      view the running prefills and the first WINDOW waiting
 *              requests, plan (kvt_sched_plan_step), apply: loads start
 *              for RUN and PREFETCH items, requests start, the decodes
 *              that fit join; price the forward pass (cost model) and hand
 *              the step to the GPU (ops->step_begin).
 *   loads:     a request's loads home: a running request's step may end
 *              (ops->step_loads_home), a waiting one may run next.
 *   step end:  prefills advance (ops->computed), finished prefills emit
 *              their first token (with a synchronous save once the step's
 *              stores are done), decodes advance one token, finished
 *              requests release what they hold; plan again.
 *
 * Invariants: a request is in exactly one of wait (WAIT) and run (PREFILL,
 * DECODE) until it is DONE and handed to ops->finished; claimed is the sum
 * of the requests' claims, priv_pages of their private pages; at most one
 * step runs (busy), and a step is ended only by its own generation.
 *
 * Single-threaded: the platform drives it from one thread.
 */
#include "engine/engine.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static uint32_t whole(const struct kvti_eng *e, uint32_t tokens)
{
	return tokens / e->P * e->P;
}

static double now(struct kvti_eng *e)
{
	return e->ops->now(e);
}

int kvti_eng_fail(struct kvti_eng *e, int err)
{
	if (!e->error)
		e->error = err ? err : -EIO;
	return err;
}

/* ---- lists ------------------------------------------------------------- */

static int list_push(struct kvti_ereq ***a, uint32_t *n, uint32_t *cap,
		     struct kvti_ereq *r)
{
	if (*n == *cap) {
		uint32_t c = *cap ? 2 * *cap : 64;
		struct kvti_ereq **x = kvt_realloc(*a, c * sizeof(*x));

		if (!x)
			return -ENOMEM;
		*a = x;
		*cap = c;
	}
	(*a)[(*n)++] = r;
	return 0;
}

static void list_del(struct kvti_ereq **a, uint32_t *n, struct kvti_ereq *r)
{
	for (uint32_t i = 0; i < *n; i++)
		if (a[i] == r) {
			memmove(&a[i], &a[i + 1], (*n - i - 1) * sizeof(*a));
			(*n)--;
			return;
		}
}

/* ---- capacity ----------------------------------------------------------- */

uint64_t kvti_eng_free_pages(const struct kvti_eng *e)
{
	uint64_t used = e->claimed + e->priv_pages +
			(e->store_holds_hbm ? e->storing : 0);

	return used >= e->hbm_pages ? 0 : e->hbm_pages - used;
}

/* From now on r holds hbm pages for its whole prompt. */
void kvti_eng_claim(struct kvti_eng *e, struct kvti_ereq *r)
{
	if (r->claim)
		return;
	r->claim = (r->prompt + e->P - 1) / e->P;
	e->claimed += r->claim;
}

void kvti_eng_storing_add(struct kvti_eng *e, struct kvti_ereq *r,
			  uint64_t pages)
{
	if (r)
		r->storing += pages;
	else
		e->storing += pages;
}

void kvti_eng_storing_sub(struct kvti_eng *e, uint64_t owner, uint64_t pages)
{
	uint64_t *from = &e->storing;

	for (uint32_t i = 0; owner && i < e->nrun; i++)
		if (e->run[i]->id == owner)
			from = &e->run[i]->storing;
	*from -= KVT_MIN(*from, pages);
	if (from == &e->storing && e->store_holds_hbm && !e->busy && e->nwait)
		kvti_eng_kick(e); /* pages came free for a waiting request */
}

uint64_t kvti_eng_store_tag(struct kvti_eng *e)
{
	if (!e->busy)
		return 0;
	e->store_flows++;
	return e->step_gen;
}

#define ROOM_TAG (1ull << 63) /* a room copy's tag: the step's, marked */

uint64_t kvti_eng_room_tag(struct kvti_eng *e)
{
	if (!e->busy)
		return 0;
	e->room_flows++;
	return e->step_gen | ROOM_TAG;
}

/* ---- loads ----------------------------------------------------------------- */

static void step_loads_home(struct kvti_eng *e, double t)
{
	if (e->ops->step_loads_home)
		e->ops->step_loads_home(e, t);
}

void kvti_eng_loads_done(struct kvti_eng *e, struct kvti_ereq *r,
			 uint32_t ok_upto)
{
	if (ok_upto < r->load_upto) {
		/* some loads failed: what follows the good prefix is computed
		 * again (the step it ran in computed on a broken prefix) */
		r->load_upto = whole(e, ok_upto);
		if (r->state == ER_PREFILL && r->done > r->load_upto) {
			uint32_t lost = r->done - r->load_upto;

			r->reused -= KVT_MIN(r->reused, lost);
			r->done = r->load_upto;
			r->step_compute = 0;
		}
	}
	if (r->in_step) {
		if (e->pending && --e->pending == 0)
			step_loads_home(e, now(e));
	} else if (!e->busy) {
		kvti_eng_kick(e);
	} else {
		e->rekick = 1; /* done inside a plan: look again after it */
	}
}

/* ---- the scheduler's view ---------------------------------------------- */

static void view_prefill(struct kvti_ereq *r)
{
	kvt_sched_req *q = &r->sr;
	uint32_t skips = q->skips;

	memset(q, 0, sizeof(*q));
	q->id = r->id;
	q->state = KVT_SREQ_PREFILL;
	q->prompt = r->prompt;
	q->done = r->done;
	q->reserved = (uint32_t)r->claim;
	q->arrival = r->arrival;
	q->skips = skips;
}

/* Fill r->sr for a waiting request: the data plane's spans, then ours. */
static int view_waiting(struct kvti_eng *e, struct kvti_ereq *r)
{
	kvt_sched_req *q = &r->sr;
	uint32_t skips = q->skips;
	int err;

	memset(q, 0, sizeof(*q));
	if ((err = e->ops->view(e, r)))
		return kvti_eng_fail(e, err);
	q->id = r->id;
	q->state = KVT_SREQ_WAITING;
	q->prompt = r->prompt;
	q->reserved = (uint32_t)r->claim;
	q->group = r->group;
	q->group_tokens = r->group_tokens;
	q->arrival = r->arrival;
	q->skips = skips;
	return 0;
}

static int scratch(struct kvti_eng *e, uint32_t n)
{
	if (n <= e->scap)
		return 0;
	kvt_free(e->sq);
	kvt_free(e->si);
	kvt_free(e->sreqs);
	e->sq = kvt_calloc(n, sizeof(*e->sq));
	e->si = kvt_calloc(n, sizeof(*e->si));
	e->sreqs = kvt_calloc(n, sizeof(*e->sreqs));
	e->scap = e->sq && e->si && e->sreqs ? n : 0;
	return e->scap ? 0 : kvti_eng_fail(e, -ENOMEM);
}

/* ---- steps ----------------------------------------------------------------- */

/* A waiting request starts running. */
static int start_request(struct kvti_eng *e, struct kvti_ereq *r,
			 const kvt_sched_item *it)
{
	int err;

	if ((err = list_push(&e->run, &e->nrun, &e->run_cap, r)))
		return kvti_eng_fail(e, err);
	list_del(e->wait, &e->nwait, r);
	kvti_eng_claim(e, r);
	r->state = ER_PREFILL;
	if (!r->started)
		r->started = now(e);
	r->done = it->reuse;
	r->reused = it->reuse;
	kvti_debug("engine %u %.6f: req %llu starts: prompt %u, hbm %u, reuse "
		   "%u, loading %u (+%u now), transient %u, recompute %u",
		   e->idx, now(e), (unsigned long long)r->id, r->prompt,
		   r->sr.hbm, it->reuse, r->sr.loading, it->load,
		   r->sr.transient, it->recompute);
	if (!r->counted) {
		/* where its reused prefix came from: what it loaded itself
		 * (now or ahead, by prefetch) by source tier, the rest was in
		 * hbm already */
		uint32_t own = 0, rest = it->reuse;

		r->counted = 1;
		for (int t = KVT_TIER_FABRIC; t < KVT_TIER_COUNT; t++) {
			uint32_t n = KVT_MIN(rest, r->loaded[t]);

			e->hit[t] += n;
			rest -= n;
			own += n;
		}
		e->hit[KVT_TIER_HBM] += it->reuse - own;
		for (int t = 0; t < KVT_TIER_COUNT; t++) {
			r->recomputed[t] = it->recompute_tier[t];
			e->recomputed[t] += it->recompute_tier[t];
		}
	}
	if (e->ops->start && (err = e->ops->start(e, r, it)))
		return kvti_eng_fail(e, err);
	return 0;
}

static int apply_plan(struct kvti_eng *e, uint32_t n, const kvt_sched_plan *p,
		      kvt_cost_prefill *pf, uint32_t *npf)
{
	int err;

	*npf = 0;
	for (uint32_t i = 0; i < n; i++) {
		const kvt_sched_item *it = &p->items[i];
		struct kvti_ereq *r = e->sreqs[i];

		if (it->action == KVT_SACT_DEFER)
			e->deferred++;
		if (it->load && (err = e->ops->load(e, r, it->load)))
			return kvti_eng_fail(e, err);
		if (it->action != KVT_SACT_RUN)
			continue;
		if (r->state == ER_WAIT && (err = start_request(e, r, it)))
			return err;
		r->step_compute = it->compute;
		r->in_step = 1;
		if (r->load_flows)
			e->pending++;
		pf[(*npf)++] = (kvt_cost_prefill){ it->compute, r->done };
	}
	return 0;
}

/* Nothing can run and prefetched requests hold the pages the head of the
 * queue needs: give their claims back (their loaded pages stay cached, no
 * longer held). Returns how many claims were released. */
static uint32_t release_claims(struct kvti_eng *e)
{
	uint32_t n = 0;

	for (uint32_t i = 0; i < e->nwait; i++) {
		struct kvti_ereq *r = e->wait[i];

		if (!r->claim || r->load_flows)
			continue;
		if (e->ops->unclaim && e->ops->unclaim(e, r))
			return 0;
		e->claimed -= r->claim;
		r->claim = 0;
		r->load_upto = 0;
		n++;
	}
	return n;
}

/* Decodes of the coming step that need a new page: with preemption on and
 * no page free, preempt the running request that arrived last (vLLM: the
 * lowest priority, FCFS) until they fit. Returns 0 or an error. */
static int preempt_one(struct kvti_eng *e);

static int make_room_for_decodes(struct kvti_eng *e)
{
	for (;;) {
		uint64_t want = 0;

		for (uint32_t i = 0; i < e->nrun; i++) {
			const struct kvti_ereq *r = e->run[i];

			/* the token it decodes next starts a new page */
			if (r->state == ER_DECODE &&
			    (r->prompt + r->generated) % e->P == 0)
				want++;
		}
		if (!want || kvti_eng_free_pages(e) >= want || e->nrun <= 1)
			return 0;
		if (preempt_one(e))
			return e->error;
	}
}

int kvti_eng_kick(struct kvti_eng *e)
{
	kvt_sched_state *st = &e->st;
	kvt_cost_prefill pf[512];
	kvt_sched_plan plan;
	uint32_t n = 0, npf, ndec = 0, decodes = 0;
	uint64_t dctx = 0;
	int err;

	if (e->busy || e->error)
		return 0;
	if (e->preempt && (err = make_room_for_decodes(e)))
		return err;
	memset(st, 0, sizeof(*st));
	st->now = now(e);
	if ((err = scratch(e, e->nrun + KVTI_ENG_WINDOW)))
		return err;
	for (uint32_t i = 0; i < e->nrun; i++) {
		struct kvti_ereq *r = e->run[i];

		if (r->state == ER_PREFILL) {
			view_prefill(r);
			e->sreqs[n] = r;
			e->sq[n++] = r->sr;
		} else {
			decodes++;
			dctx += r->prompt + r->generated;
		}
	}
	for (uint32_t i = 0; i < e->nwait && i < KVTI_ENG_WINDOW; i++) {
		struct kvti_ereq *r = e->wait[i];

		if ((err = view_waiting(e, r)))
			return err;
		if (r->load_flows) {
			r->load_eta = e->ops->load_eta ? e->ops->load_eta(e, r) :
							  st->now;
			r->sr.loading_ready = r->load_eta;
			st->link_free_at = KVT_MAX(st->link_free_at, r->load_eta);
		}
		e->sreqs[n] = r;
		e->sq[n++] = r->sr;
	}
	if (!n && !decodes)
		return 0;
	st->decodes = decodes;
	st->decode_ctx = dctx;
	st->free_pages = kvti_eng_free_pages(e);
	if (e->ops->sched_state)
		e->ops->sched_state(e, st);
	if ((err = kvt_sched_plan_step(e->sched, st, e->sq, n, e->si, &plan)))
		return kvti_eng_fail(e, err);
	for (uint32_t i = 0; i < n; i++) /* keep the skip counts */
		e->sreqs[i]->sr.skips = e->sq[i].skips;
	if (plan.nrun > KVT_ARRAY_SIZE(pf))
		return kvti_eng_fail(e, kvti_fail(-E2BIG, "more than %zu "
					"prefills in a step",
					KVT_ARRAY_SIZE(pf)));
	e->busy = 1; /* loads completing inside apply_plan must not kick */
	e->rekick = 0;
	e->pending = 0;
	e->step_gen++;
	e->store_flows = 0;
	e->room_flows = 0;
	if ((err = apply_plan(e, n, &plan, pf, &npf)))
		return err;
	/* decodes: the first plan.decodes running decoders */
	for (uint32_t i = 0; i < e->nrun && ndec < plan.decodes; i++) {
		struct kvti_ereq *r = e->run[i];

		if (r->state == ER_DECODE && !r->in_step) {
			r->in_step = 1;
			ndec++;
		}
	}
	if (!npf && !ndec) {
		int io = e->ops->busy_io ? e->ops->busy_io(e) : 0;

		/* nothing computes: wait for loads, arrivals or transients */
		e->busy = 0;
		if (e->rekick) {
			e->rekick = 0;
			return kvti_eng_kick(e);
		}
		if (!e->pending && !plan.nprefetch && !plan.ndefer && !io &&
		    e->nwait && release_claims(e))
			return kvti_eng_kick(e);
		if (!e->pending && !plan.nprefetch && !plan.ndefer && !io &&
		    e->nwait)
			return kvti_eng_fail(e, kvti_fail(KVT_ECONFIG, "engine "
				"%u stalled: a request of %u tokens cannot get "
				"the hbm pages it needs (%llu free of %llu; "
				"%llu claimed, %llu decode pages, %u running)",
				e->idx, e->wait[0]->prompt,
				(unsigned long long)st->free_pages,
				(unsigned long long)e->hbm_pages,
				(unsigned long long)e->claimed,
				(unsigned long long)e->priv_pages, e->nrun));
		return 0;
	}
	e->steps++;
	e->decode_only += !npf;
	if (e->last_end > 0 && st->now > e->last_end)
		e->bd.idle_s += st->now - e->last_end;
	if (e->nwait) {
		e->bd.steps_waiting++;
		e->bd.waiting_sum += e->nwait;
	}
	e->t0 = st->now;
	e->step_prefills = npf;
	e->step_decodes = ndec;
	e->step_tokens = plan.compute_tokens;
	e->compute_s = kvt_cost_step_s(&e->cost, pf, npf, ndec, dctx) +
		       (e->ops->step_extra_s ? e->ops->step_extra_s(e) : 0);
	if (npf)
		kvti_debug("engine %u %.6f: step: %u prefills (%u tokens), %u "
			   "decodes, compute %.2f ms, %u waiting on loads",
			   e->idx, st->now, npf, plan.compute_tokens, ndec,
			   e->compute_s * 1e3, e->pending);
	if ((err = e->ops->step_begin(e)))
		return kvti_eng_fail(e, err);
	return 0;
}

/* ---- the end of a step ------------------------------------------------------ */

/* r leaves the running list (finished, or preempted): the data plane
 * releases what it holds, its pages go back, except those its copies down
 * still hold (the engine's from now on). */
static int leave_run(struct kvti_eng *e, struct kvti_ereq *r, int preempt)
{
	int err;

	if ((err = e->ops->release(e, r, preempt)))
		return kvti_eng_fail(e, err);
	list_del(e->run, &e->nrun, r);
	e->priv_pages -= r->priv;
	r->priv = 0;
	e->claimed -= r->claim;
	r->claim = 0;
	kvti_debug("engine %u %.6f: req %llu %s, %llu pages still being "
		   "copied down (engine: %llu)", e->idx, now(e),
		   (unsigned long long)r->id, preempt ? "preempted" : "done",
		   (unsigned long long)r->storing,
		   (unsigned long long)e->storing);
	e->storing += r->storing;
	r->storing = 0;
	return 0;
}

static int finish(struct kvti_eng *e, struct kvti_ereq *r)
{
	int err;

	r->state = ER_DONE;
	r->finish = now(e);
	if ((err = leave_run(e, r, 0)))
		return err;
	if ((err = e->ops->finished(e, r)))
		return kvti_eng_fail(e, err);
	return 0;
}

/* Emit a request's first token. Returns 1 when that was its last token: the
 * request is then finished and handed back (ops->finished), and the caller
 * must not touch it again; 0 when it goes on decoding; a negative error. */
static int first_token(struct kvti_eng *e, struct kvti_ereq *r)
{
	int err;

	if (!r->preempted || r->first_token <= 0) {
		r->first_token = now(e);
		e->bd.n++;
		e->bd.queue_s += r->started - r->arrival;
		e->bd.run_s += r->first_token - r->started;
		e->bd.run_wall_s += r->bd_wall;
		e->bd.run_model_s += r->bd_model;
		e->bd.run_steps += r->bd_steps;
		kvti_debug("engine %u %.6f: req %llu first token (TTFT %.1f "
			   "ms)", e->idx, r->first_token,
			   (unsigned long long)r->id,
			   (r->first_token - r->arrival) * 1e3);
		if (e->ops->first_token)
			e->ops->first_token(e, r);
	}
	if (r->generated < r->output)
		return 0;
	if ((err = finish(e, r)))
		return err;
	return 1;
}

/* Emit the first tokens a sync_store step held back. */
static int unblock(struct kvti_eng *e)
{
	int err;

	if (e->room_held) {
		e->room_wait_s += now(e) - e->room_t0;
		e->room_held = 0;
	}
	e->blocked = 0;
	e->busy = 0;
	for (uint32_t i = 0; i < e->nrun;) {
		struct kvti_ereq *r = e->run[i];

		if (r->state == ER_DECODE && r->first_token < 0) {
			r->first_token = 0;
			if ((err = first_token(e, r)) < 0)
				return err;
			if (err) /* finished and handed back: the list moved */
				continue;
		}
		i++;
	}
	return kvti_eng_kick(e);
}

/* The step's end waits for its stores (sync_store) and for the copies
 * that made their room. */
static int held(const struct kvti_eng *e)
{
	return (e->sync_store && e->store_flows) || e->room_flows;
}

int kvti_eng_store_done(struct kvti_eng *e, uint64_t tag)
{
	if (tag & ROOM_TAG) {
		if ((tag & ~ROOM_TAG) != e->step_gen || !e->room_flows)
			return 0;
		e->room_flows--;
	} else {
		if (!tag || tag != e->step_gen || !e->store_flows)
			return 0;
		e->store_flows--;
	}
	if (e->blocked && !held(e))
		return unblock(e);
	return 0;
}

/* Account a step's prefill work. Returns what first_token() returns: 1 when
 * the request finished and was handed back, 0 otherwise, or an error. */
static int prefill_progress(struct kvti_eng *e, struct kvti_ereq *r, int hold)
{
	uint32_t prompt_pages, pages;
	int err, last;

	r->done += r->step_compute;
	r->computed += r->step_compute;
	e->computed += r->step_compute;
	last = r->done >= r->prompt;
	if ((err = e->ops->computed(e, r, last)))
		return kvti_eng_fail(e, err);
	if (!last)
		return 0;
	/* the prompt is done: this step produced the first token */
	if (e->ops->prompt_done && (err = e->ops->prompt_done(e, r)))
		return kvti_eng_fail(e, err);
	r->state = ER_DECODE;
	if (r->resume) {
		/* resumed after a preemption: its prompt held the tokens it
		 * had generated, this step produced the next one */
		r->generated = r->resume + 1;
		r->prompt -= r->resume;
		r->resume = 0;
	} else {
		r->generated = 1;
	}
	prompt_pages = r->prompt / e->P;
	pages = (r->prompt + r->generated + e->P - 1) / e->P - prompt_pages;
	r->priv = pages;
	e->priv_pages += r->priv;
	if (r->generated > 1 && r->generated >= r->output)
		return first_token(e, r); /* a resumed request may be done */
	if (hold || e->room_flows) { /* its store's room is being made */
		r->first_token = r->preempted && r->first_token > 0 ?
					 r->first_token : -1;
		if (r->first_token < 0)
			return 0; /* emitted when the stores are done */
	}
	return first_token(e, r);
}

int kvti_eng_step_end(struct kvti_eng *e, uint64_t gen)
{
	int hold = e->sync_store, changed = 0, err;
	double dur = now(e) - e->t0;

	if (gen != e->step_gen || !e->busy || e->blocked || e->error)
		return 0;
	e->busy_s += e->compute_s;
	e->stall_s += KVT_MAX(0.0, dur - e->compute_s);
	e->bd.step_wall_s += dur;
	e->bd.step_model_s += e->compute_s;
	e->last_end = now(e);
	for (uint32_t i = 0; i < e->nrun;) {
		struct kvti_ereq *r = e->run[i];

		if (!r->in_step) {
			i++;
			continue;
		}
		r->in_step = 0;
		if (r->state == ER_PREFILL) {
			r->bd_wall += dur;
			r->bd_model += e->compute_s;
			r->bd_steps++;
		}
		if (r->state == ER_DECODE) {
			uint32_t pages;

			r->generated++;
			pages = (r->prompt + r->generated + e->P - 1) / e->P -
				r->prompt / e->P;
			e->priv_pages += pages - r->priv;
			r->priv = pages;
			if (r->generated >= r->output && r->first_token >= 0) {
				if ((err = finish(e, r)))
					return err;
				changed = 1;
				continue;
			}
		} else if ((err = prefill_progress(e, r, hold)) < 0) {
			return err;
		} else {
			changed = 1;
			if (err) /* finished and handed back: the list moved */
				continue;
		}
		i++;
	}
	if (e->ops->check && (changed || e->nwait) && (err = e->ops->check(e)))
		return kvti_eng_fail(e, err);
	if (held(e)) {
		e->blocked = 1;
		if (e->room_flows) {
			e->room_waits++;
			e->room_held = 1;
			e->room_t0 = now(e);
		}
		return 0;
	}
	return unblock(e);
}

/* ---- preemption ------------------------------------------------------------- */

static int preempt_one(struct kvti_eng *e)
{
	struct kvti_ereq *r = NULL, **x;
	int err;

	for (uint32_t i = 0; i < e->nrun; i++)
		if (!e->run[i]->in_step &&
		    (!r || e->run[i]->arrival > r->arrival))
			r = e->run[i];
	if (!r)
		return 0;
	if ((err = leave_run(e, r, 1)))
		return err;
	if (r->state == ER_DECODE) {
		/* recompute the prompt and what it generated, then go on */
		r->resume = r->generated;
		r->prompt += r->generated;
	}
	r->state = ER_WAIT;
	r->done = 0;
	r->load_upto = r->load_base = 0;
	r->counted = 1; /* its hits were counted the first time */
	r->preempted++;
	e->preemptions++;
	memset(&r->sr, 0, sizeof(r->sr));
	/* back to the head of the queue */
	if ((err = list_push(&e->wait, &e->nwait, &e->wait_cap, r)))
		return kvti_eng_fail(e, err);
	x = e->wait;
	memmove(&x[1], &x[0], (e->nwait - 1) * sizeof(*x));
	x[0] = r;
	return 0;
}

/* ---- arrival, set up --------------------------------------------------------- */

int kvti_eng_enqueue(struct kvti_eng *e, struct kvti_ereq *r)
{
	int err;

	r->first_token = 0;
	if ((err = list_push(&e->wait, &e->nwait, &e->wait_cap, r)))
		return kvti_eng_fail(e, err);
	return 0;
}

int kvti_eng_arrive(struct kvti_eng *e, struct kvti_ereq *r)
{
	int err;

	if ((err = kvti_eng_enqueue(e, r)))
		return err;
	return kvti_eng_kick(e);
}

int kvti_eng_init(struct kvti_eng *e, const struct kvti_eng_config *c,
		  const struct kvti_eng_ops *ops, void *arg)
{
	int err;

	memset(e, 0, sizeof(*e));
	e->ops = ops;
	e->arg = arg;
	e->cost = *c->cost;
	e->P = c->cost->page_tokens;
	e->idx = c->idx;
	e->hbm_pages = c->hbm_pages;
	e->store_holds_hbm = c->store_holds_hbm;
	e->preempt = c->preempt;
	e->sync_store = c->sched->sync_store;
	e->overlap = (c->sched->features & KVT_SCHED_OVERLAP) != 0;
	if ((err = kvt_sched_create(&e->sched, c->sched, c->cost)))
		return err;
	return 0;
}

void kvti_eng_fini(struct kvti_eng *e)
{
	if (getenv("KVT_ENG_BREAKDOWN") && e->bd.n) {
		const struct kvti_eng_breakdown *b = &e->bd;

		fprintf(stderr, "breakdown %s: n %llu queue %.1f ms run %.1f ms"
			" | steps %llu wall %.3f ms model %.3f ms over %.3f ms "
			"| idle-before-step %.3f ms | waiting %.2f | run: steps "
			"%.2f wall %.1f model %.1f ms\n",
			getenv("KVT_ENG_BREAKDOWN"), (unsigned long long)b->n,
			b->queue_s / b->n * 1e3, b->run_s / b->n * 1e3,
			(unsigned long long)e->steps,
			b->step_wall_s / e->steps * 1e3,
			b->step_model_s / e->steps * 1e3,
			(b->step_wall_s - b->step_model_s) / e->steps * 1e3,
			b->idle_s / e->steps * 1e3,
			b->steps_waiting ? (double)b->waiting_sum / b->steps_waiting : 0,
			(double)b->run_steps / b->n, b->run_wall_s / b->n * 1e3,
			b->run_model_s / b->n * 1e3);
	}
	kvt_sched_destroy(e->sched);
	kvt_free(e->wait);
	kvt_free(e->run);
	kvt_free(e->sq);
	kvt_free(e->si);
	kvt_free(e->sreqs);
	e->sched = NULL;
	e->wait = e->run = NULL;
	e->sq = NULL;
	e->si = NULL;
	e->sreqs = NULL;
}
