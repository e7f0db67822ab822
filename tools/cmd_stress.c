/*
 * cmd_stress.c — kvtier stress: run the memory stressor (N threads, each
 * copying between two buffers) for a while and report each thread's GB/s.
 */
#include "cli.h"

#include <getopt.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static void stress_usage(FILE *f)
{
	fprintf(f,
"usage: kvtier stress [--threads N] [--buffer-bytes B] [--seconds S]\n"
"                     [--interval S] [--json]\n"
"\n"
"Each of N threads copies continuously between two buffers of B bytes\n"
"(streaming stores, as a large memcpy), reporting its own GB/s: the CPU\n"
"memory contention that tokenizers, RAG and orchestration put on a node.\n"
"It stops by itself after S seconds. Copied GB/s count each byte once;\n"
"memory traffic is twice that.\n"
"\n"
"  --threads N        stressor threads (default 1, at most 256)\n"
"  --buffer-bytes B   size of each of a thread's two buffers (default 4G,\n"
"                     as in the published experiment; K/M/G suffixes)\n"
"  --seconds S        how long (default 10, at most 86400)\n"
"  --interval S       print the total rate every S seconds (default 1;\n"
"                     0: only at the end)\n"
"  --json             one JSON object at the end\n");
}

static void sleep_s(double s)
{
	struct timespec ts = { (time_t)s, (long)((s - (time_t)s) * 1e9) };

	nanosleep(&ts, NULL);
}

static int parse_secs(const char *flag, const char *s, double lo, double hi,
		      double *out)
{
	char *end;
	double v = strtod(s, &end);

	if (!*s || *end || !(v >= lo && v <= hi)) {
		fprintf(stderr, "kvtier stress: %s: '%s' is not a number of "
			"seconds in %g..%g\n", flag, s, lo, hi);
		return -1;
	}
	*out = v;
	return 0;
}

int cmd_stress(int argc, char **argv)
{
	static const struct option lo[] = {
		{ "threads", required_argument, 0, 't' },
		{ "buffer-bytes", required_argument, 0, 'b' },
		{ "seconds", required_argument, 0, 's' },
		{ "interval", required_argument, 0, 'i' },
		{ "json", no_argument, 0, 'j' },
		{ "help", no_argument, 0, 'h' },
		{ 0, 0, 0, 0 }
	};
	uint64_t threads = 1, bytes = 4ull << 30;
	double seconds = 10, interval = 1, elapsed = 0;
	kvt_stress_stat st;
	kvt_stress *s;
	cJSON *samples = NULL;
	int json = 0, c, err;

	optind = 1;
	while ((c = getopt_long(argc, argv, "h", lo, NULL)) != -1) {
		switch (c) {
		case 't':
			if (cli_u64("--threads", optarg, 1,
				    KVT_STRESS_MAX_THREADS, &threads))
				return CLI_EXIT_USAGE;
			break;
		case 'b':
			if (kvt_size_parse(optarg, &bytes) || bytes < (1u << 20))
				return cli_usage("stress", "--buffer-bytes: '%s' "
						 "is not a size of at least 1M",
						 optarg);
			break;
		case 's':
			if (parse_secs("--seconds", optarg, 0.01, 86400, &seconds))
				return CLI_EXIT_USAGE;
			break;
		case 'i':
			if (parse_secs("--interval", optarg, 0, 3600, &interval))
				return CLI_EXIT_USAGE;
			break;
		case 'j':
			json = 1;
			break;
		case 'h':
			stress_usage(stdout);
			return 0;
		default:
			return cli_usage("stress", "bad option");
		}
	}
	if (optind < argc)
		return cli_usage("stress", "unexpected argument '%s'",
				 argv[optind]);
	if ((err = kvt_stress_start(&s, (unsigned)threads, bytes, seconds)))
		return cli_fail("stress", err);
	if (json)
		samples = cJSON_CreateArray();
	while (elapsed < seconds) {
		double step = interval > 0 && interval < seconds - elapsed ?
				      interval : seconds - elapsed;
		sleep_s(step);
		elapsed += step;
		kvt_stress_sample(s, &st);
		if (interval > 0 && !json)
			printf("%6.1f s  %8.2f GB/s  (%u thread%s)\n", st.seconds,
			       st.gbps, st.threads, st.threads == 1 ? "" : "s");
		if (samples) {
			cJSON *o = cJSON_CreateObject();
			cJSON_AddNumberToObject(o, "t", st.seconds);
			cJSON_AddNumberToObject(o, "gbps", st.gbps);
			cJSON_AddItemToArray(samples, o);
		}
		if (!st.running)
			break;
	}
	kvt_stress_stop(s, &st);
	if (json) {
		cJSON *root = cJSON_CreateObject(), *a;
		cJSON_AddNumberToObject(root, "threads", st.threads);
		cJSON_AddNumberToObject(root, "buffer_bytes", (double)bytes);
		cJSON_AddNumberToObject(root, "seconds", st.seconds);
		cJSON_AddNumberToObject(root, "gbps", st.gbps);
		cJSON_AddNumberToObject(root, "bytes", (double)st.bytes);
		a = cJSON_AddArrayToObject(root, "thread_gbps");
		for (unsigned i = 0; i < st.threads; i++)
			cJSON_AddItemToArray(a, cJSON_CreateNumber(st.thread_gbps[i]));
		cJSON_AddItemToObject(root, "samples", samples);
		cli_json_print(root);
		return 0;
	}
	printf("\n%u stressor thread%s, two buffers of ", st.threads,
	       st.threads == 1 ? "" : "s");
	{
		char b[32];
		printf("%s each, %.1f s: %.2f GB/s copied in total\n",
		       kvt_size_format(bytes, b, sizeof(b)), st.seconds, st.gbps);
	}
	for (unsigned i = 0; i < st.threads; i++)
		printf("  thread %-3u %8.2f GB/s\n", i, st.thread_gbps[i]);
	return 0;
}
