/*
 * bench_sim.c — kvtier bench sim: how fast the simulator runs a long-
 * context workload. The target (issue 5): 10,000 requests of the loogle
 * mix (documents of ~24k tokens) in under 30 s on one core.
 *
 * Measured side by side in the same run, median over --repeat rounds:
 *   sim      the whole simulation (index, scheduler, network, events)
 *   index    the index work alone: the same requests' prompts matched and
 *            inserted into a kvt_index of the same size, no simulator —
 *            the floor under any simulator that drives the real index
 * and their ratio, plus events per second and simulated seconds per
 * wall second.
 */
#include "cli.h"

#include <getopt.h>
#include <stdlib.h>
#include <string.h>

/* The index floor: every request's prompt (doc + question tokens, as the
 * workload makes them) matched once and inserted once, LRU eviction. */
static double index_floor(const kvt_sim_config *c, uint32_t n, int *err)
{
	kvt_index_config ic = { 0 };
	kvt_pool *pool = NULL;
	kvt_index *idx = NULL;
	kvt_geom g;
	uint32_t *tok = NULL;
	uint64_t t0, pages;
	double secs = -1;
	uint64_t seed = c->seed;

	*err = kvt_geom_preset(&g, c->model, c->page_tokens, c->tp, 0);
	if (*err)
		return -1;
	/* an hbm-sized tier, as the simulated engine has */
	pages = (uint64_t)((c->hw.hbm_bytes * c->hw.mem_util -
			    (double)g.params * 2 / c->tp -
			    c->hw.reserve_bytes) / kvt_geom_page_bytes(&g));
	if ((*err = kvt_pool_create(&pool, pages, kvt_geom_page_bytes(&g))))
		return -1;
	ic.page_tokens = c->page_tokens;
	ic.pools[KVT_TIER_HBM] = pool;
	if ((*err = kvt_index_create(&idx, &ic)))
		goto out;
	if (!(tok = malloc(128 * 1024 * sizeof(*tok)))) {
		*err = -12;
		goto out;
	}
	t0 = kvt_now_ns();
	for (uint32_t i = 0; i < n; i++) {
		/* documents of 24k tokens rotating over 65, 40-token questions */
		uint32_t doc = (i % 65) + 65 * (i / (65 * 8)), len = 24000 + 40;
		kvt_prefix px = { .tokens = tok, .ntokens = len / 16 * 16 };
		kvt_match m;

		for (uint32_t k = 0; k < 24000; k++)
			tok[k] = doc * 2654435761u + k * 40503u;
		for (uint32_t k = 24000; k < len; k++)
			tok[k] = (uint32_t)(seed = seed * 6364136223846793005ull +
						   1442695040888963407ull);
		if ((*err = kvt_index_match(idx, &px, 0, 0, &m, NULL, 0)))
			goto out;
		*err = kvt_index_insert(idx, &px, KVT_TIER_HBM,
					KVT_INSERT_PARTIAL, i, NULL, NULL, 0);
		if (*err && *err != KVT_EFULL)
			goto out;
		*err = 0;
	}
	secs = (kvt_now_ns() - t0) / 1e9;
out:
	free(tok);
	kvt_index_destroy(idx);
	kvt_pool_destroy(pool);
	return secs;
}

int bench_sim(int argc, char **argv)
{
	static const struct option lo[] = {
		{ "json", no_argument, 0, 'j' },
		{ "requests", required_argument, 0, 'n' },
		{ "repeat", required_argument, 0, 'r' },
		{ "rate", required_argument, 0, 'a' },
		{ "help", no_argument, 0, 'h' },
		{ 0, 0, 0, 0 }
	};
	uint64_t n = 10000, repeat = 3;
	double rate = 1.2, sim_s[16], idx_s[16], sim_m, idx_m;
	kvt_sim_config c;
	kvt_sim_result r;
	int json = 0, ch, err;

	optind = 1;
	while ((ch = getopt_long(argc, argv, "jh", lo, NULL)) != -1) {
		switch (ch) {
		case 'j': json = 1; break;
		case 'n': if (cli_u64("--requests", optarg, 200, 1000000, &n)) return 2; break;
		case 'r': if (cli_u64("--repeat", optarg, 1, 16, &repeat)) return 2; break;
		case 'a':
			if (cli_double("--rate", optarg, 1e-3, 1e6, &rate))
				return CLI_EXIT_USAGE;
			break;
		case 'h':
			printf("usage: kvtier bench sim [--json] [--requests N] "
			       "[--repeat R] [--rate R]\n\n"
			       "Times a simulation of N requests (default "
			       "10000) of the loogle mix on testbed-b,\n"
			       "llama-3.1-8b, policy kvtier, at R arrivals/s "
			       "(1.2), against the index work alone.\n"
			       "Target: under 30 s on one core.\n");
			return 0;
		default: return CLI_EXIT_USAGE;
		}
	}
	if (optind < argc)
		return cli_usage("bench sim", "unexpected argument '%s'",
				 argv[optind]);
	kvt_sim_config_init(&c);
	if ((err = kvt_hw_load(&c.hw, "testbed-b")))
		return cli_fail("bench sim", err);
	c.workload = KVT_WL_LOOGLE;
	c.requests = (uint32_t)n;
	c.rate = rate;
	for (uint64_t i = 0; i < repeat; i++) {
		uint64_t t0 = kvt_now_ns();

		if ((err = kvt_sim_run(&c, &r)))
			return cli_fail("bench sim", err);
		sim_s[i] = (kvt_now_ns() - t0) / 1e9;
		idx_s[i] = index_floor(&c, (uint32_t)n, &err);
		if (err)
			return cli_fail("bench sim", err);
	}
	sim_m = cli_median(sim_s, (int)repeat);
	idx_m = cli_median(idx_s, (int)repeat);
	if (json) {
		cJSON *o = cJSON_CreateObject(), *a = cJSON_AddArrayToObject(o, "rounds");

		cJSON_AddNumberToObject(o, "requests", (double)n);
		cJSON_AddNumberToObject(o, "sim_s", sim_m);
		cJSON_AddNumberToObject(o, "index_s", idx_m);
		cJSON_AddNumberToObject(o, "ratio", sim_m / idx_m);
		cJSON_AddNumberToObject(o, "target_s", 30);
		cJSON_AddBoolToObject(o, "met", sim_m < 30);
		cJSON_AddNumberToObject(o, "events", (double)r.events);
		cJSON_AddNumberToObject(o, "events_per_s", r.events / sim_m);
		cJSON_AddNumberToObject(o, "simulated_s", r.makespan_s);
		cJSON_AddNumberToObject(o, "speedup", r.makespan_s / sim_m);
		for (uint64_t i = 0; i < repeat; i++) {
			cJSON *x = cJSON_CreateObject();

			cJSON_AddNumberToObject(x, "sim_s", sim_s[i]);
			cJSON_AddNumberToObject(x, "index_s", idx_s[i]);
			cJSON_AddItemToArray(a, x);
		}
		cli_json_print(o);
	} else {
		printf("simulation of %llu loogle requests: %.2f s (median of "
		       "%llu; target < 30 s: %s)\n", (unsigned long long)n,
		       sim_m, (unsigned long long)repeat,
		       sim_m < 30 ? "met" : "MISSED");
		printf("index work alone (match + insert each prompt): %.2f s "
		       "(simulation / index %.1fx)\n", idx_m, sim_m / idx_m);
		printf("%llu events, %.0f events/s; %.0f simulated s, %.0fx "
		       "faster than real time\n", (unsigned long long)r.events,
		       r.events / sim_m, r.makespan_s, r.makespan_s / sim_m);
	}
	return 0;
}
