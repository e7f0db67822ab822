/*
 * bench_remote.c — kvtier bench remote: how fast the remote tier gets a
 * batch of pages out of Redis, against redis-benchmark moving values of the
 * same size, pipelined as deep, in the same run.
 *
 * Setup (untimed): unless --url names a server, a redis-server of its own
 * on a free loopback port (no persistence), in a temporary directory,
 * killed at the end. --pages pages of --model with --page-tokens tokens
 * (Llama-3.1-8B, 32 tokens: 4 MiB each) are stored with kvt_remote_set()
 * (timed once: set_gbps), and redis-benchmark's own key is set to a value
 * of the same size. Then each repeat, in turn:
 *
 *   get   kvt_remote_get() of every page in one call: one pipelined round
 *         trip; headers and per-layer XXH3 checked, pages copied into the
 *         caller's buffers
 *   ref   redis-benchmark -c 1 -P <pages> -n 2*<pages> -d <value bytes>
 *         -t get: one connection, the same pipeline depth; its requests
 *         per second times the value size (the reference)
 *   ref1  the same with -P 1: no pipelining, one request at a time (on
 *         loopback with 4 MiB values Redis is faster this way than with a
 *         deep pipeline, so this is the harder reference)
 *
 * Reported: medians over repeats; get_gbps counts page bytes (the header,
 * 0.01% of a 4 MiB page, is left out), redis_benchmark_gbps value bytes;
 * ratio = get / redis-benchmark at the same depth (goal >= 0.8, issue
 * 12); ratio_vs_p1 = get / redis-benchmark -P 1.
 */
#include "cli.h"

#include <errno.h>
#include <getopt.h>
#include <hiredis/hiredis.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/utsname.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define MAX_REP 64

struct ropt {
	const char *url, *model;
	uint64_t pages, page_tokens, repeats;
	int json;
};

struct rbench {
	struct ropt o;
	kvt_geom g;
	uint64_t page, value;
	char host[256];
	int port, cluster;
	pid_t server;
	char dir[64];
	char spec[512];
	kvt_remote *r;
	kvt_page_key *keys;
	uint8_t *pages;
	double set_s;
	double get_s[MAX_REP], ref_gbps[MAX_REP], ref1_gbps[MAX_REP];
	int nruns;
	char rb_version[64];
};

/* ---- a redis-server of our own ----------------------------------------- */

static int port_free(int port)
{
	struct sockaddr_in a = { .sin_family = AF_INET,
				 .sin_port = htons((uint16_t)port),
				 .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
	int fd = socket(AF_INET, SOCK_STREAM, 0), ok;

	ok = fd >= 0 && bind(fd, (struct sockaddr *)&a, sizeof(a)) == 0;
	if (fd >= 0)
		close(fd);
	return ok;
}

static int ping(const char *host, int port)
{
	struct timeval tv = { 1, 0 };
	redisContext *c = redisConnectWithTimeout(host, port, tv);
	redisReply *r = NULL;
	int ok = 0;

	if (c && !c->err) {
		redisSetTimeout(c, tv);
		r = redisCommand(c, "PING");
		ok = r && r->type == REDIS_REPLY_STATUS &&
		     !strcmp(r->str, "PONG");
	}
	if (r)
		freeReplyObject(r);
	if (c)
		redisFree(c);
	return ok;
}

static int start_server(struct rbench *b)
{
	char portstr[16];
	uint64_t seed = kvt_now_ns() ^ (uint64_t)getpid();

	snprintf(b->dir, sizeof(b->dir), "/tmp/kvtier-bench-remote.XXXXXX");
	if (!mkdtemp(b->dir)) {
		fprintf(stderr, "kvtier bench remote: cannot make a temporary "
			"directory: %s\n", strerror(errno));
		return CLI_EXIT_FAIL;
	}
	for (int t = 0; t < 1000 && !b->port; t++) {
		seed = seed * 6364136223846793005ull + 1442695040888963407ull;
		int p = 20000 + (int)((seed >> 33) % 40000);
		if (port_free(p))
			b->port = p;
	}
	if (!b->port) {
		fprintf(stderr, "kvtier bench remote: no free loopback port\n");
		return CLI_EXIT_FAIL;
	}
	snprintf(b->host, sizeof(b->host), "127.0.0.1");
	snprintf(portstr, sizeof(portstr), "%d", b->port);
	b->server = fork();
	if (b->server < 0)
		return cli_fail("bench remote: fork", -errno);
	if (b->server == 0) {
		prctl(PR_SET_PDEATHSIG, SIGKILL);
		if (!freopen("/dev/null", "w", stdout))
			_exit(126);
		execlp("redis-server", "redis-server", "--port", portstr,
		       "--bind", "127.0.0.1", "--save", "", "--appendonly",
		       "no", "--dir", b->dir, "--daemonize", "no", (char *)NULL);
		fprintf(stderr, "kvtier bench remote: cannot run redis-server "
			"(%s): install it (scripts/bootstrap) or give --url\n",
			strerror(errno));
		_exit(127);
	}
	for (int t = 0; t < 200; t++) {
		int st;

		if (ping(b->host, b->port))
			return 0;
		if (waitpid(b->server, &st, WNOHANG) == b->server) {
			b->server = 0;
			return CLI_EXIT_FAIL;
		}
		struct timespec ts = { 0, 50000000 };
		nanosleep(&ts, NULL);
	}
	fprintf(stderr, "kvtier bench remote: redis-server on port %d did not "
		"answer within 10 s\n", b->port);
	return CLI_EXIT_FAIL;
}

static void stop_server(struct rbench *b)
{
	char cmd[128];

	if (b->server > 0) {
		kill(b->server, SIGTERM);
		waitpid(b->server, NULL, 0);
	}
	if (b->dir[0]) {
		snprintf(cmd, sizeof(cmd), "rm -rf '%s'", b->dir);
		if (system(cmd) != 0)
			fprintf(stderr, "kvtier bench remote: could not remove "
				"%s\n", b->dir);
	}
}

/* The first HOST:PORT of --url, for redis-benchmark. */
static int url_addr(struct rbench *b)
{
	const char *p = b->o.url, *colon, *end;

	if (!strncmp(p, "remote:", 7))
		p += 7;
	b->cluster = strstr(p, "-cluster://") != NULL;
	p = strstr(p, "://") + 3; /* kvt_remote_open() has checked it */
	end = p + strcspn(p, ",");
	colon = end;
	while (colon > p && *colon != ':')
		colon--;
	if ((size_t)(colon - p) >= sizeof(b->host))
		return -1;
	memcpy(b->host, p, (size_t)(colon - p));
	b->host[colon - p] = 0;
	b->port = atoi(colon + 1);
	if (strstr(b->o.url, "auth="))
		fprintf(stderr, "kvtier bench remote: note: redis-benchmark is "
			"run without the password (give it a server without "
			"auth for the reference)\n");
	return 0;
}

/* ---- the runs ----------------------------------------------------------- */

static int store(struct rbench *b)
{
	const void **bufs = malloc(b->o.pages * sizeof(void *));
	uint64_t seed = 0x243F6A8885A308D3ull, t0;
	int got;

	if (!bufs)
		return -ENOMEM;
	for (uint64_t i = 0; i < b->o.pages; i++) {
		b->keys[i].lo = 0xbe7c4000ull + i;
		b->keys[i].hi = 0x5eed;
		bufs[i] = b->pages + i * b->page;
	}
	for (uint64_t i = 0; i < b->o.pages * b->page / 8; i++) {
		seed ^= seed << 13, seed ^= seed >> 7, seed ^= seed << 17;
		memcpy(b->pages + i * 8, &seed, 8);
	}
	t0 = kvt_now_ns();
	got = kvt_remote_set(b->r, b->keys, b->o.pages, bufs, NULL, NULL);
	b->set_s = (kvt_now_ns() - t0) / 1e9;
	free(bufs);
	if (got != (int)b->o.pages) {
		fprintf(stderr, "kvtier bench remote: the server took %d of "
			"%llu pages (see the warnings above; maxmemory?)\n",
			got, (unsigned long long)b->o.pages);
		return -EIO;
	}
	return 0;
}

static int time_get(struct rbench *b, double *s)
{
	void **bufs = malloc(b->o.pages * sizeof(void *));
	uint8_t *ok = malloc(b->o.pages);
	uint64_t t0;
	int got;

	if (!bufs || !ok) {
		free(bufs);
		free(ok);
		return -ENOMEM;
	}
	for (uint64_t i = 0; i < b->o.pages; i++)
		bufs[i] = b->pages + i * b->page;
	t0 = kvt_now_ns();
	got = kvt_remote_get(b->r, b->keys, b->o.pages, bufs, ok, NULL);
	*s = (kvt_now_ns() - t0) / 1e9;
	free(bufs);
	free(ok);
	if (got != (int)b->o.pages) {
		fprintf(stderr, "kvtier bench remote: got %d of %llu pages\n",
			got, (unsigned long long)b->o.pages);
		return -EIO;
	}
	return 0;
}

/* Run redis-benchmark; its GET (or SET) requests per second, or < 0. */
static double redis_benchmark(struct rbench *b, const char *test, uint64_t n,
			      uint64_t depth)
{
	char cmd[512], line[512];
	double rps = -1;
	FILE *p;

	snprintf(cmd, sizeof(cmd), "redis-benchmark -h %s -p %d%s -c 1 -P %llu "
		 "-n %llu -d %llu -t %s --csv 2>&1", b->host, b->port,
		 b->cluster ? " --cluster" : "",
		 (unsigned long long)depth, (unsigned long long)n,
		 (unsigned long long)b->value, test);
	if (!(p = popen(cmd, "r")))
		return -1;
	while (fgets(line, sizeof(line), p)) {
		char want[32];

		snprintf(want, sizeof(want), "\"%s\",\"", test);
		for (char *c = want; *c; c++)
			if (*c >= 'a' && *c <= 'z')
				*c = (char)(*c - 'a' + 'A');
		if (!strncmp(line, want, strlen(want)))
			rps = atof(line + strlen(want));
	}
	if (pclose(p) != 0)
		return -1;
	return rps;
}

static void rb_version(struct rbench *b)
{
	FILE *p = popen("redis-benchmark --version 2>/dev/null", "r");

	b->rb_version[0] = 0;
	if (p) {
		if (fgets(b->rb_version, sizeof(b->rb_version), p))
			b->rb_version[strcspn(b->rb_version, "\n")] = 0;
		pclose(p);
	}
}

/* ---- the report ----------------------------------------------------------- */

static double median_of(const double *v, int n)
{
	return cli_median(v, n);
}

static void report(struct rbench *b)
{
	double gbps[MAX_REP], get, ref, ref1, ratio, gmin = 1e30, gmax = 0,
	       rmin = 1e30, rmax = 0;
	uint64_t bytes = b->o.pages * b->page;
	kvt_remote_stat st;

	for (int i = 0; i < b->nruns; i++) {
		gbps[i] = bytes / b->get_s[i] / 1e9;
		gmin = gbps[i] < gmin ? gbps[i] : gmin;
		gmax = gbps[i] > gmax ? gbps[i] : gmax;
		rmin = b->ref_gbps[i] < rmin ? b->ref_gbps[i] : rmin;
		rmax = b->ref_gbps[i] > rmax ? b->ref_gbps[i] : rmax;
	}
	get = median_of(gbps, b->nruns);
	ref = median_of(b->ref_gbps, b->nruns);
	ref1 = median_of(b->ref1_gbps, b->nruns);
	ratio = ref > 0 ? get / ref : 0;
	kvt_remote_stat_get(b->r, &st);
	if (b->o.json) {
		cJSON *root = cJSON_CreateObject(), *o, *a;
		struct utsname u;
		kvt_machine m;

		kvt_probe(&m);
		cJSON_AddNumberToObject(root, "version", 1);
		cJSON_AddStringToObject(root, "bench", "remote");
		cJSON_AddStringToObject(root, "server", b->o.url ? b->o.url :
					"own redis-server on loopback");
		cJSON_AddStringToObject(root, "redis_benchmark", b->rb_version);
		cJSON_AddStringToObject(root, "model", b->g.name);
		cJSON_AddNumberToObject(root, "page_tokens", b->g.page_tokens);
		cJSON_AddNumberToObject(root, "pages", (double)b->o.pages);
		cJSON_AddNumberToObject(root, "page_bytes", (double)b->page);
		cJSON_AddNumberToObject(root, "value_bytes", (double)b->value);
		cJSON_AddNumberToObject(root, "repeats", b->nruns);
		cJSON_AddNumberToObject(root, "get_gbps", get);
		cJSON_AddNumberToObject(root, "get_gbps_min", gmin);
		cJSON_AddNumberToObject(root, "get_gbps_max", gmax);
		cJSON_AddNumberToObject(root, "set_gbps",
					bytes / b->set_s / 1e9);
		cJSON_AddNumberToObject(root, "redis_benchmark_gbps", ref);
		cJSON_AddNumberToObject(root, "redis_benchmark_gbps_min", rmin);
		cJSON_AddNumberToObject(root, "redis_benchmark_gbps_max", rmax);
		cJSON_AddNumberToObject(root, "ratio", ratio);
		cJSON_AddNumberToObject(root, "redis_benchmark_p1_gbps", ref1);
		cJSON_AddNumberToObject(root, "ratio_vs_p1",
					ref1 > 0 ? get / ref1 : 0);
		o = cJSON_AddObjectToObject(root, "goals");
		cJSON_AddNumberToObject(o, "ratio", 0.8);
		cJSON_AddBoolToObject(o, "ratio_met", ratio >= 0.8);
		o = cJSON_AddObjectToObject(root, "remote_stat");
		cJSON_AddNumberToObject(o, "hits", (double)st.hits);
		cJSON_AddNumberToObject(o, "misses", (double)st.misses);
		cJSON_AddNumberToObject(o, "bad_values", (double)st.bad_values);
		cJSON_AddNumberToObject(o, "read_failures",
					(double)st.read_failures);
		cJSON_AddNumberToObject(o, "bytes_read", (double)st.bytes_read);
		cJSON_AddNumberToObject(o, "bytes_written",
					(double)st.bytes_written);
		o = cJSON_AddObjectToObject(root, "machine");
		if (uname(&u) == 0)
			cJSON_AddStringToObject(o, "kernel", u.release);
		cJSON_AddNumberToObject(o, "cpus", m.cpus);
		cJSON_AddNumberToObject(o, "mem_total", (double)m.mem_total);
		a = cJSON_AddArrayToObject(root, "runs");
		for (int i = 0; i < b->nruns; i++) {
			cJSON *e = cJSON_CreateObject();

			cJSON_AddNumberToObject(e, "get_s", b->get_s[i]);
			cJSON_AddNumberToObject(e, "get_gbps", gbps[i]);
			cJSON_AddNumberToObject(e, "redis_benchmark_gbps",
						b->ref_gbps[i]);
			cJSON_AddNumberToObject(e, "redis_benchmark_p1_gbps",
						b->ref1_gbps[i]);
			cJSON_AddItemToArray(a, e);
		}
		cli_json_print(root);
		return;
	}
	printf("kvtier bench remote: %llu pages of %s (%u tokens, %.2f MiB "
	       "each) from %s\n", (unsigned long long)b->o.pages, b->g.name,
	       b->g.page_tokens, b->page / 1048576.0,
	       b->o.url ? b->o.url : "its own redis-server on loopback");
	printf("  get (one batch)      %.2f GB/s (%.2f-%.2f), medians of %d\n",
	       get, gmin, gmax, b->nruns);
	printf("  set (one batch)      %.2f GB/s (once)\n",
	       bytes / b->set_s / 1e9);
	printf("  redis-benchmark get  %.2f GB/s (%.2f-%.2f), -c 1 -P %llu\n",
	       ref, rmin, rmax, (unsigned long long)b->o.pages);
	printf("  redis-benchmark get  %.2f GB/s, -c 1 -P 1 (no pipeline): "
	       "ratio %.2f\n", ref1, ref1 > 0 ? get / ref1 : 0);
	printf("  ratio                %.2f  goal >= 0.8: %s\n", ratio,
	       ratio >= 0.8 ? "met" : "MISSED");
}

/* ---- the command --------------------------------------------------------- */

static void remote_usage(FILE *f)
{
	fprintf(f,
"usage: kvtier bench remote [--url SPEC] [--pages N] [--model NAME|CONFIG]\n"
"                           [--page-tokens P] [--repeats R] [--json]\n"
"\n"
"Gets N pages in one batch from Redis through the remote tier, and runs\n"
"redis-benchmark (GET, values of the same size, one connection, N deep\n"
"pipeline) in the same run. Starts its own redis-server on a free loopback\n"
"port unless --url names one (its data is overwritten: keys 'kvtbench:*'\n"
"and redis-benchmark's 'key:__rand_int__').\n"
"\n"
"  --url SPEC         remote spec, e.g. redis://10.0.0.5:6379 (see\n"
"                     docs/REMOTE.md); default: a server of its own\n"
"  --pages N          pages per batch (default 64)\n"
"  --model M          preset or config.json (default llama-3.1-8b)\n"
"  --page-tokens P    tokens per page (default 32: 4 MiB pages)\n"
"  --repeats R        repeats (default 5)\n"
"  --json             one JSON object (fields in docs/REMOTE.md)\n");
}

static int parse_args(int argc, char **argv, struct ropt *o)
{
	static const struct option lo[] = {
		{ "url", required_argument, 0, 'u' },
		{ "pages", required_argument, 0, 'n' },
		{ "model", required_argument, 0, 'm' },
		{ "page-tokens", required_argument, 0, 'p' },
		{ "repeats", required_argument, 0, 'R' },
		{ "json", no_argument, 0, 'j' },
		{ "help", no_argument, 0, 'h' },
		{ 0, 0, 0, 0 }
	};
	int c;

	optind = 1;
	while ((c = getopt_long(argc, argv, "h", lo, NULL)) != -1) {
		switch (c) {
		case 'u': o->url = optarg; break;
		case 'n': if (cli_u64("--pages", optarg, 1, 4096, &o->pages)) return -1; break;
		case 'm': o->model = optarg; break;
		case 'p': if (cli_u64("--page-tokens", optarg, 1, 1u << 16, &o->page_tokens)) return -1; break;
		case 'R': if (cli_u64("--repeats", optarg, 1, MAX_REP, &o->repeats)) return -1; break;
		case 'j': o->json = 1; break;
		case 'h': remote_usage(stdout); return 1;
		default: cli_usage("bench remote", "bad option"); return -1;
		}
	}
	if (optind < argc) {
		cli_usage("bench remote", "unexpected argument '%s'", argv[optind]);
		return -1;
	}
	return 0;
}

int bench_remote(int argc, char **argv)
{
	static struct rbench b;
	double rps, rps1;
	int err, rc = 0;

	memset(&b, 0, sizeof(b));
	b.o = (struct ropt){ .model = "llama-3.1-8b", .pages = 64,
			     .page_tokens = 32, .repeats = 5 };
	if ((rc = parse_args(argc, argv, &b.o)))
		return rc > 0 ? 0 : CLI_EXIT_USAGE;
	if ((err = cli_geom(&b.g, b.o.model, (uint32_t)b.o.page_tokens, 1, 0)))
		return cli_fail("bench remote", err);
	b.page = kvt_geom_page_bytes(&b.g);
	if (b.page * b.o.pages > (8ull << 30))
		return cli_usage("bench remote", "%llu pages of %llu bytes: "
				 "more than 8 GiB in one batch",
				 (unsigned long long)b.o.pages,
				 (unsigned long long)b.page);
	if (b.o.url) {
		/* check the spec before anything runs */
		if ((err = kvt_remote_open(&b.r, b.o.url, &b.g)))
			return cli_fail("bench remote --url", err);
		if (url_addr(&b))
			return cli_usage("bench remote", "--url: host too long");
	} else {
		if ((rc = start_server(&b)))
			goto out;
		snprintf(b.spec, sizeof(b.spec), "redis://%s:%d,prefix=kvtbench:,"
			 "timeout=30000", b.host, b.port);
		if ((err = kvt_remote_open(&b.r, b.spec, &b.g))) {
			rc = cli_fail("bench remote", err);
			goto out;
		}
	}
	b.value = kvt_remote_value_bytes(b.r);
	b.keys = malloc(b.o.pages * sizeof(*b.keys));
	b.pages = malloc(b.o.pages * b.page);
	if (!b.keys || !b.pages) {
		rc = cli_fail("bench remote", -ENOMEM);
		goto out;
	}
	rb_version(&b);
	if ((err = store(&b))) {
		rc = cli_fail("bench remote: store", err);
		goto out;
	}
	/* redis-benchmark's key, and one untimed round of each */
	if (redis_benchmark(&b, "set", 1, 1) < 0) {
		fprintf(stderr, "kvtier bench remote: redis-benchmark failed "
			"(installed? scripts/bootstrap)\n");
		rc = CLI_EXIT_FAIL;
		goto out;
	}
	if ((err = time_get(&b, &b.get_s[0])) ||
	    redis_benchmark(&b, "get", b.o.pages, b.o.pages) < 0) {
		rc = cli_fail("bench remote: warm-up", err ? err : -EIO);
		goto out;
	}
	for (b.nruns = 0; b.nruns < (int)b.o.repeats; b.nruns++) {
		if ((err = time_get(&b, &b.get_s[b.nruns]))) {
			rc = cli_fail("bench remote: get", err);
			goto out;
		}
		rps = redis_benchmark(&b, "get", 2 * b.o.pages, b.o.pages);
		rps1 = redis_benchmark(&b, "get", 2 * b.o.pages, 1);
		if (rps <= 0 || rps1 <= 0) {
			fprintf(stderr, "kvtier bench remote: redis-benchmark "
				"gave no GET figure\n");
			rc = CLI_EXIT_FAIL;
			goto out;
		}
		b.ref_gbps[b.nruns] = rps * (double)b.value / 1e9;
		b.ref1_gbps[b.nruns] = rps1 * (double)b.value / 1e9;
	}
	report(&b);
out:
	kvt_remote_close(b.r);
	stop_server(&b);
	free(b.keys);
	free(b.pages);
	return rc;
}
