/*
 * cmd_demo_out.c — what `kvtier demo` prints for people: the header (what
 * is measured, what is modeled), a table per rate and repeat, kvtier
 * against each baseline, the sweep's throughput at equal p90 TTFT and the
 * speed goals, the ablation, the checksums, the --quiet line, and the
 * --plot PNG (gnuplot). The JSON is cmd_demo_json.c.
 */
#include "cmd_demo.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* ---- text ---------------------------------------------------------------- */

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

void kvti_cd_print_header(const kvt_demo_config *c, const kvt_geom *g,
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
	       "time for each step on %s (profile %s), spent in real time\n  on "
	       "the engine's thread (the cache's copy threads run below it, "
	       "nice 10).\n",
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

void kvti_cd_print_rates(const kvt_demo_result *r)
{
	const kvt_demo_config *c = &r->config;

	for (uint32_t rep = 0; rep < c->repeat; rep++)
		for (uint32_t k = 0; k < kvti_cd_nrates(c); k++) {
			printf("\nsessions at %g/s (%u sessions):\n",
			       kvti_cd_rate_at(c, k),
			       kvt_demo_sessions_at(c, kvti_cd_rate_at(c, k)));
			if (c->repeat > 1)
				printf("  (run %u of %u)\n", rep + 1, c->repeat);
			print_table_head();
			for (int i = 0; i < NPOL; i++) {
				const kvt_demo_pass *p = kvti_cd_find(r, kvti_cd_pol[i],
							      kvti_cd_rate_at(c, k), rep);

				if (p)
					print_pass_row(p, p->policy);
			}
		}
	printf("  (recomp: cached tokens computed rather than loaded, kvtier's "
	       "load-or-recompute; computed:\n  prompt tokens prefilled in all; "
	       "GPU busy: modeled GPU time over the run's span)\n");
}

void kvti_cd_print_ablation(const kvt_demo_result *r)
{
	int any = 0;

	for (int i = 0; i < r->npasses; i++) {
		const kvt_demo_pass *p = &r->pass[i];
		char name[48];

		if (!p->variant[0])
			continue;
		if (!any) {
			const kvt_demo_pass *full = kvti_cd_find(r, "kvtier",
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

void kvti_cd_print_sweep(const kvt_demo_result *r)
{
	const kvt_demo_config *c = &r->config;
	double tg[KVT_DEMO_MAX_TARGETS];
	uint32_t nt = kvti_cd_targets(r, tg);
	struct goals g;

	if (c->nrates < 2)
		return;
	printf("\nthroughput (tokens/s) at equal p90 TTFT, interpolated along "
	       "the measured curves%s:\n  %-12s", c->repeat > 1 ?
	       " (first run)" : "", "p90 target");
	for (int i = 0; i < NPOL; i++)
		printf(" %18s", kvti_cd_pol[i]);
	printf(" %12s %12s\n", "kvt/lmcache", "kvt/vllm");
	for (uint32_t j = 0; j < nt; j++) {
		double v[NPOL];

		printf("  %9.0f ms", tg[j]);
		for (int i = 0; i < NPOL; i++) {
			int rc = kvt_demo_throughput_at(r, kvti_cd_pol[i], 0, tg[j],
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
	kvti_cd_goals(r, tg, nt, &g);
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

void kvti_cd_print_compare(const kvt_demo_result *r)
{
	const kvt_demo_config *c = &r->config;
	const kvt_demo_pass *kv = kvti_cd_find(r, "kvtier", c->rate, 0);

	if (!kv || c->nrates)
		return;
	printf("\nat %g sessions/s, kvtier against each baseline (measured side "
	       "by side, this run):\n", c->rate);
	for (int i = 0; i < 3; i++) {
		const kvt_demo_pass *b = kvti_cd_find(r, kvti_cd_pol[i], c->rate, 0);

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

void kvti_cd_print_integrity(const kvt_demo_result *r, int err)
{
	struct integrity g;

	kvti_cd_integrity(r, &g);
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
	if (g.failed) /* busy and absent are counted among failed */
		printf("  %llu restored blocks failed their load and were "
		       "recomputed: %llu being stored\n  or moved when the "
		       "load began (a load never waits for a store), %llu no "
		       "longer\n  cached (evicted since the lookup), %llu "
		       "cancelled or unreadable.\n",
		       (unsigned long long)g.failed,
		       (unsigned long long)g.failed_busy,
		       (unsigned long long)g.failed_absent,
		       (unsigned long long)(g.failed - g.failed_busy -
					    g.failed_absent));
	if (err)
		printf("THE RUN FAILED: %s\n  %llu verification failures in "
		       "all; what is above is what was checked before and after "
		       "it.\n", r->error[0] ? r->error : kvt_strerror(err),
		       (unsigned long long)g.bad);
	else
		printf("verification failures: 0. Every restore, demotion and "
		       "copy checked matched.\n");
}

void kvti_cd_print_quiet(const kvt_demo_result *r, int err)
{
	const kvt_demo_config *c = &r->config;
	struct integrity g;

	kvti_cd_integrity(r, &g);
	printf("kvtier demo:");
	for (int i = 0; i < NPOL; i++) {
		const kvt_demo_pass *p = kvti_cd_find(r, kvti_cd_pol[i],
						      kvti_cd_rate_at(c, 0), 0);

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

/* ---- the plot ------------------------------------------------------------ */

int kvti_cd_plot(const kvt_demo_result *r, const char *png)
{
	char dat[] = "/tmp/kvtier-demo-plot-XXXXXX", cmd[512];
	FILE *f, *gp;
	int fd, rc;

	if ((fd = mkstemp(dat)) < 0 || !(f = fdopen(fd, "w"))) {
		fprintf(stderr, "kvtier demo: --plot: no temp file\n");
		return -1;
	}
	for (int i = 0; i < NPOL; i++) {
		fprintf(f, "# %s\n", kvti_cd_pol[i]);
		for (uint32_t k = 0; k < kvti_cd_nrates(&r->config); k++) {
			const kvt_demo_pass *p = kvti_cd_find(r, kvti_cd_pol[i],
						      kvti_cd_rate_at(&r->config, k), 0);

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
			"title '%s'", i ? ", " : "", dat, i, kvti_cd_pol[i]);
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
