/*
 * cmd_demo.h — what the files of `kvtier demo` share: the policies in the
 * order they are printed, the readers of a result, and the calls each file
 * offers the others. The command's own comment is atop cmd_demo.c.
 *
 *   cmd_demo.c       usage, the options, the progress line, main
 *   cmd_demo_res.c   reading the result: a pass, medians over repeats,
 *                    the integrity counters, the sweep's TTFT targets and
 *                    the speed goals
 *   cmd_demo_out.c   output for people: header, tables, comparison, sweep,
 *                    ablation, checksums, --quiet, --plot (gnuplot)
 *   cmd_demo_json.c  --json
 *   cmd_demo_file.c  --out FILE: the JSON kept on disk after every pass
 *
 * No state is shared: main owns the configuration and the result
 * (kvt_demo_run()'s), which the other files only read; nothing here is
 * threaded (the demo's own threads are src/demo's, done before printing).
 */
#ifndef KVT_TOOLS_CMD_DEMO_H
#define KVT_TOOLS_CMD_DEMO_H

#include "cli.h"

#include <stdint.h>
#include <stdio.h>

/* The policies in the order the tables print them; kvtier is the last,
 * lmcache the first, vllm the third (the comparisons index them so). */
#define NPOL 4
extern const char *const kvti_cd_pol[NPOL];

/* ---- cmd_demo_res.c: reading the result --------------------------------- */

/* The headline pass of @policy at @rate (no variant, repeat @rep), or NULL. */
const kvt_demo_pass *kvti_cd_find(const kvt_demo_result *r, const char *policy,
				  double rate, uint32_t rep);
/* The rates that ran (1 without a sweep) and the k-th of them. */
uint32_t kvti_cd_nrates(const kvt_demo_config *c);
double kvti_cd_rate_at(const kvt_demo_config *c, uint32_t k);
/* The median of @v[0..n) (sorted in place), its extremes in *@lo, *@hi
 * (both or neither NULL); NaN when n is 0. */
double kvti_cd_median(double *v, uint32_t n, double *lo, double *hi);
/* The median over repeats of @get of (@pol, @rate), failed passes left
 * out; its extremes as kvti_cd_median(). */
double kvti_cd_med(const kvt_demo_result *r, const char *pol, double rate,
		   double (*get)(const kvt_demo_pass *), double *lo,
		   double *hi);
/* A pass's p90 TTFT (a getter for kvti_cd_med()). */
double kvti_cd_p90(const kvt_demo_pass *p);

/* The checks of every pass, summed. */
struct integrity {
	uint64_t engine_checked, engine_bad, failed, failed_busy,
		failed_absent, moves_verified, corrupt, move_errors, checked,
		check_bad, bad;
	int incomplete;
};
void kvti_cd_integrity(const kvt_demo_result *r, struct integrity *g);

/* The p90 TTFT targets of a sweep into @t (KVT_DEMO_MAX_TARGETS): given,
 * or five between where every curve starts and where every curve ends;
 * their count (0: no target every curve reaches). */
uint32_t kvti_cd_targets(const kvt_demo_result *r, double *t);

/* The speed goals, measured along the curves (kvti_cd_goals()). */
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
void kvti_cd_goals(const kvt_demo_result *r, const double *tg, uint32_t nt,
		   struct goals *g);

/* ---- cmd_demo_out.c: for people ------------------------------------------ */

/* What runs, what is measured and what is modeled, before the run. */
void kvti_cd_print_header(const kvt_demo_config *c, const kvt_geom *g,
			  const char *gpu);
void kvti_cd_print_rates(const kvt_demo_result *r);
void kvti_cd_print_compare(const kvt_demo_result *r);
void kvti_cd_print_sweep(const kvt_demo_result *r);
void kvti_cd_print_ablation(const kvt_demo_result *r);
void kvti_cd_print_integrity(const kvt_demo_result *r, int err);
void kvti_cd_print_quiet(const kvt_demo_result *r, int err);
/* p90 TTFT against throughput per policy as @png; 0 or -1 after a
 * message. */
int kvti_cd_plot(const kvt_demo_result *r, const char *png);

/* ---- cmd_demo_json.c ------------------------------------------------------ */

/* The whole result (the caller owns the object); @err: the run's. */
cJSON *kvti_cd_result_json(const kvt_demo_result *r, int err);

/* ---- cmd_demo_file.c: --out FILE ----------------------------------------- */

/* Check that FILE can be written (FILE.tmp made and removed): 0, or -1
 * after a message. */
int kvti_cd_out_open(const char *path);
/* SIGINT/SIGTERM set kvti_cd_stop (the signal), the run's stop flag
 * (kvt_demo_config.stop); another a second or more later has the
 * default action (one sooner is ignored: timeout(1) sends two). */
extern volatile sig_atomic_t kvti_cd_stop;
void kvti_cd_signals(void);
/* After the run: if a signal stopped it, say so (and what FILE holds),
 * remove FILE.tmp and end the process by that signal; else return. */
void kvti_cd_stopped(void);
/* The document of a run still going ("complete": false) into FILE,
 * atomically: passes @done of @total so far, @err the first failure. */
void kvti_cd_out_pass(const kvt_demo_result *r, int err, size_t done,
		      size_t total);
/* The last document: @doc (--json's, not taken) plus "complete": true. */
void kvti_cd_out_final(const cJSON *doc);
/* 1 when a write to FILE failed (said on stderr at the first). */
int kvti_cd_out_failed(void);

#endif
