/*
 * cmd_sim_explain.c — `kvtier sim --explain`: one-at-a-time sensitivity.
 * One run of one policy, then again with each hardware-profile figure and
 * each workload assumption halved and doubled (and the topology switched
 * off); the inputs are listed by how far they moved the headline TTFT
 * (warm requests' mean where there are any), the assumed ones first, so a
 * user sees which guesses the answer hangs on.
 */
#include "cmd_sim.h"
#include "core/core.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* ---- --explain: one-at-a-time sensitivity -------------------------------- */

struct sens {
	char name[48];
	int assumed;
	char from[24];
	double m[2], thr[2];   /* at the two perturbations */
	char lo[24], hi[24];   /* the perturbed values */
	double moved;          /* largest |change| of the headline, share */
};

static double headline(const kvt_sim_result *r)
{
	return r->warm_ttft_ms.n ? r->warm_ttft_ms.mean : r->ttft_ms.mean;
}

static int by_moved(const void *a, const void *b)
{
	double x = ((const struct sens *)a)->moved;
	double y = ((const struct sens *)b)->moved;

	return x < y ? 1 : x > y ? -1 : 0;
}

/* Run the two perturbed configurations @x[0..1] and fill @e. */
static int sens_runs(double m0, struct sens *e, kvt_sim_config *x,
		     kvt_sim_result *r)
{
	int err;

	for (int k = 0; k < 2; k++) {
		if ((err = kvt_sim_run(&x[k], r)))
			return err;
		e->m[k] = headline(r);
		e->thr[k] = r->throughput_tok_s;
		e->moved = MAX(e->moved, fabs(e->m[k] - m0) / m0);
	}
	return 0;
}

static void fmt(char *b, size_t n, double v)
{
	snprintf(b, n, "%.4g", v);
}

/* A workload knob: halve and double a u32 or double field. */
#define KNOB(label, field, assumption)                                        \
	do {                                                                  \
		struct sens *e = &tab[ntab];                                  \
		double v = (double)c.field;                                   \
		if (v > 0 && ntab < cap) {                                    \
			memset(e, 0, sizeof(*e));                             \
			snprintf(e->name, sizeof(e->name), "%s", label);      \
			e->assumed = assumption;                              \
			fmt(e->from, sizeof(e->from), v);                     \
			x[0] = x[1] = c;                                      \
			x[0].field = (__typeof__(c.field))(v / 2);           \
			x[1].field = (__typeof__(c.field))(v * 2);           \
			fmt(e->lo, sizeof(e->lo), (double)x[0].field);        \
			fmt(e->hi, sizeof(e->hi), (double)x[1].field);        \
			if ((err = sens_runs(m0, e, x, &r)))              \
				goto out;                                     \
			ntab++;                                               \
		}                                                             \
	} while (0)

int kvti_cs_explain(struct opts *o)
{
	enum { cap = 80 };
	kvt_sim_config c, *x = calloc(2, sizeof(*x));
	kvt_sim_result r, r0;
	struct sens *tab = calloc(cap, sizeof(*tab));
	double m0;
	int ntab = 0, err = 0, shown = 0;

	if (!x || !tab) {
		err = -ENOMEM;
		goto out;
	}
	if ((err = kvti_cs_policy_cfg(o, o->pol[0], &c)))
		goto out;
	if (c.workload == KVT_WL_AGENTIC && !c.output)
		c.output = 256; /* the default, made explicit to vary it */
	if ((err = kvt_sim_run(&c, &r0)))
		goto out;
	m0 = headline(&r0);
	if (!(m0 > 0)) {
		fprintf(stderr, "kvtier %s: --explain: the run measured no "
			"TTFT to explain\n", WHAT);
		free(x);
		free(tab);
		return CLI_EXIT_FAIL;
	}
	for (size_t i = 0; kvt_hw_key_name(i) && ntab < cap; i++) {
		struct sens *e = &tab[ntab];
		double from, to;

		memset(e, 0, sizeof(*e));
		x[0] = x[1] = c;
		if (kvt_hw_key_scale(&x[0].hw, i, 0.5, &from, &to))
			continue;
		fmt(e->lo, sizeof(e->lo), to);
		if (kvt_hw_key_scale(&x[1].hw, i, 2.0, &from, &to))
			x[1] = x[0]; /* at its top already: one side only */
		fmt(e->hi, sizeof(e->hi), to);
		snprintf(e->name, sizeof(e->name), "%s", kvt_hw_key_name(i));
		e->assumed = kvt_hw_key_assumed(&c.hw, i);
		fmt(e->from, sizeof(e->from), from);
		if ((err = sens_runs(m0, e, x, &r)))
			goto out;
		ntab++;
	}
	if (c.hw.gpus_per_uplink && ntab < cap) { /* topology: on / off */
		struct sens *e = &tab[ntab];

		memset(e, 0, sizeof(*e));
		snprintf(e->name, sizeof(e->name), "link.gpus_per_uplink");
		for (size_t i = 0; kvt_hw_key_name(i); i++)
			if (!strcmp(kvt_hw_key_name(i), e->name))
				e->assumed = kvt_hw_key_assumed(&c.hw, i);
		fmt(e->from, sizeof(e->from), c.hw.gpus_per_uplink);
		x[0] = x[1] = c;
		x[0].hw.gpus_per_uplink = 0;
		x[1].hw.gpus_per_uplink = c.hw.gpus_per_uplink > 1 ?
					  c.hw.gpus_per_uplink / 2 : 0;
		fmt(e->lo, sizeof(e->lo), 0);
		fmt(e->hi, sizeof(e->hi), x[1].hw.gpus_per_uplink);
		if ((err = sens_runs(m0, e, x, &r)))
			goto out;
		ntab++;
	}
	if (c.workload == KVT_WL_AGENTIC) {
		/* SPEC.md gives the sessions; the turns' shape is assumed */
		KNOB("workload: --append", append, 1);
		KNOB("workload: --think", think_s, 1);
		KNOB("workload: --output", output, 1);
		KNOB("workload: --sessions", sessions, 0);
	} else if (c.workload != KVT_WL_TRACE) {
		KNOB("workload: --cache-distance", cache_distance, 1);
		KNOB("workload: --rate", rate, 0);
	}
	qsort(tab, (size_t)ntab, sizeof(tab[0]), by_moved);
	printf("%s: %s, %s TP %u, offload %s, stress %u, %s\n",
	       kvt_sched_policy_name(c.policy), c.hw.name, c.model, c.tp,
	       kvt_tier_kind_name(c.offload[0]), c.stress,
	       kvt_workload_name(c.workload));
	printf("%s mean %.1f ms, throughput %.0f tok/s; each input halved and "
	       "doubled alone (%d inputs, %d runs):\n",
	       r0.warm_ttft_ms.n ? "warm TTFT" : "TTFT", m0,
	       r0.throughput_tok_s, ntab, 2 * ntab + 1);
	printf("  %-30s %-8s %10s %10s %9s %10s %9s\n", "input", "source",
	       "value", "halved", "TTFT", "doubled", "TTFT");
	for (int i = 0; i < ntab && i < 15; i++)
		printf("  %-30s %-8s %10s %10s %+8.1f%% %10s %+8.1f%%\n",
		       tab[i].name, tab[i].assumed ? "ASSUMED" :
		       !strncmp(tab[i].name, "workload", 8) ? "given" : "sourced",
		       tab[i].from, tab[i].lo, 100 * (tab[i].m[0] / m0 - 1),
		       tab[i].hi, 100 * (tab[i].m[1] / m0 - 1));
	printf("assumptions that moved the result most:\n");
	for (int i = 0; i < ntab && shown < 5; i++)
		if (tab[i].assumed && tab[i].moved > 0.001) {
			printf("  %d. %s (%s): %.1f%%\n", ++shown, tab[i].name,
			       tab[i].from, 100 * tab[i].moved);
		}
	if (!shown)
		printf("  none moved it by more than 0.1%%\n");
out:
	free(x);
	free(tab);
	return err ? cli_fail(WHAT, err) : 0;
}

