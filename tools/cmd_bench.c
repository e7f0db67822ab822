/*
 * cmd_bench.c — kvtier bench <what>: run one benchmark. Each prints a
 * human summary, or one JSON object with --json. Benchmarks report medians
 * over repeats and ratios against a baseline measured in the same run.
 */
#include "cli.h"

#include <string.h>

static const struct {
	const char *name;
	int (*fn)(int argc, char **argv);
	const char *summary;
} benches[] = {
	{ "pool", bench_pool, "page pool alloc+free pairs per second" },
	{ "index", bench_index, "radix index match/insert time, memory, replay" },
	{ "sim", bench_sim, "simulator speed: 10,000 long-context requests" },
	{ "xfer", bench_xfer, "transfer engine GB/s vs one contiguous copy" },
	{ "cache", bench_cache, "layer-wise cache load into engine memory vs bare copy" },
	{ "remote", bench_remote, "batch GET of pages from Redis vs redis-benchmark" },
	{ "server", bench_server, "daemon load into a client process vs the in-process cache" },
	{ "contend", bench_contend, "one tenant's lookup latency while another's stores evict" },
};

static void bench_usage(FILE *f)
{
	fprintf(f, "usage: kvtier bench <what> [--json] [options]\n\n");
	for (size_t i = 0; i < sizeof(benches) / sizeof(benches[0]); i++)
		fprintf(f, "  %-8s %s\n", benches[i].name, benches[i].summary);
}

int cmd_bench(int argc, char **argv)
{
	if (argc < 2) {
		bench_usage(stderr);
		return CLI_EXIT_USAGE;
	}
	if (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h")) {
		bench_usage(stdout);
		return 0;
	}
	for (size_t i = 0; i < sizeof(benches) / sizeof(benches[0]); i++)
		if (!strcmp(argv[1], benches[i].name))
			return benches[i].fn(argc - 1, argv + 1);
	fprintf(stderr, "kvtier bench: unknown benchmark '%s'\n", argv[1]);
	bench_usage(stderr);
	return CLI_EXIT_USAGE;
}
