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
"  --policy LIST         lmcache, hicache, kvtier, or all (default kvtier);\n"
"                        several: one result per policy\n"
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
"output\n"
"  --json                one JSON object (docs/FORMATS.md)\n"
"  --csv                 CSV rows, one per policy (and rate)\n"
"  --plot FILE.png       sweep: TTFT vs throughput per policy (gnuplot)\n"
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
	uint32_t budget, max_batch, delay_hit, max_skips;
	double ratio;
	int sweep, json, csv;
	double rates[MAX_RATES];
	int nrates;
	double target;
	const char *plot;
	const char *xfer;
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
				  "kvtier or all (at most one each)", tok);
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
	O_THINK, O_REQ, O_RATE, O_DIST, O_QS, O_SPEED, O_SEED, O_MAXSIM,
	O_SWEEP, O_RATES, O_TARGET, O_JSON, O_CSV, O_PLOT, O_HELP, O_XFER,
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
	case O_PAGE: return u32("--page-tokens", a, 1, 4096, &k->page_tokens);
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
		{
			char buf[1024], *tok, *save = NULL;

			snprintf(buf, sizeof(buf), "%s", a);
			o->nrates = 0;
			for (tok = strtok_r(buf, ",", &save); tok;
			     tok = strtok_r(NULL, ",", &save)) {
				if (o->nrates == MAX_RATES)
					return cli_usage(WHAT, "--rates: at most "
							 "%d", MAX_RATES), -1;
				if (cli_double("--rates", tok, 1e-6, 1e6,
					&o->rates[o->nrates++]))
					return -1;
			}
			o->sweep = 1;
		}
		return 0;
	case O_TARGET: return cli_double("--ttft-target", a, 1e-3, 1e9, &o->target);
	case O_JSON: o->json = 1; return 0;
	case O_CSV: o->csv = 1; return 0;
	case O_PLOT: o->plot = a; return 0;
	case O_XFER: o->xfer = a; return 0;
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

/* Write the sweep curves as data files and plot them with gnuplot. */
static int plot(const char *png, kvt_sim_config *cfg, kvt_sweep **sw,
		int n, double target)
{
	char dir[] = "/tmp/kvtier-plot-XXXXXX", path[256], cmd[4096];
	FILE *f, *g;
	int rc;

	if (!mkdtemp(dir))
		return cli_fail(WHAT, -errno);
	snprintf(path, sizeof(path), "%s/plot.gp", dir);
	if (!(g = fopen(path, "w")))
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
