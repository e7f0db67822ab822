/*
 * cmd_demo.c — kvtier demo: the serving engine over the real cache under
 * kvtier's scheduler and the baselines (src/demo/), printed for people (a
 * progress line, a table per rate, the comparison, the sweep's throughput
 * at equal TTFT, the ablation, the checks) or for machines (--json); the
 * curves as PNG with --plot (gnuplot).
 *
 * This file: usage, the options, the progress line and main; what it
 * prints is in cmd_demo_out.c (text, plot) and cmd_demo_json.c (--json),
 * over the result readers of cmd_demo_res.c (cmd_demo.h); --out FILE keeps
 * the JSON on disk after every pass (cmd_demo_file.c).
 *
 * The progress line gives the time since the run started and an estimate
 * of the time left: the passes finished so far, their mean wall time
 * (setup included) times the passes still to run, less the time the
 * current pass has run. A sweep's later rates have more sessions, so the
 * estimate is low early in a repeat; it is "?" until a pass has finished.
 */
#include "cmd_demo.h"

#include <errno.h>
#include <getopt.h>
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
"  --out FILE          the JSON result written to FILE after every pass\n"
"                      (FILE.tmp, fsync, rename: never half-written) with\n"
"                      \"complete\": false, passes_done and passes_total\n"
"                      until the last, then --json's document with\n"
"                      \"complete\": true; a run cut short keeps its\n"
"                      finished passes. Checked before the first pass\n"
"  --quiet             no progress line and no tables: one summary line\n"
"\n"
"Exit status: 0 when every request ran, every load and store succeeded\n"
"and every checksum matched; 1 otherwise (the summary says what failed).\n"
"SIGINT/SIGTERM stop the run at the next step: its temporary tiers are\n"
"removed, --out's FILE keeps the passes finished, and the exit is by the\n"
"signal (130/143); another signal a second or more later ends it at once.\n");
}

static int progress_on;
static uint64_t run_t0, pass_t0; /* the run's start, the last pass's end */
static size_t passes_fin;
static const char *out_file;

/* "1h02m", "3m05s", "42s" */
static void fmt_dur(char *b, size_t n, double s)
{
	unsigned long v = s > 0 ? (unsigned long)(s + 0.5) : 0;

	if (v >= 3600)
		snprintf(b, n, "%luh%02lum", v / 3600, v / 60 % 60);
	else if (v >= 60)
		snprintf(b, n, "%lum%02lus", v / 60, v % 60);
	else
		snprintf(b, n, "%lus", v);
}

static void progress(void *arg, const char *label, size_t done, size_t total,
		     size_t pass, size_t passes)
{
	int width = 20, fill = total ? (int)(done * (size_t)width / total) : 0;
	uint64_t now = kvt_now_ns();
	double el = (double)(now - run_t0) / 1e9;
	char e[16], l[16] = "?";

	(void)arg;
	if (!progress_on)
		return;
	fmt_dur(e, sizeof(e), el);
	if (passes_fin) {
		double mean = (double)(pass_t0 - run_t0) / 1e9 /
			      (double)passes_fin;
		double left = mean * (double)(passes - passes_fin) -
			      (double)(now - pass_t0) / 1e9;

		fmt_dur(l, sizeof(l), left);
	}
	fprintf(stderr, "\r  pass %zu/%zu [%.*s%*s] %3zu/%zu req  %s elapsed, "
		"~%s left  %-24s", pass + 1, passes, fill,
		"####################", width - fill, "", done, total, e, l,
		label);
	if (done == total && pass + 1 == passes)
		fputc('\n', stderr);
	fflush(stderr);
}

/* After every pass (and before the first): the progress line's clock, and
 * --out's file. */
static void pass_done(void *arg, const kvt_demo_result *r, int err,
		      size_t done, size_t total)
{
	(void)arg;
	passes_fin = done;
	pass_t0 = kvt_now_ns();
	if (out_file)
		kvti_cd_out_pass(r, err, done, total);
}

/* ---- options and main -------------------------------------------------- */

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
	       O_PLOT, O_PREDICT, O_OUT };
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
		{ "out", required_argument, 0, O_OUT },
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
		case O_OUT: out_file = optarg; break;
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
	if (getenv("KVT_DEMO_TAMPER_ENGINE") &&
	    cli_u64("KVT_DEMO_TAMPER_ENGINE", getenv("KVT_DEMO_TAMPER_ENGINE"),
		    0, UINT64_MAX, &c.tamper_engine_after))
		return 2;
	if (out_file && kvti_cd_out_open(out_file))
		return CLI_EXIT_USAGE;
	progress_on = !json && !quiet && isatty(2);
	c.progress = progress;
	c.pass_done = pass_done;
	c.stop = &kvti_cd_stop;
	kvti_cd_signals();
	run_t0 = pass_t0 = kvt_now_ns();
	if (!json && !quiet) {
		kvt_geom g;
		kvt_hw hw;
		char gpu[KVT_NAME_MAX] = "?";

		kvt_geom_preset(&g, c.model, c.page_tokens, 1, 0);
		if (!kvt_hw_load(&hw, c.hardware))
			snprintf(gpu, sizeof(gpu), "%s", hw.gpu_name);
		kvti_cd_print_header(&c, &g, gpu);
		fflush(stdout);
	}
	err = kvt_demo_run(&c, &r);
	kvti_cd_stopped(); /* a signal: FILE as it was, exit by the signal */
	if (!r)
		return cli_fail("demo", err);
	if (json || out_file) {
		cJSON *doc = kvti_cd_result_json(r, err);

		if (out_file)
			kvti_cd_out_final(doc);
		if (json)
			cli_json_print(doc);
		else
			cJSON_Delete(doc);
	}
	if (json) {
		/* printed above */
	} else if (quiet) {
		kvti_cd_print_quiet(r, err);
	} else {
		kvti_cd_print_rates(r);
		kvti_cd_print_compare(r);
		kvti_cd_print_sweep(r);
		kvti_cd_print_ablation(r);
		kvti_cd_print_integrity(r, err);
		printf("done in %.1f s (load average %.2f at the start, %.2f at "
		       "the end)\n", r->seconds, r->loadavg_start,
		       r->loadavg_end);
	}
	if (png && kvti_cd_plot(r, png) && !err)
		err = -EIO;
	if (err)
		fprintf(stderr, "kvtier demo: %s\n", r->error[0] ? r->error :
			kvt_strerror(err));
	if (out_file && kvti_cd_out_failed() && !err)
		fprintf(stderr, "kvtier demo: --out: '%s' is not up to date\n",
			out_file);
	kvt_demo_result_free(r);
	return err || (out_file && kvti_cd_out_failed()) ? CLI_EXIT_FAIL : 0;
}
