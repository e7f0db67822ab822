/*
 * engine.c — one engine instance, as the simulator runs it: the step loop
 * of src/engine/engine.c (the same one the demo runs on the wall clock)
 * over a virtual clock, a radix index and modelled links.
 *
 * This file is the loop's platform (struct kvti_eng_ops):
 *
 *   data plane  a radix index (kvt_index) over an hbm pool and the offload
 *               pools (kvt_pool: the index takes and frees their slots).
 *               view:  match the prompt; per page: hbm | loadable per tier
 *                      | transient (in-flight marks: another request is
 *                      computing or loading it) | compute.
 *               load:  one flow per source tier and TP rank (an ssd one,
 *                      with ssd_stage_pages, then a second hop on the cpu
 *                      lane: the cache's bounce); when they are all done
 *                      the loaded prefix goes into hbm.
 *               background: after every store, tiers above bg_high
 *                      demote to bg_low (the cache's watermarks).
 *               start: the context a request computes is marked in flight
 *                      (kvt_index_start) until its prefill is done.
 *               computed: pages go into hbm; the write policy's copies go
 *                      down as store flows; with store_top (the demo's
 *                      stores) into the top offload tier too, and, with
 *                      store_room_wait, the step's end and its first
 *                      tokens wait for the copies making that room: the
 *                      insert's own demotions and the background pass's
 *                      copies still reading the tier (kvt_cache_store()
 *                      runs the first and waits for the second before
 *                      it returns, on the engine's thread).
 *   GPU         a step ends after its modelled compute time, or — when it
 *               waits on loads — at
 *                 overlap:  max(a + C + (t_load - a)/L, t_load + C/L),
 *                           a = max(t0, when the last awaited load
 *                           started moving: later if it queued on a
 *                           transfer engine lane, net.h; at its end if
 *                           it came from the ssd on the io lane, whose
 *                           layers land all at once)
 *                 else:     t_load + C
 *   clock       the simulator's (sim.c): EV_STEP events.
 *
 * Every copy the index asks for (write-through, demotion) is collected by
 * the mover callback and started as one flow per (source, destination)
 * pair and TP rank after the index call returns.
 *
 * Pins: a request holds one lease on the longest prefix it depends on
 * (what it is loading, then what is in hbm), so nothing it reads is
 * evicted under it. Unclaimed hbm pages hold cached context the index
 * evicts on demand.
 *
 * KVT_ENG_BREAKDOWN: at the end, a "sim loads" line beside the demo's
 * "demo loads" one (src/demo/serve.c) — loads' size, submit-to-home time
 * and layer 0, and the steps with loads pending — so one pass and its
 * prediction can be held side by side (docs/SIMULATOR.md section 7).
 *
 * Single-threaded, like the whole simulation.
 */
#include "sim/sim.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static uint64_t ns(double t)
{
	return t <= 0 ? 0 : (uint64_t)(t * 1e9);
}

static struct engine *eng_of(struct kvti_eng *k)
{
	return (struct engine *)k;
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
	return kvti_eng_fail(&e->eng, err);
}

/* ---- moving pages -------------------------------------------------------- */

static int mover_copy(void *arg, const kvt_move *mv)
{
	struct engine *e = arg;

	e->mv[mv->src][mv->dst]++;
	return 0;
}

static void store_done(void *arg, struct net_flow *f, double now);

#define BG_TAG (1ull << 62) /* a background copy's flow tag (| its id) */

/* A background copy out of tier @src starts: its tag (UINT64_MAX: no
 * memory). */
static uint64_t bg_track(struct engine *e, int src)
{
	struct bg_flow *b;

	if (kvti_grow((void **)&e->bgf, &e->bgf_cap, e->nbgf + 1,
		      sizeof(*e->bgf), 16))
		return UINT64_MAX;
	b = &e->bgf[e->nbgf++];
	b->id = ++e->bg_seq;
	b->waiter = 0;
	b->src = (uint8_t)src;
	return BG_TAG | b->id;
}

/* A store writes fresh slots of tier @t: the step waits for every
 * background copy still reading that tier (its slots may be the ones the
 * store got). */
static void bg_wait(struct engine *e, int t)
{
	for (size_t i = 0; i < e->nbgf; i++)
		if (e->bgf[i].src == t && !e->bgf[i].waiter)
			e->bgf[i].waiter = kvti_eng_room_tag(&e->eng);
}

/* A background copy is done: the step waiting for it, if any, is told. */
static void bg_done(struct engine *e, uint64_t tag)
{
	for (size_t i = 0; i < e->nbgf; i++)
		if ((e->bgf[i].id | BG_TAG) == tag) {
			uint64_t w = e->bgf[i].waiter;

			e->bgf[i] = e->bgf[--e->nbgf];
			if (w)
				kvti_eng_store_done(&e->eng, w);
			return;
		}
}

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
			if (a == KVT_TIER_HBM) /* hbm held until copied */
				kvti_eng_storing_add(&e->eng, e->flush_owner ?
						     &e->flush_owner->er : NULL,
						     pages);
			s->flow_owner = a == KVT_TIER_HBM && e->flush_owner ?
					e->flush_owner->er.id : 0;
			for (uint32_t g = 0; g < e->tp; g++) {
				/* the tag ties a store to the step that waits
				 * for it (sync_store), and a copy making
				 * room for one to the step that waits for
				 * that (store_room_wait) */
				uint64_t tag = a == KVT_TIER_HBM ?
					kvti_eng_store_tag(&e->eng) :
					e->room ? kvti_eng_room_tag(&e->eng) :
					e->bg && c->store_room_wait ?
					bg_track(e, a) : 0;

				if (tag == UINT64_MAX) {
					s->flow_owner = 0;
					return fail(e, -ENOMEM);
				}

				err = kvti_sim_flow(s, e->gpu0 + g,
						    (kvt_tier_kind)a,
						    (kvt_tier_kind)b, bytes, cap,
						    store_done, e, tag);
				if (err) {
					s->flow_owner = 0;
					return fail(e, err);
				}
			}
			s->flow_owner = 0;
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

/* A load flow's own rate cap: the scheduler's copy method. */
static double load_cap(const struct engine *e)
{
	const kvt_sim_config *c = e->sim->cfg;

	return kvt_cost_copy_gbps(&e->cost, c->sched.method,
			kvt_cost_method_chunk(&e->cost, c->sched.method,
					      c->sched.object_tokens)) * 1e9;
}

#define TAG_STAGE_HOP (KVT_TIER_COUNT + 1) /* no tier's measured rate */

static void load_done(void *arg, struct net_flow *f, double now)
{
	struct sreq *r = arg;
	struct engine *e = r->e;
	const kvt_sim_config *c = e->sim->cfg;

	/* measured_rates: the rate this load reached (its tag: tier + 1),
	 * from when it first moved, as the transfer engine measures a job
	 * from its start, not from its submission */
	if (f->tag && f->tag <= KVT_TIER_COUNT && now > f->run_start) {
		double x = f->total / (now - f->run_start);
		double *v = &e->tier_rate[f->tag - 1];

		*v = *v > 0 ? 0.7 * *v + 0.3 * x : x;
	}
	/* an ssd load through the cache's bounce (ssd_stage_pages; the
	 * demo's cache, src/cache/job_finish.c staged_run()): the io lane's
	 * reads are the first hop, in rounds of half the bounce; the second,
	 * bounce -> engine memory, is a cpu lane copy that queues there
	 * behind the loads before it. Each earlier round's copy runs while
	 * the next round is read; the last round's is what the load waits
	 * for, and its layers land as it copies them. */
	if (f->tag == KVT_TIER_SSD + 1 && c->ssd_stage_pages >= 2 &&
	    f->lane >= 0 && f->lane == e->sim->lane_io) {
		double round = (double)(c->ssd_stage_pages / 2) *
			       (double)e->page_bytes;
		int err = kvti_sim_flow_host(e->sim, KVT_MIN(f->total, round),
					     load_cap(e), load_done, r,
					     TAG_STAGE_HOP);

		if (err)
			fail(e, err);
		e->stage_hops++;
		return; /* the hop stands in for this flow (load_flows) */
	}
	/* the step waits for it: on a lane, its layers land evenly from when
	 * it first moved, or all at its end on the io lane (io.c: one
	 * whole-slot read per page, every layer of a page at once: the job's
	 * layers are reported when it is done); without lanes (the GPU
	 * profiles) as they always have, from the step's start */
	if (r->er.in_step && f->lane >= 0)
		e->step_run_at = KVT_MAX(e->step_run_at,
					 f->lane == e->sim->lane_io ?
					 now : f->run_start);
	/* the breakdown's layer 0: when this flow's first layer landed */
	r->ld_l0 = KVT_MAX(r->ld_l0, f->lane == e->sim->lane_io ? now :
			   f->run_start + (now - f->run_start) /
			   e->cost.layers);
	if (--r->er.load_flows == 0) {
		e->bd_loads++;
		e->bd_ld_bytes += r->ld_bytes;
		e->bd_ld_actual += now - r->ld_t0;
		e->bd_ld_l0 += r->ld_l0 - r->ld_t0;
		loads_complete(r->e, r);
	}
}

static void loads_complete(struct engine *e, struct sreq *r)
{
	kvt_insert_result res = { 0 };
	int err;

	err = kvt_index_insert(e->index, PX(r, whole(e, r->er.load_upto)),
			       KVT_TIER_HBM, KVT_INSERT_PARTIAL,
			       ns(e->sim->now), &res, NULL, 0);
	if (err && err != KVT_EFULL) {
		fail(e, err);
		return;
	}
	if (res.pages * P_of(e) < r->er.load_upto)
		r->er.load_upto = (uint32_t)(res.pages * P_of(e));
	kvti_debug("sim %.6f: req %llu loads done: %u tokens in hbm",
		   e->sim->now, (unsigned long long)r->er.id, r->er.load_upto);
	flush_moves(e);
	repin(e, r, r->er.load_upto);
	kvti_eng_loads_done(&e->eng, &r->er, r->er.load_upto);
}

/* Start loading @tokens more of r's prefix (after what it has or loads),
 * split over the offload tiers fastest first as the match found them. */
static int op_load(struct kvti_eng *k, struct kvti_ereq *q, uint32_t tokens)
{
	struct engine *e = eng_of(k);
	struct sreq *r = sreq_of(q);
	struct sim *s = e->sim;
	const kvt_sim_config *c = s->cfg;
	uint32_t from = q->load_flows || q->load_upto > q->sr.hbm ?
				q->load_upto : q->sr.hbm;
	uint32_t upto = whole(e, from + tokens), left, start_flows;
	double cap = load_cap(e);
	int err;

	if (upto <= from)
		return 0;
	tokens = upto - from;
	kvti_eng_claim(k, q);
	if ((err = repin(e, r, upto)))
		return err;
	/* others see these pages in flight until the load is expected done */
	if ((err = kvt_index_start(e->index, PX(r, upto), q->id,
				   ns(s->now + kvt_cost_copy_s(&e->cost,
					c->sched.method,
					kvt_cost_method_chunk(&e->cost,
						c->sched.method,
						c->sched.object_tokens),
					(uint64_t)tokens * e->cost.token_bytes)),
				   ns(s->now), NULL)))
		return fail(e, err);
	if (!q->load_flows) {
		q->load_base = from;
		r->ld_t0 = s->now;
		r->ld_l0 = r->ld_bytes = 0;
	}
	q->load_upto = upto;
	start_flows = q->load_flows;
	left = tokens;
	for (int t = KVT_TIER_FABRIC; t < KVT_TIER_COUNT && left; t++) {
		uint32_t n = KVT_MIN(left, q->sr.tier[t]);
		double bytes = (double)n * e->cost.token_bytes;

		if (!n)
			continue;
		left -= n;
		q->loaded[t] += n;
		s->load_bytes[t] += bytes * e->tp;
		r->ld_bytes += bytes * e->tp;
		for (uint32_t g = 0; g < e->tp; g++) {
			if ((err = kvti_sim_flow(s, e->gpu0 + g,
						 (kvt_tier_kind)t, KVT_TIER_HBM,
						 bytes, cap, load_done, r,
						 (uint64_t)t + 1)))
				return fail(e, err);
			q->load_flows++;
		}
	}
	if (q->load_flows == start_flows) {
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

	if (kvti_grow((void **)&e->locs, &e->nlocs, m->pages,
		      sizeof(*e->locs), 64))
		return fail(e, -ENOMEM);
	if ((err = kvt_index_match(e->index, PX(r, r->it.prompt), 0, 0, &m2,
				   e->locs, m->pages)))
		return fail(e, err);
	if (r->er.load_upto > r->er.load_base) {
		lo = r->er.load_base / P;
		hi = r->er.load_upto / P;
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

/* hbm_share off (an engine with no prefix cache: the demo's): only what r
 * loaded itself is in hbm for it; pages with a copy below are loadable
 * (tier runs in prefix order), pages held only in hbm by others or being
 * computed are transient. */
static int view_private(struct engine *e, struct sreq *r, kvt_sched_req *q)
{
	const kvt_sim_config *c = e->sim->cfg;
	uint32_t P = P_of(e), full = r->it.prompt / P, own_to, own_done;
	size_t found = 0;
	uint64_t ready = 0;
	int phase = 0, err;

	if (full > e->ninfo) {
		kvt_page_info *x = kvt_realloc(e->info, full * sizeof(*x));

		if (!x)
			return fail(e, -ENOMEM);
		e->info = x;
		e->ninfo = full;
	}
	if (full && (err = kvt_index_inspect(e->index, PX(r, full * P), e->info,
					     full, &found)))
		return fail(e, err);
	own_to = r->er.load_upto / P;
	own_done = r->er.load_flows ? r->er.load_base / P : own_to;
	for (uint32_t j = 0; j < found; j++) {
		const kvt_page_info *pi = &e->info[j];
		int t = -1;

		for (uint32_t i = 0; i < c->noffload && t < 0; i++)
			if (pi->slot[c->offload[i]] != KVT_SLOT_NONE)
				t = (int)c->offload[i];
		if (j < own_done && phase == 0 &&
		    pi->slot[KVT_TIER_HBM] != KVT_SLOT_NONE) {
			q->hbm += P;
			continue;
		}
		if ((j < own_to || t >= 0) && phase <= 1) {
			uint32_t tt = t >= 0 ? (uint32_t)t : c->offload[0];

			phase = 1;
			q->tier[tt] += P;
			if (j < own_to)
				q->loading += P;
			if (q->nruns && q->run_tier[q->nruns - 1] == tt)
				q->run_tokens[q->nruns - 1] += P;
			else if (q->nruns < KVT_SCHED_RUNS) {
				q->run_tier[q->nruns] = tt;
				q->run_tokens[q->nruns++] = P;
			} else { /* more runs than the scheduler takes */
				q->run_tokens[q->nruns - 1] += P;
				q->tier[q->run_tier[q->nruns - 1]] += P;
				q->tier[tt] -= P;
			}
			continue;
		}
		if (pi->slot[KVT_TIER_HBM] != KVT_SLOT_NONE ||
		    pi->state == KVT_PAGE_INFLIGHT ||
		    pi->state == KVT_PAGE_QUEUED) {
			phase = 2;
			q->transient += P;
			ready = KVT_MAX(ready, pi->ready_ns);
			continue;
		}
		break;
	}
	if (q->loading)
		q->loading_ready = r->er.load_flows ? r->er.load_eta :
						      e->sim->now;
	q->transient_ready = ready * 1e-9;
	return 0;
}

/* Fill r->sr's spans from the index, for a waiting request. */
static int op_view(struct kvti_eng *k, struct kvti_ereq *qr)
{
	struct engine *e = eng_of(k);
	struct sreq *r = sreq_of(qr);
	kvt_sched_req *q = &qr->sr;
	uint32_t own = 0, trans;
	kvt_match m;
	int err;

	if ((err = ensure_tokens(e, r)))
		return err;
	if (!e->sim->cfg->hbm_share)
		return view_private(e, r, q);
	if ((err = kvt_index_match(e->index, PX(r, r->it.prompt), 0, 0, &m,
				   NULL, 0)))
		return fail(e, err);
	q->hbm = (uint32_t)m.tier_tokens[KVT_TIER_HBM];
	for (int t = KVT_TIER_FABRIC; t < KVT_TIER_COUNT; t++)
		q->tier[t] = (uint32_t)m.tier_tokens[t];
	trans = (uint32_t)(m.inflight_tokens + m.queued_tokens);
	if (trans && (err = view_pages(e, r, &m, q, &own, &trans)))
		return err;
	if (own) {
		q->loading = own;
		q->loading_ready = qr->load_flows ? qr->load_eta : e->sim->now;
	}
	q->transient = trans;
	q->transient_ready = m.ready_ns * 1e-9;
	return 0;
}

static double op_load_eta(struct kvti_eng *k, struct kvti_ereq *q)
{
	struct engine *e = eng_of(k);
	struct net *n = &e->sim->net;
	double t = e->sim->now;

	for (uint32_t i = 0; i < n->nact; i++)
		if (n->act[i]->arg == (void *)q && n->act[i]->done == load_done)
			t = KVT_MAX(t, kvti_net_eta(n, n->act[i]));
	return t;
}

/* ---- the GPU model ---------------------------------------------------------- */

static int op_step_begin(struct kvti_eng *k)
{
	struct engine *e = eng_of(k);

	e->step_run_at = 0;
	if (!k->pending)
		return kvti_sim_push(e->sim, e->sim->now + k->compute_s,
				     EV_STEP, e, k->step_gen);
	return 0;
}

static void op_step_loads_home(struct kvti_eng *k, double t_load)
{
	struct engine *e = eng_of(k);
	double L = e->cost.layers, end;
	/* the GPU's part overlaps the loads layer by layer; the host's is
	 * spent whole (the demo's step thread: its plan before the step,
	 * its wake-ups and page writes in it, past the GPU's layers) */
	double gpu = k->compute_s - e->step_host_s;
	/* the loads' layers land evenly from when the last of them started
	 * moving (the step's start, or later when one waited on its lane)
	 * until t_load; layer l's compute waits for layer l */
	double a = KVT_MIN(KVT_MAX(k->t0, e->step_run_at), t_load);

	if (k->overlap)
		end = KVT_MAX(a + gpu + (t_load - a) / L,
			      t_load + gpu / L) + e->step_host_s;
	else
		end = KVT_MAX(t_load, k->t0) + k->compute_s;
	e->bd_wait_steps++;
	e->bd_wait_s += KVT_MAX(end - (k->t0 + k->compute_s), 0);
	kvti_sim_push(e->sim, end, EV_STEP, e, k->step_gen);
}

/* The engine's per-step CPU work (scheduling, input preparation, kernel
 * launches) shares the host's memory channels: the part of it that waits
 * on DRAM (step_mem_frac) stretches with the socket's loaded latency. */
static double op_step_extra_s(struct kvti_eng *k)
{
	struct engine *e = eng_of(k);
	const struct sim *s = e->sim;
	const kvt_hw *hw = &s->cfg->hw;
	const struct net_socket *x;
	/* the engine's own host time; a step with prefills may cost more */
	double host = (k->step_prefills && hw->host_prefill_us > 0 ?
		       hw->host_prefill_us : hw->host_us) * 1e-6;

	e->step_host_s = host;

	if (!s->cfg->cpu_mem_latency || !(hw->step_mem_frac > 0))
		return host;
	x = &s->net.sock[s->gpu[e->gpu0].socket];
	if (!(x->lat > x->lat0))
		return host;
	/* DMA streams that are not latency-bound can ask more of a socket
	 * than it has; the queue model then has no fixed point and the
	 * latency runs away. A core's misses see at most what a 99%-busy
	 * M/D/1 queue gives: lat0 * (1 + 0.99 / 0.02) ~ 50 lat0. */
	return host + hw->step_us * 1e-6 * hw->step_mem_frac *
	       (KVT_MIN(x->lat / x->lat0, 50.5) - 1);
}

static int op_busy_io(struct kvti_eng *k)
{
	return eng_of(k)->sim->net.nact != 0;
}

/* ---- requests starting, advancing, ending ------------------------------------ */

static int op_start(struct kvti_eng *k, struct kvti_ereq *q,
		    const kvt_sched_item *it)
{
	struct engine *e = eng_of(k);
	struct sreq *r = sreq_of(q);
	struct sim *s = e->sim;
	int err;

	/* the context it computes is in flight from now on, expected done
	 * when its whole prefill would be, running alone */
	if ((err = kvt_index_start(e->index, PX(r, r->it.prompt), q->id,
				   ns(s->now + kvt_cost_prefill_s(&e->cost,
					r->it.prompt - it->reuse, it->reuse)),
				   ns(s->now), NULL)))
		return fail(e, err);
	return 0;
}

/* store_top: the pages r's prefill completed go into the fastest offload
 * tier now (the demo's engine stores every step): a copy out of hbm, held
 * until it lands. */
static int store_top(struct engine *e, struct sreq *r)
{
	const kvt_sim_config *c = e->sim->cfg;
	uint32_t a = c->store_align, upto;
	kvt_insert_result res = { 0 };
	uint64_t np;
	int err;

	upto = a ? r->er.done / a * a : whole(e, r->er.done);
	upto = KVT_MIN(upto, whole(e, r->it.prompt));
	if (upto <= r->stored)
		return 0;
	np = upto / P_of(e);
	if (kvti_grow((void **)&e->locs, &e->nlocs, np, sizeof(*e->locs), 64))
		return fail(e, -ENOMEM);
	/* as kvt_cache_store() places them (src/cache/store.c): a page with
	 * no copy goes into the top tier, or spills below when it has no
	 * room; a page with a copy in an offload tier keeps it (a loaded
	 * prefix is not promoted back up, nor held twice); its copy in hbm
	 * does not count (KVT_INSERT_SPILL looks from offload[0] down) */
	err = kvt_index_insert(e->index, PX(r, upto), c->offload[0],
			       KVT_INSERT_SPILL | KVT_INSERT_PARTIAL,
			       ns(e->sim->now), &res, e->locs, np);
	if (err && err != KVT_EFULL)
		return fail(e, err);
	for (uint64_t i = 0; !err && i < res.pages && i < np; i++)
		if (e->locs[i].fresh && e->locs[i].tier < KVT_TIER_COUNT) {
			if (!e->mv[KVT_TIER_HBM][e->locs[i].tier] &&
			    c->store_room_wait)
				bg_wait(e, e->locs[i].tier);
			e->mv[KVT_TIER_HBM][e->locs[i].tier]++;
		}
	r->stored = upto;
	e->flush_owner = r;
	e->room = c->store_room_wait;
	err = flush_moves(e);
	e->room = 0;
	e->flush_owner = NULL;
	return err;
}

static int op_computed(struct kvti_eng *k, struct kvti_ereq *q, int last)
{
	struct engine *e = eng_of(k);
	struct sreq *r = sreq_of(q);
	uint32_t upto = whole(e, q->done);
	kvt_insert_result res = { 0 };
	int err;

	(void)last;
	if (!upto)
		return 0;
	err = kvt_index_insert(e->index, PX(r, upto), KVT_TIER_HBM,
			       KVT_INSERT_PARTIAL, ns(e->sim->now), &res, NULL,
			       0);
	if (err && err != KVT_EFULL)
		return fail(e, err);
	e->flush_owner = r;
	err = flush_moves(e);
	e->flush_owner = NULL;
	if (err)
		return err;
	if ((err = repin(e, r, (uint32_t)(res.pages * P_of(e)))))
		return err;
	return e->sim->cfg->store_top ? store_top(e, r) : 0;
}

static int op_prompt_done(struct kvti_eng *k, struct kvti_ereq *q)
{
	struct engine *e = eng_of(k);
	int err;

	if ((err = kvt_index_cancel(e->index, PX(sreq_of(q), q->prompt), q->id,
				    NULL)))
		return fail(e, err);
	return 0;
}

static int op_release(struct kvti_eng *k, struct kvti_ereq *q, int preempt)
{
	struct engine *e = eng_of(k);
	struct sreq *r = sreq_of(q);
	int err;

	if ((err = repin(e, r, 0)))
		return err;
	if ((err = kvt_index_cancel(e->index, PX(r, r->it.prompt), q->id,
				    NULL)))
		return fail(e, err);
	if (preempt)
		return 0;
	if (!e->hbm_reuse) {
		/* no reuse across requests in hbm: drop every page no running
		 * request holds; the next turn loads from the offload tier */
		kvt_index_evict_pages(e->index, KVT_TIER_HBM, e->hbm_pages,
				      NULL);
		return flush_moves(e);
	}
	return 0;
}

static int op_unclaim(struct kvti_eng *k, struct kvti_ereq *q)
{
	struct engine *e = eng_of(k);
	struct sreq *r = sreq_of(q);

	if (repin(e, r, 0))
		return -1;
	kvt_index_cancel(e->index, PX(r, r->it.prompt), q->id, NULL);
	return 0;
}

static int op_finished(struct kvti_eng *k, struct kvti_ereq *q)
{
	struct sreq *r = sreq_of(q);

	kvt_free(r->tok);
	r->tok = NULL;
	return kvti_sim_finished(eng_of(k)->sim, r);
}

static int op_check(struct kvti_eng *k)
{
	struct engine *e = eng_of(k);

	return e->sim->cfg->check ? kvt_index_check(e->index) : 0;
}

static double op_now(struct kvti_eng *k)
{
	return eng_of(k)->sim->now;
}

/* measured_rates: the scheduler prices loads per tier at the rates this
 * engine's loads reached (none yet: the cost model's, as the demo does). */
static void op_sched_state(struct kvti_eng *k, kvt_sched_state *st)
{
	struct engine *e = eng_of(k);

	if (!e->sim->cfg->measured_rates)
		return;
	for (int t = KVT_TIER_FABRIC; t < KVT_TIER_REMOTE; t++)
		st->tier_gbps[t] = e->tier_rate[t] / 1e9;
}

static const struct kvti_eng_ops sim_ops = {
	.now = op_now,
	.view = op_view,
	.load = op_load,
	.load_eta = op_load_eta,
	.start = op_start,
	.step_begin = op_step_begin,
	.step_loads_home = op_step_loads_home,
	.step_extra_s = op_step_extra_s,
	.computed = op_computed,
	.prompt_done = op_prompt_done,
	.release = op_release,
	.unclaim = op_unclaim,
	.finished = op_finished,
	.busy_io = op_busy_io,
	.check = op_check,
	.sched_state = op_sched_state,
};

/* ---- copies out of hbm done ----------------------------------------------- */

/* A copy out of hbm is done: its pages are free to reuse (counted once,
 * on the engine's first rank). */
static void store_freed(struct engine *e, const struct net_flow *f)
{
	const struct sim *s = e->sim;
	uint64_t pages;

	if (!f->nres || f->res[0] != (uint32_t)s->gpu[e->gpu0].d2h)
		return; /* not from hbm, or another rank's copy */
	pages = (uint64_t)(f->total / (double)e->page_bytes + 0.5);
	kvti_eng_storing_sub(&e->eng, f->owner, pages);
}

/* The cache's background pass (src/cache/mover.c, bg_decide(): kicked by
 * every store that ends): each offload tier above bg_high of its slots
 * demotes its least recently used unleased pages until bg_low, and the
 * copies start as flows like any other move. */
static int bg_demote(struct engine *e)
{
	const kvt_sim_config *c = e->sim->cfg;
	int any = 0, err;

	if (!(c->bg_high > 0))
		return 0;
	for (uint32_t i = 0; i < c->noffload; i++) {
		kvt_pool *p = e->pool[c->offload[i]];
		uint64_t used, slots, low;

		if (!p)
			continue;
		used = kvt_pool_used(p);
		slots = kvt_pool_slots(p);
		low = (uint64_t)(c->bg_low * (double)slots);
		if ((double)used <= c->bg_high * (double)slots || used <= low)
			continue;
		kvt_index_evict_pages(e->index, c->offload[i], used - low,
				      NULL);
		any = 1;
	}
	if (!any)
		return 0;
	e->flush_owner = NULL;
	e->bg_passes++;
	e->bg = 1;
	err = flush_moves(e);
	e->bg = 0;
	return err;
}

static void store_done(void *arg, struct net_flow *f, double now)
{
	struct engine *e = arg;

	(void)now;
	store_freed(e, f);
	if (f->tag & BG_TAG)
		bg_done(e, f->tag);
	else
		kvti_eng_store_done(&e->eng, f->tag);
	bg_demote(e); /* (an error is recorded by flush_moves()) */
}

/* ---- arrival, step end, set up ------------------------------------------------ */

int kvti_engine_arrive(struct engine *e, struct sreq *r)
{
	r->e = e;
	r->er.prompt = r->it.prompt;
	r->er.output = r->it.output;
	r->er.arrival = r->it.arrival;
	r->er.group = r->it.group;
	r->er.group_tokens = r->it.group_tokens;
	if (kvti_eng_enqueue(&e->eng, &r->er)) {
		kvt_free(r); /* owned by no list: the run's cleanup would miss it */
		return fail(e, -ENOMEM);
	}
	kvti_eng_kick(&e->eng);
	return e->eng.error;
}

int kvti_engine_step_end(struct engine *e, uint64_t gen)
{
	int err = kvti_eng_step_end(&e->eng, gen);

	return err ? err : e->eng.error;
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
	struct kvti_eng_config ec = { 0 };
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
	if (c->page_contig) /* one copy per page, all layers */
		e->cost.chunk_bytes = e->cost.token_bytes * e->geom.page_tokens;
	e->page_bytes = kvt_geom_page_bytes(&e->geom);
	kv = c->kv_bytes > 0 ? c->kv_bytes :
	     c->hw.hbm_bytes * c->hw.mem_util - (double)e->cost.weight_bytes -
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
	ec.sched = &c->sched;
	ec.cost = &e->cost;
	ec.hbm_pages = e->hbm_pages;
	ec.store_holds_hbm = c->store_holds_hbm;
	ec.idx = idx;
	if ((err = kvti_eng_init(&e->eng, &ec, &sim_ops, e)))
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
	if (getenv("KVT_ENG_BREAKDOWN") && e->bd_loads)
		fprintf(stderr, "sim loads: %llu, per load: %.1f MB, %.2f ms "
			"actual (layer 0 %.2f); steps with loads pending "
			"%llu, %.3f ms past their compute on average\n",
			(unsigned long long)e->bd_loads,
			e->bd_ld_bytes / e->bd_loads / 1e6,
			e->bd_ld_actual / e->bd_loads * 1e3,
			e->bd_ld_l0 / e->bd_loads * 1e3,
			(unsigned long long)e->bd_wait_steps,
			e->bd_wait_steps ? e->bd_wait_s / e->bd_wait_steps *
			1e3 : 0);
	if (getenv("KVT_ENG_BREAKDOWN") && e->eng.room_waits)
		fprintf(stderr, "sim stores: %llu step ends waited for room, "
			"%.2f ms each on average\n",
			(unsigned long long)e->eng.room_waits,
			e->eng.room_wait_s / e->eng.room_waits * 1e3);
	kvti_eng_fini(&e->eng);
	kvt_index_destroy(e->index);
	for (int t = 0; t < KVT_TIER_COUNT; t++)
		kvt_pool_destroy(e->pool[t]);
	kvt_free(e->locs);
	kvt_free(e->bgf);
	kvt_free(e->info);
	memset(e, 0, sizeof(*e));
}
