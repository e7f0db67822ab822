/*
 * cmd_trace.c — kvtier trace replay FILE [--capacity B[,B...]]
 * [--policy lru|lfu] [--json]: replay a Mooncake trace through the index
 * at one or more capacities (in blocks; 0 = unbounded) and report the
 * prefix hit rate of each. The replay itself is kvt_index_replay().
 */
#include "cli.h"

#include <getopt.h>
#include <string.h>

#define MAXCAP 64

static void usage(FILE *f)
{
	fprintf(f,
		"usage: kvtier trace replay FILE [--capacity BLOCKS[,BLOCKS...]]\n"
		"                         [--policy lru|lfu] [--json]\n\n"
		"Replay a Mooncake-format trace (one JSON request per line:\n"
		"timestamp, input_length, output_length, hash_ids) through the\n"
		"radix index, in file order. Per request, the leading blocks\n"
		"already cached count as hits (a prefix hit stops at the first\n"
		"miss); then all its blocks are inserted or touched.\n\n"
		"  --capacity LIST  tier sizes in blocks, comma-separated; 0 is\n"
		"                   unbounded (default: 1/32, 1/8 and 1/2 of the\n"
		"                   trace's distinct blocks, and unbounded)\n"
		"  --policy P       eviction order: lru (default) or lfu\n"
		"  --json           one JSON object (docs/FORMATS.md)\n");
}

static int replay(int argc, char **argv)
{
	static const struct option lo[] = {
		{ "capacity", required_argument, 0, 'c' },
		{ "policy", required_argument, 0, 'p' },
		{ "json", no_argument, 0, 'j' },
		{ "help", no_argument, 0, 'h' },
		{ 0, 0, 0, 0 }
	};
	uint64_t caps[MAXCAP], t0, t1, t2;
	kvt_replay_result res[MAXCAP];
	int ncap = 0, json = 0, policy = KVT_EVICT_LRU, c, err;
	kvt_trace *t;

	optind = 1;
	while ((c = getopt_long(argc, argv, "h", lo, NULL)) != -1) {
		switch (c) {
		case 'c':
			ncap = cli_u64_list("--capacity", optarg, 0,
					    KVT_POOL_MAX_SLOTS, caps, MAXCAP);
			if (ncap < 0)
				return CLI_EXIT_USAGE;
			break;
		case 'p':
			if (!strcmp(optarg, "lru"))
				policy = KVT_EVICT_LRU;
			else if (!strcmp(optarg, "lfu"))
				policy = KVT_EVICT_LFU;
			else
				return cli_usage("trace replay", "--policy: "
						 "'%s' is not lru or lfu",
						 optarg);
			break;
		case 'j':
			json = 1;
			break;
		case 'h':
			usage(stdout);
			return 0;
		default:
			return CLI_EXIT_USAGE;
		}
	}
	if (optind != argc - 1)
		return cli_usage("trace replay", "give exactly one trace file");
	t0 = kvt_now_ns();
	if ((err = kvt_trace_open(&t, argv[optind])))
		return cli_fail("trace replay", err);
	if (!ncap) {
		uint64_t u = kvt_trace_unique_blocks(t);
		caps[0] = u / 32 ? u / 32 : 1;
		caps[1] = u / 8 ? u / 8 : 1;
		caps[2] = u / 2 ? u / 2 : 1;
		caps[3] = 0;
		ncap = 4;
	}
	t1 = kvt_now_ns();
	for (int i = 0; i < ncap; i++)
		if ((err = kvt_index_replay(t, caps[i], policy, &res[i]))) {
			kvt_trace_close(t);
			return cli_fail("trace replay", err);
		}
	t2 = kvt_now_ns();
	if (json) {
		cJSON *root = cJSON_CreateObject(), *a;
		cJSON_AddStringToObject(root, "file", argv[optind]);
		cJSON_AddStringToObject(root, "policy",
					kvt_evict_policy_name(policy));
		cJSON_AddNumberToObject(root, "requests",
					(double)kvt_trace_count(t));
		cJSON_AddNumberToObject(root, "blocks",
					(double)kvt_trace_blocks(t));
		cJSON_AddNumberToObject(root, "unique_blocks",
					(double)kvt_trace_unique_blocks(t));
		a = cJSON_AddArrayToObject(root, "results");
		for (int i = 0; i < ncap; i++) {
			cJSON *o = cJSON_CreateObject();
			cJSON_AddNumberToObject(o, "capacity", (double)caps[i]);
			cJSON_AddNumberToObject(o, "hit_blocks",
						(double)res[i].hit_blocks);
			cJSON_AddNumberToObject(o, "hit_rate", res[i].hit_rate);
			cJSON_AddNumberToObject(o, "evicted",
						(double)res[i].evicted);
			cJSON_AddNumberToObject(o, "index_bytes",
						(double)res[i].mem_bytes);
			cJSON_AddItemToArray(a, o);
		}
		cJSON_AddNumberToObject(root, "seconds", (t2 - t1) / 1e9);
		cJSON_AddNumberToObject(root, "read_seconds", (t1 - t0) / 1e9);
		cli_json_print(root);
	} else {
		printf("%s: %zu requests, %llu blocks (%llu distinct), "
		       "policy %s\n", argv[optind], kvt_trace_count(t),
		       (unsigned long long)kvt_trace_blocks(t),
		       (unsigned long long)kvt_trace_unique_blocks(t),
		       kvt_evict_policy_name(policy));
		printf("  %12s %12s %9s %12s\n", "capacity", "hit blocks",
		       "hit rate", "evicted");
		for (int i = 0; i < ncap; i++) {
			char cap[32];
			if (caps[i])
				snprintf(cap, sizeof(cap), "%llu",
					 (unsigned long long)caps[i]);
			else
				snprintf(cap, sizeof(cap), "unbounded");
			printf("  %12s %12llu %8.2f%% %12llu\n", cap,
			       (unsigned long long)res[i].hit_blocks,
			       100 * res[i].hit_rate,
			       (unsigned long long)res[i].evicted);
		}
		printf("replay %.3f s (%d capacities), read %.3f s\n",
		       (t2 - t1) / 1e9, ncap, (t1 - t0) / 1e9);
	}
	kvt_trace_close(t);
	return 0;
}

int cmd_trace(int argc, char **argv)
{
	if (argc < 2) {
		usage(stderr);
		return CLI_EXIT_USAGE;
	}
	if (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h")) {
		usage(stdout);
		return 0;
	}
	if (!strcmp(argv[1], "replay"))
		return replay(argc - 1, argv + 1);
	fprintf(stderr, "kvtier trace: unknown subcommand '%s'\n\n", argv[1]);
	usage(stderr);
	return CLI_EXIT_USAGE;
}
