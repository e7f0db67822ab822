/*
 * cmd_sim_out.c — what `kvtier sim` prints: one run as a table, JSON or
 * CSV; a sweep of arrival rates as JSON, a table and gnuplot PNG curves;
 * and throughput at equal TTFT, interpolated along the measured sweep
 * curves (--ttft-targets, --ratio-plot). Formats are in docs/FORMATS.md;
 * nothing here runs the simulator but the sweeps main hands in.
 */
#include "cmd_sim.h"
#include "core/core.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* ---- output -------------------------------------------------------------- */

static const char *tier_name(int t)
{
	return kvt_tier_kind_name((kvt_tier_kind)t);
}

cJSON *kvti_cs_result_json(const kvt_sim_result *r)
{
	cJSON *o = cJSON_CreateObject(), *t, *h, *a;

	cJSON_AddNumberToObject(o, "requests", (double)r->requests);
	cJSON_AddNumberToObject(o, "finished", (double)r->finished);
	cJSON_AddNumberToObject(o, "measured", (double)r->measured);
	cJSON_AddItemToObject(o, "ttft_ms", cli_dist_json(&r->ttft_ms));
	cJSON_AddItemToObject(o, "warm_ttft_ms", cli_dist_json(&r->warm_ttft_ms));
	cJSON_AddItemToObject(o, "tpot_ms", cli_dist_json(&r->tpot_ms));
	cJSON_AddItemToObject(o, "e2e_ms", cli_dist_json(&r->e2e_ms));
	cJSON_AddNumberToObject(o, "throughput_tok_s", r->throughput_tok_s);
	cJSON_AddNumberToObject(o, "output_tok_s", r->output_tok_s);
	cJSON_AddNumberToObject(o, "request_s", r->request_s);
	cJSON_AddNumberToObject(o, "gpu_busy", r->gpu_busy);
	cJSON_AddNumberToObject(o, "stall_s", r->stall_s);
	cJSON_AddNumberToObject(o, "makespan_s", r->makespan_s);
	cJSON_AddNumberToObject(o, "steps", (double)r->steps);
	cJSON_AddNumberToObject(o, "decode_only_steps",
				(double)r->decode_only_steps);
	cJSON_AddNumberToObject(o, "deferred", (double)r->deferred);
	cJSON_AddNumberToObject(o, "bg_passes", (double)r->bg_passes);
	cJSON_AddNumberToObject(o, "room_waits", (double)r->room_waits);
	cJSON_AddNumberToObject(o, "room_wait_s", r->room_wait_s);
	t = cJSON_AddObjectToObject(o, "tokens");
	cJSON_AddNumberToObject(t, "prompt", (double)r->prompt_tokens);
	cJSON_AddNumberToObject(t, "computed", (double)r->computed_tokens);
	h = cJSON_AddObjectToObject(t, "hit");
	for (int k = 0; k < KVT_TIER_COUNT; k++)
		cJSON_AddNumberToObject(h, tier_name(k),
					(double)r->hit_tokens[k]);
	t = cJSON_AddObjectToObject(o, "bytes");
	h = cJSON_AddObjectToObject(t, "load");
	for (int k = 1; k < KVT_TIER_COUNT; k++)
		cJSON_AddNumberToObject(h, tier_name(k), r->load_bytes[k]);
	h = cJSON_AddObjectToObject(t, "store");
	for (int k = 1; k < KVT_TIER_COUNT; k++)
		cJSON_AddNumberToObject(h, tier_name(k), r->store_bytes[k]);
	a = cJSON_AddArrayToObject(o, "links");
	for (uint32_t i = 0; i < r->nlinks; i++) {
		const kvt_sim_link *l = &r->links[i];
		cJSON *x = cJSON_CreateObject();

		cJSON_AddStringToObject(x, "name", l->name);
		cJSON_AddNumberToObject(x, "bytes_in", l->bytes_in);
		cJSON_AddNumberToObject(x, "bytes_out", l->bytes_out);
		cJSON_AddNumberToObject(x, "busy_s", l->busy_s);
		cJSON_AddNumberToObject(x, "capacity_gbps", l->capacity_gbps);
		cJSON_AddItemToArray(a, x);
	}
	cJSON_AddNumberToObject(o, "stress_gbps", r->stress_gbps);
	t = cJSON_AddObjectToObject(o, "sim");
	cJSON_AddNumberToObject(t, "events", (double)r->events);
	cJSON_AddNumberToObject(t, "wall_s", r->wall_s);
	return o;
}

cJSON *kvti_cs_config_json(const kvt_sim_config *c)
{
	cJSON *o = cJSON_CreateObject(), *a;
	char feats[128] = "";

	for (uint32_t b = 1; b < KVT_SCHED_ALL; b <<= 1)
		if (c->sched.features & b)
			snprintf(feats + strlen(feats), sizeof(feats) -
				 strlen(feats), "%s%s", feats[0] ? "," : "",
				 kvt_sched_feature_name(b));
	cJSON_AddStringToObject(o, "hardware", c->hw.name);
	cJSON_AddStringToObject(o, "model", c->model);
	cJSON_AddNumberToObject(o, "tp", c->tp);
	cJSON_AddNumberToObject(o, "engines", c->engines);
	cJSON_AddNumberToObject(o, "page_tokens", c->page_tokens);
	cJSON_AddBoolToObject(o, "page_contig", c->page_contig);
	cJSON_AddBoolToObject(o, "cpu_latency", c->cpu_mem_latency);
	cJSON_AddBoolToObject(o, "store_holds_hbm", c->store_holds_hbm);
	if (c->bg_high > 0) {
		cJSON *w = cJSON_AddArrayToObject(o, "watermarks");

		cJSON_AddItemToArray(w, cJSON_CreateNumber(c->bg_high));
		cJSON_AddItemToArray(w, cJSON_CreateNumber(c->bg_low));
	} else {
		cJSON_AddNullToObject(o, "watermarks");
	}
	cJSON_AddStringToObject(o, "policy", kvt_sched_policy_name(c->policy));
	cJSON_AddStringToObject(o, "features", feats);
	cJSON_AddStringToObject(o, "io", kvt_copy_method_name(c->sched.method));
	a = cJSON_AddArrayToObject(o, "offload");
	for (uint32_t i = 0; i < c->noffload; i++)
		cJSON_AddItemToArray(a, cJSON_CreateString(
					   tier_name(c->offload[i])));
	cJSON_AddNumberToObject(o, "stress", c->stress);
	cJSON_AddStringToObject(o, "workload", kvt_workload_name(c->workload));
	if (c->workload == KVT_WL_TRACE)
		cJSON_AddStringToObject(o, "trace", c->trace_path);
	cJSON_AddNumberToObject(o, "seed", (double)c->seed);
	if (c->rate > 0)
		cJSON_AddNumberToObject(o, "rate", c->rate);
	return o;
}

void kvti_cs_print_result(const kvt_sim_config *c, const kvt_sim_result *r)
{
	printf("%s: %s, %s TP %u x %u, offload %s%s, stress %u, %s\n",
	       kvt_sched_policy_name(c->policy), c->hw.name, c->model, c->tp,
	       c->engines, tier_name(c->offload[0]),
	       c->noffload > 1 ? "+" : "", c->stress,
	       kvt_workload_name(c->workload));
	printf("  requests %llu (%llu measured)   TTFT ms mean %.1f p50 %.1f "
	       "p90 %.1f p99 %.1f\n", (unsigned long long)r->finished,
	       (unsigned long long)r->measured, r->ttft_ms.mean, r->ttft_ms.p50,
	       r->ttft_ms.p90, r->ttft_ms.p99);
	if (r->warm_ttft_ms.n)
		printf("  warm (%llu)     TTFT ms mean %.1f p50 %.1f p90 %.1f "
		       "p99 %.1f\n", (unsigned long long)r->warm_ttft_ms.n,
		       r->warm_ttft_ms.mean, r->warm_ttft_ms.p50,
		       r->warm_ttft_ms.p90, r->warm_ttft_ms.p99);
	printf("  TPOT ms mean %.2f   throughput %.0f tok/s (%.0f out), %.3f "
	       "req/s\n", r->tpot_ms.mean, r->throughput_tok_s,
	       r->output_tok_s, r->request_s);
	printf("  GPU busy %.1f%%   stall %.2f s   steps %llu (%llu decode-only)"
	       "   deferred %llu\n", 100 * r->gpu_busy, r->stall_s,
	       (unsigned long long)r->steps,
	       (unsigned long long)r->decode_only_steps,
	       (unsigned long long)r->deferred);
	if (c->bg_high > 0)
		printf("  background demotion above %.0f%% of a tier, to %.0f%%: "
		       "%llu passes\n", 100 * c->bg_high, 100 * c->bg_low,
		       (unsigned long long)r->bg_passes);
	printf("  prompt tokens %llu: computed %llu, from hbm %llu, fabric "
	       "%llu, dram %llu, ssd %llu\n",
	       (unsigned long long)r->prompt_tokens,
	       (unsigned long long)r->computed_tokens,
	       (unsigned long long)r->hit_tokens[KVT_TIER_HBM],
	       (unsigned long long)r->hit_tokens[KVT_TIER_FABRIC],
	       (unsigned long long)r->hit_tokens[KVT_TIER_DRAM],
	       (unsigned long long)r->hit_tokens[KVT_TIER_SSD]);
	if (c->stress)
		printf("  each stressor kept %.2f GB/s\n", r->stress_gbps);
	printf("  (%llu events in %.2f s)\n", (unsigned long long)r->events,
	       r->wall_s);
}

void kvti_cs_csv_header(void)
{
	printf("policy,hardware,model,tp,offload,stress,workload,rate,"
	       "requests,ttft_mean_ms,ttft_p50_ms,ttft_p90_ms,ttft_p99_ms,"
	       "warm_ttft_mean_ms,warm_ttft_p90_ms,tpot_mean_ms,"
	       "throughput_tok_s,request_s,gpu_busy,stall_s\n");
}

void kvti_cs_csv_row(const kvt_sim_config *c, double rate,
		    const kvt_sim_result *r)
{
	printf("%s,%s,%s,%u,%s,%u,%s,%g,%llu,%.3f,%.3f,%.3f,%.3f,%.3f,%.3f,"
	       "%.4f,%.1f,%.5f,%.4f,%.4f\n",
	       kvt_sched_policy_name(c->policy), c->hw.name, c->model, c->tp,
	       tier_name(c->offload[0]), c->stress,
	       kvt_workload_name(c->workload), rate,
	       (unsigned long long)r->finished, r->ttft_ms.mean, r->ttft_ms.p50,
	       r->ttft_ms.p90, r->ttft_ms.p99, r->warm_ttft_ms.mean,
	       r->warm_ttft_ms.p90, r->tpot_ms.mean, r->throughput_tok_s,
	       r->request_s, r->gpu_busy, r->stall_s);
}

/* Run @dir/plot.gp with gnuplot and remove @dir; 0 or CLI_EXIT_FAIL. */
static int run_gnuplot(const char *dir)
{
	char cmd[4200];
	int rc;

	snprintf(cmd, sizeof(cmd), "gnuplot '%s/plot.gp' 2>&1", dir);
	rc = system(cmd);
	snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
	if (system(cmd)) {
		/* a leftover temp dir is harmless */
	}
	if (rc) {
		fprintf(stderr, "kvtier %s: gnuplot failed (is gnuplot-nox "
			"installed? scripts/bootstrap installs it)\n", WHAT);
		return CLI_EXIT_FAIL;
	}
	return 0;
}

/* Open @dir/@name for writing; NULL with errno set. */
static FILE *plot_file(const char *dir, const char *name)
{
	char path[256];

	snprintf(path, sizeof(path), "%s/%s", dir, name);
	return fopen(path, "w");
}

/* Write the sweep curves as data files and plot them with gnuplot. */
int kvti_cs_plot(const char *png, kvt_sim_config *cfg, kvt_sweep **sw,
		int n, double target)
{
	char dir[] = "/tmp/kvtier-plot-XXXXXX", path[256];
	FILE *f, *g;

	if (!mkdtemp(dir) || !(g = plot_file(dir, "plot.gp")))
		return cli_fail(WHAT, -errno);
	fprintf(g, "set terminal pngcairo size 900,600 noenhanced\n"
		   "set output '%s'\n"
		   "set title '%s, %s TP %u, %s: mean TTFT vs throughput'\n"
		   "set xlabel 'throughput (prompt + output tokens/s)'\n"
		   "set ylabel 'mean TTFT (ms)'\nset logscale y\nset grid\n"
		   "set key top left\n", png, cfg[0].hw.name, cfg[0].model,
		cfg[0].tp, kvt_workload_name(cfg[0].workload));
	if (target > 0)
		fprintf(g, "set arrow from graph 0, first %g to graph 1, "
			   "first %g nohead dt 2 lc rgb 'gray'\n", target,
			target);
	fprintf(g, "plot ");
	for (int i = 0; i < n; i++) {
		snprintf(path, sizeof(path), "%s/%d.dat", dir, i);
		if (!(f = fopen(path, "w"))) {
			fclose(g);
			return cli_fail(WHAT, -errno);
		}
		for (uint32_t k = 0; k < sw[i]->n; k++)
			fprintf(f, "%g %g %g\n", sw[i]->pt[k].r.throughput_tok_s,
				sw[i]->pt[k].r.ttft_ms.mean, sw[i]->pt[k].rate);
		fclose(f);
		fprintf(g, "%s'%s' using 1:2 with linespoints lw 2 title '%s'",
			i ? ", " : "", path,
			kvt_sched_policy_name(cfg[i].policy));
	}
	fprintf(g, "\n");
	fclose(g);
	return run_gnuplot(dir);
}

cJSON *kvti_cs_sweep_json(const kvt_sweep *w)
{
	cJSON *o = cJSON_CreateObject(), *a = cJSON_AddArrayToObject(o, "curve");

	for (uint32_t i = 0; i < w->n; i++) {
		cJSON *p = kvti_cs_result_json(&w->pt[i].r);

		cJSON_AddNumberToObject(p, "rate", w->pt[i].rate);
		cJSON_AddItemToArray(a, p);
	}
	if (w->have_target) {
		cJSON *t = cJSON_AddObjectToObject(o, "at_target");

		cJSON_AddNumberToObject(t, "target_ms", w->target_ms);
		cJSON_AddBoolToObject(t, "met", w->met);
		cJSON_AddNumberToObject(t, "rate", w->at_rate);
		cJSON_AddNumberToObject(t, "throughput_tok_s", w->at_throughput);
		cJSON_AddNumberToObject(t, "ttft_ms", w->at_ttft_ms);
		cJSON_AddBoolToObject(t, "at_top_of_range", w->at_top);
	}
	return o;
}

void kvti_cs_print_sweep(const kvt_sim_config *c, const kvt_sweep *w)
{
	printf("%s: %s, %s TP %u, %s sweep\n", kvt_sched_policy_name(c->policy),
	       c->hw.name, c->model, c->tp, kvt_workload_name(c->workload));
	printf("  %10s %14s %12s %12s %9s\n", "rate/s", "throughput t/s",
	       "TTFT mean", "TTFT p90", "GPU busy");
	for (uint32_t i = 0; i < w->n; i++)
		printf("  %10.4g %14.0f %12.1f %12.1f %8.1f%%\n", w->pt[i].rate,
		       w->pt[i].r.throughput_tok_s, w->pt[i].r.ttft_ms.mean,
		       w->pt[i].r.ttft_ms.p90, 100 * w->pt[i].r.gpu_busy);
	if (w->have_target && w->met)
		printf("  at TTFT <= %g ms: %.0f tok/s (rate %.4g/s, TTFT %.1f "
		       "ms)%s\n", w->target_ms, w->at_throughput, w->at_rate,
		       w->at_ttft_ms, w->at_top ? "; the highest rate swept "
		       "still meets the target: the limit is higher (--rates)" :
		       "");
	else if (w->have_target)
		printf("  no rate met TTFT <= %g ms\n", w->target_ms);
}


/* ---- throughput at equal TTFT ------------------------------------------- */

/* Default targets: 8 log-spaced between the lowest TTFT every curve
 * reaches and the highest TTFT every curve reaches. 0 or -1. */
static int default_targets(const struct opts *o, kvt_sweep **sw, double *t,
			   int *n)
{
	double bot = 0, top = INFINITY;

	for (int i = 0; i < o->npol; i++) {
		double mn = INFINITY, mx = 0;

		for (uint32_t k = 0; k < sw[i]->n; k++) {
			mn = MIN(mn, sw[i]->pt[k].r.ttft_ms.mean);
			mx = MAX(mx, sw[i]->pt[k].r.ttft_ms.mean);
		}
		bot = MAX(bot, mn);
		top = MIN(top, mx);
	}
	if (!(top > bot * 1.01))
		return -1;
	for (int k = 0; k < 8; k++)
		t[k] = bot * pow(top / bot, (k + 0.5) / 8);
	*n = 8;
	return 0;
}

/* Throughput of each policy at each target, and each policy's ratio to
 * the first; the largest ratio per policy. Text, or @f as CSV when
 * @csv; returns the number of targets or -1. */
static int ratio_table(const struct opts *o, kvt_sim_config *cfg,
		       kvt_sweep **sw, const double *t, int nt, FILE *f,
		       int csv, double *best, double *best_at)
{
	for (int i = 0; i < o->npol; i++)
		best[i] = best_at[i] = 0;
	if (csv) {
		fprintf(f, "ttft_ms");
		for (int i = 0; i < o->npol; i++)
			fprintf(f, ",%s_tok_s", kvt_sched_policy_name(cfg[i].policy));
		for (int i = 1; i < o->npol; i++)
			fprintf(f, ",%s_over_%s", kvt_sched_policy_name(cfg[i].policy),
				kvt_sched_policy_name(cfg[0].policy));
		fprintf(f, "\n");
	} else {
		fprintf(f, "throughput at equal mean TTFT, tok/s, then each "
			"policy's ratio to %s ('>': the curve still meets the "
			"TTFT at its top rate)\n",
			kvt_sched_policy_name(cfg[0].policy));
		fprintf(f, "  %10s", "TTFT ms");
		for (int i = 0; i < o->npol; i++)
			fprintf(f, " %15s", kvt_sched_policy_name(cfg[i].policy));
		for (int i = 1; i < o->npol; i++)
			fprintf(f, " %15s", kvt_sched_policy_name(cfg[i].policy));
		fprintf(f, "\n");
	}
	for (int k = 0; k < nt; k++) {
		double thr[KVT_POLICY_COUNT];
		int rc[KVT_POLICY_COUNT];

		for (int i = 0; i < o->npol; i++)
			rc[i] = kvt_sweep_throughput_at(sw[i], t[k], &thr[i]);
		fprintf(f, csv ? "%g" : "  %10.0f", t[k]);
		for (int i = 0; i < o->npol; i++) {
			if (rc[i] < 0)
				fprintf(f, csv ? "," : " %15s", "-");
			else if (csv)
				fprintf(f, ",%.1f", thr[i]);
			else
				fprintf(f, " %c%14.0f", rc[i] ? '>' : ' ',
					thr[i]);
		}
		for (int i = 1; i < o->npol; i++) {
			double r;

			if (rc[i] < 0 || rc[0] < 0 || !(thr[0] > 0) ||
			    rc[0] == 1 || rc[i] == 1) {
				/* a bound, not a ratio */
				fprintf(f, csv ? "," : " %15s", "-");
				continue;
			}
			r = thr[i] / thr[0];
			fprintf(f, csv ? ",%.4f" : " %15.2f", r);
			if (r > best[i]) {
				best[i] = r;
				best_at[i] = t[k];
			}
		}
		fprintf(f, "\n");
	}
	return nt;
}

static int ratio_plot(const char *png, const struct opts *o,
		      kvt_sim_config *cfg, kvt_sweep **sw, const double *t,
		      int nt)
{
	char dir[] = "/tmp/kvtier-ratio-XXXXXX";
	double best[KVT_POLICY_COUNT], at[KVT_POLICY_COUNT];
	FILE *f, *g;

	if (!mkdtemp(dir) || !(f = plot_file(dir, "ratio.csv")))
		return cli_fail(WHAT, -errno);
	ratio_table(o, cfg, sw, t, nt, f, 1, best, at);
	fclose(f);
	if (!(g = plot_file(dir, "plot.gp")))
		return cli_fail(WHAT, -errno);
	fprintf(g, "set terminal pngcairo size 900,600 noenhanced\n"
		   "set output '%s'\nset datafile separator ','\n"
		   "set datafile missing '-'\n"
		   "set title '%s, %s TP %u, %s: throughput at equal mean TTFT, "
		   "relative to %s'\n"
		   "set xlabel 'mean TTFT target (ms)'\nset logscale x\n"
		   "set ylabel 'throughput ratio'\nset grid\n"
		   "set key outside bottom center horizontal\n"
		   "plot ", png, cfg[0].hw.name, cfg[0].model, cfg[0].tp,
		kvt_workload_name(cfg[0].workload),
		kvt_sched_policy_name(cfg[0].policy));
	for (int i = 1; i < o->npol; i++)
		fprintf(g, "%s'%s/ratio.csv' using 1:%d skip 1 with linespoints "
			"lw 2 title '%s / %s'", i > 1 ? ", " : "", dir,
			1 + o->npol + i, kvt_sched_policy_name(cfg[i].policy),
			kvt_sched_policy_name(cfg[0].policy));
	fprintf(g, ", 1 with lines dt 2 lc rgb 'gray' notitle\n");
	fclose(g);
	return run_gnuplot(dir);
}

/* The ratio section of a sweep with several policies. */
int kvti_cs_ratios(const struct opts *o, kvt_sim_config *cfg, kvt_sweep **sw,
		  cJSON *root)
{
	double t[MAX_RATES], best[KVT_POLICY_COUNT], at[KVT_POLICY_COUNT];
	int nt = o->ntargets;

	if (o->npol < 2)
		return 0;
	if (nt)
		memcpy(t, o->targets, sizeof(double) * (size_t)nt);
	else if (default_targets(o, sw, t, &nt))
		return 0; /* the curves share no TTFT range */
	if (root) {
		cJSON *a = cJSON_AddArrayToObject(root, "equal_ttft");

		for (int k = 0; k < nt; k++) {
			cJSON *x = cJSON_CreateObject();

			cJSON_AddNumberToObject(x, "ttft_ms", t[k]);
			for (int i = 0; i < o->npol; i++) {
				double thr;
				int rc = kvt_sweep_throughput_at(sw[i], t[k],
								 &thr);
				char key[64];

				snprintf(key, sizeof(key), "%s_tok_s",
					 kvt_sched_policy_name(cfg[i].policy));
				if (rc == 0)
					cJSON_AddNumberToObject(x, key, thr);
				else
					cJSON_AddNullToObject(x, key);
			}
			cJSON_AddItemToArray(a, x);
		}
	} else if (!o->csv) {
		ratio_table(o, cfg, sw, t, nt, stdout, 0, best, at);
		for (int i = 1; i < o->npol; i++)
			if (best[i] > 0)
				printf("  %s / %s: up to %.2fx (at %.0f ms)\n",
				       kvt_sched_policy_name(cfg[i].policy),
				       kvt_sched_policy_name(cfg[0].policy),
				       best[i], at[i]);
	}
	if (o->ratio_plot)
		return ratio_plot(o->ratio_plot, o, cfg, sw, t, nt);
	return 0;
}

