/*
 * kvtier.c — the kvtier command: find the subcommand, run it; and the small
 * helpers of cli.h every subcommand shares.
 */
#include "cli.h"

#include <errno.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

static const struct {
	const char *name;
	int (*fn)(int argc, char **argv);
	const char *summary;
} cmds[] = {
	{ "demo", cmd_demo, "the main job: an agentic workload through the real cache" },
	{ "info", cmd_info, "what this machine offers; build and report tiers" },
	{ "bench", cmd_bench, "benchmarks (JSON with --json)" },
	{ "trace", cmd_trace, "replay request traces through the index" },
	{ "sim", cmd_sim, "simulate a serving node: TTFT, throughput, policies" },
	{ "stress", cmd_stress, "memory stressor: N threads copying, GB/s each" },
	{ "serve", cmd_serve, "the node daemon (kvtierd): tiers shared by engines" },
	{ "stat", cmd_stat, "the node daemon's metrics, for a person (--json, --watch)" },
};

static void usage(FILE *f)
{
	fprintf(f, "usage: kvtier <command> [options]   (kvtier <command> "
		   "--help for more)\n\ncommands:\n");
	for (size_t i = 0; i < sizeof(cmds) / sizeof(cmds[0]); i++)
		fprintf(f, "  %-8s %s\n", cmds[i].name, cmds[i].summary);
	fprintf(f, "  %-8s %s\n", "version", "print the version");
	fprintf(f, "\nenvironment: KVT_LOG=error|warn|info|debug, and "
		   "KVT_<OPTION> for options\n(see docs/ARCHITECTURE.md and "
		   "README.md)\n");
}

int main(int argc, char **argv)
{
	const char *self = strrchr(argv[0], '/');

	/* installed as kvtierd too: that name is `kvtier serve` */
	if (!strcmp(self ? self + 1 : argv[0], "kvtierd"))
		return cmd_serve(argc, argv);
	if (argc < 2) {
		usage(stderr);
		return CLI_EXIT_USAGE;
	}
	if (!strcmp(argv[1], "-h") || !strcmp(argv[1], "--help") ||
	    !strcmp(argv[1], "help")) {
		usage(stdout);
		return 0;
	}
	if (!strcmp(argv[1], "version") || !strcmp(argv[1], "--version")) {
		if (argc == 3 && (!strcmp(argv[2], "-h") ||
				  !strcmp(argv[2], "--help"))) {
			printf("usage: kvtier version\n\nPrints the version "
			       "of this kvtier.\n");
			return 0;
		}
		if (argc > 2)
			return cli_usage("version", "unexpected argument '%s'",
					 argv[2]);
		printf("kvtier %s\n", kvt_version());
		return 0;
	}
	for (size_t i = 0; i < sizeof(cmds) / sizeof(cmds[0]); i++)
		if (!strcmp(argv[1], cmds[i].name))
			return cmds[i].fn(argc - 1, argv + 1);
	fprintf(stderr, "kvtier: unknown command '%s'\n\n", argv[1]);
	usage(stderr);
	return CLI_EXIT_USAGE;
}

/* ---- helpers (cli.h) --------------------------------------------------- */

int cli_fail(const char *what, int err)
{
	const char *d = kvt_errdetail();

	if (d && *d)
		fprintf(stderr, "kvtier %s: %s\n", what, d);
	else
		fprintf(stderr, "kvtier %s: %s\n", what, kvt_strerror(err));
	return err == KVT_ESPEC || err == KVT_EPRESET || err == KVT_ECONFIG ||
	       err == KVT_EGEOM ?
		       CLI_EXIT_USAGE : CLI_EXIT_FAIL;
}

int cli_usage(const char *what, const char *fmt, ...)
{
	va_list ap;

	fprintf(stderr, "kvtier %s: ", what);
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fprintf(stderr, " (try: kvtier %s --help)\n", what);
	return CLI_EXIT_USAGE;
}

int cli_u64(const char *flag, const char *s, uint64_t lo, uint64_t hi,
	    uint64_t *out)
{
	char *end;
	unsigned long long v;

	errno = 0;
	v = strtoull(s, &end, 10);
	if (!*s || *s == '-' || *end || errno || v < lo || v > hi) {
		fprintf(stderr, "kvtier: %s: '%s' is not an integer in %llu..%llu\n",
			flag, s, (unsigned long long)lo, (unsigned long long)hi);
		return -1;
	}
	*out = v;
	return 0;
}

int cli_double(const char *flag, const char *s, double lo, double hi,
	       double *out)
{
	char *end;
	double v;

	errno = 0;
	v = strtod(s, &end);
	if (!*s || *end || errno || !(v >= lo && v <= hi)) {
		fprintf(stderr, "kvtier: %s: '%s' is not a number in %g..%g\n",
			flag, s, lo, hi);
		return -1;
	}
	*out = v;
	return 0;
}

int cli_u64_list(const char *flag, const char *s, uint64_t lo, uint64_t hi,
		 uint64_t *out, int max)
{
	char buf[512], *tok, *save = NULL;
	int n = 0;

	snprintf(buf, sizeof(buf), "%s", s);
	for (tok = strtok_r(buf, ",", &save); tok;
	     tok = strtok_r(NULL, ",", &save)) {
		if (n == max) {
			fprintf(stderr, "kvtier: %s: more than %d values\n", flag,
				max);
			return -1;
		}
		if (cli_u64(flag, tok, lo, hi, &out[n]))
			return -1;
		n++;
	}
	if (!n) {
		fprintf(stderr, "kvtier: %s: empty list\n", flag);
		return -1;
	}
	return n;
}

int cli_geom(kvt_geom *g, const char *model, uint32_t page_tokens,
	     uint32_t tp, uint32_t rank)
{
	struct stat st;
	char path[4096];

	/* an existing file or directory is a config; anything else a preset */
	if (stat(model, &st) == 0) {
		snprintf(path, sizeof(path), "%s%s", model,
			 S_ISDIR(st.st_mode) ? "/config.json" : "");
		return kvt_geom_from_config(g, path, page_tokens, tp, rank);
	}
	return kvt_geom_preset(g, model, page_tokens, tp, rank);
}

void cli_json_print(cJSON *root)
{
	char *s = cJSON_Print(root);

	if (s) {
		fputs(s, stdout);
		fputc('\n', stdout);
		cJSON_free(s);
	}
	cJSON_Delete(root);
}

cJSON *cli_dist_json(const kvt_dist *d)
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

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return x < y ? -1 : x > y;
}

double cli_median(const double *v, int n)
{
	double s[1024];

	if (n <= 0)
		return 0;
	if (n > 1024)
		n = 1024;
	memcpy(s, v, (size_t)n * sizeof(*v));
	qsort(s, (size_t)n, sizeof(*s), cmp_double);
	return n % 2 ? s[n / 2] : (s[n / 2 - 1] + s[n / 2]) / 2;
}
