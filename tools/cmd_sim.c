/*
 * cmd_sim.c — kvtier sim: run the serving simulator (kvt_sim_run) once,
 * per policy, or over a sweep of arrival rates (kvt_sim_sweep), and print
 * a table, JSON, CSV, or a gnuplot PNG of the sweep curves.
 */
#include "cli.h"
#include "core/core.h"

#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define WHAT "sim"
#define MAX_RATES 48
#define NSETS 16
#define MIN(a, b) ((a) < (b) ? (a) : (b))
#define MAX(a, b) ((a) > (b) ? (a) : (b))

static void usage(FILE *f)
{
	fprintf(f,
"usage: kvtier sim [options]\n"
"\n"
"Simulate a serving node on a virtual clock: the real radix index, page\n"
"pools and scheduler, a cost model for the GPUs and a fluid model for the\n"
"links and host memory (docs/SIMULATOR.md). Deterministic per seed.\n"
"\n"
"node and model\n"
"  --hardware NAME|FILE  testbed-a (default), testbed-b, gh200, or a .prof\n"
"  --model NAME|CONFIG   preset or config.json (default llama-3.1-8b)\n"
"  --tp N                tensor-parallel degree (default 1)\n"
"  --engines N           engine instances of tp GPUs each (default 1)\n"
"  --page-tokens P       tokens per page (default 16)\n"
"  --xfer FILE           host->GPU copy rates measured by `kvtier bench xfer\n"
"                        --json` on a GPU machine, in place of the profile's\n"
"  --set KEY=VALUE       override one profile key (repeatable), e.g.\n"
"                        --set link.gpus_per_uplink=0 (no shared uplink)\n"
"mechanisms (each switchable, to show its effect alone)\n"
"  --cpu-latency on|off  engine CPU time per step grows with loaded DRAM\n"
"                        latency (engine.step_mem_frac; default on)\n"
"  --store-holds-hbm on|off  an hbm page copied down stays taken until its\n"
"                        copy is done (default on)\n"
"  --page-contig on|off  GPU pool keeps a page's layers contiguous, so a\n"
"                        copy chunk is a whole page (default: the policy's;\n"
"                        on for vllm)\n"
"tiers\n"
"  --offload LIST        tiers below hbm, fastest first: fabric, dram, ssd\n"
"                        (default dram; e.g. fabric or dram,ssd)\n"
"  --offload-bytes LIST  their sizes per node (default: the profile's)\n"
"  --stress N            CPU stressor threads copying on socket 0 (0)\n"
"  --hbm-reuse on|off|auto  keep finished requests' KV in hbm (auto: off\n"
"                        for agentic, whose warm turns restore from the\n"
"                        offload tier, on otherwise)\n"
"  --write through|back|selective   write policy (through)\n"
"policy\n"
"  --policy LIST         lmcache, hicache, hicache-kernel, vllm, kvtier, or\n"
"                        all (default kvtier); several: one result each\n"
"  --features LIST       ablation on top of the policy: +name / -name of\n"
"                        overlap, prefetch, delay-hit, balance, stall-hide,\n"
"                        starve (e.g. -balance,-delay-hit)\n"
"  --io METHOD           load copy method: contig, memcpy, batch, gather,\n"
"                        object (default: the policy's)\n"
"  --token-budget N  --max-batch N  --delay-hit N  --balance-ratio X\n"
"  --max-skips N         scheduler knobs (8192, 256, 100, 1.0, 8)\n"
"workload\n"
"  --workload W          agentic (default), loogle, narrativeqa, reviewmt,\n"
"                        sharegpt, trace:FILE (Mooncake format)\n"
"  --sessions N --turns N   agentic (10, 6: one cold turn, then warm)\n"
"  --context N           agentic: last turn's prompt (32768); documents:\n"
"                        fixed document length (default: the dataset's)\n"
"  --append N            agentic: new tokens per warm turn (1024)\n"
"  --output N            output tokens (agentic 256; else the dataset's)\n"
"  --think S             agentic: mean think/tool seconds (5)\n"
"  --system N            agentic: a shared system prompt of N tokens opens\n"
"                        every session (0)\n"
"  --session-rate R      agentic: sessions arrive as a Poisson process, R per\n"
"                        second (0: all at once)\n"
"  --think-sigma X       agentic: each session's mean think time log-normal\n"
"                        around --think with log-sd X (0)\n"
"  --hbm-share on|off    a request may use another's pages in hbm (on); off:\n"
"                        an engine with no prefix cache (kvtier demo's)\n"
"  --requests N          open loop: requests (1000; trace: all)\n"
"  --rate R              open loop: arrivals per second (default: half\n"
"                        the node's estimated capacity)\n"
"  --cache-distance K    documents: other documents between two questions\n"
"                        on one (64)\n"
"  --questions N         documents: questions per document (dataset's)\n"
"  --trace-speed X       replay a trace X times faster (1)\n"
"  --seed N              (1)   --max-sim S   stop the clock at S seconds\n"
"sweeps\n"
"  --sweep               run a range of arrival rates (open loop only)\n"
"  --rates LIST          the rates (default: 12 from 5%% to 150%% of the\n"
"                        node's estimated capacity)\n"
"  --ttft-target MS      report the highest throughput whose mean TTFT\n"
"                        meets MS, per policy (refined by bisection)\n"
"  --ttft-targets LIST   with several policies: throughput of each at equal\n"
"                        mean TTFT for each target (ms), its ratio to the\n"
"                        first policy, and the largest ratio (default: 8\n"
"                        targets across the range all curves cover)\n"
"  --ratio-plot FILE.png that ratio against the TTFT target (gnuplot)\n"
"output\n"
"  --json                one JSON object (docs/FORMATS.md)\n"
"  --csv                 CSV rows, one per policy (and rate)\n"
"  --plot FILE.png       sweep: TTFT vs throughput per policy (gnuplot)\n"
"  --copy-rates          print the cost model's host->GPU rate of every copy\n"
"                        method by chunk size (4 KiB .. 16 MiB) and exit\n"
"  --explain             one run, then again with each profile figure and\n"
"                        workload assumption halved and doubled; lists what\n"
"                        moved the result most, assumptions first\n"
"\n"
"examples\n"
"  kvtier sim --hardware testbed-a --model qwen2.5-32b --tp 4 \\\n"
"      --workload agentic --offload fabric --policy all\n"
"  kvtier sim --hardware testbed-b --model llama-3.1-8b --workload loogle \\\n"
"      --policy all --sweep --ttft-target 2000 --plot loogle.png\n");
}

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

static int u32(const char *flag, const char *s, uint64_t lo, uint64_t hi,
	       uint32_t *out)
{
	uint64_t v;

	if (cli_u64(flag, s, lo, hi, &v))
		return -1;
	*out = (uint32_t)v;
	return 0;
}

static int on_off(const char *flag, const char *s, int *out)
{
	if (strcmp(s, "on") && strcmp(s, "off"))
		return cli_usage(WHAT, "%s: on or off", flag), -1;
	*out = !strcmp(s, "on");
	return 0;
}

/* A comma-separated list of at most MAX_RATES positive numbers. */
static int dbl_list(const char *flag, const char *s, double *v, int *n)
{
	char buf[1024], *tok, *save = NULL;

	snprintf(buf, sizeof(buf), "%s", s);
	*n = 0;
	for (tok = strtok_r(buf, ",", &save); tok;
	     tok = strtok_r(NULL, ",", &save)) {
		if (*n == MAX_RATES)
			return cli_usage(WHAT, "%s: at most %d", flag,
					 MAX_RATES), -1;
		if (cli_double(flag, tok, 1e-6, 1e9, &v[(*n)++]))
			return -1;
	}
	return *n ? 0 : -1;
}

static int parse_policies(struct opts *o, const char *s)
{
	char buf[128], *tok, *save = NULL;

	o->npol = 0;
	if (!strcmp(s, "all")) {
		for (int p = 0; p < KVT_POLICY_COUNT; p++)
			o->pol[o->npol++] = (kvt_sched_policy)p;
		return 0;
	}
	snprintf(buf, sizeof(buf), "%s", s);
	for (tok = strtok_r(buf, ",", &save); tok;
	     tok = strtok_r(NULL, ",", &save)) {
		if (o->npol == KVT_POLICY_COUNT ||
		    kvt_sched_policy_parse(tok, &o->pol[o->npol])) {
			cli_usage(WHAT, "--policy: '%s' is not lmcache, hicache, "
				  "hicache-kernel, vllm, kvtier or all (at most "
				  "one each)", tok);
			return -1;
		}
		o->npol++;
	}
	return o->npol ? 0 : -1;
}

static int parse_offload(kvt_sim_config *c, const char *s)
{
	char buf[128], *tok, *save = NULL;

	c->noffload = 0;
	snprintf(buf, sizeof(buf), "%s", s);
	for (tok = strtok_r(buf, ",", &save); tok;
	     tok = strtok_r(NULL, ",", &save)) {
		kvt_tier_kind k;

		if (!strcmp(tok, "fabric"))
			k = KVT_TIER_FABRIC;
		else if (!strcmp(tok, "dram"))
			k = KVT_TIER_DRAM;
		else if (!strcmp(tok, "ssd"))
			k = KVT_TIER_SSD;
		else {
			cli_usage(WHAT, "--offload: '%s' is not fabric, dram "
				  "or ssd", tok);
			return -1;
		}
		if (c->noffload == KVT_SIM_MAX_OFFLOAD) {
			cli_usage(WHAT, "--offload: at most %d tiers",
				  KVT_SIM_MAX_OFFLOAD);
			return -1;
		}
		c->offload[c->noffload++] = k;
	}
	return c->noffload ? 0 : -1;
}

static int parse_sizes(kvt_sim_config *c, const char *s)
{
	char buf[256], *tok, *save = NULL;
	uint32_t n = 0;

	snprintf(buf, sizeof(buf), "%s", s);
	for (tok = strtok_r(buf, ",", &save); tok;
	     tok = strtok_r(NULL, ",", &save)) {
		uint64_t v;

		if (n == KVT_SIM_MAX_OFFLOAD || kvt_size_parse(tok, &v) || !v) {
			cli_usage(WHAT, "--offload-bytes: '%s' is not a size "
				  "(e.g. 512G), or too many", tok);
			return -1;
		}
		c->offload_bytes[n++] = (double)v;
	}
	return 0;
}

enum {
	O_HW = 256, O_MODEL, O_TP, O_ENG, O_PAGE, O_OFF, O_OFFB, O_STRESS,
	O_REUSE, O_WRITE, O_POL, O_FEAT, O_IO, O_BUDGET, O_MAXB, O_DH,
	O_RATIO, O_SKIPS, O_WL, O_SESS, O_TURNS, O_CTX, O_APPEND, O_OUT,
	O_THINK, O_SYSTEM, O_SRATE, O_SIGMA, O_SHARE, O_REQ, O_RATE, O_DIST, O_QS, O_SPEED, O_SEED, O_MAXSIM,
	O_SWEEP, O_RATES, O_TARGET, O_JSON, O_CSV, O_PLOT, O_HELP, O_XFER,
	O_SET, O_CPULAT, O_HOLD, O_CONTIG, O_TARGETS, O_RPLOT, O_EXPLAIN, O_RATESCOPY,
};

static const struct option lo[] = {
	{ "hardware", required_argument, 0, O_HW },
	{ "model", required_argument, 0, O_MODEL },
	{ "tp", required_argument, 0, O_TP },
	{ "engines", required_argument, 0, O_ENG },
	{ "page-tokens", required_argument, 0, O_PAGE },
	{ "offload", required_argument, 0, O_OFF },
	{ "offload-bytes", required_argument, 0, O_OFFB },
	{ "stress", required_argument, 0, O_STRESS },
	{ "hbm-reuse", required_argument, 0, O_REUSE },
	{ "write", required_argument, 0, O_WRITE },
	{ "policy", required_argument, 0, O_POL },
	{ "features", required_argument, 0, O_FEAT },
	{ "io", required_argument, 0, O_IO },
	{ "token-budget", required_argument, 0, O_BUDGET },
	{ "max-batch", required_argument, 0, O_MAXB },
	{ "delay-hit", required_argument, 0, O_DH },
	{ "balance-ratio", required_argument, 0, O_RATIO },
	{ "max-skips", required_argument, 0, O_SKIPS },
	{ "workload", required_argument, 0, O_WL },
	{ "sessions", required_argument, 0, O_SESS },
	{ "turns", required_argument, 0, O_TURNS },
	{ "context", required_argument, 0, O_CTX },
	{ "append", required_argument, 0, O_APPEND },
	{ "output", required_argument, 0, O_OUT },
	{ "think", required_argument, 0, O_THINK },
	{ "system", required_argument, 0, O_SYSTEM },
	{ "session-rate", required_argument, 0, O_SRATE },
	{ "think-sigma", required_argument, 0, O_SIGMA },
	{ "hbm-share", required_argument, 0, O_SHARE },
	{ "requests", required_argument, 0, O_REQ },
	{ "rate", required_argument, 0, O_RATE },
	{ "cache-distance", required_argument, 0, O_DIST },
	{ "questions", required_argument, 0, O_QS },
	{ "trace-speed", required_argument, 0, O_SPEED },
	{ "seed", required_argument, 0, O_SEED },
	{ "max-sim", required_argument, 0, O_MAXSIM },
	{ "sweep", no_argument, 0, O_SWEEP },
	{ "rates", required_argument, 0, O_RATES },
	{ "ttft-target", required_argument, 0, O_TARGET },
	{ "json", no_argument, 0, O_JSON },
	{ "csv", no_argument, 0, O_CSV },
	{ "plot", required_argument, 0, O_PLOT },
	{ "help", no_argument, 0, O_HELP },
	{ "xfer", required_argument, 0, O_XFER },
	{ "set", required_argument, 0, O_SET },
	{ "cpu-latency", required_argument, 0, O_CPULAT },
	{ "store-holds-hbm", required_argument, 0, O_HOLD },
	{ "page-contig", required_argument, 0, O_CONTIG },
	{ "ttft-targets", required_argument, 0, O_TARGETS },
	{ "ratio-plot", required_argument, 0, O_RPLOT },
	{ "explain", no_argument, 0, O_EXPLAIN },
	{ "copy-rates", no_argument, 0, O_RATESCOPY },
	{ 0, 0, 0, 0 }
};

/* One option; 0, 1 (--help done) or -1 (usage error, message printed). */
static int option(struct opts *o, int c, const char *a)
{
	kvt_sim_config *k = &o->cfg;
	uint64_t v;
	int err;

	switch (c) {
	case O_HW:
		if ((err = kvt_hw_load(&k->hw, a)))
			return cli_fail(WHAT, err), -1;
		return 0;
	case O_MODEL:
		if (strlen(a) >= sizeof(k->model))
			return cli_usage(WHAT, "--model: name too long"), -1;
		snprintf(k->model, sizeof(k->model), "%s", a);
		return 0;
	case O_TP: return u32("--tp", a, 1, 64, &k->tp);
	case O_ENG: return u32("--engines", a, 1, 64, &k->engines);
	case O_PAGE: return u32("--page-tokens", a, 1, 4096, &o->page_tokens);
	case O_OFF: return parse_offload(k, a);
	case O_OFFB: return parse_sizes(k, a);
	case O_STRESS: return u32("--stress", a, 0, 4096, &k->stress);
	case O_REUSE:
		if (!strcmp(a, "on") || !strcmp(a, "off") || !strcmp(a, "auto")) {
			k->hbm_reuse = !strcmp(a, "on") ? 1 :
				       !strcmp(a, "off") ? 0 : -1;
			return 0;
		}
		return cli_usage(WHAT, "--hbm-reuse: on, off or auto"), -1;
	case O_WRITE:
		if (!strcmp(a, "through"))
			k->write_policy = KVT_WRITE_THROUGH;
		else if (!strcmp(a, "back"))
			k->write_policy = KVT_WRITE_BACK;
		else if (!strcmp(a, "selective"))
			k->write_policy = KVT_WRITE_SELECTIVE;
		else
			return cli_usage(WHAT, "--write: through, back or "
					 "selective"), -1;
		return 0;
	case O_POL: return parse_policies(o, a);
	case O_FEAT:
		snprintf(o->features, sizeof(o->features), "%s", a);
		{
			uint32_t f = 0; /* checked now, applied per policy */

			if ((err = kvt_sched_features_parse(a, &f)))
				return cli_fail(WHAT, err), -1;
		}
		return 0;
	case O_IO:
		{
			kvt_copy_method m;

			if (kvt_copy_method_parse(a, &m))
				return cli_fail(WHAT, -EINVAL), -1;
			o->io = (int)m;
		}
		return 0;
	case O_BUDGET: return u32("--token-budget", a, 1, 1 << 24, &o->budget);
	case O_MAXB: return u32("--max-batch", a, 1, 4096, &o->max_batch);
	case O_DH: return u32("--delay-hit", a, 0, 1 << 24, &o->delay_hit);
	case O_RATIO: return cli_double("--balance-ratio", a, 0.01, 1000, &o->ratio);
	case O_SKIPS: return u32("--max-skips", a, 0, 1 << 20, &o->max_skips);
	case O_WL:
		if ((err = kvt_workload_parse(a, &k->workload, k->trace_path,
					      sizeof(k->trace_path))))
			return cli_fail(WHAT, KVT_ECONFIG), -1;
		return 0;
	case O_SESS: return u32("--sessions", a, 1, 1 << 20, &k->sessions);
	case O_TURNS: return u32("--turns", a, 1, 1 << 16, &k->turns);
	case O_CTX: return u32("--context", a, 1, 1 << 24, &k->context);
	case O_APPEND: return u32("--append", a, 0, 1 << 24, &k->append);
	case O_OUT: return u32("--output", a, 1, 1 << 20, &k->output);
	case O_THINK: return cli_double("--think", a, 0, 1e6, &k->think_s);
	case O_SYSTEM: return u32("--system", a, 0, 1 << 24, &k->system);
	case O_SRATE: return cli_double("--session-rate", a, 0, 1e6, &k->session_rate);
	case O_SIGMA: return cli_double("--think-sigma", a, 0, 10, &k->think_sigma);
	case O_SHARE:
		if (!strcmp(a, "on") || !strcmp(a, "off")) {
			k->hbm_share = !strcmp(a, "on");
			return 0;
		}
		return cli_usage(WHAT, "--hbm-share: on or off"), -1;
	case O_REQ: return u32("--requests", a, 1, 1 << 24, &k->requests);
	case O_RATE: return cli_double("--rate", a, 1e-6, 1e6, &k->rate);
	case O_DIST:
		return u32("--cache-distance", a, 0, 1 << 20,
			   &k->cache_distance);
	case O_QS: return u32("--questions", a, 1, 1 << 20, &k->questions);
	case O_SPEED: return cli_double("--trace-speed", a, 1e-6, 1e6, &k->trace_speed);
	case O_SEED:
		if (cli_u64("--seed", a, 0, UINT64_MAX, &v))
			return -1;
		k->seed = v;
		return 0;
	case O_MAXSIM: return cli_double("--max-sim", a, 1e-6, 1e9, &k->max_sim_s);
	case O_SWEEP: o->sweep = 1; return 0;
	case O_RATES:
		o->sweep = 1;
		return dbl_list("--rates", a, o->rates, &o->nrates);
	case O_TARGET: return cli_double("--ttft-target", a, 1e-3, 1e9, &o->target);
	case O_JSON: o->json = 1; return 0;
	case O_CSV: o->csv = 1; return 0;
	case O_PLOT: o->plot = a; return 0;
	case O_XFER: o->xfer = a; return 0;
	case O_SET:
		if (o->nsets == NSETS || !strchr(a, '=') ||
		    strlen(a) >= sizeof(o->sets[0]))
			return cli_usage(WHAT, "--set: KEY=VALUE (at most %d)",
					 NSETS), -1;
		snprintf(o->sets[o->nsets++], sizeof(o->sets[0]), "%s", a);
		return 0;
	case O_CPULAT:
		if (on_off("--cpu-latency", a, &k->cpu_mem_latency))
			return -1;
		return 0;
	case O_HOLD:
		return on_off("--store-holds-hbm", a, &k->store_holds_hbm);
	case O_CONTIG:
		return on_off("--page-contig", a, &o->page_contig);
	case O_TARGETS:
		return dbl_list("--ttft-targets", a, o->targets, &o->ntargets);
	case O_RPLOT: o->ratio_plot = a; return 0;
	case O_EXPLAIN: o->explain = 1; return 0;
	case O_RATESCOPY: o->copy_rates = 1; return 0;
	case O_HELP: usage(stdout); return 1;
	default: return -1;
	}
}

/* The configuration for policy @p: its preset, then the ablation knobs. */
static int policy_cfg(const struct opts *o, kvt_sched_policy p,
		      kvt_sim_config *c)
{
	int err;

	*c = o->cfg;
	if ((err = kvt_sim_config_policy(c, p)))
		return err;
	if (o->page_tokens)
		c->page_tokens = o->page_tokens;
	if (o->page_contig >= 0)
		c->page_contig = o->page_contig;
	if (o->features[0] &&
	    (err = kvt_sched_features_parse(o->features, &c->sched.features)))
		return err;
	if (o->io >= 0)
		c->sched.method = (kvt_copy_method)o->io;
	if (o->budget)
		c->sched.token_budget = o->budget;
	if (o->max_batch)
		c->sched.max_batch = o->max_batch;
	if (o->delay_hit != UINT32_MAX)
		c->sched.delay_hit_tokens = o->delay_hit;
	if (o->ratio > 0)
		c->sched.balance_ratio = o->ratio;
	if (o->max_skips != UINT32_MAX)
		c->sched.max_skips = o->max_skips;
	return 0;
}

/* ---- output -------------------------------------------------------------- */

static const char *tier_name(int t)
{
	return kvt_tier_kind_name((kvt_tier_kind)t);
}

static cJSON *dist_json(const kvt_dist *d)
{
	cJSON *o = cJSON_CreateObject();

	cJSON_AddNumberToObject(o, "mean", d->mean);
	cJSON_AddNumberToObject(o, "p50", d->p50);
	cJSON_AddNumberToObject(o, "p90", d->p90);
	cJSON_AddNumberToObject(o, "p99", d->p99);
	cJSON_AddNumberToObject(o, "max", d->max);
	cJSON_AddNumberToObject(o, "n", (double)d->n);
	return o;
}

static cJSON *result_json(const kvt_sim_result *r)
{
	cJSON *o = cJSON_CreateObject(), *t, *h, *a;

	cJSON_AddNumberToObject(o, "requests", (double)r->requests);
	cJSON_AddNumberToObject(o, "finished", (double)r->finished);
	cJSON_AddNumberToObject(o, "measured", (double)r->measured);
	cJSON_AddItemToObject(o, "ttft_ms", dist_json(&r->ttft_ms));
	cJSON_AddItemToObject(o, "warm_ttft_ms", dist_json(&r->warm_ttft_ms));
	cJSON_AddItemToObject(o, "tpot_ms", dist_json(&r->tpot_ms));
	cJSON_AddItemToObject(o, "e2e_ms", dist_json(&r->e2e_ms));
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

static cJSON *config_json(const kvt_sim_config *c)
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

static void print_result(const kvt_sim_config *c, const kvt_sim_result *r)
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

static void csv_header(void)
{
	printf("policy,hardware,model,tp,offload,stress,workload,rate,"
	       "requests,ttft_mean_ms,ttft_p50_ms,ttft_p90_ms,ttft_p99_ms,"
	       "warm_ttft_mean_ms,warm_ttft_p90_ms,tpot_mean_ms,"
	       "throughput_tok_s,request_s,gpu_busy,stall_s\n");
}

static void csv_row(const kvt_sim_config *c, double rate,
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
static int plot(const char *png, kvt_sim_config *cfg, kvt_sweep **sw,
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

static cJSON *sweep_json(const kvt_sweep *w)
{
	cJSON *o = cJSON_CreateObject(), *a = cJSON_AddArrayToObject(o, "curve");

	for (uint32_t i = 0; i < w->n; i++) {
		cJSON *p = result_json(&w->pt[i].r);

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

static void print_sweep(const kvt_sim_config *c, const kvt_sweep *w)
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
static int ratios(const struct opts *o, kvt_sim_config *cfg, kvt_sweep **sw,
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

static int explain(struct opts *o)
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
	if ((err = policy_cfg(o, o->pol[0], &c)))
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

/* ---- main ------------------------------------------------------------------ */

static int run_all(struct opts *o)
{
	kvt_sim_config *cfg = calloc(o->npol, sizeof(*cfg));
	kvt_sim_result *res = calloc(o->npol, sizeof(*res));
	kvt_sweep *sw[KVT_POLICY_COUNT] = { 0 };
	cJSON *root = NULL, *arr = NULL;
	int rc = 0, err;

	if (!cfg || !res) {
		rc = cli_fail(WHAT, -ENOMEM);
		goto out;
	}
	for (int i = 0; i < o->npol; i++) {
		if ((err = policy_cfg(o, o->pol[i], &cfg[i]))) {
			rc = cli_fail(WHAT, err);
			goto out;
		}
		if (o->sweep) {
			if (!(sw[i] = calloc(1, sizeof(*sw[i])))) {
				rc = cli_fail(WHAT, -ENOMEM);
				goto out;
			}
			err = kvt_sim_sweep(&cfg[i], o->nrates ? o->rates : NULL,
					    (uint32_t)o->nrates, o->target,
					    sw[i]);
		} else {
			err = kvt_sim_run(&cfg[i], &res[i]);
		}
		if (err) {
			rc = cli_fail(WHAT, err);
			goto out;
		}
	}
	if (o->json) {
		root = cJSON_CreateObject();
		if (o->npol > 1)
			arr = cJSON_AddArrayToObject(root, "policies");
		for (int i = 0; i < o->npol; i++) {
			cJSON *x = o->sweep ? sweep_json(sw[i]) :
					      result_json(&res[i]);

			cJSON_AddItemToObject(x, "config", config_json(&cfg[i]));
			if (!arr) {
				cJSON_Delete(root);
				root = x;
			} else {
				cJSON_AddStringToObject(x, "policy",
					kvt_sched_policy_name(cfg[i].policy));
				cJSON_AddItemToArray(arr, x);
			}
		}
		if (o->sweep && o->npol > 1)
			ratios(o, cfg, sw, root);
		cli_json_print(root);
	} else if (o->csv) {
		csv_header();
		for (int i = 0; i < o->npol; i++) {
			if (!o->sweep) {
				csv_row(&cfg[i], cfg[i].rate, &res[i]);
				continue;
			}
			for (uint32_t k = 0; k < sw[i]->n; k++)
				csv_row(&cfg[i], sw[i]->pt[k].rate,
					&sw[i]->pt[k].r);
		}
	} else {
		for (int i = 0; i < o->npol; i++)
			if (o->sweep)
				print_sweep(&cfg[i], sw[i]);
			else
				print_result(&cfg[i], &res[i]);
	}
	if (o->plot)
		rc = plot(o->plot, cfg, sw, o->npol, o->target);
	if (!rc && o->sweep && (rc = ratios(o, cfg, sw, NULL)))
		goto out;
out:
	for (int i = 0; i < KVT_POLICY_COUNT; i++)
		free(sw[i]);
	free(cfg);
	free(res);
	return rc;
}

/* --xfer FILE, after --hardware whatever the order on the line. */
static int apply_xfer(struct opts *o)
{
	char *text;
	int err;

	if ((err = kvti_read_file(o->xfer, 64 << 20, &text, NULL))) {
		fprintf(stderr, "kvtier %s: --xfer %s: %s\n", WHAT, o->xfer,
			kvti_file_strerror(err));
		return CLI_EXIT_FAIL;
	}
	err = kvt_hw_apply_xfer(&o->cfg.hw, text, o->xfer);
	kvt_free(text);
	return err ? cli_fail(WHAT, err) : 0;
}

/* --copy-rates: the cost model's uncontended rate per method and chunk
 * size (per-chunk call costs included), as a table or CSV. */
static int copy_rates(const struct opts *o)
{
	kvt_sim_config c;
	kvt_cost cost;
	kvt_geom g;
	int err;

	if ((err = policy_cfg(o, o->pol[0], &c)) ||
	    (err = kvt_geom_preset(&g, "llama-3.1-8b", 16, 1, 0)) ||
	    (err = kvt_hw_cost(&c.hw, &g, &cost)))
		return cli_fail(WHAT, err);
	printf(o->csv ? "method,chunk_bytes,gbps\n" : "%s: host->GPU GB/s by "
	       "chunk size (call costs included)\n  %-8s", c.hw.name, "chunk");
	if (!o->csv)
		for (int m = 0; m < KVT_COPY_COUNT; m++)
			printf(" %8s", kvt_copy_method_name((kvt_copy_method)m));
	if (!o->csv)
		printf("\n");
	for (uint64_t ch = 4096; ch <= 16u << 20; ch *= 2) {
		if (!o->csv)
			printf("  %6lluK", (unsigned long long)(ch >> 10));
		for (int m = 0; m < KVT_COPY_COUNT; m++) {
			double r = kvt_cost_copy_gbps(&cost, (kvt_copy_method)m,
						      ch);

			if (o->csv)
				printf("%s,%llu,%.3f\n",
				       kvt_copy_method_name((kvt_copy_method)m),
				       (unsigned long long)ch, r);
			else
				printf(" %8.2f", r);
		}
		if (!o->csv)
			printf("\n");
	}
	return 0;
}

/* --set KEY=VALUE, after --hardware and --xfer. */
static int apply_sets(struct opts *o)
{
	for (int i = 0; i < o->nsets; i++) {
		char key[128], *eq;
		int err;

		snprintf(key, sizeof(key), "%s", o->sets[i]);
		eq = strchr(key, '=');
		*eq = '\0';
		if ((err = kvt_hw_set(&o->cfg.hw, key, eq + 1)))
			return cli_fail(WHAT, err);
	}
	return 0;
}

int cmd_sim(int argc, char **argv)
{
	struct opts *o = calloc(1, sizeof(*o));
	int c, r, rc, err;

	if (!o)
		return cli_fail(WHAT, -ENOMEM);
	kvt_sim_config_init(&o->cfg);
	o->npol = 1;
	o->pol[0] = KVT_POLICY_KVTIER;
	o->io = -1;
	o->page_contig = -1;
	o->delay_hit = o->max_skips = UINT32_MAX;
	if ((err = kvt_hw_load(&o->cfg.hw, "testbed-a"))) {
		free(o);
		return cli_fail(WHAT, err);
	}
	optind = 1;
	while ((c = getopt_long(argc, argv, "h", lo, NULL)) != -1) {
		r = option(o, c == 'h' ? O_HELP : c, optarg);
		if (r) {
			free(o);
			return r > 0 ? 0 : CLI_EXIT_USAGE;
		}
	}
	if (o->xfer && (rc = apply_xfer(o)))
		; /* message printed */
	else if ((rc = apply_sets(o)))
		; /* message printed */
	else if (o->copy_rates)
		rc = copy_rates(o);
	else if (o->explain && (o->sweep || o->json || o->csv || o->npol > 1))
		rc = cli_usage(WHAT, "--explain explains one run: one policy, "
			       "no --sweep, --json or --csv");
	else if (o->explain)
		rc = optind < argc ? cli_usage(WHAT, "unexpected argument "
					      "'%s'", argv[optind]) :
				     explain(o);
	else if (o->ratio_plot && !(o->sweep && o->npol > 1))
		rc = cli_usage(WHAT, "--ratio-plot needs --sweep and two or "
			       "more policies");
	else if (optind < argc)
		rc = cli_usage(WHAT, "unexpected argument '%s'", argv[optind]);
	else if (o->plot && !o->sweep)
		rc = cli_usage(WHAT, "--plot draws sweep curves: add --sweep");
	else if (o->target > 0 && !o->sweep)
		rc = cli_usage(WHAT, "--ttft-target needs --sweep");
	else if (o->json && o->csv)
		rc = cli_usage(WHAT, "--json or --csv, not both");
	else
		rc = run_all(o);
	free(o);
	return rc;
}
