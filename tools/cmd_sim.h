/*
 * cmd_sim.h — what the files of `kvtier sim` share: the options (struct
 * opts, filled by cmd_sim.c's parser) and the calls each file offers the
 * others. The command's own comment is atop cmd_sim.c.
 *
 *   cmd_sim.c          usage, options, the policy configurations, running
 *                      the policies and the sweep, main
 *   cmd_sim_out.c      output: the table, JSON, CSV, gnuplot plots, and
 *                      throughput at equal TTFT (--ttft-targets)
 *   cmd_sim_explain.c  --explain: one-at-a-time sensitivity of the result
 *
 * No state is shared but the options, which main owns; nothing is
 * threaded.
 */
#ifndef KVT_TOOLS_CMD_SIM_H
#define KVT_TOOLS_CMD_SIM_H

#include "cli.h"

#include <stdint.h>
#include <stdio.h>

#define WHAT "sim"
#define MAX_RATES 48
#define NSETS 16
#define MIN(a, b) ((a) < (b) ? (a) : (b))
#define MAX(a, b) ((a) > (b) ? (a) : (b))

struct opts {
	kvt_sim_config cfg;
	kvt_sched_policy pol[KVT_POLICY_COUNT];
	int npol;
	char features[256];
	int io;                   /* -1: the policy's */
	uint32_t budget, max_batch, delay_hit, max_skips, page_tokens;
	double ratio;
	int sweep, json, csv;
	double rates[MAX_RATES];
	int nrates;
	double target;
	const char *plot;
	const char *xfer;
	char sets[NSETS][128];
	int nsets;
	int page_contig;          /* -1: the policy's */
	double targets[MAX_RATES];
	int ntargets;
	const char *ratio_plot;
	int explain;
	int copy_rates;
};

/* cmd_sim.c: the configuration for policy @p: its preset, then the
 * ablation knobs of @o. 0 or a negative code. */
int kvti_cs_policy_cfg(const struct opts *o, kvt_sched_policy p,
		       kvt_sim_config *c);

/* cmd_sim_out.c: one run's result and configuration as JSON (the caller
 * owns the object), as a table, as CSV rows; a sweep as JSON and a table;
 * the sweeps' PNG (gnuplot); throughput at equal TTFT over the sweeps. */
cJSON *kvti_cs_result_json(const kvt_sim_result *r);
cJSON *kvti_cs_config_json(const kvt_sim_config *c);
void kvti_cs_print_result(const kvt_sim_config *c, const kvt_sim_result *r);
void kvti_cs_csv_header(void);
void kvti_cs_csv_row(const kvt_sim_config *c, double rate,
		    const kvt_sim_result *r);
int kvti_cs_plot(const char *png, kvt_sim_config *cfg, kvt_sweep **sw,
		int n, double target);
cJSON *kvti_cs_sweep_json(const kvt_sweep *w);
void kvti_cs_print_sweep(const kvt_sim_config *c, const kvt_sweep *w);
int kvti_cs_ratios(const struct opts *o, kvt_sim_config *cfg, kvt_sweep **sw,
		  cJSON *root);

/* cmd_sim_explain.c: --explain (0, or the command's exit code). */
int kvti_cs_explain(struct opts *o);

#endif
