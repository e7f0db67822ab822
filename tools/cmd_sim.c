/*
 * cmd_sim.c — kvtier sim: run the serving simulator (kvt_sim_run) once,
 * per policy, or over a sweep of arrival rates (kvt_sim_sweep), and print
 * a table, JSON, CSV, or a gnuplot PNG of the sweep curves.
 */
#include "cmd_sim.h"
#include "core/core.h"

#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>


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
"  --watermarks H,L|off  the cache's background demotion: after every\n"
"                        store, each offload tier above H of its slots\n"
"                        demotes to L (kvtier's cache: 0.90,0.75; kvtier\n"
"                        demo --predict sets that); off: a tier fills and\n"
"                        demotes on demand only (default off)\n"
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
	O_WMARK,
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
	{ "watermarks", required_argument, 0, O_WMARK },
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
	case O_WMARK: {
		double h, l;
		int n = -1;

		if (!strcmp(a, "off")) {
			k->bg_high = k->bg_low = 0;
			return 0;
		}
		if (sscanf(a, "%lf,%lf%n", &h, &l, &n) != 2 || a[n] ||
		    !(l > 0 && l <= h && h <= 1))
			return cli_usage(WHAT, "--watermarks: HIGH,LOW with 0 < "
					 "LOW <= HIGH <= 1 (e.g. 0.90,0.75), "
					 "or off"), -1;
		k->bg_high = h;
		k->bg_low = l;
		return 0;
	}
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
int kvti_cs_policy_cfg(const struct opts *o, kvt_sched_policy p,
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
		if ((err = kvti_cs_policy_cfg(o, o->pol[i], &cfg[i]))) {
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
			cJSON *x = o->sweep ? kvti_cs_sweep_json(sw[i]) :
					      kvti_cs_result_json(&res[i]);

			cJSON_AddItemToObject(x, "config", kvti_cs_config_json(&cfg[i]));
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
			kvti_cs_ratios(o, cfg, sw, root);
		cli_json_print(root);
	} else if (o->csv) {
		kvti_cs_csv_header();
		for (int i = 0; i < o->npol; i++) {
			if (!o->sweep) {
				kvti_cs_csv_row(&cfg[i], cfg[i].rate, &res[i]);
				continue;
			}
			for (uint32_t k = 0; k < sw[i]->n; k++)
				kvti_cs_csv_row(&cfg[i], sw[i]->pt[k].rate,
					&sw[i]->pt[k].r);
		}
	} else {
		for (int i = 0; i < o->npol; i++)
			if (o->sweep)
				kvti_cs_print_sweep(&cfg[i], sw[i]);
			else
				kvti_cs_print_result(&cfg[i], &res[i]);
	}
	if (o->plot)
		rc = kvti_cs_plot(o->plot, cfg, sw, o->npol, o->target);
	if (!rc && o->sweep && (rc = kvti_cs_ratios(o, cfg, sw, NULL)))
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

	if ((err = kvti_cs_policy_cfg(o, o->pol[0], &c)) ||
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
				     kvti_cs_explain(o);
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
