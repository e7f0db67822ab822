/*
 * bench_pool.c — kvtier bench pool: page pool alloc+free pairs per second.
 *
 * Four measurements in the same run, median over --repeat rounds:
 *   pool      kvt_pool_alloc + kvt_pool_free, one thread (the target)
 *   unlocked  the same algorithm (stack + position map + double-free
 *             check) in out-of-line calls without the lock: the limit
 *   malloc    glibc malloc + free of a 64-byte block: the naive way
 *   threads   N threads hammering one pool at once (total pairs/s)
 * Each round cycles a working set (allocate W slots, free them in a
 * shuffled order) so the free list is not a single hot slot.
 */
#include "cli.h"

#include <getopt.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

struct thr {
	kvt_pool *pool;
	uint64_t pairs;
	int failed;
	pthread_t th;
};

static void *thr_main(void *arg)
{
	struct thr *t = arg;
	uint32_t s[16];

	for (uint64_t i = 0; i < t->pairs; i += 16) {
		for (int k = 0; k < 16; k++)
			if (kvt_pool_alloc(t->pool, &s[k]))
				t->failed = 1;
		for (int k = 15; k >= 0; k--)
			if (kvt_pool_free(t->pool, s[k]))
				t->failed = 1;
	}
	return NULL;
}

/* The unlocked reference: kvt_pool's algorithm without its lock. */
static uint32_t *u_stack, *u_pos, u_nfree;

static __attribute__((noinline)) int u_alloc(uint32_t *slot)
{
	if (!u_nfree)
		return -1;
	*slot = u_stack[--u_nfree];
	u_pos[*slot] = UINT32_MAX;
	return 0;
}

static __attribute__((noinline)) int u_free(uint32_t slot)
{
	if (u_pos[slot] != UINT32_MAX)
		return -1;
	u_pos[slot] = u_nfree;
	u_stack[u_nfree++] = slot;
	return 0;
}

/* Shuffled order of 0..w-1 (xorshift, fixed seed: same every run). */
static void shuffle(uint32_t *ord, uint32_t w)
{
	uint64_t x = 88172645463325252ull;

	for (uint32_t i = 0; i < w; i++)
		ord[i] = i;
	for (uint32_t i = w - 1; i > 0; i--) {
		uint32_t j;
		x ^= x << 13, x ^= x >> 7, x ^= x << 17;
		j = (uint32_t)(x % (i + 1));
		uint32_t tmp = ord[i];
		ord[i] = ord[j];
		ord[j] = tmp;
	}
}

int bench_pool(int argc, char **argv)
{
	static const struct option lo[] = {
		{ "json", no_argument, 0, 'j' },
		{ "pairs", required_argument, 0, 'n' },
		{ "slots", required_argument, 0, 's' },
		{ "working-set", required_argument, 0, 'w' },
		{ "threads", required_argument, 0, 't' },
		{ "repeat", required_argument, 0, 'r' },
		{ "help", no_argument, 0, 'h' },
		{ 0, 0, 0, 0 }
	};
	uint64_t pairs = 20000000, slots = 1 << 20, ws = 256, nthreads = 2,
		 repeat = 5;
	double pool_r[64], base_r[64], thr_r[64], mal_r[64], pool_m, base_m,
		thr_m, mal_m;
	uint32_t *ord, *held;
	void **blocks;
	int json = 0, c, rc = 0;
	kvt_pool *p;

	optind = 1;
	while ((c = getopt_long(argc, argv, "jh", lo, NULL)) != -1) {
		switch (c) {
		case 'j': json = 1; break;
		case 'n': if (cli_u64("--pairs", optarg, 1000, 1ull << 40, &pairs)) return 2; break;
		case 's': if (cli_u64("--slots", optarg, 64, KVT_POOL_MAX_SLOTS, &slots)) return 2; break;
		case 'w': if (cli_u64("--working-set", optarg, 1, 1 << 20, &ws)) return 2; break;
		case 't': if (cli_u64("--threads", optarg, 1, 256, &nthreads)) return 2; break;
		case 'r': if (cli_u64("--repeat", optarg, 1, 64, &repeat)) return 2; break;
		case 'h':
			printf("usage: kvtier bench pool [--json] [--pairs N] "
			       "[--slots N] [--working-set W] [--threads T] "
			       "[--repeat R]\n");
			return 0;
		default: return CLI_EXIT_USAGE;
		}
	}
	if (optind < argc)
		return cli_usage("bench pool", "unexpected argument '%s'",
				 argv[optind]);
	if (ws * nthreads > slots)
		return cli_usage("bench pool", "working set x threads exceeds slots");
	if ((rc = kvt_pool_create(&p, slots, 4096)))
		return cli_fail("bench pool", rc);
	ord = malloc(ws * sizeof(*ord));
	held = malloc(ws * sizeof(*held));
	u_stack = malloc(slots * sizeof(*u_stack));
	u_pos = malloc(slots * sizeof(*u_pos));
	blocks = malloc(ws * sizeof(*blocks));
	if (!ord || !held || !u_stack || !u_pos || !blocks) {
		rc = CLI_EXIT_FAIL;
		goto out;
	}
	shuffle(ord, (uint32_t)ws);
	for (uint64_t r = 0; r < repeat; r++) {
		uint64_t t0, rounds = pairs / ws;

		/* kvtier pool */
		t0 = kvt_now_ns();
		for (uint64_t i = 0; i < rounds; i++) {
			for (uint64_t k = 0; k < ws; k++)
				if (kvt_pool_alloc(p, &held[k]))
					rc = 1;
			for (uint64_t k = 0; k < ws; k++)
				if (kvt_pool_free(p, held[ord[k]]))
					rc = 1;
		}
		pool_r[r] = (double)(rounds * ws) / ((kvt_now_ns() - t0) / 1e9);

		/* unlocked reference */
		for (uint64_t i = 0; i < slots; i++) {
			u_stack[i] = (uint32_t)(slots - 1 - i);
			u_pos[slots - 1 - i] = (uint32_t)i;
		}
		u_nfree = (uint32_t)slots;
		t0 = kvt_now_ns();
		for (uint64_t i = 0; i < rounds; i++) {
			for (uint64_t k = 0; k < ws; k++)
				if (u_alloc(&held[k]))
					rc = 1;
			for (uint64_t k = 0; k < ws; k++)
				if (u_free(held[ord[k]]))
					rc = 1;
		}
		base_r[r] = (double)(rounds * ws) / ((kvt_now_ns() - t0) / 1e9);

		/* glibc malloc/free */
		t0 = kvt_now_ns();
		for (uint64_t i = 0; i < rounds; i++) {
			for (uint64_t k = 0; k < ws; k++)
				blocks[k] = malloc(64);
			for (uint64_t k = 0; k < ws; k++)
				free(blocks[ord[k]]);
		}
		mal_r[r] = (double)(rounds * ws) / ((kvt_now_ns() - t0) / 1e9);

		/* threads on one pool */
		{
			struct thr th[256];
			t0 = kvt_now_ns();
			for (uint64_t i = 0; i < nthreads; i++) {
				th[i].pool = p;
				th[i].pairs = pairs / nthreads / 4;
				th[i].failed = 0;
				pthread_create(&th[i].th, NULL, thr_main, &th[i]);
			}
			for (uint64_t i = 0; i < nthreads; i++) {
				pthread_join(th[i].th, NULL);
				rc |= th[i].failed;
			}
			thr_r[r] = (double)(pairs / nthreads / 4 / 16 * 16 * nthreads) /
				   ((kvt_now_ns() - t0) / 1e9);
		}
	}
	if (rc || kvt_pool_used(p)) {
		fprintf(stderr, "kvtier bench pool: pool misbehaved (alloc or free "
			"failed, or %llu slots left in use)\n",
			(unsigned long long)kvt_pool_used(p));
		rc = CLI_EXIT_FAIL;
		goto out;
	}
	pool_m = cli_median(pool_r, (int)repeat);
	base_m = cli_median(base_r, (int)repeat);
	thr_m = cli_median(thr_r, (int)repeat);
	mal_m = cli_median(mal_r, (int)repeat);
	if (json) {
		cJSON *root = cJSON_CreateObject(), *a = cJSON_AddArrayToObject(root, "rounds");
		cJSON_AddNumberToObject(root, "pairs_per_round", (double)(pairs / ws * ws));
		cJSON_AddNumberToObject(root, "working_set", (double)ws);
		cJSON_AddNumberToObject(root, "slots", (double)slots);
		cJSON_AddNumberToObject(root, "pool_pairs_per_s", pool_m);
		cJSON_AddNumberToObject(root, "unlocked_pairs_per_s", base_m);
		cJSON_AddNumberToObject(root, "ratio", pool_m / base_m);
		cJSON_AddNumberToObject(root, "malloc_pairs_per_s", mal_m);
		cJSON_AddNumberToObject(root, "threads", (double)nthreads);
		cJSON_AddNumberToObject(root, "threaded_pairs_per_s", thr_m);
		for (uint64_t r = 0; r < repeat; r++) {
			cJSON *x = cJSON_CreateObject();
			cJSON_AddNumberToObject(x, "pool", pool_r[r]);
			cJSON_AddNumberToObject(x, "unlocked", base_r[r]);
			cJSON_AddNumberToObject(x, "malloc", mal_r[r]);
			cJSON_AddNumberToObject(x, "threaded", thr_r[r]);
			cJSON_AddItemToArray(a, x);
		}
		cli_json_print(root);
	} else {
		printf("pool alloc+free, 1 thread:   %.1f M pairs/s (median of %llu)\n",
		       pool_m / 1e6, (unsigned long long)repeat);
		printf("same algorithm, no lock:     %.1f M pairs/s (pool/unlocked "
		       "%.2f)\n", base_m / 1e6, pool_m / base_m);
		printf("glibc malloc+free (64 B):    %.1f M pairs/s\n", mal_m / 1e6);
		printf("pool, %llu threads together:  %.1f M pairs/s\n",
		       (unsigned long long)nthreads, thr_m / 1e6);
	}
	rc = 0;
out:
	free(ord);
	free(held);
	free(u_stack);
	free(u_pos);
	free(blocks);
	kvt_pool_destroy(p);
	return rc;
}
