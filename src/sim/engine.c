/*
 * engine.c — one engine instance, as the simulator runs it.
 *
 * The engine owns a radix index (kvt_index) over an hbm pool and the
 * offload pools (kvt_pool: the index takes and frees their slots), and a
 * scheduler (kvt_sched). It runs steps like a continuous-batching engine:
 *
 *   step begin: match the first WINDOW waiting requests in the index,
 *               turn each into a kvt_sched_req (hbm | loadable | transient
 *               | compute), ask the scheduler for a plan, then apply it:
 *               start loads (flows) for RUN/PREFETCH items, mark the
 *               pages being loaded or computed in flight (others see them
 *               as transient), and price the forward pass with the cost
 *               model.
 *   loads done: insert the loaded prefix into hbm; if the request is in
 *               the running step and it was the last load the step waited
 *               for, the step's end is due at
 *                 overlap:  max(t0 + C + load/L, t_load + C/L)
 *                 else:     t_load + C
 *   step end:   computed pages go into the index (hbm, and by the write
 *               policy copies go down: store flows); finished prefills
 *               emit their first token (with sync_store, once the step's
 *               stores are done); decodes advance; finished requests
 *               release their pins (and, without hbm reuse, their hbm
 *               pages: the next turn restores from the offload tier).
 *
 * Every copy the index asks for (write-through, demotion) is collected by
 * the mover callback and started as one flow per (source, destination)
 * pair and TP rank after the index call returns.
 *
 * Pins: a request holds one lease on the longest prefix it depends on
 * (what it is loading, then what is in hbm), so nothing it reads is
 * evicted under it.
 *
 * Capacity: from its first load or its start, a request claims hbm pages
 * for its whole prompt (shared prefixes are counted once per request:
 * conservative), plus its decode pages; the scheduler sees
 * hbm pages - claims as free, and admits a request only when its whole
 * prompt fits, so a started prefill never waits for pages (no preemption).
 * Unclaimed pages hold cached context the index evicts on demand.
 *
 * Single-threaded, like the whole simulation.
 */
#include "sim/sim.h"

#include <errno.h>
#include <math.h>
#include <string.h>

#define WINDOW 64 /* waiting requests the scheduler sees per step */

static uint64_t ns(double t)
{
	return t <= 0 ? 0 : (uint64_t)(t * 1e9);
}

static uint32_t P_of(const struct engine *e)
{
	return e->geom.page_tokens;
}

static uint32_t whole(const struct engine *e, uint32_t tokens)
{
	return tokens / P_of(e) * P_of(e);
}

/* The first @n tokens of r's prompt, as the index takes a prefix. */
#define PX(r, n) (&(kvt_prefix){ .tenant = 0, .tokens = (r)->tok, \
				  .ntokens = (n) })

static int fail(struct engine *e, int err)
{
	if (!e->sim->error)
		e->sim->error = err ? err : -EIO;
	return err;
}

/* ---- lists ------------------------------------------------------------- */

static int list_push(struct sreq ***a, uint32_t *n, uint32_t *cap,
		     struct sreq *r)
{
	if (*n == *cap) {
		uint32_t c = *cap ? 2 * *cap : 64;
		struct sreq **x = kvt_realloc(*a, c * sizeof(*x));

		if (!x)
			return -ENOMEM;
		*a = x;
		*cap = c;
	}
	(*a)[(*n)++] = r;
	return 0;
}

static void list_del(struct sreq **a, uint32_t *n, struct sreq *r)
{
	for (uint32_t i = 0; i < *n; i++)
		if (a[i] == r) {
			memmove(&a[i], &a[i + 1], (*n - i - 1) * sizeof(*a));
			(*n)--;
			return;
		}
}

/* ---- moving pages -------------------------------------------------------- */

static int mover_copy(void *arg, const kvt_move *mv)
{
	struct engine *e = arg;

	e->mv[mv->src][mv->dst]++;
	return 0;
}

static void store_done(void *arg, struct net_flow *f, double now);

/* Start flows for every copy the index asked for since the last flush. */
static int flush_moves(struct engine *e)
{
	struct sim *s = e->sim;
	const kvt_sim_config *c = s->cfg;
	int err;

	for (int a = 0; a < KVT_TIER_COUNT; a++)
		for (int b = 0; b < KVT_TIER_COUNT; b++) {
			uint64_t pages = e->mv[a][b];
			double bytes = (double)pages * e->page_bytes, cap = 0;

			if (!pages)
				continue;
			e->mv[a][b] = 0;
			if (a == KVT_TIER_HBM)
				cap = kvt_cost_copy_gbps(&e->cost,
					c->store_method,
					kvt_cost_method_chunk(&e->cost,
						c->store_method,
						c->sched.object_tokens)) * 1e9;
			s->store_bytes[b] += bytes * e->tp;
			for (uint32_t g = 0; g < e->tp; g++) {
				/* the tag ties a store to the step that waits
				 * for it (sync_store) */
				err = kvti_sim_flow(s, e->gpu0 + g,
						    (kvt_tier_kind)a,
						    (kvt_tier_kind)b, bytes, cap,
						    store_done, e,
						    a == KVT_TIER_HBM && e->busy ?
							    e->step_gen : 0);
				if (err)
					return fail(e, err);
				if (a == KVT_TIER_HBM && e->busy) {
					e->store_flows++;
					e->step_stored = 1;
				}
			}
		}
	return 0;
}

/* ---- pins and marks ---------------------------------------------------- */

/* Hold one lease on the first @tokens (whole pages) of r's prompt. */
static int repin(struct engine *e, struct sreq *r, uint32_t tokens)
{
	uint32_t t = whole(e, tokens);
	int err;

	if (t == r->pinned)
		return 0;
	if (t && (err = kvt_index_pin(e->index, PX(r, t))))
		return fail(e, err);
	if (r->pinned && (err = kvt_index_unpin(e->index, PX(r, r->pinned))))
		return fail(e, err);
	r->pinned = t;
	return 0;
}

static int ensure_tokens(struct engine *e, struct sreq *r)
{
	if (r->tok)
		return 0;
	if (!(r->tok = kvt_malloc((size_t)r->it.prompt * sizeof(*r->tok))))
		return fail(e, -ENOMEM);
	kvti_wl_tokens(&e->sim->wl, &r->it, r->tok);
	return 0;
}

/* ---- loads --------------------------------------------------------------- */

static void loads_complete(struct engine *e, struct sreq *r);

static void load_done(void *arg, struct net_flow *f, double now)
{
	struct sreq *r = arg;

	(void)f;
	(void)now;
	if (--r->load_flows == 0)
		loads_complete(r->e, r);
}

static void step_due(struct engine *e, double t_load);

static void loads_complete(struct engine *e, struct sreq *r)
{
	kvt_insert_result res = { 0 };
	int err;

	err = kvt_index_insert(e->index, PX(r, whole(e, r->load_upto)),
			       KVT_TIER_HBM, KVT_INSERT_PARTIAL,
			       ns(e->sim->now), &res, NULL, 0);
	if (err && err != KVT_EFULL) {
		fail(e, err);
		return;
	}
	if (res.pages * P_of(e) < r->load_upto)
		r->load_upto = (uint32_t)(res.pages * P_of(e));
	kvti_debug("sim %.6f: req %llu loads done: %u tokens in hbm",
		   e->sim->now, (unsigned long long)r->id, r->load_upto);
	flush_moves(e);
	repin(e, r, r->load_upto);
	if (r->in_step) {
		if (--e->pending == 0)
			step_due(e, e->sim->now);
	} else if (!e->busy) {
		kvti_engine_kick(e);
	} else {
		e->rekick = 1; /* done inside a plan: look again after it */
	}
}

/* From now on r holds hbm pages for its whole prompt. */
static void claim(struct engine *e, struct sreq *r)
{
	if (r->claim)
		return;
	r->claim = (r->it.prompt + P_of(e) - 1) / P_of(e);
	e->claimed += r->claim;
}

/* Start loading @tokens more of r's prefix (after what it has or loads),
 * split over the offload tiers fastest first as the match found them. */
static int issue_loads(struct engine *e, struct sreq *r, uint32_t tokens)
{
	struct sim *s = e->sim;
	const kvt_sim_config *c = s->cfg;
	uint32_t from = r->load_flows || r->load_upto > r->sr.hbm ?
				r->load_upto : r->sr.hbm;
	uint32_t upto = whole(e, from + tokens), left, start_flows;
	double cap = kvt_cost_copy_gbps(&e->cost, c->sched.method,
			kvt_cost_method_chunk(&e->cost, c->sched.method,
					      c->sched.object_tokens)) * 1e9;
	int err;

	if (upto <= from)
		return 0;
	tokens = upto - from;
	claim(e, r);
	if ((err = repin(e, r, upto)))
		return err;
	/* others see these pages in flight until the load is expected done */
	if ((err = kvt_index_start(e->index, PX(r, upto), r->id,
				   ns(s->now + kvt_cost_copy_s(&e->cost,
					c->sched.method, e->cost.chunk_bytes,
					(uint64_t)tokens * e->cost.token_bytes)),
				   ns(s->now), NULL)))
		return fail(e, err);
	if (!r->load_flows)
		r->load_base = from;
	r->load_upto = upto;
	start_flows = r->load_flows;
	left = tokens;
	for (int t = KVT_TIER_FABRIC; t < KVT_TIER_COUNT && left; t++) {
		uint32_t n = KVT_MIN(left, r->sr.tier[t]);
		double bytes = (double)n * e->cost.token_bytes;

		if (!n)
			continue;
		left -= n;
		r->loaded[t] += n;
		s->load_bytes[t] += bytes * e->tp;
		for (uint32_t g = 0; g < e->tp; g++) {
			if ((err = kvti_sim_flow(s, e->gpu0 + g,
						 (kvt_tier_kind)t, KVT_TIER_HBM,
						 bytes, cap, load_done, r, 0)))
				return fail(e, err);
			r->load_flows++;
		}
	}
	if (r->load_flows == start_flows) {
		/* nothing to move after all (the spans changed): done now */
		loads_complete(e, r);
	}
	return 0;
}

/* ---- the scheduler's view ---------------------------------------------- */

/* Classify the matched pages one by one (needed when some are in flight):
 * this request's own loads count as loadable and loading; pages another
 * request is loading still have a copy below — with delay-hit the request
 * waits for them (transient), without it loads its own (as a cache layer
 * that knows nothing of the other load would); pages being computed with
 * no copy anywhere are transient. */
static int view_pages(struct engine *e, struct sreq *r, const kvt_match *m,
		      kvt_sched_req *q, uint32_t *own, uint32_t *trans)
{
	uint32_t P = P_of(e), lo = 0, hi = 0;
	int wait_loads = e->sim->cfg->sched.features & KVT_SCHED_DELAYHIT;
	kvt_match m2;
	int err;

	if (m->pages > e->nlocs) {
		kvt_page_loc *l = kvt_realloc(e->locs, m->pages * sizeof(*l));

		if (!l)
			return fail(e, -ENOMEM);
		e->locs = l;
		e->nlocs = m->pages;
	}
	if ((err = kvt_index_match(e->index, PX(r, r->it.prompt), 0, 0, &m2,
				   e->locs, m->pages)))
		return fail(e, err);
	if (r->load_upto > r->load_base) {
		lo = r->load_base / P;
		hi = r->load_upto / P;
	}
	q->hbm = 0;
	memset(q->tier, 0, sizeof(q->tier));
	*own = *trans = 0;
	for (uint32_t j = 0; j < m2.pages; j++) {
		const kvt_page_loc *l = &e->locs[j];
		int copy = l->tier < KVT_TIER_COUNT;

		if (l->state == KVT_PAGE_RESIDENT && l->tier == KVT_TIER_HBM) {
			q->hbm += P;
		} else if (l->state == KVT_PAGE_RESIDENT) {
			q->tier[l->tier] += P;
		} else if (j >= lo && j < hi) {
			*own += P;
			q->tier[copy ? l->tier : e->sim->cfg->offload[0]] += P;
		} else if (copy && !wait_loads && l->tier != KVT_TIER_HBM) {
			q->tier[l->tier] += P;
		} else {
			*trans += P;
		}
	}
	return 0;
}

/* Fill r->sr from the index, for a waiting request. */
static int view_waiting(struct engine *e, struct sreq *r)
{
	kvt_sched_req *q = &r->sr;
	uint32_t skips = q->skips, own = 0, trans;
	kvt_match m;
	int err;

	if ((err = ensure_tokens(e, r)))
		return err;
	if ((err = kvt_index_match(e->index, PX(r, r->it.prompt), 0, 0, &m,
				   NULL, 0)))
		return fail(e, err);
	memset(q, 0, sizeof(*q));
	q->id = r->id;
	q->state = KVT_SREQ_WAITING;
	q->prompt = r->it.prompt;
	q->hbm = (uint32_t)m.tier_tokens[KVT_TIER_HBM];
	for (int t = KVT_TIER_FABRIC; t < KVT_TIER_COUNT; t++)
		q->tier[t] = (uint32_t)m.tier_tokens[t];
	trans = (uint32_t)(m.inflight_tokens + m.queued_tokens);
	if (trans && (err = view_pages(e, r, &m, q, &own, &trans)))
		return err;
	if (own) {
		q->loading = own;
		q->loading_ready = r->load_flows ? r->load_eta : e->sim->now;
	}
	q->transient = trans;
	q->transient_ready = m.ready_ns * 1e-9;
	q->reserved = (uint32_t)r->claim;
	q->group = r->it.group;
	q->group_tokens = r->it.group_tokens;
	q->arrival = r->it.arrival;
	q->skips = skips;
	return 0;
}

static void view_prefill(struct sreq *r)
{
	kvt_sched_req *q = &r->sr;
	uint32_t skips = q->skips;

	memset(q, 0, sizeof(*q));
	q->id = r->id;
	q->state = KVT_SREQ_PREFILL;
	q->prompt = r->it.prompt;
	q->done = r->done;
	q->reserved = (uint32_t)r->claim;
	q->arrival = r->it.arrival;
	q->skips = skips;
}

static double load_eta(struct engine *e, struct sreq *r)
{
	struct net *n = &e->sim->net;
	double t = e->sim->now;

	for (uint32_t i = 0; i < n->nact; i++)
		if (n->act[i]->arg == r && n->act[i]->done == load_done)
			t = KVT_MAX(t, kvti_net_eta(n, n->act[i]));
	return t;
}

static int scratch(struct engine *e, uint32_t n)
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
	return e->scap ? 0 : fail(e, -ENOMEM);
}

static uint64_t free_pages(struct engine *e)
{
	uint64_t used = e->claimed + e->priv_pages;

	return used >= e->hbm_pages ? 0 : e->hbm_pages - used;
}

/* ---- steps ----------------------------------------------------------------- */

static void step_due(struct engine *e, double t_load)
{
	int overlap = e->sim->cfg->sched.features & KVT_SCHED_OVERLAP;
	double L = e->cost.layers, end;

	if (overlap)
		end = KVT_MAX(e->t0 + e->compute_s + (t_load - e->t0) / L,
			      t_load + e->compute_s / L);
	else
		end = KVT_MAX(t_load, e->t0) + e->compute_s;
	kvti_sim_push(e->sim, end, EV_STEP, e, e->step_gen);
}

/* A waiting request starts running. */
static int start_request(struct engine *e, struct sreq *r,
			 const kvt_sched_item *it)
{
	struct sim *s = e->sim;
	uint32_t rest;
	int err;

	if ((err = list_push(&e->run, &e->nrun, &e->run_cap, r)))
		return fail(e, err);
	list_del(e->wait, &e->nwait, r);
	claim(e, r);
	r->state = R_PREFILL;
	r->done = it->reuse;
	r->reused = it->reuse;
	kvti_debug("sim %.6f: req %llu starts: prompt %u, hbm %u, reuse %u, "
		   "loading %u (+%u now), transient %u", s->now,
		   (unsigned long long)r->id, r->it.prompt, r->sr.hbm,
		   it->reuse, r->sr.loading, it->load, r->sr.transient);
	if (!r->counted) {
		/* where its reused prefix came from: what it loaded itself
		 * (now or ahead, by prefetch) by source tier, the rest was in
		 * hbm already */
		uint32_t own = 0;

		r->counted = 1;
		rest = it->reuse;
		for (int t = KVT_TIER_FABRIC; t < KVT_TIER_COUNT; t++) {
			uint32_t n = KVT_MIN(rest, r->loaded[t]);

			s->hit[t] += n;
			rest -= n;
			own += n;
		}
		s->hit[KVT_TIER_HBM] += it->reuse - own;
	}
	/* the context it computes is in flight from now on, expected done
	 * when its whole prefill would be, running alone */
	if ((err = kvt_index_start(e->index, PX(r, r->it.prompt), r->id,
				   ns(s->now + kvt_cost_prefill_s(&e->cost,
					r->it.prompt - it->reuse, it->reuse)),
				   ns(s->now), NULL)))
		return fail(e, err);
	return 0;
}

static int apply_plan(struct engine *e, uint32_t n, const kvt_sched_plan *p,
		      kvt_cost_prefill *pf, uint32_t *npf)
{
	int err;

	*npf = 0;
	for (uint32_t i = 0; i < n; i++) {
		const kvt_sched_item *it = &p->items[i];
		struct sreq *r = e->sreqs[i];

		if (it->action == KVT_SACT_DEFER)
			e->deferred++;
		if (it->load && (err = issue_loads(e, r, it->load)))
			return err;
		if (it->action != KVT_SACT_RUN)
			continue;
		if (r->state == R_WAIT && (err = start_request(e, r, it)))
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
 * longer pinned). Returns how many claims were released. */
static uint32_t release_claims(struct engine *e)
{
	uint32_t n = 0;

	for (uint32_t i = 0; i < e->nwait; i++) {
		struct sreq *r = e->wait[i];

		if (!r->claim || r->load_flows)
			continue;
		if (repin(e, r, 0))
			return 0;
		kvt_index_cancel(e->index, PX(r, r->it.prompt), r->id, NULL);
		e->claimed -= r->claim;
		r->claim = 0;
		r->load_upto = 0;
		n++;
	}
	return n;
}

int kvti_engine_kick(struct engine *e)
{
	struct sim *s = e->sim;
	kvt_sched_state st = { .now = s->now };
	kvt_cost_prefill pf[512];
	kvt_sched_plan plan;
	uint32_t n = 0, npf, ndec = 0, decodes = 0;
	uint64_t dctx = 0;
	int err;

	if (e->busy || s->error)
		return 0;
	if ((err = scratch(e, e->nrun + WINDOW)))
		return err;
	for (uint32_t i = 0; i < e->nrun; i++) {
		struct sreq *r = e->run[i];

		if (r->state == R_PREFILL) {
			view_prefill(r);
			e->sreqs[n] = r;
			e->sq[n++] = r->sr;
		} else {
			decodes++;
			dctx += r->it.prompt + r->generated;
		}
	}
	for (uint32_t i = 0; i < e->nwait && i < WINDOW; i++) {
		struct sreq *r = e->wait[i];

		if ((err = view_waiting(e, r)))
			return err;
		if (r->load_flows) {
			r->load_eta = load_eta(e, r);
			r->sr.loading_ready = r->load_eta;
			st.link_free_at = KVT_MAX(st.link_free_at, r->load_eta);
		}
		e->sreqs[n] = r;
		e->sq[n++] = r->sr;
	}
	if (!n && !decodes)
		return 0;
	st.decodes = decodes;
	st.decode_ctx = dctx;
	st.free_pages = free_pages(e);
	if ((err = kvt_sched_plan_step(e->sched, &st, e->sq, n, e->si, &plan)))
		return fail(e, err);
	for (uint32_t i = 0; i < n; i++) /* keep the skip counts */
		e->sreqs[i]->sr.skips = e->sq[i].skips;
	if (plan.nrun > KVT_ARRAY_SIZE(pf))
		return fail(e, kvti_fail(-E2BIG, "more than %zu prefills in a "
					 "step", KVT_ARRAY_SIZE(pf)));
	e->busy = 1; /* loads completing inside apply_plan must not kick */
	e->rekick = 0;
	e->pending = 0;
	e->step_gen++;
	e->store_flows = 0;
	e->step_stored = 0;
	if ((err = apply_plan(e, n, &plan, pf, &npf)))
		return err;
	/* decodes: the first plan.decodes running decoders */
	for (uint32_t i = 0; i < e->nrun && ndec < plan.decodes; i++) {
		struct sreq *r = e->run[i];

		if (r->state == R_DECODE && !r->in_step) {
			r->in_step = 1;
			ndec++;
		}
	}
	if (!npf && !ndec) {
		/* nothing computes: wait for loads, arrivals or transients */
		e->busy = 0;
		if (e->rekick) {
			e->rekick = 0;
			return kvti_engine_kick(e);
		}
		if (!e->pending && !plan.nprefetch && !plan.ndefer &&
		    !s->net.nact && e->nwait && release_claims(e))
			return kvti_engine_kick(e);
		if (!e->pending && !plan.nprefetch && !plan.ndefer &&
		    !s->net.nact && e->nwait)
			return fail(e, kvti_fail(KVT_ECONFIG, "engine %u "
				"stalled: a request of %u tokens cannot get "
				"the hbm pages it needs (%llu free of %llu; "
				"%llu claimed, %llu decode pages, %u running)",
				e->idx, e->wait[0]->it.prompt,
				(unsigned long long)st.free_pages,
				(unsigned long long)e->hbm_pages,
				(unsigned long long)e->claimed,
				(unsigned long long)e->priv_pages, e->nrun));
		return 0;
	}
	e->steps++;
	e->decode_only += !npf;
	e->t0 = s->now;
	e->compute_s = kvt_cost_step_s(&e->cost, pf, npf, ndec, dctx);
	if (npf)
		kvti_debug("sim %.6f: engine %u step: %u prefills (%u tokens), "
			   "%u decodes, compute %.2f ms, %u waiting on loads",
			   s->now, e->idx, npf, plan.compute_tokens, ndec,
			   e->compute_s * 1e3, e->pending);
	if (!e->pending)
		kvti_sim_push(s, s->now + e->compute_s, EV_STEP, e,
			      e->step_gen);
	return 0;
}

/* ---- the end of a step ------------------------------------------------------ */

static int finish(struct engine *e, struct sreq *r)
{
	struct sim *s = e->sim;
	int err;

	r->state = R_DONE;
	r->finish = s->now;
	if ((err = repin(e, r, 0)))
		return err;
	if ((err = kvt_index_cancel(e->index, PX(r, r->it.prompt), r->id,
				    NULL)))
		return fail(e, err);
	list_del(e->run, &e->nrun, r);
	e->priv_pages -= r->priv;
	r->priv = 0;
	e->claimed -= r->claim;
	r->claim = 0;
	kvt_free(r->tok);
	r->tok = NULL;
	if (!e->hbm_reuse) {
		/* no reuse across requests in hbm: drop every page no running
		 * request holds; the next turn loads from the offload tier */
		kvt_index_evict_pages(e->index, KVT_TIER_HBM, e->hbm_pages,
				      NULL);
		flush_moves(e);
	}
	return kvti_sim_finished(s, r);
}

/* Emit a request's first token. Returns 1 when that was its last token: the
 * request is then finished and freed (kvti_sim_finished), and the caller must
 * not touch it again; 0 when it goes on decoding; a negative error. */
static int first_token(struct engine *e, struct sreq *r)
{
	int err;

	r->first_token = e->sim->now;
	kvti_debug("sim %.6f: req %llu first token (TTFT %.1f ms)",
		   e->sim->now, (unsigned long long)r->id,
		   (r->first_token - r->it.arrival) * 1e3);
	if (r->generated < r->it.output)
		return 0;
	if ((err = finish(e, r)))
		return err;
	return 1;
}

/* Emit the first tokens a sync_store step held back. */
static int unblock(struct engine *e)
{
	int err;

	e->blocked = 0;
	e->busy = 0;
	for (uint32_t i = 0; i < e->nrun;) {
		struct sreq *r = e->run[i];

		if (r->state == R_DECODE && r->first_token < 0) {
			if ((err = first_token(e, r)) < 0)
				return err;
			if (err) /* finished and freed: the list moved up */
				continue;
		}
		i++;
	}
	return kvti_engine_kick(e);
}

static void store_done(void *arg, struct net_flow *f, double now)
{
	struct engine *e = arg;

	(void)now;
	if (!f->tag || f->tag != e->step_gen || !e->store_flows)
		return;
	if (--e->store_flows == 0 && e->blocked)
		unblock(e);
}

/* Account a step's prefill work. Returns what first_token() returns: 1 when
 * the request finished and was freed, 0 otherwise, or a negative error. */
static int prefill_progress(struct engine *e, struct sreq *r, int hold)
{
	struct sim *s = e->sim;
	uint32_t upto;
	kvt_insert_result res = { 0 };
	int err;

	r->done += r->step_compute;
	s->computed += r->step_compute;
	upto = whole(e, r->done);
	if (upto) {
		err = kvt_index_insert(e->index, PX(r, upto), KVT_TIER_HBM,
				       KVT_INSERT_PARTIAL, ns(s->now), &res,
				       NULL, 0);
		if (err && err != KVT_EFULL)
			return fail(e, err);
		if ((err = flush_moves(e)))
			return err;
		if ((err = repin(e, r, (uint32_t)(res.pages * P_of(e)))))
			return err;
	}
	if (r->done < r->it.prompt)
		return 0;
	/* the prompt is done: this step produced the first token */
	if ((err = kvt_index_cancel(e->index, PX(r, r->it.prompt), r->id,
				    NULL)))
		return fail(e, err);
	r->state = R_DECODE;
	r->generated = 1;
	r->priv = (r->it.prompt + 1 + P_of(e) - 1) / P_of(e) -
		  r->it.prompt / P_of(e);
	e->priv_pages += r->priv;
	if (hold) {
		r->first_token = -1; /* emitted when the stores are done */
		return 0;
	}
	return first_token(e, r);
}

int kvti_engine_step_end(struct engine *e, uint64_t gen)
{
	struct sim *s = e->sim;
	int hold = s->cfg->sched.sync_store, changed = 0, err;
	double dur = s->now - e->t0;

	if (gen != e->step_gen || !e->busy || e->blocked)
		return 0;
	e->busy_s += e->compute_s;
	e->stall_s += KVT_MAX(0.0, dur - e->compute_s);
	for (uint32_t i = 0; i < e->nrun;) {
		struct sreq *r = e->run[i];

		if (!r->in_step) {
			i++;
			continue;
		}
		r->in_step = 0;
		if (r->state == R_DECODE) {
			uint32_t pages;

			r->generated++;
			pages = (r->it.prompt + r->generated + P_of(e) - 1) /
				P_of(e) - r->it.prompt / P_of(e);
			e->priv_pages += pages - r->priv;
			r->priv = pages;
			if (r->generated >= r->it.output &&
			    r->first_token >= 0) {
				if ((err = finish(e, r)))
					return err;
				changed = 1;
				continue;
			}
		} else if ((err = prefill_progress(e, r, hold)) < 0) {
			return err;
		} else {
			changed = 1;
			if (err) /* finished and freed: the list moved up */
				continue;
		}
		i++;
	}
	/* decode-only steps change nothing in the index */
	if (s->cfg->check && (changed || e->nwait) &&
	    (err = kvt_index_check(e->index)))
		return fail(e, err);
	if (hold && e->store_flows) {
		e->blocked = 1;
		return 0;
	}
	return unblock(e);
}

/* ---- arrival, set up --------------------------------------------------------- */

int kvti_engine_arrive(struct engine *e, struct sreq *r)
{
	int err;

	r->e = e;
	r->first_token = 0;
	if ((err = list_push(&e->wait, &e->nwait, &e->wait_cap, r))) {
		kvt_free(r); /* owned by no list: the run's cleanup would miss it */
		return fail(e, err);
	}
	return kvti_engine_kick(e);
}

static double tier_bytes(const kvt_sim_config *c, int i)
{
	const kvt_hw *hw = &c->hw;

	if (c->offload_bytes[i] > 0)
		return c->offload_bytes[i];
	switch (c->offload[i]) {
	case KVT_TIER_FABRIC: return hw->fabric_bytes * hw->gpus;
	case KVT_TIER_DRAM: return hw->dram_bytes;
	case KVT_TIER_SSD: return hw->ssd_bytes;
	default: return 0;
	}
}

int kvti_engine_init(struct engine *e, struct sim *s, uint32_t idx)
{
	const kvt_sim_config *c = s->cfg;
	kvt_index_config ic = { 0 };
	double kv;
	int err;

	memset(e, 0, sizeof(*e));
	e->sim = s;
	e->idx = idx;
	e->tp = c->tp;
	e->gpu0 = idx * c->tp;
	e->hbm_reuse = s->hbm_reuse;
	if ((err = kvti_sim_geom(c, &e->geom)) ||
	    (err = kvt_hw_cost(&c->hw, &e->geom, &e->cost)))
		return err;
	e->page_bytes = kvt_geom_page_bytes(&e->geom);
	kv = c->hw.hbm_bytes * c->hw.mem_util - (double)e->cost.weight_bytes -
	     c->hw.reserve_bytes;
	if (kv < 64.0 * e->page_bytes)
		return kvti_fail(KVT_ECONFIG, "%s at TP %u does not fit %s's "
				 "%.0f GB of HBM (weights %.1f GB per GPU)",
				 e->geom.name, c->tp, c->hw.gpu_name,
				 c->hw.hbm_bytes / 1e9,
				 e->cost.weight_bytes / 1e9);
	e->hbm_pages = (uint64_t)(kv / e->page_bytes);
	if ((err = kvt_pool_create(&e->pool[KVT_TIER_HBM], e->hbm_pages,
				   e->page_bytes)))
		goto err_pools;
	for (uint32_t i = 0; i < c->noffload; i++) {
		double per_engine = tier_bytes(c, (int)i) / c->engines;
		uint64_t pages = (uint64_t)(per_engine /
					    ((double)e->page_bytes * c->tp));

		if (!pages) {
			err = kvti_fail(KVT_ECONFIG, "offload tier %s: no "
					"room for a page on %s",
					kvt_tier_kind_name(c->offload[i]),
					c->hw.name);
			goto err_pools;
		}
		if ((err = kvt_pool_create(&e->pool[c->offload[i]], pages,
					   e->page_bytes)))
			goto err_pools;
	}
	ic.page_tokens = e->geom.page_tokens;
	ic.key_mode = KVT_KEY_TOKENS;
	ic.evict = c->evict_policy;
	ic.write = c->write_policy;
	memcpy(ic.pools, e->pool, sizeof(ic.pools));
	ic.mover.copy = mover_copy;
	ic.mover.arg = e;
	if ((err = kvt_index_create(&e->index, &ic)))
		goto err_pools;
	if ((err = kvt_sched_create(&e->sched, &c->sched, &e->cost)))
		goto err_index;
	return 0;

err_index:
	kvt_index_destroy(e->index);
	e->index = NULL;
err_pools:
	for (int t = 0; t < KVT_TIER_COUNT; t++)
		kvt_pool_destroy(e->pool[t]);
	memset(e->pool, 0, sizeof(e->pool));
	return err;
}

void kvti_engine_fini(struct engine *e)
{
	kvt_sched_destroy(e->sched);
	kvt_index_destroy(e->index);
	for (int t = 0; t < KVT_TIER_COUNT; t++)
		kvt_pool_destroy(e->pool[t]);
	kvt_free(e->wait);
	kvt_free(e->run);
	kvt_free(e->sq);
	kvt_free(e->si);
	kvt_free(e->sreqs);
	kvt_free(e->locs);
	memset(e, 0, sizeof(*e));
}
