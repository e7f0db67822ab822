/*
 * cmd_stat.c — kvtier stat [--socket PATH] [--json] [--watch SECS]
 * [--count N] [--tenant NAME]: the node daemon's metrics for a person.
 *
 * The daemon renders its metrics as JSON (src/server/metrics_json.c, format in
 * docs/METRICS.md) and sends them on a STATS request; this command asks
 * through the client library and prints a table per tier and per tenant
 * (or the JSON itself with --json). The same numbers are served to
 * Prometheus on GET /metrics. --from-file FILE reads a saved `--json`
 * output instead (the tests use it on a document the renderer made).
 */
#include "cli.h"

#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#if defined(__has_include)
#if __has_include(<kvtier/client.h>)
#include <kvtier/client.h>
#define STAT_HAVE_CLIENT 1
#endif
#endif

#define METRICS_FORMAT 1 /* the JSON "format" this command reads */

static void usage(FILE *f)
{
	fprintf(f,
		"usage: kvtier stat [--socket PATH | --from-file FILE] [--json]\n"
		"                   [--watch SECS [--count N]] [--tenant NAME]\n"
		"                   [--config FILE]\n\n"
		"The node daemon's metrics (kvtier serve): capacity and use "
		"per tier, the\n"
		"cache's totals, and per tenant: hits and misses, read "
		"failures (pages a\n"
		"tier held but could not deliver, not misses), evictions, "
		"demotions,\n"
		"checksum failures, bytes per link, lease expiries, protocol "
		"errors and\n"
		"lookup/load/store latency (p50/p99 estimated from the "
		"histogram buckets).\n"
		"The same numbers are on the daemon's Prometheus endpoint "
		"(docs/METRICS.md).\n\n"
		"  --socket PATH   the daemon's socket (default: KVT_SOCKET, "
		"else\n"
		"                  /run/kvtier/kvtierd.sock)\n"
		"  --json          the daemon's JSON as it is (one line per "
		"refresh with\n"
		"                  --watch)\n"
		"  --watch SECS    refresh every SECS seconds (0.1..86400) "
		"until interrupted\n"
		"  --count N       with --watch: stop after N refreshes\n"
		"  --tenant NAME   only this tenant (\"\" for the node's own "
		"counters)\n"
		"  --from-file F   read a saved `kvtier stat --json` instead of "
		"asking the\n"
		"                  daemon\n"
		"  --config FILE   options file as for kvtier serve (socket, "
		"namespace)\n\n"
		"The daemon answers a monitor (no geometry: STATS only) when "
		"any of its\n"
		"tenants allows your uid/gid (root: always).\n");
}

/* ---- reading the JSON ------------------------------------------------------ */

static double num(const cJSON *o, const char *k)
{
	const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);

	return cJSON_IsNumber(v) ? v->valuedouble : 0;
}

static const char *str(const cJSON *o, const char *k)
{
	const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);

	return cJSON_IsString(v) ? v->valuestring : "";
}

/* The member name of @v ("?" inside an array: a malformed document). */
static const char *key(const cJSON *v)
{
	return v->string ? v->string : "?";
}

static const char *bytes(double b, char *buf, size_t len)
{
	return kvt_size_format(b > 0 ? (uint64_t)b : 0, buf, len);
}

/* A duration for a person: "850 ns", "18.0 us", "3.20 ms", "1.50 s". */
static const char *dur(double s, char *buf, size_t len)
{
	if (s < 1e-6)
		snprintf(buf, len, "%.0f ns", s * 1e9);
	else if (s < 1e-3)
		snprintf(buf, len, "%.1f us", s * 1e6);
	else if (s < 1)
		snprintf(buf, len, "%.2f ms", s * 1e3);
	else
		snprintf(buf, len, "%.2f s", s);
	return buf;
}

/*
 * The @q quantile of a histogram from its cumulative bucket counts (as
 * Prometheus' histogram_quantile(): linear within the bucket the rank falls
 * in, from its lower bound, 0 for the first). INFINITY when it falls in the
 * +Inf bucket, NAN with no observations.
 */
static double quantile(const cJSON *bounds, const cJSON *cum, double q)
{
	int nb = cJSON_GetArraySize(bounds), nc = cJSON_GetArraySize(cum);
	double count, rank, prev = 0, lo = 0;

	if (nc != nb + 1 || nb < 1)
		return NAN;
	count = cJSON_GetArrayItem(cum, nc - 1)->valuedouble;
	if (!(count > 0))
		return NAN;
	rank = q * count;
	for (int i = 0; i < nb; i++) {
		double c = cJSON_GetArrayItem(cum, i)->valuedouble;
		double hi = cJSON_GetArrayItem(bounds, i)->valuedouble;

		if (c >= rank && c > prev)
			return lo + (hi - lo) * (rank - prev) / (c - prev);
		prev = c;
		lo = hi;
	}
	return INFINITY;
}

/* A quantile as dur() writes it; past the last bound "> BOUND"; "-" for
 * none. */
static const char *qdur(const cJSON *bounds, const cJSON *cum, double q,
			char *buf, size_t len)
{
	double v = quantile(bounds, cum, q);
	char last[24];

	if (isnan(v)) {
		snprintf(buf, len, "-");
	} else if (isinf(v)) {
		dur(cJSON_GetArrayItem(bounds, cJSON_GetArraySize(bounds) - 1)
			    ->valuedouble, last, sizeof(last));
		snprintf(buf, len, "> %s", last);
	} else {
		dur(v, buf, len);
	}
	return buf;
}

/* ---- printing ---------------------------------------------------------------- */

static void print_head(const cJSON *root)
{
	const cJSON *g = cJSON_GetObjectItemCaseSensitive(root, "gauges");
	double up = num(root, "time") - num(root, "start_time");
	char b[32];

	printf("kvtier daemon %s, up %.0fh%02.0fm%02.0fs\nclients %.0f, leases "
	       "%.0f (%.0f pages pinned), jobs in flight %.0f, engine memory "
	       "registered %s\n",
	       str(root, "version"), floor(up / 3600),
	       floor(fmod(up, 3600) / 60), floor(fmod(up, 60)),
	       num(g, "clients"), num(g, "leases"), num(g, "pinned_pages"),
	       num(g, "jobs_in_flight"),
	       bytes(num(g, "registered_memory_bytes"), b, sizeof(b)));
}

static void print_tiers(const cJSON *root)
{
	const cJSON *tiers = cJSON_GetObjectItemCaseSensitive(root, "tiers");
	const cJSON *t, *c = cJSON_GetObjectItemCaseSensitive(root, "cache");
	char b1[32], b2[32], b3[32];

	if (cJSON_GetArraySize(tiers) > 0) {
		printf("\n%-8s %12s %12s %6s %21s %11s\n", "tier", "capacity",
		       "used", "used%", "pages used/total", "alloc-fail");
		cJSON_ArrayForEach(t, tiers) {
			double cap = num(t, "capacity_bytes");
			char pages[48];

			snprintf(pages, sizeof(pages), "%.0f/%.0f",
				 num(t, "used_pages"), num(t, "capacity_pages"));
			printf("%-8s %12s %12s %5.1f%% %21s %11.0f\n",
			       str(t, "tier"), bytes(cap, b1, sizeof(b1)),
			       bytes(num(t, "used_bytes"), b2, sizeof(b2)),
			       cap > 0 ? 100 * num(t, "used_bytes") / cap : 0,
			       pages, num(t, "alloc_failures"));
		}
	}
	if (cJSON_IsObject(c))
		printf("\ncache: pages loaded %.0f (%s), stored %.0f (%s), "
		       "moved %.0f (%s)\n       evicted %.0f, move errors "
		       "%.0f, checksum failures %.0f of %.0f verified, failed "
		       "blocks %.0f, waited %.3f s\n",
		       num(c, "load_pages"),
		       bytes(num(c, "load_bytes"), b1, sizeof(b1)),
		       num(c, "store_pages"),
		       bytes(num(c, "store_bytes"), b2, sizeof(b2)),
		       num(c, "move_pages"),
		       bytes(num(c, "move_bytes"), b3, sizeof(b3)),
		       num(c, "evicted_pages"), num(c, "move_errors"),
		       num(c, "checksum_failures"), num(c, "verified_copies"),
		       num(c, "failed_blocks"), num(c, "wait_seconds"));
	c = cJSON_GetObjectItemCaseSensitive(root, "remote");
	if (cJSON_IsObject(c))
		printf("remote: pages hit %.0f, missed %.0f, stored %.0f "
		       "(%.0f failed), read %s, written %s\n        bad "
		       "values %.0f (failed MAC/checksum: forged or corrupt, "
		       "never served), node errors %.0f, write-through "
		       "dropped %.0f of %.0f\n",
		       num(c, "hits"), num(c, "misses"), num(c, "stored"),
		       num(c, "write_failures"),
		       bytes(num(c, "bytes_read"), b1, sizeof(b1)),
		       bytes(num(c, "bytes_written"), b2, sizeof(b2)),
		       num(c, "bad_values"), num(c, "node_errors"),
		       num(c, "dropped"), num(c, "queued"));
}

/* The data path: who moved the bytes, who hashed them, the devices. */
static void print_datapath(const cJSON *root)
{
	const cJSON *dp = cJSON_GetObjectItemCaseSensitive(root, "datapath");
	const cJSON *devs = cJSON_GetObjectItemCaseSensitive(root, "devices");
	static const char *flows[] = { "restore", "save", "tier" };
	const cJSON *x;
	char b1[32], b2[32], b3[32], b4[32];

	if (!cJSON_IsObject(dp))
		return;
	printf("\ndata path: restore bytes copied by a CPU %s; device "
	       "checksums %.0f, failed %.0f\n",
	       bytes(num(dp, "restore_cpu_copy_bytes"), b1, sizeof(b1)),
	       num(dp, "device_checksums"),
	       num(dp, "device_checksum_failures"));
	if (num(dp, "method_substituted") > 0)
		printf("  device jobs by another method than chosen (batched "
		       "copies not built: one copy per chunk): %.0f\n",
		       num(dp, "method_substituted"));
	printf("  %-8s %12s %12s %12s %12s %12s %12s\n", "flow", "cpu", "io",
	       "copy-engine", "kernel", "cpu-hashed", "dev-hashed");
	for (size_t f = 0; f < sizeof(flows) / sizeof(flows[0]); f++) {
		double m[4] = { 0 };
		static const char *movers[] = { "cpu", "io", "copy_engine",
						"kernel" };

		cJSON_ArrayForEach(x, cJSON_GetObjectItemCaseSensitive(dp,
								       "bytes")) {
			if (strcmp(str(x, "flow"), flows[f]))
				continue;
			for (int k = 0; k < 4; k++)
				if (!strcmp(str(x, "mover"), movers[k]))
					m[k] += num(x, "bytes");
		}
		printf("  %-8s %12s %12s %12s %12s", flows[f],
		       bytes(m[0], b1, sizeof(b1)), bytes(m[1], b2, sizeof(b2)),
		       bytes(m[2], b3, sizeof(b3)), bytes(m[3], b4, sizeof(b4)));
		printf(" %12s %12s\n",
		       bytes(num(cJSON_GetObjectItemCaseSensitive(dp,
				 "cpu_hashed"), flows[f]), b1, sizeof(b1)),
		       bytes(num(cJSON_GetObjectItemCaseSensitive(dp,
				 "device_hashed"), flows[f]), b2, sizeof(b2)));
	}
	cJSON_ArrayForEach(x, devs)
		printf("  device %s%s: copy engines %s, kernels %s, checksummed "
		       "%s, faults %.0f, allocations open %.0f\n",
		       str(x, "device"),
		       cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(x,
				    "emulated")) ? " (emulated: CPU copies)" : "",
		       bytes(num(x, "copy_engine_bytes"), b1, sizeof(b1)),
		       bytes(num(x, "kernel_bytes"), b2, sizeof(b2)),
		       bytes(num(x, "checksum_bytes"), b3, sizeof(b3)),
		       num(x, "faults"), num(x, "live_imports"));
}

/* "name value, name value" for the nonzero members of object @o ("none"). */
static void print_counts(const char *what, const cJSON *o)
{
	const cJSON *v;
	int n = 0;

	printf("  %s:", what);
	cJSON_ArrayForEach(v, o) {
		if (!cJSON_IsNumber(v) || v->valuedouble == 0)
			continue;
		printf("%s %s %.0f", n++ ? "," : "", key(v), v->valuedouble);
	}
	printf("%s\n", n ? "" : " none");
}

static void print_tenant(const cJSON *root, const cJSON *t)
{
	const cJSON *tiers = cJSON_GetObjectItemCaseSensitive(t, "tiers");
	const cJSON *lat = cJSON_GetObjectItemCaseSensitive(t, "latency");
	const cJSON *bounds = cJSON_GetObjectItemCaseSensitive(root, "buckets");
	const cJSON *x;
	double hits = 0, miss = num(t, "misses");
	char b1[32], b2[32], b3[32];
	int n = 0;

	cJSON_ArrayForEach(x, tiers)
		hits += num(x, "hits");
	if (*str(t, "name"))
		printf("\ntenant %s (id %.0f): ", str(t, "name"), num(t, "id"));
	else
		printf("\nnode (no tenant: before HELLO, background work): ");
	if (hits + miss > 0)
		printf("%.0f pages looked up, hit rate %.1f%%, %.0f misses\n",
		       hits + miss, 100 * hits / (hits + miss), miss);
	else
		printf("no lookups\n");
	if (num(t, "fingerprint_conflicts") > 0)
		printf("  warning: %.0f engine(s) published another page-hash "
		       "fingerprint: their pages never match (vLLM: another "
		       "PYTHONHASHSEED, hash algorithm or model)\n",
		       num(t, "fingerprint_conflicts"));
	if (cJSON_GetArraySize(tiers) > 0) {
		printf("  %-8s %10s %10s %10s %10s %10s %15s\n", "tier", "hits",
		       "read-fail", "evicted", "demoted", "csum-fail",
		       "pages/quota");
		cJSON_ArrayForEach(x, tiers) {
			char pq[48] = "-";

			if (cJSON_GetObjectItemCaseSensitive(x, "used_pages")) {
				if (num(x, "quota_pages") > 0)
					snprintf(pq, sizeof(pq), "%.0f/%.0f",
						 num(x, "used_pages"),
						 num(x, "quota_pages"));
				else
					snprintf(pq, sizeof(pq), "%.0f/-",
						 num(x, "used_pages"));
			}
			printf("  %-8s %10.0f %10.0f %10.0f %10.0f %10.0f %15s\n",
			       key(x), num(x, "hits"),
			       num(x, "read_failures"), num(x, "evictions"),
			       num(x, "demotions"), num(x, "checksum_failures"),
			       pq);
		}
	}
	printf("  transfers:");
	cJSON_ArrayForEach(x, cJSON_GetObjectItemCaseSensitive(t,
							       "transfer_bytes"))
		printf("%s %s->%s %s", n++ ? "," : "", str(x, "from"),
		       str(x, "to"), bytes(num(x, "bytes"), b1, sizeof(b1)));
	printf("%s\n", n ? "" : " none");
	print_counts("lease expiries",
		     cJSON_GetObjectItemCaseSensitive(t, "lease_expiries"));
	print_counts("protocol errors",
		     cJSON_GetObjectItemCaseSensitive(t, "protocol_errors"));
	n = 0;
	cJSON_ArrayForEach(x, lat) {
		const cJSON *cum = cJSON_GetObjectItemCaseSensitive(x,
								    "cumulative");
		double count = num(x, "count");

		if (!(count > 0))
			continue;
		if (!n++)
			printf("  %-8s %10s %10s %10s %10s\n", "latency",
			       "count", "p50", "p99", "mean");
		printf("  %-8s %10.0f %10s %10s %10s\n", key(x), count,
		       qdur(bounds, cum, 0.5, b1, sizeof(b1)),
		       qdur(bounds, cum, 0.99, b2, sizeof(b2)),
		       dur(num(x, "sum_seconds") / count, b3, sizeof(b3)));
	}
	if (!n)
		printf("  latency: no operations timed\n");
}

/* Check the document is ours and print it. 0 or an exit code. */
static int print_table(const cJSON *root, const char *tenant)
{
	const cJSON *ts = cJSON_GetObjectItemCaseSensitive(root, "tenants");
	const cJSON *t;
	int shown = 0;

	print_head(root);
	print_tiers(root);
	print_datapath(root);
	cJSON_ArrayForEach(t, ts) {
		if (tenant && strcmp(tenant, str(t, "name")))
			continue;
		print_tenant(root, t);
		shown++;
	}
	if (tenant && !shown) {
		fprintf(stderr, "kvtier stat: no tenant '%s' in the daemon's "
			"metrics\n", tenant);
		return CLI_EXIT_FAIL;
	}
	return 0;
}

/* ---- getting the JSON ---------------------------------------------------------- */

static int fetch_file(const char *path, char **json)
{
	FILE *f = fopen(path, "r");
	size_t len = 0, cap = 65536;
	char *buf;

	if (!f) {
		fprintf(stderr, "kvtier stat: %s: %s\n", path, strerror(errno));
		return CLI_EXIT_FAIL;
	}
	buf = malloc(cap);
	while (buf) {
		size_t r = fread(buf + len, 1, cap - len - 1, f);

		len += r;
		if (len < cap - 1)
			break;
		if (cap >= (64u << 20)) {
			fprintf(stderr, "kvtier stat: %s: over 64 MiB\n", path);
			free(buf);
			fclose(f);
			return CLI_EXIT_FAIL;
		}
		cap *= 2;
		{
			char *nb = realloc(buf, cap);

			if (!nb)
				free(buf);
			buf = nb;
		}
	}
	fclose(f);
	if (!buf)
		return cli_fail("stat", -ENOMEM);
	buf[len] = 0;
	*json = buf;
	return 0;
}

/*
 * Ask the daemon: connect as a monitor (HELLO with no geometry: allowed
 * when any tenant allows our uid/gid, and answered for STATS only), send
 * STATS, disconnect. The socket and namespace come from the options
 * (--socket, --config, KVT_SOCKET, KVT_NAMESPACE) as for `kvtier serve`.
 */
static int fetch_daemon(const kvt_opts *o, const char *socket, char **json)
{
#ifdef STAT_HAVE_CLIENT
	kvt_client_config cfg = KVT_CLIENT_CONFIG_INIT;
	kvt_client *cl;
	char *text;
	int err;

	cfg.socket = socket ? socket : kvt_opts_get(o, "socket");
	cfg.ns = kvt_opts_get(o, "namespace");
	err = kvt_client_connect(&cl, &cfg);
	if (err) {
		fprintf(stderr, "kvtier stat: daemon at %s: %s\n", cfg.socket,
			*kvt_errdetail() ? kvt_errdetail() : kvt_strerror(err));
		return CLI_EXIT_FAIL;
	}
	err = kvt_client_stats(cl, &text);
	kvt_client_close(cl);
	if (err)
		return cli_fail("stat", err);
	*json = text; /* malloc'ed by the client library, free()d by once() */
	return 0;
#else
	fprintf(stderr, "kvtier stat: this build has no client library "
		"(<kvtier/client.h>) to ask a daemon%s%s; --from-file reads "
		"a saved `kvtier stat --json`\n", socket ? " at " : "",
		socket ? socket : "");
	return CLI_EXIT_FAIL;
#endif
}

static volatile sig_atomic_t stop;

static void on_signal(int sig)
{
	stop = 1;
}

/* One refresh: fetch, check, print. 0 or an exit code. */
struct stat_args {
	const kvt_opts *o;
	const char *socket, *file, *tenant;
	int json;
};

static int once(const struct stat_args *a, int watch)
{
	const char *file = a->file, *tenant = a->tenant;
	int json = a->json;
	char *text = NULL;
	cJSON *root;
	int rc;
	double fmt;

	rc = file ? fetch_file(file, &text) :
		    fetch_daemon(a->o, a->socket, &text);
	if (rc)
		return rc;
	root = cJSON_Parse(text);
	if (!root || !cJSON_IsObject(root)) {
		fprintf(stderr, "kvtier stat: %s: not valid JSON metrics\n",
			file ? file : "the daemon's reply");
		rc = CLI_EXIT_FAIL;
		goto out;
	}
	fmt = num(root, "format");
	if (fmt != METRICS_FORMAT) {
		fprintf(stderr, "kvtier stat: metrics format %.0f, this kvtier "
			"reads format %d\n", fmt, METRICS_FORMAT);
		rc = CLI_EXIT_FAIL;
		goto out;
	}
	if (json) {
		char *s = watch ? cJSON_PrintUnformatted(root) :
				  cJSON_Print(root);

		if (s)
			printf("%s\n", s);
		cJSON_free(s);
	} else {
		if (watch && isatty(STDOUT_FILENO))
			printf("\033[H\033[2J");
		rc = print_table(root, tenant);
	}
	fflush(stdout);
out:
	cJSON_Delete(root);
	free(text);
	return rc;
}

int cmd_stat(int argc, char **argv)
{
	static const struct option lo[] = {
		{ "socket", required_argument, 0, 's' },
		{ "json", no_argument, 0, 'j' },
		{ "watch", required_argument, 0, 'w' },
		{ "count", required_argument, 0, 'n' },
		{ "tenant", required_argument, 0, 't' },
		{ "from-file", required_argument, 0, 'f' },
		{ "config", required_argument, 0, 'c' },
		{ "help", no_argument, 0, 'h' },
		{ 0, 0, 0, 0 }
	};
	struct stat_args a = { 0 };
	double watch = 0;
	uint64_t count = 0;
	kvt_opts *o;
	int c, rc = 0, err;

	if ((err = kvt_opts_create(&o)))
		return cli_fail("stat", err);
	if ((rc = cli_opts_load(o, "stat", cli_config_arg(argc, argv))))
		goto out;
	a.o = o;
	optind = 1;
	while ((c = getopt_long(argc, argv, "jh", lo, NULL)) != -1) {
		switch (c) {
		case 's':
			if (!*optarg) {
				rc = cli_usage("stat", "--socket: empty path");
				goto out;
			}
			a.socket = optarg;
			break;
		case 'j':
			a.json = 1;
			break;
		case 'w':
			if (cli_double("--watch", optarg, 0.1, 86400, &watch))
				rc = CLI_EXIT_USAGE;
			break;
		case 'n':
			if (cli_u64("--count", optarg, 1, UINT32_MAX, &count))
				rc = CLI_EXIT_USAGE;
			break;
		case 't':
			a.tenant = optarg;
			break;
		case 'f':
			a.file = optarg;
			break;
		case 'c':
			break; /* read before the environment */
		case 'h':
			usage(stdout);
			goto out;
		default:
			usage(stderr);
			rc = CLI_EXIT_USAGE;
			goto out;
		}
		if (rc)
			goto out;
	}
	if (optind < argc)
		rc = cli_usage("stat", "unexpected argument '%s'", argv[optind]);
	else if (count && !watch)
		rc = cli_usage("stat", "--count needs --watch");
	else if (a.file && a.socket)
		rc = cli_usage("stat", "--from-file and --socket exclude each "
			       "other");
	else if (a.json && a.tenant)
		rc = cli_usage("stat", "--tenant selects rows of the table; "
			       "--json prints the daemon's document whole");
	if (rc)
		goto out;
	if (!watch) {
		rc = once(&a, 0);
		goto out;
	}
	signal(SIGINT, on_signal);
	signal(SIGTERM, on_signal);
	for (uint64_t i = 0; !stop; i++) {
		struct timespec ts = { (time_t)watch,
				       (long)((watch - floor(watch)) * 1e9) };

		rc = once(&a, 1);
		if (rc || (count && i + 1 == count))
			break;
		while (nanosleep(&ts, &ts) && !stop)
			;
	}
out:
	kvt_opts_destroy(o);
	return rc;
}
