/*
 * sim.c — one simulation run: the virtual clock, the event queue, the
 * node's topology, and the results.
 *
 *   events (a binary heap on (time, insertion order)):
 *     ARRIVAL  a request reaches its engine (routed by affinity)
 *     NET      the earliest flow completion (one pending event; a newer
 *              generation makes older ones void)
 *     STEP     an engine's step ends (generation-checked the same way)
 *
 *   each event: the net advances to its time; the handler runs (it may
 *   start flows); if flows changed, rates are solved and the NET event is
 *   pushed again.
 *
 *   topology, per GPU g (the resources a flow crosses):
 *
 *     dram --(root port: shared uplink or g's own)-- g.h2d --> GPU g
 *     fabric controller g: fab.dev -- fab.out --------- g.h2d --> GPU g
 *     ssd.rd -- dram (bounce, 2 bytes of DRAM per byte) -- root port --> g
 *
 * The run ends when every request is done (or at max_sim_s); a run with
 * requests left and nothing that could move them is reported as stalled.
 */
#include "sim/sim.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- events ------------------------------------------------------------- */

static int ev_less(const struct ev *a, const struct ev *b)
{
	return a->t < b->t || (a->t == b->t && a->seq < b->seq);
}

int kvti_sim_push(struct sim *s, double t, int type, void *p, uint64_t gen)
{
	struct ev *h;
	uint32_t i;

	if (s->nheap == s->heap_cap) {
		uint32_t c = s->heap_cap ? 2 * s->heap_cap : 1024;

		if (!(h = kvt_realloc(s->heap, c * sizeof(*h))))
			return -ENOMEM;
		s->heap = h;
		s->heap_cap = c;
	}
	h = s->heap;
	i = s->nheap++;
	h[i] = (struct ev){ .t = KVT_MAX(t, s->now), .seq = s->seq++,
			    .type = type, .p = p, .gen = gen };
	while (i && ev_less(&h[i], &h[(i - 1) / 2])) {
		struct ev x = h[i];

		h[i] = h[(i - 1) / 2];
		h[(i - 1) / 2] = x;
		i = (i - 1) / 2;
	}
	return 0;
}

static struct ev ev_pop(struct sim *s)
{
	struct ev *h = s->heap, top = h[0];
	uint32_t i = 0;

	h[0] = h[--s->nheap];
	for (;;) {
		uint32_t l = 2 * i + 1, r = l + 1, m = i;
		struct ev x;

		if (l < s->nheap && ev_less(&h[l], &h[m]))
			m = l;
		if (r < s->nheap && ev_less(&h[r], &h[m]))
			m = r;
		if (m == i)
			break;
		x = h[i];
		h[i] = h[m];
		h[m] = x;
		i = m;
	}
	return top;
}

/* ---- topology and flows -------------------------------------------------- */

static int add(struct sim *s, int *out, const char *fmt, uint32_t i,
	       double gbps, int port, int socket)
{
	char name[32];
	int r;

	snprintf(name, sizeof(name), fmt, i);
	r = port ? kvti_net_add_port(&s->net, name, gbps * 1e9, socket,
				     s->cfg->hw.link_latency_ns * 1e-9) :
		   kvti_net_add_res(&s->net, name, gbps * 1e9);
	if (r < 0)
		return r;
	*out = r;
	return 0;
}

/* A per-chunk copy method (one call per chunk) is issued by one CPU
 * thread per GPU: its call costs bound the GPU's total rate with that
 * method, however many requests load at once. The rate, 0 if @m pays per
 * job instead. */
static double issue_gbps(const kvt_sim_config *c, kvt_copy_method m)
{
	kvt_cost cost;
	kvt_geom g;

	if ((m != KVT_COPY_MEMCPY && m != KVT_COPY_OBJECT) ||
	    kvti_sim_geom(c, &g) || kvt_hw_cost(&c->hw, &g, &cost))
		return 0; /* (a bad model fails later, with its message) */
	if (c->page_contig)
		cost.chunk_bytes = cost.token_bytes * g.page_tokens;
	return kvt_cost_copy_gbps(&cost, m, kvt_cost_method_chunk(&cost, m,
					c->sched.object_tokens));
}

static int build_topology(struct sim *s)
{
	const kvt_hw *hw = &s->cfg->hw;
	uint32_t per_sock = hw->gpus / hw->sockets;
	int up_h2d = -1, up_d2h = -1, err;
	double ld = issue_gbps(s->cfg, s->cfg->sched.method);
	double st = issue_gbps(s->cfg, s->cfg->store_method);

	kvti_net_init(&s->net, hw->dma_window, hw->stress_gbps * 1e9);
	for (uint32_t k = 0; k < hw->sockets; k++) {
		char name[32];
		int r;

		snprintf(name, sizeof(name), "dram%u", k);
		r = kvti_net_add_socket(&s->net, name,
					hw->dram_gbps * hw->dram_eff * 1e9,
					hw->dram_latency_ns * 1e-9);
		if (r < 0)
			return r;
	}
	/* stressor threads run on the first socket */
	kvti_net_set_stress(&s->net, 0, s->cfg->stress);
	for (uint32_t g = 0; g < hw->gpus; g++) {
		struct gpu_res *x = &s->gpu[g];
		uint32_t u = hw->gpus_per_uplink ? g / hw->gpus_per_uplink : 0;

		x->socket = (int)(g / per_sock);
		x->fab_out = x->fab_in = x->fab_dev = -1;
		x->issue_ld = x->issue_st = -1;
		if ((ld > 0 && (err = add(s, &x->issue_ld, "gpu%u.calls_load",
					  g, ld, 0, 0))) ||
		    (st > 0 && (err = add(s, &x->issue_st, "gpu%u.calls_store",
					  g, st, 0, 0))))
			return err;
		if ((err = add(s, &x->h2d, "gpu%u.h2d", g, hw->link_gbps, 0, 0)) ||
		    (err = add(s, &x->d2h, "gpu%u.d2h", g, hw->link_gbps, 0, 0)))
			return err;
		if (hw->gpus_per_uplink) {
			if (g % hw->gpus_per_uplink == 0 &&
			    ((err = add(s, &up_h2d, "uplink%u.h2d", u,
					hw->uplink_gbps, 1, x->socket)) ||
			     (err = add(s, &up_d2h, "uplink%u.d2h", u,
					hw->uplink_gbps, 0, 0))))
				return err;
			x->up_h2d = up_h2d;
			x->up_d2h = up_d2h;
		} else {
			/* the GPU's own root port */
			if ((err = add(s, &x->up_h2d, "port%u.h2d", g,
				       hw->link_gbps, 1, x->socket)))
				return err;
			x->up_d2h = -1;
		}
		if (hw->fabric_bytes > 0 &&
		    ((err = add(s, &x->fab_out, "fabric%u.out", g,
				hw->fabric_link_gbps, 0, 0)) ||
		     (err = add(s, &x->fab_in, "fabric%u.in", g,
				hw->fabric_link_gbps, 0, 0)) ||
		     (err = add(s, &x->fab_dev, "fabric%u.mem", g,
				hw->fabric_device_gbps, 0, 0))))
			return err;
	}
	s->cpu_copy = s->lane_cpu = s->lane_io = -1;
	if (hw->copy_gbps > 0 &&
	    (err = add(s, &s->cpu_copy, "cpu%u.copy", 0, hw->copy_gbps, 0, 0)))
		return err;
	/* a host whose copies are all the CPU's is kvtier's transfer engine
	 * on a machine without a GPU (the demo's): its cpu lane (every copy
	 * between memory tiers) and io lane (every copy to or from the ssd),
	 * each one job at a time by priority (net.h) */
	if (hw->copy_gbps > 0) {
		if ((err = kvti_net_add_lane(&s->net, "xfer.cpu")) < 0)
			return err;
		s->lane_cpu = err;
		if ((err = kvti_net_add_lane(&s->net, "xfer.io")) < 0)
			return err;
		s->lane_io = err;
	}
	s->ssd_rd = s->ssd_wr = -1;
	if (hw->ssd_bytes > 0 &&
	    ((err = add(s, &s->ssd_rd, "ssd%u.read", 0, hw->ssd_read_gbps, 0,
			0)) ||
	     (err = add(s, &s->ssd_wr, "ssd%u.write", 0, hw->ssd_write_gbps,
			0, 0))))
		return err;
	return 0;
}

static void hop(struct net_flow *f, int r)
{
	if (r >= 0 && f->nres < NET_MAX_HOPS)
		f->res[f->nres++] = (uint32_t)r;
}

/* The resources (and DRAM use) of a copy from @src to @dst at GPU @g;
 * 0 or KVT_ECONFIG when the simulator has no such path. */
static int path(const struct sim *s, const struct gpu_res *g,
		kvt_tier_kind src, kvt_tier_kind dst, struct net_flow *f)
{
#define K(a, b) ((a) * KVT_TIER_COUNT + (b))
	switch (src * KVT_TIER_COUNT + dst) {
	case K(KVT_TIER_DRAM, KVT_TIER_HBM):
		hop(f, g->h2d), hop(f, g->up_h2d), f->socket = g->socket;
		return 0;
	case K(KVT_TIER_HBM, KVT_TIER_DRAM):
		hop(f, g->d2h), hop(f, g->up_d2h), f->socket = g->socket;
		return 0;
	case K(KVT_TIER_FABRIC, KVT_TIER_HBM):
		hop(f, g->h2d), hop(f, g->fab_out), hop(f, g->fab_dev);
		return 0;
	case K(KVT_TIER_HBM, KVT_TIER_FABRIC):
		hop(f, g->d2h), hop(f, g->fab_in), hop(f, g->fab_dev);
		return 0;
	case K(KVT_TIER_SSD, KVT_TIER_HBM):
		hop(f, s->ssd_rd), hop(f, g->h2d), hop(f, g->up_h2d);
		f->socket = g->socket, f->amp = 2;
		return 0;
	case K(KVT_TIER_HBM, KVT_TIER_SSD):
		hop(f, g->d2h), hop(f, g->up_d2h), hop(f, s->ssd_wr);
		f->socket = g->socket, f->amp = 2;
		return 0;
	case K(KVT_TIER_DRAM, KVT_TIER_SSD):
		hop(f, s->ssd_wr), f->socket = g->socket;
		return 0;
	case K(KVT_TIER_SSD, KVT_TIER_DRAM):
		hop(f, s->ssd_rd), f->socket = g->socket;
		return 0;
	case K(KVT_TIER_FABRIC, KVT_TIER_DRAM):
		hop(f, g->fab_out), hop(f, g->fab_dev), f->socket = g->socket;
		return 0;
	case K(KVT_TIER_DRAM, KVT_TIER_FABRIC):
		hop(f, g->fab_in), hop(f, g->fab_dev), f->socket = g->socket;
		return 0;
	case K(KVT_TIER_FABRIC, KVT_TIER_SSD):
		hop(f, g->fab_out), hop(f, g->fab_dev), hop(f, s->ssd_wr);
		f->socket = g->socket, f->amp = 2;
		return 0;
	default:
		return kvti_fail(KVT_ECONFIG, "no path from %s to %s",
				 kvt_tier_kind_name(src),
				 kvt_tier_kind_name(dst));
	}
#undef K
}

/* Start a flow over @probe's resources (its path). */
static int flow_go(struct sim *s, const struct net_flow *probe, double bytes,
		   double cap, net_done_fn done, void *arg, uint64_t tag,
		   int lane, int prio)
{
	struct net_flow *f = kvti_net_flow_new(&s->net);

	if (!f)
		return -ENOMEM;
	memcpy(f->res, probe->res, sizeof(f->res));
	f->nres = probe->nres;
	f->socket = probe->socket;
	f->amp = probe->amp;
	f->total = bytes;
	f->cap = cap;
	f->done = done;
	f->arg = arg;
	f->tag = tag;
	f->owner = s->flow_owner;
	f->lane = lane;
	f->prio = prio;
	s->net_dirty = 1;
	return kvti_net_flow_start(&s->net, f);
}

int kvti_sim_flow(struct sim *s, uint32_t gpu, kvt_tier_kind src,
		  kvt_tier_kind dst, double bytes, double cap,
		  net_done_fn done, void *arg, uint64_t tag)
{
	struct net_flow probe;
	int err, lane = -1, prio = 0;

	memset(&probe, 0, sizeof(probe));
	probe.socket = -1;
	probe.amp = 1;
	if ((err = path(s, &s->gpu[gpu], src, dst, &probe)))
		return err;
	if (dst == KVT_TIER_HBM)
		hop(&probe, s->gpu[gpu].issue_ld);
	else if (src == KVT_TIER_HBM)
		hop(&probe, s->gpu[gpu].issue_st);
	hop(&probe, s->cpu_copy); /* a host whose copies are all the CPU's */
	if (s->lane_cpu >= 0) {
		/* the cache's priorities: loads high, stores of the engine's
		 * pages normal, the mover's copies between tiers low */
		lane = src == KVT_TIER_SSD || dst == KVT_TIER_SSD ?
		       s->lane_io : s->lane_cpu;
		prio = dst == KVT_TIER_HBM ? 0 : src == KVT_TIER_HBM ? 1 : 2;
	}
	return flow_go(s, &probe, bytes, cap, done, arg, tag, lane, prio);
}

int kvti_sim_flow_host(struct sim *s, double bytes, double cap,
		       net_done_fn done, void *arg, uint64_t tag)
{
	struct net_flow probe;

	if (s->lane_cpu < 0 || s->cpu_copy < 0)
		return -EINVAL;
	memset(&probe, 0, sizeof(probe));
	probe.socket = -1;
	probe.amp = 1;
	hop(&probe, s->cpu_copy);
	return flow_go(s, &probe, bytes, cap, done, arg, tag, s->lane_cpu, 0);
}

/* ---- requests ---------------------------------------------------------- */

static int arrive(struct sim *s, const struct wl_item *it)
{
	struct sreq *r = kvt_calloc(1, sizeof(*r));
	struct engine *e;

	if (!r)
		return -ENOMEM;
	r->it = *it;
	r->er.id = ++s->next_id;
	/* ids follow arrivals, which differ between a demo pass and its
	 * prediction: the (source, turn) pair matches them up */
	kvti_debug("sim: req %llu is source %u turn %u (arrival %.6f)",
		   (unsigned long long)r->er.id, it->source, it->turn,
		   it->arrival);
	e = &s->eng[it->affinity % s->neng];
	if (kvti_sim_push(s, it->arrival, EV_ARRIVAL, r, e->idx)) {
		kvt_free(r);
		return -ENOMEM;
	}
	s->generated_reqs++;
	return 0;
}

static int stat_push(struct dvec *d, double v)
{
	if (d->n == d->cap) {
		uint64_t c = d->cap ? 2 * d->cap : 1024;
		double *x = kvt_realloc(d->v, c * sizeof(*x));

		if (!x)
			return -ENOMEM;
		d->v = x;
		d->cap = c;
	}
	d->v[d->n++] = v;
	return 0;
}

int kvti_sim_finished(struct sim *s, struct sreq *r)
{
	struct wl_item next;
	double ttft = (r->er.first_token - r->it.arrival) * 1e3;
	int err = 0;

	s->finished++;
	s->run_end = KVT_MAX(s->run_end, r->er.finish);
	if (!s->run_start_set || r->it.arrival < s->run_start) {
		s->run_start = r->it.arrival;
		s->run_start_set = 1;
	}
	if (!r->it.measure)
		goto next;
	s->measured++;
	s->prompt_tokens += r->it.prompt;
	s->output_tokens += r->er.generated;
	s->last_finish = KVT_MAX(s->last_finish, r->er.finish);
	if (!s->first_arrival_set || r->it.arrival < s->first_arrival) {
		s->first_arrival = r->it.arrival;
		s->first_arrival_set = 1;
	}
	err |= stat_push(&s->ttft, ttft);
	/* warm: a later turn or question (the workload's notion), or, for
	 * workloads without one, a request that found a cached prefix */
	if (r->it.warm || (r->er.reused && (s->cfg->workload == KVT_WL_TRACE ||
					 s->cfg->workload == KVT_WL_SHAREGPT)))
		err |= stat_push(&s->warm_ttft, ttft);
	if (r->er.generated > 1)
		err |= stat_push(&s->tpot, (r->er.finish - r->er.first_token) *
						   1e3 / (r->er.generated - 1));
	err |= stat_push(&s->e2e, (r->er.finish - r->it.arrival) * 1e3);
next:
	if (!err && kvti_wl_next(&s->wl, &r->it, r->er.finish, &next))
		err = arrive(s, &next);
	kvt_free(r->tok);
	kvt_free(r);
	if (err && !s->error)
		s->error = -ENOMEM;
	return err ? -ENOMEM : 0;
}

/* ---- statistics ---------------------------------------------------------- */

static int cmp_d(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;

	return x < y ? -1 : x > y;
}

static void dist(double *v, uint64_t n, kvt_dist *d)
{
	double sum = 0;

	memset(d, 0, sizeof(*d));
	if (!n)
		return;
	qsort(v, n, sizeof(*v), cmp_d);
	for (uint64_t i = 0; i < n; i++)
		sum += v[i];
	d->n = n;
	d->mean = sum / n;
	/* nearest rank */
	d->p50 = v[(uint64_t)ceil(0.50 * n) - 1];
	d->p90 = v[(uint64_t)ceil(0.90 * n) - 1];
	d->p99 = v[(uint64_t)ceil(0.99 * n) - 1];
	d->max = v[n - 1];
}

static void results(struct sim *s, kvt_sim_result *r)
{
	double span = s->last_finish - s->first_arrival, busy = 0, stall = 0;

	memset(r, 0, sizeof(*r));
	r->requests = s->generated_reqs;
	r->finished = s->finished;
	r->measured = s->measured;
	dist(s->ttft.v, s->ttft.n, &r->ttft_ms);
	dist(s->warm_ttft.v, s->warm_ttft.n, &r->warm_ttft_ms);
	dist(s->tpot.v, s->tpot.n, &r->tpot_ms);
	dist(s->e2e.v, s->e2e.n, &r->e2e_ms);
	r->makespan_s = span;
	if (span > 0) {
		r->throughput_tok_s = (s->prompt_tokens + s->output_tokens) /
				      span;
		r->output_tok_s = s->output_tokens / span;
		r->request_s = s->finished / span;
	}
	for (uint32_t i = 0; i < s->neng; i++) {
		const struct kvti_eng *k = &s->eng[i].eng;

		busy += k->busy_s;
		stall += k->stall_s;
		r->steps += k->steps;
		r->decode_only_steps += k->decode_only;
		r->deferred += k->deferred;
		r->bg_passes += s->eng[i].bg_passes;
		r->stage_hops += s->eng[i].stage_hops;
		r->room_waits += s->eng[i].eng.room_waits;
		r->room_wait_s += s->eng[i].eng.room_wait_s;
		for (int t = 0; t < KVT_TIER_COUNT; t++)
			r->hit_tokens[t] += k->hit[t];
		r->computed_tokens += k->computed;
	}
	/* engines' compute over the whole run (warm-up included: its steps
	 * are the engines' too) */
	r->gpu_busy = s->run_end > s->run_start ?
		busy / (s->neng * (s->run_end - s->run_start)) : 0;
	r->stall_s = stall;
	r->prompt_tokens = s->prompt_tokens;
	memcpy(r->load_bytes, s->load_bytes, sizeof(r->load_bytes));
	memcpy(r->store_bytes, s->store_bytes, sizeof(r->store_bytes));
	for (uint32_t i = 0; i < s->net.nres && i < KVT_SIM_MAX_LINKS; i++) {
		const struct net_res *x = &s->net.res[i];
		kvt_sim_link *l = &r->links[r->nlinks++];

		kvti_strlcpy(l->name, x->name, sizeof(l->name));
		l->bytes_in = x->bytes_in;
		l->bytes_out = x->bytes_out;
		l->busy_s = x->busy_s;
		l->capacity_gbps = x->cap / 1e9;
	}
	if (s->cfg->stress && s->net.now > 0)
		r->stress_gbps = s->net.stress_bytes / 1e9 /
				 (s->cfg->stress * s->net.now);
	r->events = s->events;
}

/* ---- the loop ------------------------------------------------------------ */

static int net_event(struct sim *s)
{
	double t = kvti_net_next(&s->net);

	s->net_dirty = 0;
	if (!isfinite(t))
		return 0;
	return kvti_sim_push(s, t, EV_NET, NULL, ++s->net_gen);
}

static int dispatch(struct sim *s, const struct ev *x)
{
	struct engine *e;

	switch (x->type) {
	case EV_ARRIVAL:
		e = &s->eng[x->gen];
		return kvti_engine_arrive(e, x->p);
	case EV_NET:
		if (x->gen != s->net_gen)
			return 0;
		kvti_net_complete(&s->net, s->now);
		s->net_dirty = 1;
		return 0;
	case EV_STEP:
		return kvti_engine_step_end(x->p, x->gen);
	default:
		return -EINVAL;
	}
}

static int loop(struct sim *s)
{
	const kvt_sim_config *c = s->cfg;
	int err = 0;

	while (s->nheap && !err && !s->error) {
		struct ev x = ev_pop(s);

		if (c->max_sim_s > 0 && x.t > c->max_sim_s)
			break;
		s->now = x.t;
		s->events++;
		kvti_net_advance(&s->net, s->now);
		err = dispatch(s, &x);
		for (uint32_t i = 0; !err && i < s->neng; i++)
			err = s->eng[i].eng.error; /* raised in a callback */
		if (!err && s->net_dirty) {
			kvti_net_solve(&s->net);
			err = net_event(s);
		}
	}
	return err ? err : s->error;
}

static int check_config(const kvt_sim_config *c)
{
	const kvt_hw *hw = &c->hw;

	if (!hw->gpus || !hw->copy[KVT_COPY_CONTIG].n)
		return kvti_fail(KVT_ECONFIG, "no hardware profile loaded "
				 "(kvt_hw_load)");
	if (!c->tp || !c->engines || c->tp * c->engines > hw->gpus)
		return kvti_fail(KVT_ECONFIG, "%u engine(s) at TP %u need %u "
				 "GPUs; %s has %u", c->engines, c->tp,
				 c->engines * c->tp, hw->name, hw->gpus);
	if (hw->gpus > KVT_ARRAY_SIZE(((struct sim *)0)->gpu))
		return kvti_fail(KVT_ECONFIG, "%s: more GPUs (%u) than the "
				 "simulator models", hw->name, hw->gpus);
	if (!c->noffload || c->noffload > KVT_SIM_MAX_OFFLOAD)
		return kvti_fail(KVT_ECONFIG, "1 to %d offload tiers, not %u",
				 KVT_SIM_MAX_OFFLOAD, c->noffload);
	for (uint32_t i = 0; i < c->noffload; i++) {
		kvt_tier_kind t = c->offload[i];
		int have = t == KVT_TIER_DRAM ||
			   (t == KVT_TIER_FABRIC && hw->fabric_bytes > 0) ||
			   (t == KVT_TIER_SSD && hw->ssd_bytes > 0);

		if (!have)
			return kvti_fail(KVT_ECONFIG, "offload tier '%s': %s "
					 "has none (tiers: dram%s%s)",
					 kvt_tier_kind_name(t), hw->name,
					 hw->fabric_bytes > 0 ? ", fabric" : "",
					 hw->ssd_bytes > 0 ? ", ssd" : "");
		if (i && t <= c->offload[i - 1])
			return kvti_fail(KVT_ECONFIG, "offload tiers must go "
					 "fastest first (fabric, dram, ssd)");
	}
	if (c->page_tokens < 1 || c->page_tokens > 4096)
		return kvti_fail(KVT_ECONFIG, "page tokens %u out of 1..4096",
				 c->page_tokens);
	if ((c->bg_high != 0 || c->bg_low != 0) &&
	    !(c->bg_low > 0 && c->bg_low <= c->bg_high && c->bg_high <= 1))
		return kvti_fail(KVT_ECONFIG, "background watermarks low %g, "
				 "high %g: need 0 < low <= high <= 1 (or both "
				 "0: none)", c->bg_low, c->bg_high);
	return 0;
}

static double auto_rate(const kvt_sim_config *c)
{
	return c->rate > 0 ? c->rate : 0.5 * kvti_sim_capacity(c);
}

int kvti_sim_run(const kvt_sim_config *c, kvt_sim_result *out)
{
	struct sim *s;
	struct wl_item *items = NULL;
	uint32_t n = 0;
	uint64_t t0 = kvt_now_ns();
	int err;

	kvti_errclear();
	if ((err = check_config(c)))
		return err;
	if (!(s = kvt_calloc(1, sizeof(*s))))
		return -ENOMEM;
	s->cfg = c;
	s->hbm_reuse = c->hbm_reuse >= 0 ? c->hbm_reuse :
					   c->workload != KVT_WL_AGENTIC;
	if (!(s->eng = kvt_calloc(c->engines, sizeof(*s->eng)))) {
		err = -ENOMEM;
		goto out;
	}
	if ((err = build_topology(s)))
		goto out;
	s->neng = c->engines;
	for (uint32_t i = 0; i < s->neng; i++)
		if ((err = kvti_engine_init(&s->eng[i], s, i))) {
			s->neng = i;
			goto out;
		}
	if ((err = kvti_wl_init(&s->wl, c,
				c->workload == KVT_WL_AGENTIC ||
				c->workload == KVT_WL_TRACE ? 1 :
							      auto_rate(c))))
		goto out;
	if ((err = kvti_wl_initial(&s->wl, &items, &n)))
		goto out;
	for (uint32_t i = 0; i < n && !err; i++)
		err = arrive(s, &items[i]);
	kvt_free(items);
	if (!err)
		err = loop(s);
	if (!err && s->finished < s->generated_reqs &&
	    !(c->max_sim_s > 0 && s->now >= c->max_sim_s))
		err = kvti_fail(-EDEADLK, "simulation stalled at t=%.3f s with "
				"%llu of %llu requests unfinished", s->now,
				(unsigned long long)(s->generated_reqs -
						     s->finished),
				(unsigned long long)s->generated_reqs);
	if (!err) {
		results(s, out);
		out->wall_s = (kvt_now_ns() - t0) / 1e9;
	}
out:
	for (uint32_t i = 0; i < s->nheap; i++)
		if (s->heap[i].type == EV_ARRIVAL) {
			struct sreq *r = s->heap[i].p;

			kvt_free(r->tok);
			kvt_free(r);
		}
	for (uint32_t i = 0; i < s->neng; i++) {
		struct engine *e = &s->eng[i];

		for (uint32_t k = 0; k < e->eng.nwait; k++) {
			kvt_free(sreq_of(e->eng.wait[k])->tok);
			kvt_free(e->eng.wait[k]);
		}
		for (uint32_t k = 0; k < e->eng.nrun; k++) {
			kvt_free(sreq_of(e->eng.run[k])->tok);
			kvt_free(e->eng.run[k]);
		}
		kvti_engine_fini(e);
	}
	kvti_wl_fini(&s->wl);
	kvti_net_fini(&s->net);
	kvt_free(s->eng);
	kvt_free(s->heap);
	kvt_free(s->ttft.v);
	kvt_free(s->warm_ttft.v);
	kvt_free(s->tpot.v);
	kvt_free(s->e2e.v);
	kvt_free(s);
	return err;
}
