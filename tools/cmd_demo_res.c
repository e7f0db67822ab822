/*
 * cmd_demo_res.c — reading a `kvtier demo` result for its printers: the
 * headline pass of a (policy, rate, repeat), medians over the repeats,
 * the integrity counters summed over every pass, the p90 TTFT targets of
 * a sweep and the speed goals measured along the curves. Nothing
 * here prints; the result is only read.
 */
#include "cmd_demo.h"

#include <math.h>
#include <string.h>

/* ---- what ran ------------------------------------------------------------ */

const char *const kvti_cd_pol[NPOL] = { "lmcache", "lmcache-layerwise",
					     "vllm", "kvtier" };

/* The headline pass of @policy at @rate (no variant, repeat @rep). */
const kvt_demo_pass *kvti_cd_find(const kvt_demo_result *r, const char *policy,
				  double rate, uint32_t rep)
{
	for (int i = 0; i < r->npasses; i++) {
		const kvt_demo_pass *p = &r->pass[i];

		if (!strcmp(p->policy, policy) && !p->variant[0] &&
		    p->rate == rate && p->repeat == rep)
			return p;
	}
	return NULL;
}

uint32_t kvti_cd_nrates(const kvt_demo_config *c)
{
	return c->nrates ? c->nrates : 1;
}

double kvti_cd_rate_at(const kvt_demo_config *c, uint32_t k)
{
	return c->nrates ? c->rates[k] : c->rate;
}

/* The median of @v[0..n) (sorted in place), its extremes in *@lo, *@hi;
 * NaN when n is 0. */
double kvti_cd_median(double *v, uint32_t n, double *lo, double *hi)
{
	if (!n) {
		if (lo)
			*lo = *hi = NAN;
		return NAN;
	}
	for (uint32_t i = 1; i < n; i++)
		for (uint32_t j = i; j > 0 && v[j] < v[j - 1]; j--) {
			double t = v[j];

			v[j] = v[j - 1];
			v[j - 1] = t;
		}
	if (lo) {
		*lo = v[0];
		*hi = v[n - 1];
	}
	return n & 1 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

/* Median over repeats of one statistic of (policy, rate). */
double kvti_cd_med(const kvt_demo_result *r, const char *pol, double rate,
		   double (*get)(const kvt_demo_pass *), double *lo, double *hi)
{
	double v[64];
	uint32_t n = 0;

	for (uint32_t k = 0; k < r->config.repeat && n < 64; k++) {
		const kvt_demo_pass *p = kvti_cd_find(r, pol, rate, k);

		if (p && !p->err)
			v[n++] = get(p);
	}
	return kvti_cd_median(v, n, lo, hi);
}

double kvti_cd_p90(const kvt_demo_pass *p) { return p->st.ttft_ms.p90; }

/* ---- integrity ----------------------------------------------------------- */

void kvti_cd_integrity(const kvt_demo_result *r, struct integrity *g)
{
	memset(g, 0, sizeof(*g));
	for (int i = 0; i < r->npasses; i++) {
		const kvt_demo_pass *p = &r->pass[i];

		for (size_t j = 0; j < p->nreqs; j++) {
			g->engine_checked += p->reqs[j].engine_checked;
			g->engine_bad += p->reqs[j].engine_bad;
			g->failed += p->reqs[j].failed_pages;
			g->failed_busy += p->reqs[j].failed_busy;
			g->failed_absent += p->reqs[j].failed_absent;
		}
		g->moves_verified += p->cache.verified;
		g->corrupt += p->cache.corrupt;
		g->move_errors += p->cache.move_errors;
		g->checked += p->check.checked;
		g->check_bad += p->check.bad;
		g->incomplete |= p->check_err != 0 && p->check_err != KVT_ECORRUPT;
		g->bad += p->cache.corrupt + p->check.bad;
	}
	g->bad += g->engine_bad;
}

/* The p90 TTFT targets: given, or five between where every curve starts
 * and where every curve ends (log-spaced). */
uint32_t kvti_cd_targets(const kvt_demo_result *r, double *t)
{
	const kvt_demo_config *c = &r->config;
	double lo = 0, hi = INFINITY;
	uint32_t n = 0;

	if (c->ntargets) {
		memcpy(t, c->targets_ms, c->ntargets * sizeof(*t));
		return c->ntargets;
	}
	for (int i = 0; i < NPOL; i++) {
		const char *pol = kvti_cd_pol[i];
		double a = kvti_cd_med(r, pol, kvti_cd_rate_at(c, 0),
				       kvti_cd_p90, NULL, NULL);
		double b = kvti_cd_med(r, pol,
				       kvti_cd_rate_at(c, kvti_cd_nrates(c) - 1),
				       kvti_cd_p90, NULL, NULL);

		if (isnan(a))
			continue;
		lo = fmax(lo, a);
		hi = fmin(hi, b);
	}
	if (!(lo > 0) || !isfinite(hi))
		return 0;
	if (hi <= lo * 1.01)
		hi = lo * 4;
	for (n = 0; n < 5; n++)
		t[n] = lo * 1.02 * pow(hi / (lo * 1.02), n / 4.0);
	return n;
}

/* The speed goals of the issue, from the measured curves: kvtier's
 * throughput at equal p90 TTFT >= 1.5x lmcache's and >= 1.2x vllm's (the
 * ratio of each repeat's curves, side by side in one run, its median over
 * the repeats; the target where that median is highest, named in the
 * output); kvtier's p90 TTFT at the highest rate every policy sustains
 * (the median p90 under the largest target) lower than each baseline's. */
void kvti_cd_goals(const kvt_demo_result *r, const double *tg, uint32_t nt,
		   struct goals *g)
{
	const kvt_demo_config *c = &r->config;
	double bound = 0;

	memset(g, 0, sizeof(*g));
	for (uint32_t i = 0; i < nt; i++) {
		double rl[64], rv[64], lo, hi, m;
		uint32_t nl = 0, nv = 0;

		bound = fmax(bound, tg[i]);
		for (uint32_t k = 0; k < c->repeat && k < 64; k++) {
			double kv, lm, vl;

			if (kvt_demo_throughput_at(r, "kvtier", k, tg[i], &kv) < 0)
				continue;
			if (kvt_demo_throughput_at(r, "lmcache", k, tg[i],
						   &lm) >= 0 && lm > 0)
				rl[nl++] = kv / lm;
			if (kvt_demo_throughput_at(r, "vllm", k, tg[i], &vl) >= 0 &&
			    vl > 0)
				rv[nv++] = kv / vl;
		}
		if (nl && (m = kvti_cd_median(rl, nl, &lo, &hi)) > g->ratio_lm) {
			g->ratio_lm = m;
			g->lm_lo = lo;
			g->lm_hi = hi;
			g->lm_n = nl;
			g->at_lm = tg[i];
			g->have_ratio = 1;
		}
		if (nv && (m = kvti_cd_median(rv, nv, &lo, &hi)) > g->ratio_vllm) {
			g->ratio_vllm = m;
			g->vl_lo = lo;
			g->vl_hi = hi;
			g->vl_n = nv;
			g->at_vllm = tg[i];
			g->have_ratio = 1;
		}
	}
	g->pass_ratio = g->have_ratio && g->ratio_lm >= 1.5 &&
			g->ratio_vllm >= 1.2;
	for (uint32_t k = 0; k < kvti_cd_nrates(c); k++) {
		int all = 1;

		for (int i = 0; i < NPOL; i++) {
			double v = kvti_cd_med(r, kvti_cd_pol[i], kvti_cd_rate_at(c, k), kvti_cd_p90,
					       NULL, NULL);

			if (!isnan(v) && (!bound || v > bound))
				all = 0;
		}
		if (all) {
			g->top_rate = kvti_cd_rate_at(c, k);
			g->have_top = 1;
		}
	}
	if (g->have_top) {
		/* every median first: kvtier's (the last) is compared with
		 * each baseline's */
		for (int i = 0; i < NPOL; i++)
			g->p90[i] = kvti_cd_med(r, kvti_cd_pol[i], g->top_rate, kvti_cd_p90,
						NULL, NULL);
		g->pass_p90 = !isnan(g->p90[3]);
		for (int i = 0; i < 3; i++)
			if (!isnan(g->p90[i]) && !(g->p90[3] < g->p90[i]))
				g->pass_p90 = 0;
	}
}
