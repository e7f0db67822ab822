/*
 * serve_view.c — what kvtier's scheduler (and each baseline's) sees of the
 * live cache for one waiting request, every step:
 *
 *   view      kvt_cache_lookup_runs() of the prompt's pages: tier runs in
 *             prefix order (one lookup per request per 20 ms, as engines
 *             cache a request's lookup); the request's own loads (landed,
 *             in flight); right after them, pages another request stores
 *             (the lookup's in-flight pages) or computes right now (the
 *             transient table)
 *   rates     the transfer engine's measured rates per tier
 *             (kvt_cache_rates()), refreshed every 20 ms, and when the
 *             loads in flight from each tier are expected done
 *
 * TRANSIENT TABLE: page key -> (ticket, expected ready time) for every page
 * a running request computes from its start until its store of the page
 * commits (or it gives up on storing it); open addressing, linear probing,
 * tombstones (ticket UINT64_MAX), grown at half full. A waiting request
 * whose prefix runs into such pages is told how many and when (DELAYHIT
 * waits for them instead of computing them twice).
 */
#include "demo/serve_impl.h"

#include <errno.h>

#define RATES_EVERY_NS 20000000ull /* measured rates refreshed every 20 ms */
#define STORE_GUESS_S 0.005 /* a page being stored: expected home soon */
#define LOOKUP_EVERY_NS 20000000ull /* a waiting request's lookup: 20 ms */

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

int kvti_tt_put(struct serve *s, kvt_page_key k, uint64_t ticket,
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
			kvti_tt_put(s, old[i].k, old[i].ticket, old[i].ready);
	kvt_free(old);
	return 0;
}

/* Drop @r's marks on pages [from, to). */
void kvti_tt_drop(struct serve *s, const struct dreq *r, uint32_t from,
		    uint32_t to)
{
	for (uint32_t p = from; p < to && p < r->nkeys; p++) {
		struct tent *t = tt_find(s, r->keys[p]);

		if (t && t->ticket == r->er.id)
			t->ticket = UINT64_MAX;
	}
}

/* ---- measured rates and queues ------------------------------------------- */

void kvti_sv_rates(struct serve *s)
{
	static kvt_xfer_rate rt[KVT_TIER_COUNT][KVT_TIER_COUNT];
	uint64_t now = kvt_now_ns();

	if (now - s->rates_at < RATES_EVERY_NS && s->rates_at)
		return;
	for (int t = KVT_TIER_FABRIC; t < KVT_TIER_REMOTE && s->rates_at; t++)
		if (s->gbps[t] > 0) { /* the rate held since the last look */
			double dt = (double)(now - s->rates_at) / 1e9;

			s->gbps_sum[t] += s->gbps[t] * dt;
			s->gbps_s[t] += dt;
		}
	s->rates_at = now;
	if (kvti_dp_rates(&s->dp, rt))
		return;
	for (int t = KVT_TIER_FABRIC; t < KVT_TIER_REMOTE; t++)
		if (rt[t][KVT_TIER_HBM].gbps > 0) {
			s->gbps[t] = rt[t][KVT_TIER_HBM].gbps;
			if (rt[t][KVT_TIER_HBM].jobs)
				s->job_kib[t] = rt[t][KVT_TIER_HBM].total_bytes /
					(double)rt[t][KVT_TIER_HBM].jobs / 1024;
		}
}

/* When the loads in flight from each tier are expected done. */
static void tier_queues(struct serve *s, double *free_at)
{
	double now = kvti_sv_now(s);

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

void kvti_sv_sched_state(struct kvti_eng *e, kvt_sched_state *st)
{
	struct serve *s = kvti_sv(e);

	kvti_sv_rates(s);
	for (int t = KVT_TIER_FABRIC; t < KVT_TIER_REMOTE; t++)
		st->tier_gbps[t] = s->gbps[t];
	tier_queues(s, st->tier_free_at);
}

/* The tier of the loadable page @p (runs from page 0), or the last run's. */
uint32_t kvti_sv_tier_at(const struct dreq *r, uint32_t p)
{
	uint32_t at = 0;

	for (size_t i = 0; i < r->nruns; i++) {
		if (p < at + r->runs[i].pages)
			return r->runs[i].tier;
		at += r->runs[i].pages;
	}
	return r->nruns ? r->runs[r->nruns - 1].tier : KVT_TIER_SSD;
}

int kvti_sv_view(struct kvti_eng *e, struct kvti_ereq *er)
{
	struct serve *s = kvti_sv(e);
	struct dreq *r = kvti_dq(er);
	kvt_sched_req *q = &er->sr;
	uint32_t P = s->P, full = er->prompt / P, H, U, Lp, E, p;
	kvt_cache_lookup_result lr;
	double now = kvti_sv_now(s), ready = 0;
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
			return kvti_sv_fail(s, err, "lookup");
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
		uint32_t t = kvti_sv_tier_at(r, p);

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

double kvti_sv_load_eta(struct kvti_eng *e, struct kvti_ereq *er)
{
	struct serve *s = kvti_sv(e);
	double free_at[KVT_TIER_COUNT], eta = kvti_sv_now(s);

	tier_queues(s, free_at);
	for (struct pjob *j = s->jobs; j; j = j->next)
		if (!j->store && j->r == kvti_dq(er))
			for (int t = 0; t < KVT_TIER_COUNT; t++)
				if (j->bytes[t] > 0)
					eta = KVT_MAX(eta, free_at[t]);
	return eta;
}
