/*
 * cmd_demo.c — kvtier demo: the serving engine over the real cache under
 * kvtier's scheduler and the baselines (src/demo/), printed for people (a
 * progress line, a table per rate, the comparison, the sweep's throughput
 * at equal TTFT, the ablation, the checks) or for machines (--json); the
 * curves as PNG with --plot (gnuplot).
 */
#include "cli.h"

#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static void demo_usage(FILE *f)
{
	fprintf(f,
"usage: kvtier demo [options]\n"
"\n"
"Serves an agentic workload through the real kvtier cache on this machine\n"
"with a continuous-batching engine: agent sessions arrive (Poisson) and run\n"
"turns over a growing context with think times between them, so many\n"
"requests wait, load, prefill and decode at once. Every step is planned by\n"
"the scheduler from the live cache; loads and stores are real copies into\n"
"and out of the engine's KV memory (host memory in vLLM's layout, EMULATED\n"
"hbm), every restored page checksum-verified layer by layer; each step's\n"
"GPU time is MODELED (hardware profile) and spent in real time. TTFT,\n"
"decode tokens and throughput are MEASURED on the wall clock, under\n"
"kvtier's scheduler and the LMCache, LMCache layer-wise and vLLM\n"
"offloading baselines, one after another on tiers of the same sizes.\n"
"\n"
"workload\n"
"  --sessions N        agent sessions (8)\n"
"  --turns N           turns per session, the first cold (4)\n"
"  --rate R            sessions arriving per second (2)\n"
"  --think S           median of the sessions' mean think times (1.5)\n"
"  --think-sigma X     log-sd of those means (0.5)\n"
"  --system N          shared system prompt tokens (2048)\n"
"  --context N         each session's own tokens at the cold turn (4096)\n"
"  --turn-tokens N     new tokens per turn: tool output, user input (1024)\n"
"  --output N          answer tokens per turn (64)\n"
"  --seed N            (1)\n"
"engine and model\n"
"  --model NAME        geometry preset (llama-3.2-1b)\n"
"  --page-tokens P     tokens per page (16)\n"
"  --hardware NAME     GPU profile for the modeled compute (testbed-b: H200)\n"
"  --token-budget N    tokens per step (8192)\n"
"  --hbm SIZE          the engine's KV memory, its blocks (default: four of\n"
"                      the largest requests)\n"
"policies\n"
"  --policy LIST       lmcache, lmcache-layerwise, vllm, kvtier or all (all)\n"
"  --sweep             every policy at several session rates (--rates), the\n"
"                      sessions arriving over the same window at each (so\n"
"                      more of them at a higher rate): the throughput each\n"
"                      policy reaches at equal p90 TTFT\n"
"  --rates LIST        the sweep's rates (default 1,2,4,8 x --rate / 2)\n"
"  --ttft-targets LIST p90 TTFT targets in ms (default: chosen from the\n"
"                      curves, where all of them reach)\n"
"  --ablation          kvtier with each of its policies switched off alone\n"
"  --repeat N          every (policy, rate) N times (1)\n"
"  --plot FILE.png     p90 TTFT against throughput per policy (gnuplot)\n"
"  --predict PROFILE   also simulate every pass (kvtier sim's engine, the\n"
"                      same requests) on this machine's hardware profile\n"
"                      (scripts/demo-profile): predicted next to measured\n"
"tiers\n"
"  --fabric/--dram/--ssd SIZE  kvtier's tier sizes (default: from the\n"
"                      workload and the machine)\n"
"  --fabric numa=N,SIZE | /dev/daxX.Y[,SIZE] | memfd,SIZE | file=PATH,SIZE\n"
"                      where the fabric tier lives: a CPU-less NUMA node\n"
"                      (CXL memory onlined as RAM), a devdax device (one\n"
"                      owner: run one --policy), or EMULATED (memfd, the\n"
"                      default; a file)\n"
"  --dir DIR           directory for the ssd tier (default: a temp dir,\n"
"                      removed at the end)\n"
"  --daemon            each policy's cache in a node daemon process\n"
"                      (kvtierd), the engine a client of it\n"
"  --stress N          N memory-stressor threads copying during the runs\n"
"  --stress-bytes B    each stressor's two buffers (256M)\n"
"output\n"
"  --json              machine-readable result on stdout\n"
"  --quiet             no progress line and no tables: one summary line\n"
"\n"
"Exit status: 0 when every request ran, every load and store succeeded\n"
"and every checksum matched; 1 otherwise (the summary says what failed).\n");
}

static int progress_on;

static void progress(void *arg, const char *label, size_t done, size_t total,
		     size_t pass, size_t passes)
{
	int width = 30, fill = total ? (int)(done * (size_t)width / total) : 0;

	(void)arg;
	if (!progress_on)
		return;
	fprintf(stderr, "\r  pass %zu/%zu [%.*s%*s] %3zu/%zu requests  %-28s",
		pass + 1, passes, fill, "##############################",
		width - fill, "", done, total, label);
	if (done == total && pass + 1 == passes)
		fputc('\n', stderr);
	fflush(stderr);
}

/* ---- what ran ------------------------------------------------------------ */

#define NPOL 4
static const char *const pol_order[NPOL] = { "lmcache", "lmcache-layerwise",
					     "vllm", "kvtier" };

/* The headline pass of @policy at @rate (no variant, repeat @rep). */
static const kvt_demo_pass *find(const kvt_demo_result *r, const char *policy,
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

static uint32_t nrates(const kvt_demo_config *c)
{
	return c->nrates ? c->nrates : 1;
}

static double rate_at(const kvt_demo_config *c, uint32_t k)
{
	return c->nrates ? c->rates[k] : c->rate;
}

/* Median over repeats of one statistic of (policy, rate). */
/* The median of @v[0..n) (sorted in place), its extremes in *@lo, *@hi;
 * NaN when n is 0. */
static double median(double *v, uint32_t n, double *lo, double *hi)
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

static double med(const kvt_demo_result *r, const char *pol, double rate,
		  double (*get)(const kvt_demo_pass *), double *lo, double *hi)
{
	double v[64];
	uint32_t n = 0;

	for (uint32_t k = 0; k < r->config.repeat && n < 64; k++) {
		const kvt_demo_pass *p = find(r, pol, rate, k);

		if (p && !p->err)
			v[n++] = get(p);
	}
	return median(v, n, lo, hi);
}

static double g_p90(const kvt_demo_pass *p) { return p->st.ttft_ms.p90; }

/* ---- integrity ------------------------------------------------------------- */

struct integrity {
	uint64_t engine_checked, engine_bad, failed, moves_verified, corrupt,
		move_errors, checked, check_bad, bad;
	int incomplete;
};

static void integrity_get(const kvt_demo_result *r, struct integrity *g)
{
	memset(g, 0, sizeof(*g));
	for (int i = 0; i < r->npasses; i++) {
		const kvt_demo_pass *p = &r->pass[i];

		for (size_t j = 0; j < p->nreqs; j++) {
			g->engine_checked += p->reqs[j].engine_checked;
			g->engine_bad += p->reqs[j].engine_bad;
			g->failed += p->reqs[j].failed_pages;
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

/* ---- text ------------------------------------------------------------------ */

static const char *fabric_label(const char *b, char *buf, size_t len)
{
	if (!b[0] || !strncmp(b, "memfd", 5))
		return "EMULATED: memfd";
	if (!strncmp(b, "file=", 5))
		snprintf(buf, len, "EMULATED: %s", b);
	else if (!strncmp(b, "numa=", 5))
		snprintf(buf, len, "CPU-less NUMA node %s", b + 5);
	else
		snprintf(buf, len, "devdax %s", b);
	return buf;
}

static void print_header(const kvt_demo_config *c, const kvt_geom *g,
			 const char *gpu)
{
	char fab[KVT_PATH_MAX + 16], a[32], b[32], d[32], e[32];
	uint64_t page = kvt_geom_page_bytes(g);

	printf("kvtier demo: %u agent sessions arriving at %g/s (Poisson), %u "
	       "turns each (1 cold + %u warm),\n  think time %.2g s median "
	       "per session (log-sd %.2g); system prompt %u + context %u "
	       "tokens,\n  +%u new and +%u answer tokens per turn; %s geometry "
	       "(%s of KV per token), %u-token pages\n", c->sessions, c->rate,
	       c->turns, c->turns - 1, c->think_s, c->think_sigma,
	       c->system_tokens, c->context_tokens, c->turn_tokens,
	       c->output_tokens, g->name,
	       kvt_size_format(kvt_geom_token_bytes(g), a, sizeof(a)),
	       c->page_tokens);
	printf("engine: the serving step loop of src/engine (the simulator's), "
	       "token budget %u,\n  chunked prefill, a decode batch, "
	       "admission and preemption over %llu blocks of KV memory\n  (%s, "
	       "EMULATED hbm: host memory, vLLM layout; no prefix cache of its "
	       "own)\n", c->token_budget,
	       (unsigned long long)(c->hbm_bytes / page),
	       kvt_size_format(c->hbm_bytes, a, sizeof(a)));
	printf("tiers: fabric %s (%s) | dram %s | ssd %s (temp dir, removed at "
	       "the end)\n", kvt_size_format(c->fabric_bytes, b, sizeof(b)),
	       fabric_label(c->fabric, fab, sizeof(fab)),
	       kvt_size_format(c->dram_bytes, d, sizeof(d)),
	       kvt_size_format(c->ssd_bytes, e, sizeof(e)));
	printf("MEASURED on this machine: every TTFT and decode token (wall "
	       "clock), throughput, every load,\n  store and demotion, the "
	       "transfer engine's rates, every checksum.\nMODELED: the GPU's "
	       "time for each step on %s (profile %s), spent in real time.\n",
	       gpu, c->hardware);
	if (c->stress)
		printf("stress: %u memory-stressor threads copying %s buffers "
		       "during the runs\n", c->stress,
		       kvt_size_format(c->stress_bytes, a, sizeof(a)));
	printf("load average at the start: %.2f (2 cores; other engineers' "
	       "builds share them)\n", kvt_demo_loadavg());
}

static void print_pass_row(const kvt_demo_pass *p, const char *name)
{
	const kvt_demo_stat *s = &p->st;
	uint64_t rec = 0;

	for (int t = 0; t < KVT_TIER_COUNT; t++)
		rec += s->recomputed_tokens[t];
	printf("  %-19s %7.1f %6.1f %7.1f %7.1f %6.2f %8.0f | %7llu %7llu "
	       "%7llu %7llu %8llu | %5llu %5llu %3llu %4.2f%s\n", name,
	       s->ttft_ms.mean, s->ttft_ms.p50, s->ttft_ms.p90, s->ttft_ms.p99,
	       s->tpot_ms.mean, s->tokens_per_s,
	       (unsigned long long)s->loaded_tokens[KVT_TIER_FABRIC],
	       (unsigned long long)s->loaded_tokens[KVT_TIER_DRAM],
	       (unsigned long long)s->loaded_tokens[KVT_TIER_SSD],
	       (unsigned long long)rec,
	       (unsigned long long)s->computed_tokens,
	       (unsigned long long)s->steps, (unsigned long long)s->deferred,
	       (unsigned long long)s->preemptions, s->gpu_busy,
	       p->err ? "  FAILED" : "");
}

static void print_table_head(void)
{
	printf("  %-19s %-30s %6s %8s | %-31s %8s | %-5s %5s %3s %4s\n", "",
	       "TTFT ms, measured", "TPOT", "tokens/s", "tokens loaded from",
	       "computed", "steps", "defer", "pre", "GPU");
	printf("  %-19s %7s %6s %7s %7s %6s %8s | %7s %7s %7s %7s %8s | %5s "
	       "%5s %3s %4s\n", "policy", "mean", "p50", "p90", "p99", "ms", "",
	       "fabric", "dram", "ssd", "recomp", "(prefill)", "", "", "emp",
	       "busy");
}

static void print_rates(const kvt_demo_result *r)
{
	const kvt_demo_config *c = &r->config;

	for (uint32_t rep = 0; rep < c->repeat; rep++)
		for (uint32_t k = 0; k < nrates(c); k++) {
			printf("\nsessions at %g/s (%u sessions):\n",
			       rate_at(c, k), kvt_demo_sessions_at(c, rate_at(c, k)));
			if (c->repeat > 1)
				printf("  (run %u of %u)\n", rep + 1, c->repeat);
			print_table_head();
			for (int i = 0; i < NPOL; i++) {
				const kvt_demo_pass *p = find(r, pol_order[i],
							      rate_at(c, k), rep);

				if (p)
					print_pass_row(p, p->policy);
			}
		}
	printf("  (recomp: cached tokens computed rather than loaded, kvtier's "
	       "load-or-recompute; computed:\n  prompt tokens prefilled in all; "
	       "GPU busy: modeled GPU time over the run's span)\n");
}

static void print_ablation(const kvt_demo_result *r)
{
	int any = 0;

	for (int i = 0; i < r->npasses; i++) {
		const kvt_demo_pass *p = &r->pass[i];
		char name[48];

		if (!p->variant[0])
			continue;
		if (!any) {
			const kvt_demo_pass *full = find(r, "kvtier",
							 r->config.rate, 0);

			printf("\nablation: kvtier with one policy switched off "
			       "at a time (sessions at %g/s):\n",
			       r->config.rate);
			print_table_head();
			if (full)
				print_pass_row(full, "kvtier (all on)");
			any = 1;
		}
		snprintf(name, sizeof(name), "kvtier %s", p->variant);
		print_pass_row(p, name);
	}
}

/* The p90 TTFT targets: given, or five between where every curve starts
 * and where every curve ends (log-spaced). */
static uint32_t targets(const kvt_demo_result *r, double *t)
{
	const kvt_demo_config *c = &r->config;
	double lo = 0, hi = INFINITY;
	uint32_t n = 0;

	if (c->ntargets) {
		memcpy(t, c->targets_ms, c->ntargets * sizeof(*t));
		return c->ntargets;
	}
	for (int i = 0; i < NPOL; i++) {
		double a = med(r, pol_order[i], rate_at(c, 0), g_p90, NULL, NULL);
		double b = med(r, pol_order[i], rate_at(c, nrates(c) - 1), g_p90,
			       NULL, NULL);

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

struct goals {
	double ratio_lm, ratio_vllm;    /* max over targets of the median
					   over repeats of kvtier / x */
	double lm_lo, lm_hi, vl_lo, vl_hi; /* their spread over repeats */
	uint32_t lm_n, vl_n;            /* repeats the medians are of */
	double at_lm, at_vllm;          /* the target where it is reached */
	double top_rate;                /* highest rate all sustain */
	double p90[NPOL];
	int have_ratio, have_top;
	int pass_ratio, pass_p90;
};

/* The speed goals of the issue, from the measured curves: kvtier's
 * throughput at equal p90 TTFT >= 1.5x lmcache's and >= 1.2x vllm's (the
 * ratio of each repeat's curves, side by side in one run, its median over
 * the repeats; the target where that median is highest, named in the
 * output); kvtier's p90 TTFT at the highest rate every policy sustains
 * (the median p90 under the largest target) lower than each baseline's. */
static void goals_get(const kvt_demo_result *r, const double *tg, uint32_t nt,
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
		if (nl && (m = median(rl, nl, &lo, &hi)) > g->ratio_lm) {
			g->ratio_lm = m;
			g->lm_lo = lo;
			g->lm_hi = hi;
			g->lm_n = nl;
			g->at_lm = tg[i];
			g->have_ratio = 1;
		}
		if (nv && (m = median(rv, nv, &lo, &hi)) > g->ratio_vllm) {
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
	for (uint32_t k = 0; k < nrates(c); k++) {
		int all = 1;

		for (int i = 0; i < NPOL; i++) {
			double v = med(r, pol_order[i], rate_at(c, k), g_p90,
				       NULL, NULL);

			if (!isnan(v) && (!bound || v > bound))
				all = 0;
		}
		if (all) {
			g->top_rate = rate_at(c, k);
			g->have_top = 1;
		}
	}
	if (g->have_top) {
		/* every median first: kvtier's (the last) is compared with
		 * each baseline's */
		for (int i = 0; i < NPOL; i++)
			g->p90[i] = med(r, pol_order[i], g->top_rate, g_p90,
					NULL, NULL);
		g->pass_p90 = !isnan(g->p90[3]);
		for (int i = 0; i < 3; i++)
			if (!isnan(g->p90[i]) && !(g->p90[3] < g->p90[i]))
				g->pass_p90 = 0;
	}
}

static void print_sweep(const kvt_demo_result *r)
{
	const kvt_demo_config *c = &r->config;
	double tg[KVT_DEMO_MAX_TARGETS];
	uint32_t nt = targets(r, tg);
	struct goals g;

	if (c->nrates < 2)
		return;
	printf("\nthroughput (tokens/s) at equal p90 TTFT, interpolated along "
	       "the measured curves%s:\n  %-12s", c->repeat > 1 ?
	       " (first run)" : "", "p90 target");
	for (int i = 0; i < NPOL; i++)
		printf(" %18s", pol_order[i]);
	printf(" %12s %12s\n", "kvt/lmcache", "kvt/vllm");
	for (uint32_t j = 0; j < nt; j++) {
		double v[NPOL];

		printf("  %9.0f ms", tg[j]);
		for (int i = 0; i < NPOL; i++) {
			int rc = kvt_demo_throughput_at(r, pol_order[i], 0, tg[j],
							&v[i]);

			if (rc < 0) {
				v[i] = NAN;
				printf(" %18s", rc == -ERANGE ? "(never this low)" :
				       "-");
			} else {
				printf(" %17.0f%s", v[i], rc == 1 ? "+" : " ");
			}
		}
		printf(" %12.2f %12.2f\n", v[3] / v[0], v[3] / v[2]);
	}
	printf("  (+: every rate met the target: a lower bound)\n");
	goals_get(r, tg, nt, &g);
	printf("\nspeed goals (this run):\n");
	if (g.have_ratio)
		printf("  kvtier's throughput at equal p90 TTFT (median of %u "
		       "runs, range %.2f-%.2f): %.2fx lmcache's (at %.0f ms; "
		       "goal >= 1.5x), (median of %u, range %.2f-%.2f) %.2fx "
		       "vllm's (at %.0f ms; goal >= 1.2x): %s\n", g.lm_n,
		       g.lm_lo, g.lm_hi, g.ratio_lm, g.at_lm, g.vl_n, g.vl_lo,
		       g.vl_hi, g.ratio_vllm, g.at_vllm,
		       g.pass_ratio ? "met" : "NOT MET");
	else
		printf("  throughput at equal p90 TTFT: no target every curve "
		       "reaches: NOT MEASURED\n");
	if (g.have_top)
		printf("  p90 TTFT at %g sessions/s, the highest rate every policy "
		       "sustains (p90 under %.0f ms):\n    lmcache %.0f, "
		       "lmcache-layerwise %.0f, vllm %.0f, kvtier %.0f ms: %s\n",
		       g.top_rate, tg[nt ? nt - 1 : 0], g.p90[0], g.p90[1],
		       g.p90[2], g.p90[3], g.pass_p90 ? "kvtier lowest (met)" :
		       "kvtier NOT the lowest (NOT MET)");
	else
		printf("  no rate every policy sustains: p90 goal NOT MEASURED\n");
}

static void print_compare(const kvt_demo_result *r)
{
	const kvt_demo_config *c = &r->config;
	const kvt_demo_pass *kv = find(r, "kvtier", c->rate, 0);

	if (!kv || c->nrates)
		return;
	printf("\nat %g sessions/s, kvtier against each baseline (measured side "
	       "by side, this run):\n", c->rate);
	for (int i = 0; i < 3; i++) {
		const kvt_demo_pass *b = find(r, pol_order[i], c->rate, 0);

		if (!b || b->err || kv->err)
			continue;
		printf("  vs %-18s p90 TTFT %.0f vs %.0f ms (%.2fx lower), mean "
		       "%.0f vs %.0f ms; throughput %.0f vs %.0f tokens/s "
		       "(%.2fx)%s\n", b->policy, kv->st.ttft_ms.p90,
		       b->st.ttft_ms.p90, b->st.ttft_ms.p90 / kv->st.ttft_ms.p90,
		       kv->st.ttft_ms.mean, b->st.ttft_ms.mean,
		       kv->st.tokens_per_s, b->st.tokens_per_s,
		       kv->st.tokens_per_s / b->st.tokens_per_s,
		       kv->st.ttft_ms.p90 < b->st.ttft_ms.p90 ? "" :
		       "  -- kvtier did NOT win this one");
	}
	printf("  (throughput at one rate mostly follows the offered load; "
	       "--sweep measures it at equal TTFT)\n");
}

static void print_integrity(const kvt_demo_result *r, int err)
{
	struct integrity g;

	integrity_get(r, &g);
	printf("\nchecksums: %llu restored blocks sampled by the engine: %llu "
	       "wrong; %llu page copies verified\n  (loads, stores, moves); "
	       "%llu failed verification; %llu I/O errors between tiers;\n",
	       (unsigned long long)g.engine_checked,
	       (unsigned long long)g.engine_bad,
	       (unsigned long long)g.moves_verified,
	       (unsigned long long)g.corrupt, (unsigned long long)g.move_errors);
	if (g.incomplete)
		printf("  the final re-read of every copy did NOT complete (%llu "
		       "re-read before it stopped).\n",
		       (unsigned long long)g.checked);
	else if (err || g.bad)
		printf("  of the page copies still in the tiers at the end, %llu "
		       "were re-read and %llu did not match\n  (copies that "
		       "failed before were dropped and are not among them).\n",
		       (unsigned long long)g.checked,
		       (unsigned long long)g.check_bad);
	else
		printf("  %llu page copies re-read in every tier at the end: "
		       "%llu bad.\n", (unsigned long long)g.checked,
		       (unsigned long long)g.check_bad);
	if (err)
		printf("THE RUN FAILED: %s\n  %llu verification failures in "
		       "all; what is above is what was checked before and after "
		       "it.\n", r->error[0] ? r->error : kvt_strerror(err),
		       (unsigned long long)g.bad);
	else
		printf("verification failures: 0. Every restore, demotion and "
		       "copy checked matched.\n");
}

static void print_quiet(const kvt_demo_result *r, int err)
{
	const kvt_demo_config *c = &r->config;
	struct integrity g;

	integrity_get(r, &g);
	printf("kvtier demo:");
	for (int i = 0; i < NPOL; i++) {
		const kvt_demo_pass *p = find(r, pol_order[i], rate_at(c, 0), 0);

		if (p)
			printf(" %s p90 %.0f ms %.0f tok/s;", p->policy,
			       p->st.ttft_ms.p90, p->st.tokens_per_s);
	}
	printf(" checksums: %llu blocks sampled, %llu copies re-read%s, %llu "
	       "bad%s%s; %.1f s\n", (unsigned long long)g.engine_checked,
	       (unsigned long long)g.checked, g.incomplete ?
	       " (re-read incomplete)" : "", (unsigned long long)g.bad,
	       err ? "; FAILED: " : "", err ? (r->error[0] ? r->error :
					      kvt_strerror(err)) : "",
	       r->seconds);
}

/* ---- JSON -------------------------------------------------------------------- */

static cJSON *dist_json(const kvt_dist *d)
{
	cJSON *o = cJSON_CreateObject();

	cJSON_AddNumberToObject(o, "mean", d->mean);
	cJSON_AddNumberToObject(o, "p50", d->p50);
	cJSON_AddNumberToObject(o, "p90", d->p90);
	cJSON_AddNumberToObject(o, "p99", d->p99);
	cJSON_AddNumberToObject(o, "n", (double)d->n);
	return o;
}

static cJSON *tiers_json(const uint64_t *v)
{
	cJSON *o = cJSON_CreateObject();

	for (int t = KVT_TIER_FABRIC; t < KVT_TIER_REMOTE; t++)
		cJSON_AddNumberToObject(o, kvt_tier_kind_name((kvt_tier_kind)t),
					(double)v[t]);
	return o;
}

static cJSON *stat_json(const kvt_demo_pass *p)
{
	const kvt_demo_stat *s = &p->st;
	cJSON *o = cJSON_CreateObject(), *x;

	cJSON_AddItemToObject(o, "ttft_ms", dist_json(&s->ttft_ms));
	cJSON_AddItemToObject(o, "warm_ttft_ms", dist_json(&s->warm_ttft_ms));
	cJSON_AddItemToObject(o, "tpot_ms", dist_json(&s->tpot_ms));
	cJSON_AddNumberToObject(o, "tokens_per_s", s->tokens_per_s);
	cJSON_AddNumberToObject(o, "output_tokens_per_s", s->output_per_s);
	cJSON_AddNumberToObject(o, "makespan_s", s->makespan_s);
	cJSON_AddItemToObject(o, "loaded_tokens", tiers_json(s->loaded_tokens));
	cJSON_AddItemToObject(o, "recomputed_tokens",
			      tiers_json(s->recomputed_tokens));
	cJSON_AddNumberToObject(o, "computed_tokens", (double)s->computed_tokens);
	cJSON_AddNumberToObject(o, "prompt_tokens", (double)s->prompt_tokens);
	cJSON_AddNumberToObject(o, "output_tokens", (double)s->output_tokens);
	cJSON_AddNumberToObject(o, "steps", (double)s->steps);
	cJSON_AddNumberToObject(o, "decode_only_steps",
				(double)s->decode_only_steps);
	cJSON_AddNumberToObject(o, "deferred", (double)s->deferred);
	cJSON_AddNumberToObject(o, "preemptions", (double)s->preemptions);
	cJSON_AddNumberToObject(o, "gpu_busy_modeled", s->gpu_busy);
	cJSON_AddNumberToObject(o, "gpu_overrun_s", s->gpu_overrun_s);
	cJSON_AddNumberToObject(o, "load_wait_s", s->load_wait_s);
	cJSON_AddNumberToObject(o, "engine_ms_per_step", s->plan_ms_mean);
	cJSON_AddNumberToObject(o, "host_us_per_step", s->host_us_per_step);
	cJSON_AddNumberToObject(o, "host_us_prefill_step",
				s->host_us_prefill_step);
	cJSON_AddNumberToObject(o, "host_us_decode_step",
				s->host_us_decode_step);
	cJSON_AddNumberToObject(o, "load_stretch", s->load_stretch);
	cJSON_AddNumberToObject(o, "store_skipped_pages",
				(double)s->store_skipped_pages);
	x = cJSON_AddObjectToObject(o, "load_gbps_measured");
	for (int t = KVT_TIER_FABRIC; t < KVT_TIER_REMOTE; t++)
		cJSON_AddNumberToObject(x, kvt_tier_kind_name((kvt_tier_kind)t),
					s->load_gbps[t]);
	x = cJSON_AddObjectToObject(o, "load_gbps_mean");
	for (int t = KVT_TIER_FABRIC; t < KVT_TIER_REMOTE; t++)
		cJSON_AddNumberToObject(x, kvt_tier_kind_name((kvt_tier_kind)t),
					s->load_gbps_mean[t]);
	return o;
}

static cJSON *pass_json(const kvt_demo_pass *p)
{
	cJSON *o = stat_json(p), *x;

	cJSON_AddStringToObject(o, "policy", p->policy);
	cJSON_AddStringToObject(o, "variant", p->variant);
	cJSON_AddNumberToObject(o, "rate", p->rate);
	cJSON_AddNumberToObject(o, "sessions", p->sessions);
	cJSON_AddNumberToObject(o, "repeat", p->repeat);
	cJSON_AddNumberToObject(o, "order", p->order);
	cJSON_AddStringToObject(o, "tiers", p->tiers);
	cJSON_AddStringToObject(o, "fabric_tier", p->fabric_where);
	cJSON_AddNumberToObject(o, "requests", (double)p->nreqs);
	cJSON_AddNumberToObject(o, "requests_run", (double)p->done);
	cJSON_AddNumberToObject(o, "engine_blocks", (double)p->nblocks);
	cJSON_AddNumberToObject(o, "seconds", p->seconds);
	cJSON_AddNumberToObject(o, "setup_seconds", p->setup_s);
	cJSON_AddNumberToObject(o, "loadavg", p->loadavg);
	if (p->predicted) {
		x = cJSON_AddObjectToObject(o, "predicted");
		cJSON_AddItemToObject(x, "ttft_ms", dist_json(&p->pred_ttft_ms));
		cJSON_AddItemToObject(x, "tpot_ms", dist_json(&p->pred_tpot_ms));
		cJSON_AddNumberToObject(x, "tokens_per_s", p->pred_tokens_per_s);
		cJSON_AddNumberToObject(x, "loaded_tokens", (double)p->pred_loaded);
	}
	if (p->predicted_env) {
		x = cJSON_AddObjectToObject(o, "predicted_measured_env");
		cJSON_AddItemToObject(x, "ttft_ms", dist_json(&p->penv_ttft_ms));
		cJSON_AddNumberToObject(x, "tokens_per_s", p->penv_tokens_per_s);
		cJSON_AddNumberToObject(x, "cpu_copy_factor", p->penv_cpu_f);
		cJSON_AddNumberToObject(x, "ssd_factor", p->penv_ssd_f);
		cJSON_AddNumberToObject(x, "host_us", p->st.host_us_per_step);
		cJSON_AddNumberToObject(x, "load_stretch",
					p->st.load_stretch);
	}
	if (p->stress_gbps > 0)
		cJSON_AddNumberToObject(o, "stress_gbps", p->stress_gbps);
	x = cJSON_AddObjectToObject(o, "data");
	cJSON_AddNumberToObject(x, "loads", (double)p->cache.loads);
	cJSON_AddNumberToObject(x, "load_bytes", (double)p->cache.load_bytes);
	cJSON_AddNumberToObject(x, "stores", (double)p->cache.stores);
	cJSON_AddNumberToObject(x, "store_bytes", (double)p->cache.store_bytes);
	cJSON_AddNumberToObject(x, "move_pages", (double)p->cache.move_pages);
	cJSON_AddNumberToObject(x, "move_bytes", (double)p->cache.move_bytes);
	cJSON_AddNumberToObject(x, "move_errors", (double)p->cache.move_errors);
	cJSON_AddNumberToObject(x, "verified", (double)p->cache.verified);
	cJSON_AddNumberToObject(x, "corrupt", (double)p->cache.corrupt);
	cJSON_AddNumberToObject(x, "failed_blocks",
				(double)p->cache.failed_blocks);
	cJSON_AddNumberToObject(x, "bg_passes", (double)p->cache.bg_passes);
	cJSON_AddNumberToObject(x, "cache_wait_seconds", p->cache.wait_s);
	cJSON_AddBoolToObject(x, "final_check_complete",
			      p->check_err == 0 || p->check_err == KVT_ECORRUPT);
	cJSON_AddNumberToObject(x, "final_checked", (double)p->check.checked);
	cJSON_AddNumberToObject(x, "final_bad", (double)p->check.bad);
	if (p->err)
		cJSON_AddStringToObject(o, "error", p->error);
	return o;
}

static cJSON *result_json(const kvt_demo_result *r, int err)
{
	const kvt_demo_config *c = &r->config;
	cJSON *root = cJSON_CreateObject(), *o, *a;
	double tg[KVT_DEMO_MAX_TARGETS];
	uint32_t nt = c->nrates >= 2 ? targets(r, tg) : 0;
	struct integrity g;

	o = cJSON_AddObjectToObject(root, "config");
	cJSON_AddStringToObject(o, "model", r->geom.name);
	cJSON_AddNumberToObject(o, "token_bytes",
				(double)kvt_geom_token_bytes(&r->geom));
	cJSON_AddNumberToObject(o, "page_tokens", c->page_tokens);
	cJSON_AddNumberToObject(o, "sessions", c->sessions);
	cJSON_AddNumberToObject(o, "turns", c->turns);
	cJSON_AddNumberToObject(o, "rate", c->rate);
	cJSON_AddNumberToObject(o, "think_s", c->think_s);
	cJSON_AddNumberToObject(o, "think_sigma", c->think_sigma);
	cJSON_AddNumberToObject(o, "system_tokens", c->system_tokens);
	cJSON_AddNumberToObject(o, "context_tokens", c->context_tokens);
	cJSON_AddNumberToObject(o, "turn_tokens", c->turn_tokens);
	cJSON_AddNumberToObject(o, "output_tokens", c->output_tokens);
	cJSON_AddNumberToObject(o, "token_budget", c->token_budget);
	cJSON_AddStringToObject(o, "hardware", c->hardware);
	cJSON_AddStringToObject(o, "gpu_modeled", r->gpu_name);
	cJSON_AddBoolToObject(o, "daemon", c->daemon);
	cJSON_AddNumberToObject(o, "stress_threads", c->stress);
	cJSON_AddNumberToObject(o, "hbm_bytes", (double)c->hbm_bytes);
	cJSON_AddNumberToObject(o, "fabric_bytes", (double)c->fabric_bytes);
	cJSON_AddNumberToObject(o, "dram_bytes", (double)c->dram_bytes);
	cJSON_AddNumberToObject(o, "ssd_bytes", (double)c->ssd_bytes);
	cJSON_AddNumberToObject(o, "seed", (double)c->seed);
	cJSON_AddNumberToObject(o, "repeat", c->repeat);
	a = cJSON_AddArrayToObject(o, "rates");
	for (uint32_t k = 0; k < nrates(c); k++)
		cJSON_AddItemToArray(a, cJSON_CreateNumber(rate_at(c, k)));
	/* the headline: each policy at the first rate, first run */
	o = cJSON_AddObjectToObject(root, "policies");
	for (int i = 0; i < NPOL; i++) {
		const kvt_demo_pass *p = find(r, pol_order[i], rate_at(c, 0), 0);

		if (p)
			cJSON_AddItemToObject(o, p->policy, stat_json(p));
	}
	a = cJSON_AddArrayToObject(root, "passes");
	for (int i = 0; i < r->npasses; i++)
		cJSON_AddItemToArray(a, pass_json(&r->pass[i]));
	if (nt) {
		struct goals gl;

		o = cJSON_AddObjectToObject(root, "throughput_at_equal_ttft");
		cJSON_AddStringToObject(o, "statistic", "p90");
		for (uint32_t j = 0; j < nt; j++) {
			char key[32];
			cJSON *t;

			snprintf(key, sizeof(key), "%.0f", tg[j]);
			t = cJSON_AddObjectToObject(o, key);
			for (int i = 0; i < NPOL; i++) {
				double v;
				int rc = kvt_demo_throughput_at(r, pol_order[i],
								0, tg[j], &v);

				if (rc < 0)
					cJSON_AddNullToObject(t, pol_order[i]);
				else
					cJSON_AddNumberToObject(t, pol_order[i],
								v);
			}
		}
		goals_get(r, tg, nt, &gl);
		o = cJSON_AddObjectToObject(root, "goals");
		cJSON_AddNumberToObject(o, "kvtier_over_lmcache", gl.ratio_lm);
		cJSON_AddNumberToObject(o, "kvtier_over_vllm", gl.ratio_vllm);
		cJSON_AddNumberToObject(o, "ratio_repeats", c->repeat);
		cJSON_AddNumberToObject(o, "kvtier_over_lmcache_min", gl.lm_lo);
		cJSON_AddNumberToObject(o, "kvtier_over_lmcache_max", gl.lm_hi);
		cJSON_AddNumberToObject(o, "kvtier_over_lmcache_at_ms", gl.at_lm);
		cJSON_AddNumberToObject(o, "kvtier_over_vllm_min", gl.vl_lo);
		cJSON_AddNumberToObject(o, "kvtier_over_vllm_max", gl.vl_hi);
		cJSON_AddNumberToObject(o, "kvtier_over_vllm_at_ms", gl.at_vllm);
		cJSON_AddBoolToObject(o, "throughput_goal_met", gl.pass_ratio);
		cJSON_AddNumberToObject(o, "highest_sustained_rate",
					gl.have_top ? gl.top_rate : 0);
		cJSON_AddBoolToObject(o, "p90_goal_met", gl.pass_p90);
	}
	integrity_get(r, &g);
	o = cJSON_AddObjectToObject(root, "integrity");
	cJSON_AddNumberToObject(o, "engine_checked", (double)g.engine_checked);
	cJSON_AddNumberToObject(o, "engine_bad", (double)g.engine_bad);
	cJSON_AddNumberToObject(o, "restore_failed", (double)g.failed);
	cJSON_AddNumberToObject(o, "verified", (double)g.moves_verified);
	cJSON_AddNumberToObject(o, "corrupt", (double)g.corrupt);
	cJSON_AddNumberToObject(o, "move_io_errors", (double)g.move_errors);
	cJSON_AddNumberToObject(o, "final_checked", (double)g.checked);
	cJSON_AddNumberToObject(o, "final_bad", (double)g.check_bad);
	cJSON_AddBoolToObject(o, "final_check_complete", !g.incomplete);
	cJSON_AddNumberToObject(o, "bad", (double)g.bad);
	cJSON_AddBoolToObject(root, "ok", !err);
	if (err)
		cJSON_AddStringToObject(root, "error", r->error[0] ? r->error :
					kvt_strerror(err));
	cJSON_AddNumberToObject(root, "seconds", r->seconds);
	cJSON_AddNumberToObject(root, "loadavg_start", r->loadavg_start);
	cJSON_AddNumberToObject(root, "loadavg_end", r->loadavg_end);
	return root;
}

/* ---- the plot ------------------------------------------------------------------ */

static int plot(const kvt_demo_result *r, const char *png)
{
	char dat[] = "/tmp/kvtier-demo-plot-XXXXXX", cmd[512];
	FILE *f, *gp;
	int fd, rc;

	if ((fd = mkstemp(dat)) < 0 || !(f = fdopen(fd, "w"))) {
		fprintf(stderr, "kvtier demo: --plot: no temp file\n");
		return -1;
	}
	for (int i = 0; i < NPOL; i++) {
		fprintf(f, "# %s\n", pol_order[i]);
		for (uint32_t k = 0; k < nrates(&r->config); k++) {
			const kvt_demo_pass *p = find(r, pol_order[i],
						      rate_at(&r->config, k), 0);

			if (p && !p->err)
				fprintf(f, "%g %g %g\n", p->st.tokens_per_s,
					p->st.ttft_ms.p90, p->rate);
		}
		fprintf(f, "\n\n");
	}
	fclose(f);
	if (!(gp = popen("gnuplot 2>&1", "w"))) {
		fprintf(stderr, "kvtier demo: --plot: cannot run gnuplot\n");
		unlink(dat);
		return -1;
	}
	fprintf(gp, "set terminal png size 900,600\nset output '%s'\n"
		"set title 'kvtier demo: p90 TTFT against throughput (measured, "
		"%s, %u sessions)'\nset xlabel 'throughput, tokens/s'\n"
		"set ylabel 'p90 TTFT, ms'\nset logscale y\nset key top left\n"
		"set grid\nplot ", png, r->geom.name, r->config.sessions);
	for (int i = 0; i < NPOL; i++)
		fprintf(gp, "%s'%s' index %d using 1:2 with linespoints "
			"title '%s'", i ? ", " : "", dat, i, pol_order[i]);
	fprintf(gp, "\n");
	rc = pclose(gp);
	unlink(dat);
	snprintf(cmd, sizeof(cmd), "%s", png);
	if (rc || access(cmd, R_OK)) {
		fprintf(stderr, "kvtier demo: --plot: gnuplot failed (is "
			"gnuplot-nox installed? scripts/bootstrap)\n");
		return -1;
	}
	return 0;
}

/* ---- main ------------------------------------------------------------------------ */

static int size_opt(const char *flag, const char *v, uint64_t *out)
{
	if (kvt_size_parse(v, out) || !*out) {
		fprintf(stderr, "kvtier demo: %s: bad size '%s' (e.g. 512M, 4G)\n",
			flag, v);
		return -1;
	}
	return 0;
}

static int fabric_opt(const char *v, kvt_demo_config *c)
{
	const char *comma = strrchr(v, ',');
	uint64_t n;

	if (!kvt_size_parse(v, &n) && n) {
		c->fabric_bytes = n;
		return 0;
	}
	if (comma && !kvt_size_parse(comma + 1, &n) && n)
		c->fabric_bytes = n;
	else
		comma = v + strlen(v);
	if (comma == v || (size_t)(comma - v) >= sizeof(c->fabric) ||
	    (strncmp(v, "memfd", 5) && strncmp(v, "numa=", 5) &&
	     strncmp(v, "/dev/dax", 8) && strncmp(v, "file=", 5))) {
		fprintf(stderr, "kvtier demo: --fabric: '%s' is not SIZE or "
			"BACKING[,SIZE] (BACKING: memfd, numa=N, /dev/daxX.Y, "
			"file=PATH)\n", v);
		return -1;
	}
	snprintf(c->fabric, sizeof(c->fabric), "%.*s", (int)(comma - v), v);
	return 0;
}

/* A comma list of positive numbers into @v (at most @max): count or -1. */
static int num_list(const char *flag, const char *s, double *v, uint32_t max)
{
	char buf[512], *tok, *save = NULL;
	uint32_t n = 0;

	if (snprintf(buf, sizeof(buf), "%s", s) >= (int)sizeof(buf))
		return -1;
	for (tok = strtok_r(buf, ",", &save); tok;
	     tok = strtok_r(NULL, ",", &save)) {
		if (n == max || cli_double(flag, tok, 1e-6, 1e9, &v[n]))
			return -1;
		n++;
	}
	return n ? (int)n : -1;
}

int cmd_demo(int argc, char **argv)
{
	enum { O_HBM = 1, O_FAB, O_DRAM, O_SSD, O_RATE, O_THINK, O_SIGMA,
	       O_BUDGET, O_SWEEP, O_RATES, O_TARGETS, O_ABL, O_REPEAT,
	       O_PLOT, O_PREDICT };
	static const struct option lo[] = {
		{ "sessions", required_argument, 0, 'S' },
		{ "turns", required_argument, 0, 'T' },
		{ "system", required_argument, 0, 'y' },
		{ "context", required_argument, 0, 'c' },
		{ "turn-tokens", required_argument, 0, 'n' },
		{ "output", required_argument, 0, 'o' },
		{ "model", required_argument, 0, 'm' },
		{ "page-tokens", required_argument, 0, 'p' },
		{ "hardware", required_argument, 0, 'H' },
		{ "policy", required_argument, 0, 'P' },
		{ "stress", required_argument, 0, 's' },
		{ "stress-bytes", required_argument, 0, 'B' },
		{ "hbm", required_argument, 0, O_HBM },
		{ "fabric", required_argument, 0, O_FAB },
		{ "dram", required_argument, 0, O_DRAM },
		{ "ssd", required_argument, 0, O_SSD },
		{ "rate", required_argument, 0, O_RATE },
		{ "think", required_argument, 0, O_THINK },
		{ "think-sigma", required_argument, 0, O_SIGMA },
		{ "token-budget", required_argument, 0, O_BUDGET },
		{ "sweep", no_argument, 0, O_SWEEP },
		{ "rates", required_argument, 0, O_RATES },
		{ "ttft-targets", required_argument, 0, O_TARGETS },
		{ "ablation", no_argument, 0, O_ABL },
		{ "repeat", required_argument, 0, O_REPEAT },
		{ "plot", required_argument, 0, O_PLOT },
		{ "predict", required_argument, 0, O_PREDICT },
		{ "dir", required_argument, 0, 'd' },
		{ "seed", required_argument, 0, 'e' },
		{ "json", no_argument, 0, 'j' },
		{ "quiet", no_argument, 0, 'q' },
		{ "daemon", no_argument, 0, 'D' },
		{ "help", no_argument, 0, 'h' },
		{ 0, 0, 0, 0 }
	};
	kvt_demo_config c;
	kvt_demo_result *r = NULL;
	int json = 0, quiet = 0, sweep = 0, ch, err, n;
	const char *png = NULL;
	uint64_t v;

	kvt_demo_config_init(&c);
	optind = 1;
	while ((ch = getopt_long(argc, argv, "jqh", lo, NULL)) != -1) {
		switch (ch) {
		case 'S': if (cli_u64("--sessions", optarg, 1, KVT_DEMO_MAX_SESSIONS, &v)) return 2; c.sessions = (uint32_t)v; break;
		case 'T': if (cli_u64("--turns", optarg, 1, KVT_DEMO_MAX_TURNS, &v)) return 2; c.turns = (uint32_t)v; break;
		case 'y': if (cli_u64("--system", optarg, 0, 1u << 24, &v)) return 2; c.system_tokens = (uint32_t)v; break;
		case 'c': if (cli_u64("--context", optarg, 1, 1u << 24, &v)) return 2; c.context_tokens = (uint32_t)v; break;
		case 'n': if (cli_u64("--turn-tokens", optarg, 0, 1u << 24, &v)) return 2; c.turn_tokens = (uint32_t)v; break;
		case 'o': if (cli_u64("--output", optarg, 1, 1u << 20, &v)) return 2; c.output_tokens = (uint32_t)v; break;
		case 'p': if (cli_u64("--page-tokens", optarg, 1, 4096, &v)) return 2; c.page_tokens = (uint32_t)v; break;
		case 'm': snprintf(c.model, sizeof(c.model), "%s", optarg); break;
		case 'H': snprintf(c.hardware, sizeof(c.hardware), "%s", optarg); break;
		case 'P':
			if (kvt_demo_policy_parse(optarg, &c.policies))
				return cli_usage("demo", "--policy: '%s' is not a list of lmcache, lmcache-layerwise, vllm, kvtier or all", optarg);
			break;
		case 's': if (cli_u64("--stress", optarg, 0, 64, &v)) return 2; c.stress = (unsigned)v; break;
		case 'B': if (size_opt("--stress-bytes", optarg, &c.stress_bytes)) return 2; break;
		case O_HBM: if (size_opt("--hbm", optarg, &c.hbm_bytes)) return 2; break;
		case O_FAB: if (fabric_opt(optarg, &c)) return 2; break;
		case O_DRAM: if (size_opt("--dram", optarg, &c.dram_bytes)) return 2; break;
		case O_SSD: if (size_opt("--ssd", optarg, &c.ssd_bytes)) return 2; break;
		case O_RATE: if (cli_double("--rate", optarg, 1e-3, 1e4, &c.rate)) return 2; break;
		case O_THINK: if (cli_double("--think", optarg, 0, 1e4, &c.think_s)) return 2; break;
		case O_SIGMA: if (cli_double("--think-sigma", optarg, 0, 10, &c.think_sigma)) return 2; break;
		case O_BUDGET: if (cli_u64("--token-budget", optarg, 1, 1u << 24, &v)) return 2; c.token_budget = (uint32_t)v; break;
		case O_SWEEP: sweep = 1; break;
		case O_RATES:
			if ((n = num_list("--rates", optarg, c.rates, KVT_DEMO_MAX_RATES)) < 0)
				return cli_usage("demo", "--rates: '%s' is not a list of up to %d rates", optarg, KVT_DEMO_MAX_RATES);
			c.nrates = (uint32_t)n;
			sweep = 1;
			break;
		case O_TARGETS:
			if ((n = num_list("--ttft-targets", optarg, c.targets_ms, KVT_DEMO_MAX_TARGETS)) < 0)
				return cli_usage("demo", "--ttft-targets: '%s' is not a list of up to %d targets in ms", optarg, KVT_DEMO_MAX_TARGETS);
			c.ntargets = (uint32_t)n;
			break;
		case O_ABL: c.ablation = 1; break;
		case O_REPEAT: if (cli_u64("--repeat", optarg, 1, 64, &v)) return 2; c.repeat = (uint32_t)v; break;
		case O_PLOT: png = optarg; sweep = 1; break;
		case O_PREDICT: snprintf(c.predict, sizeof(c.predict), "%s", optarg); break;
		case 'd': snprintf(c.dir, sizeof(c.dir), "%s", optarg); break;
		case 'e': if (cli_u64("--seed", optarg, 0, UINT64_MAX, &v)) return 2; c.seed = v; break;
		case 'j': json = 1; break;
		case 'q': quiet = 1; break;
		case 'D': c.daemon = 1; break;
		case 'h': demo_usage(stdout); return 0;
		default: demo_usage(stderr); return CLI_EXIT_USAGE;
		}
	}
	if (optind < argc)
		return cli_usage("demo", "unexpected argument '%s'", argv[optind]);
	if (sweep && !c.nrates) {
		static const double x[] = { 0.5, 1, 2, 4 };

		for (size_t i = 0; i < sizeof(x) / sizeof(x[0]); i++)
			c.rates[c.nrates++] = c.rate * x[i];
	}
	if (sweep && c.nrates < 2)
		return cli_usage("demo", "--sweep needs at least two rates");
	if ((err = kvt_demo_size(&c)))
		return cli_fail("demo", err);
	if (getenv("KVT_DEMO_TAMPER") &&
	    cli_u64("KVT_DEMO_TAMPER", getenv("KVT_DEMO_TAMPER"), 0,
		    UINT64_MAX, &c.tamper_after))
		return 2;
	progress_on = !json && !quiet && isatty(2);
	c.progress = progress;
	if (!json && !quiet) {
		kvt_geom g;
		kvt_hw hw;
		char gpu[KVT_NAME_MAX] = "?";

		kvt_geom_preset(&g, c.model, c.page_tokens, 1, 0);
		if (!kvt_hw_load(&hw, c.hardware))
			snprintf(gpu, sizeof(gpu), "%s", hw.gpu_name);
		print_header(&c, &g, gpu);
		fflush(stdout);
	}
	err = kvt_demo_run(&c, &r);
	if (!r)
		return cli_fail("demo", err);
	if (json) {
		cli_json_print(result_json(r, err));
	} else if (quiet) {
		print_quiet(r, err);
	} else {
		print_rates(r);
		print_compare(r);
		print_sweep(r);
		print_ablation(r);
		print_integrity(r, err);
		printf("done in %.1f s (load average %.2f at the start, %.2f at "
		       "the end)\n", r->seconds, r->loadavg_start,
		       r->loadavg_end);
	}
	if (png && plot(r, png) && !err)
		err = -EIO;
	if (err)
		fprintf(stderr, "kvtier demo: %s\n", r->error[0] ? r->error :
			kvt_strerror(err));
	kvt_demo_result_free(r);
	return err ? CLI_EXIT_FAIL : 0;
}
