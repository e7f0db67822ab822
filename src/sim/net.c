/*
 * net.c — the fluid model of links, devices and DRAM, and the transfer
 * engine's lanes (see net.h for the picture and the invariants).
 */
#include "sim/net.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#define NET_EPS_BYTES 1e-3

int kvti_net_init(struct net *n, double dma_window, double stress_cap)
{
	memset(n, 0, sizeof(*n));
	n->dma_window = dma_window > 0 ? dma_window : 1.0;
	n->stress_cap = stress_cap;
	return 0;
}

void kvti_net_fini(struct net *n)
{
	struct net_flow *f, *next;

	for (uint32_t i = 0; i < n->nact; i++)
		kvt_free(n->act[i]);
	for (f = n->free_list; f; f = next) {
		next = f->arg;
		kvt_free(f);
	}
	kvt_free(n->act);
	kvt_free(n->res);
	memset(n, 0, sizeof(*n));
}

int kvti_net_add_res(struct net *n, const char *name, double cap)
{
	struct net_res *r;

	if (n->nres == n->res_cap) {
		uint32_t c = n->res_cap ? 2 * n->res_cap : 16;

		if (!(r = kvt_realloc(n->res, c * sizeof(*r))))
			return -ENOMEM;
		n->res = r;
		n->res_cap = c;
	}
	r = &n->res[n->nres];
	memset(r, 0, sizeof(*r));
	kvti_strlcpy(r->name, name, sizeof(r->name));
	r->cap = cap;
	r->socket = -1;
	return (int)n->nres++;
}

int kvti_net_add_port(struct net *n, const char *name, double cap,
		      int socket, double lfix)
{
	int r;

	if (socket < 0 || (uint32_t)socket >= n->nsock)
		return -EINVAL;
	if ((r = kvti_net_add_res(n, name, cap)) < 0)
		return r;
	n->res[r].socket = socket;
	n->res[r].lfix = lfix;
	/* Little's law at idle: enough reads in flight for the port's rate */
	n->res[r].window = n->dma_window * cap *
			   (lfix + n->sock[socket].lat0);
	return r;
}

int kvti_net_add_socket(struct net *n, const char *name, double cap,
			double lat0)
{
	struct net_socket *s;
	int r;

	if (n->nsock == KVT_ARRAY_SIZE(n->sock))
		return -E2BIG;
	if ((r = kvti_net_add_res(n, name, cap)) < 0)
		return r;
	s = &n->sock[n->nsock];
	memset(s, 0, sizeof(*s));
	s->res = (uint32_t)r;
	s->cap = cap;
	s->lat0 = s->lat = lat0;
	s->stress_rate = n->stress_cap;
	return (int)n->nsock++;
}

void kvti_net_set_stress(struct net *n, uint32_t s, uint32_t threads)
{
	if (s < n->nsock)
		n->sock[s].stressors = threads;
}

struct net_flow *kvti_net_flow_new(struct net *n)
{
	struct net_flow *f = n->free_list;

	if (f) {
		n->free_list = f->arg;
		memset(f, 0, sizeof(*f));
	} else if (!(f = kvt_calloc(1, sizeof(*f)))) {
		return NULL;
	}
	f->socket = -1;
	f->amp = 1;
	f->lane = -1;
	return f;
}

int kvti_net_add_lane(struct net *n, const char *name)
{
	struct net_lane *l;

	if (n->nlane == NET_MAX_LANES)
		return -E2BIG;
	l = &n->lane[n->nlane];
	memset(l, 0, sizeof(*l));
	kvti_strlcpy(l->name, name, sizeof(l->name));
	return (int)n->nlane++;
}

/* ---- lanes ------------------------------------------------------------- */

/* @f moves (again): counted on its resources. */
static void flow_run(struct net *n, struct net_flow *f)
{
	f->waiting = 0;
	if (f->run_start < 0) {
		f->run_start = n->now;
		if (f->lane >= 0)
			n->lane[f->lane].wait_s += n->now - f->start;
	}
	for (uint32_t i = 0; i < f->nres; i++)
		n->res[f->res[i]].nactive++;
	if (f->socket >= 0)
		n->res[n->sock[f->socket].res].nactive++;
}

/* @f stops moving (it waits on its lane again). */
static void flow_pause(struct net *n, struct net_flow *f)
{
	f->waiting = 1;
	f->rate = 0;
	for (uint32_t i = 0; i < f->nres; i++)
		n->res[f->res[i]].nactive--;
	if (f->socket >= 0)
		n->res[n->sock[f->socket].res].nactive--;
}

static void lane_push(struct net_lane *l, struct net_flow *f, int front)
{
	int p = f->prio;

	if (front) {
		f->qnext = l->head[p];
		l->head[p] = f;
		if (!l->tail[p])
			l->tail[p] = f;
		return;
	}
	f->qnext = NULL;
	if (l->tail[p])
		l->tail[p]->qnext = f;
	else
		l->head[p] = f;
	l->tail[p] = f;
}

static struct net_flow *lane_pop(struct net_lane *l, int p)
{
	struct net_flow *f = l->head[p];

	if (f && !(l->head[p] = f->qnext))
		l->tail[p] = NULL;
	if (f)
		f->qnext = NULL;
	return f;
}

/* The lane takes the head of its highest-priority non-empty queue when it
 * is idle, or when that head outranks the flow it runs (which goes back
 * to the front of its own queue). */
static void lane_pick(struct net *n, struct net_lane *l)
{
	int p = 0;

	while (p < NET_NPRIO && !l->head[p])
		p++;
	if (p == NET_NPRIO || (l->cur && l->cur->prio <= p))
		return;
	if (l->cur) {
		flow_pause(n, l->cur);
		lane_push(l, l->cur, 1);
		l->preempted++;
	}
	l->cur = lane_pop(l, p);
	l->flows++;
	flow_run(n, l->cur);
}

static void flow_recycle(struct net *n, struct net_flow *f)
{
	f->arg = n->free_list;
	n->free_list = f;
}

int kvti_net_flow_start(struct net *n, struct net_flow *f)
{
	if (f->lane >= (int)n->nlane || f->prio < 0 || f->prio >= NET_NPRIO) {
		flow_recycle(n, f);
		return -EINVAL;
	}
	if (n->nact == n->act_cap) {
		uint32_t c = n->act_cap ? 2 * n->act_cap : 64;
		struct net_flow **a = kvt_realloc(n->act, c * sizeof(*a));

		if (!a) {
			flow_recycle(n, f);
			return -ENOMEM;
		}
		n->act = a;
		n->act_cap = c;
	}
	f->remaining = f->total;
	f->start = n->now;
	f->run_start = -1;
	f->rate = 0;
	if (f->total <= 0)
		f->lane = -1; /* nothing to move: done at once, on no lane */
	if (f->socket >= 0)
		n->res[n->sock[f->socket].res].bytes_in += f->total * f->amp;
	for (uint32_t i = 0; i < f->nres; i++)
		n->res[f->res[i]].bytes_in += f->total;
	f->slot = n->nact;
	n->act[n->nact++] = f;
	if (f->lane < 0) {
		flow_run(n, f);
	} else {
		f->waiting = 1;
		lane_push(&n->lane[f->lane], f, 0);
		lane_pick(n, &n->lane[f->lane]);
	}
	return 0;
}

/* ---- rates ------------------------------------------------------------- */

static double flow_cap(const struct net *n, const struct net_flow *f)
{
	return f->cap > 0 ? f->cap : 1e15;
}

/* A resource's capacity with DRAM latencies as they are in n->sock. */
static double res_cap(const struct net *n, const struct net_res *r)
{
	if (r->socket < 0)
		return r->cap;
	return KVT_MIN(r->cap, r->window / (r->lfix + n->sock[r->socket].lat));
}

/* Max-min fair rates by progressive filling. */
static void fill(struct net *n)
{
	uint32_t left = n->nact;

	for (uint32_t r = 0; r < n->nres; r++) {
		n->res[r].left = res_cap(n, &n->res[r]);
		n->res[r].nfree = 0;
	}
	for (uint32_t i = 0; i < n->nact; i++) {
		struct net_flow *f = n->act[i];

		f->rate = 0;
		f->frozen = f->waiting;
		if (f->waiting) {
			left--;
			continue;
		}
		for (uint32_t k = 0; k < f->nres; k++)
			n->res[f->res[k]].nfree++;
	}
	while (left) {
		double inc = INFINITY;

		for (uint32_t r = 0; r < n->nres; r++)
			if (n->res[r].nfree)
				inc = KVT_MIN(inc, n->res[r].left /
							   n->res[r].nfree);
		for (uint32_t i = 0; i < n->nact; i++)
			if (!n->act[i]->frozen)
				inc = KVT_MIN(inc, flow_cap(n, n->act[i]) -
							   n->act[i]->rate);
		if (!isfinite(inc))
			break;
		inc = KVT_MAX(inc, 0.0);
		for (uint32_t i = 0; i < n->nact; i++) {
			struct net_flow *f = n->act[i];

			if (f->frozen)
				continue;
			f->rate += inc;
			for (uint32_t k = 0; k < f->nres; k++)
				n->res[f->res[k]].left -= inc;
		}
		for (uint32_t i = 0; i < n->nact; i++) {
			struct net_flow *f = n->act[i];
			int stop = f->rate >= flow_cap(n, f) * (1 - 1e-12);

			if (f->frozen)
				continue;
			for (uint32_t k = 0; k < f->nres && !stop; k++)
				stop = n->res[f->res[k]].left <=
				       res_cap(n, &n->res[f->res[k]]) * 1e-12;
			if (!stop)
				continue;
			f->frozen = 1;
			left--;
			for (uint32_t k = 0; k < f->nres; k++)
				n->res[f->res[k]].nfree--;
		}
	}
}

/* DRAM utilisation that M/D/1 queueing gives at latency @lat. */
static double util_at(const struct net_socket *s, double lat)
{
	double x = lat / s->lat0 - 1;   /* lat = lat0 (1 + U / (2(1-U))) */

	return x <= 0 ? 0 : 2 * x / (1 + 2 * x);
}

static double stress_traffic(const struct net *n, const struct net_socket *s,
			     double lat)
{
	/* a copy thread moves 2 bytes of DRAM traffic per byte copied and
	 * keeps 2 * cap * lat0 bytes in flight */
	double one = KVT_MIN(2 * n->stress_cap,
			     2 * n->stress_cap * s->lat0 / lat);

	return s->stressors * one;
}

static double socket_traffic(struct net *n, uint32_t si)
{
	const struct net_socket *s = &n->sock[si];
	double t = stress_traffic(n, s, s->lat);

	for (uint32_t i = 0; i < n->nact; i++)
		if (n->act[i]->socket == (int)si)
			t += n->act[i]->rate * n->act[i]->amp;
	return t;
}

/* Find socket si's latency: traffic(lat) = cap * util(lat). */
static void solve_socket(struct net *n, uint32_t si)
{
	struct net_socket *s = &n->sock[si];
	double lo = s->lat0, hi = s->lat0 * 2, g;

	s->lat = lo;
	fill(n);
	if (socket_traffic(n, si) <= 0)
		return;
	for (;;) { /* bracket: at hi the queue must exceed the traffic */
		s->lat = hi;
		fill(n);
		if (socket_traffic(n, si) <= s->cap * util_at(s, hi) ||
		    hi > s->lat0 * 1e6)
			break;
		lo = hi;
		hi *= 4;
	}
	for (int it = 0; it < 40 && hi / lo > 1 + 1e-6; it++) {
		s->lat = sqrt(lo * hi);
		fill(n);
		g = socket_traffic(n, si) - s->cap * util_at(s, s->lat);
		if (g > 0)
			lo = s->lat;
		else
			hi = s->lat;
	}
	s->lat = hi;
}

void kvti_net_solve(struct net *n)
{
	int used[KVT_ARRAY_SIZE(n->sock)] = { 0 }, any = 0;

	n->solves++;
	for (uint32_t si = 0; si < n->nsock; si++)
		used[si] = n->sock[si].stressors > 0;
	for (uint32_t i = 0; i < n->nact; i++)
		if (n->act[i]->socket >= 0 && !n->act[i]->waiting)
			used[n->act[i]->socket] = 1;
	for (uint32_t si = 0; si < n->nsock; si++) {
		n->sock[si].lat = n->sock[si].lat0;
		any |= used[si];
	}
	/* sockets interact only through flows sharing a link (rare): a
	 * second Gauss-Seidel round settles that */
	for (int round = 0; any && round < (n->nsock > 1 ? 2 : 1); round++)
		for (uint32_t si = 0; si < n->nsock; si++)
			if (used[si])
				solve_socket(n, si);
	fill(n);
	for (uint32_t si = 0; si < n->nsock; si++) {
		struct net_socket *s = &n->sock[si];

		s->stress_rate = s->stressors ?
			stress_traffic(n, s, s->lat) / s->stressors / 2 :
			n->stress_cap;
	}
}

/* ---- time -------------------------------------------------------------- */

void kvti_net_advance(struct net *n, double t)
{
	double dt = t - n->now;

	if (dt <= 0)
		return;
	for (uint32_t i = 0; i < n->nact; i++) {
		struct net_flow *f = n->act[i];

		f->remaining = KVT_MAX(0.0, f->remaining - f->rate * dt);
	}
	for (uint32_t r = 0; r < n->nres; r++)
		if (n->res[r].nactive)
			n->res[r].busy_s += dt;
	for (uint32_t si = 0; si < n->nsock; si++)
		n->stress_bytes += n->sock[si].stressors *
				   n->sock[si].stress_rate * dt;
	n->now = t;
}

static double run_eta(const struct net *n, const struct net_flow *f)
{
	if (f->remaining <= NET_EPS_BYTES)
		return n->now;
	if (f->rate <= 0)
		return INFINITY;
	return n->now + f->remaining / f->rate;
}

/* A waiting flow: the lane's bytes before it and its own, at the running
 * flow's rate (or its own cap when nothing runs). */
static double wait_eta(const struct net *n, const struct net_flow *f)
{
	const struct net_lane *l = &n->lane[f->lane];
	double rate = l->cur && l->cur->rate > 0 ? l->cur->rate :
		      flow_cap(n, f), bytes = 0;

	if (l->cur)
		bytes += l->cur->remaining;
	for (int p = 0; p <= f->prio; p++)
		for (const struct net_flow *g = l->head[p]; g; g = g->qnext) {
			bytes += g->remaining;
			if (g == f)
				return n->now + bytes / rate;
		}
	return INFINITY; /* not queued: cannot happen */
}

double kvti_net_eta(const struct net *n, const struct net_flow *f)
{
	return f->waiting ? wait_eta(n, f) : run_eta(n, f);
}

double kvti_net_next(const struct net *n)
{
	double t = INFINITY;

	for (uint32_t i = 0; i < n->nact; i++)
		if (!n->act[i]->waiting)
			t = KVT_MIN(t, run_eta(n, n->act[i]));
	return t;
}

static void flow_remove(struct net *n, struct net_flow *f)
{
	uint32_t i = f->slot;

	for (uint32_t k = 0; k < f->nres; k++) {
		n->res[f->res[k]].bytes_out += f->total;
		n->res[f->res[k]].nactive--;
	}
	if (f->socket >= 0) {
		n->res[n->sock[f->socket].res].bytes_out += f->total * f->amp;
		n->res[n->sock[f->socket].res].nactive--;
	}
	n->act[i] = n->act[--n->nact];
	n->act[i]->slot = i;
	if (f->lane >= 0 && n->lane[f->lane].cur == f) {
		/* the next job's units are taken as this one's last end,
		 * before the finished job's callback runs */
		n->lane[f->lane].cur = NULL;
		lane_pick(n, &n->lane[f->lane]);
	}
}

uint32_t kvti_net_complete(struct net *n, double t)
{
	uint32_t done = 0;

	kvti_net_advance(n, t);
	for (;;) {
		struct net_flow *f = NULL;

		/* one at a time: a callback may start flows. Done: nothing
		 * left, or so little that the clock cannot tell the end from
		 * now (now + remaining / rate rounds to now) */
		for (uint32_t i = 0; i < n->nact; i++)
			if (!n->act[i]->waiting &&
			    (n->act[i]->remaining <=
				     NET_EPS_BYTES + 1e-12 * n->act[i]->total ||
			     run_eta(n, n->act[i]) <= n->now)) {
				f = n->act[i];
				break;
			}
		if (!f)
			break;
		flow_remove(n, f);
		if (f->done)
			f->done(f->arg, f, n->now);
		flow_recycle(n, f);
		done++;
	}
	if (done)
		kvti_net_solve(n);
	return done;
}
