/*
 * bench_index.c — kvtier bench index: the radix index's speed and size.
 *
 * Measured side by side in one run, each the median of --repeat calls:
 *   match      kvt_index_match of a fully cached prompt (default 32k
 *              tokens, 16-token pages: 2,048 pages), without and with the
 *              per-page locations (the slots to load)
 *   flat       the plain baseline: what a block-hash prefix cache does per
 *              lookup (vLLM-style): chain-hash every page (XXH3-128 of
 *              parent hash + tokens) and probe a flat hash map, stopping
 *              at the first miss
 *   limit      the least any exact lookup must do: read the prompt's
 *              tokens once (memcmp against a stored copy)
 *   insert     kvt_index_insert of the same prompt into an empty index
 *              (one edge, 2,048 slots from the pool), and of a prompt
 *              already cached (a touch); flat: chain-hash + map insert
 *   hash       match in hash-key mode, the engine giving its block hashes
 * Memory per cached page (index bytes / pages, no KV data): the one long
 * prompt, and a tree of many prompts sharing prefixes (hbm, dram and ssd
 * managed: 3 slots per page). Replay: the conversation trace at four
 * capacities, when ../shared/data/traces (or $KVT_TRACE_DIR) has it.
 */
#include "cli.h"
#include "kvt_build.h"

#include <errno.h>
#include <getopt.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <xxhash.h>

#define MAXREP 1024

/* ---- the flat baseline ------------------------------------------------ */

struct flat {
	kvt_page_key *k;
	uint32_t *v;
	size_t cap;
};

static kvt_page_key chain(const kvt_page_key *prev, const uint32_t *tok,
			  uint32_t P, unsigned char *buf)
{
	XXH128_hash_t h;
	kvt_page_key k;

	memcpy(buf, prev, 16);
	memcpy(buf + 16, tok, (size_t)P * 4);
	h = XXH3_128bits(buf, 16 + (size_t)P * 4);
	k.lo = h.low64 | 1; /* 0 marks an empty slot */
	k.hi = h.high64;
	return k;
}

static uint32_t *flat_find(struct flat *f, kvt_page_key k, int add)
{
	size_t i = k.lo & (f->cap - 1);

	while (f->k[i].lo) {
		if (f->k[i].lo == k.lo && f->k[i].hi == k.hi)
			return &f->v[i];
		i = (i + 1) & (f->cap - 1);
	}
	if (!add)
		return NULL;
	f->k[i] = k;
	return &f->v[i];
}

/* Pages of the prompt found; the flat map's whole lookup. */
static __attribute__((noinline)) size_t flat_match(struct flat *f,
						   const uint32_t *tok,
						   size_t np, uint32_t P,
						   unsigned char *buf)
{
	kvt_page_key prev = { 0, 0 };
	size_t i;

	for (i = 0; i < np; i++) {
		prev = chain(&prev, tok + i * P, P, buf);
		if (!flat_find(f, prev, 0))
			break;
	}
	return i;
}

static __attribute__((noinline)) void flat_insert(struct flat *f,
						  const uint32_t *tok,
						  size_t np, uint32_t P,
						  unsigned char *buf)
{
	kvt_page_key prev = { 0, 0 };

	for (size_t i = 0; i < np; i++) {
		prev = chain(&prev, tok + i * P, P, buf);
		*flat_find(f, prev, 1) = (uint32_t)i;
	}
}

/* ---- helpers ---------------------------------------------------------- */

static int mk_index_mode(kvt_index **x, kvt_pool **pools, uint32_t P,
			 uint64_t slots, int mode)
{
	kvt_index_config c = { .page_tokens = P, .key_mode = mode };
	int err;

	memset(pools, 0, sizeof(kvt_pool *) * KVT_TIER_COUNT);
	if ((err = kvt_pool_create(&pools[KVT_TIER_HBM], slots, 1)) ||
	    (err = kvt_pool_create(&pools[KVT_TIER_DRAM], slots, 1)) ||
	    (err = kvt_pool_create(&pools[KVT_TIER_SSD], slots, 1)))
		return err;
	memcpy(c.pools, pools, sizeof(c.pools));
	return kvt_index_create(x, &c);
}

static int mk_index(kvt_index **x, kvt_pool **pools, uint32_t P,
		    uint64_t slots)
{
	return mk_index_mode(x, pools, P, slots, KVT_KEY_TOKENS);
}

static void rm_index(kvt_index *x, kvt_pool **pools)
{
	kvt_index_destroy(x);
	for (int t = 0; t < KVT_TIER_COUNT; t++)
		kvt_pool_destroy(pools[t]);
}

struct stat3 {
	double med, lo, hi; /* median, 10th and 90th percentile */
};

static int cmpd(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return x < y ? -1 : x > y;
}

static struct stat3 summarize(double *v, int n)
{
	struct stat3 s;

	qsort(v, (size_t)n, sizeof(*v), cmpd);
	s.med = cli_median(v, n);
	s.lo = v[n / 10];
	s.hi = v[n - 1 - n / 10];
	return s;
}

static cJSON *stat_json(struct stat3 s)
{
	cJSON *o = cJSON_CreateObject();

	cJSON_AddNumberToObject(o, "median_us", s.med);
	cJSON_AddNumberToObject(o, "p10_us", s.lo);
	cJSON_AddNumberToObject(o, "p90_us", s.hi);
	return o;
}

static int find_trace(char *path, size_t len)
{
	const char *dirs[3] = { getenv("KVT_TRACE_DIR"), "../shared/data/traces",
				KVT_SOURCE_DIR "/../shared/data/traces" };

	for (int i = 0; i < 3; i++) {
		if (!dirs[i])
			continue;
		snprintf(path, len, "%s/conversation_trace.jsonl", dirs[i]);
		if (!access(path, R_OK))
			return 1;
	}
	return 0;
}

/* Memory per page of a tree of @n prompts of @np pages that share
 * random-length prefixes with earlier ones (a chat/agent mix). */
static int tree_mem(uint32_t P, size_t np, int n, double *per_page,
		    uint64_t *pages, uint64_t *nodes)
{
	kvt_pool *pools[KVT_TIER_COUNT];
	uint32_t *all = malloc((size_t)n * np * P * sizeof(uint32_t));
	uint64_t r = 12345;
	kvt_index_stat st;
	kvt_index *x;
	int err;

	if (!all)
		return -ENOMEM;
	if ((err = mk_index(&x, pools, P, (uint64_t)n * np)))
		goto out;
	for (int i = 0; i < n; i++) {
		uint32_t *t = all + (size_t)i * np * P;
		size_t share = 0;
		kvt_prefix px = { .tokens = t, .ntokens = np * P };
		if (i) {
			r ^= r << 13, r ^= r >> 7, r ^= r << 17;
			share = (size_t)(r % np) * P;
			memcpy(t, all + (size_t)(r % (uint64_t)i) * np * P,
			       share * sizeof(*t));
		}
		for (size_t k = share; k < np * P; k++) {
			r ^= r << 13, r ^= r >> 7, r ^= r << 17;
			t[k] = (uint32_t)(r % 128000);
		}
		if ((err = kvt_index_insert(x, &px, KVT_TIER_HBM, 0, (uint64_t)i,
					    NULL, NULL, 0)))
			break;
	}
	kvt_index_stat_get(x, &st);
	*per_page = (double)st.mem_bytes / (double)st.pages;
	*pages = st.pages;
	*nodes = st.nodes;
	rm_index(x, pools);
out:
	free(all);
	return err;
}

int bench_index(int argc, char **argv)
{
	static const struct option lo[] = {
		{ "json", no_argument, 0, 'j' },
		{ "tokens", required_argument, 0, 't' },
		{ "page-tokens", required_argument, 0, 'p' },
		{ "repeat", required_argument, 0, 'r' },
		{ "help", no_argument, 0, 'h' },
		{ 0, 0, 0, 0 }
	};
	uint64_t ntok = 32768, P = 16, rep = 301;
	static double tm[7][MAXREP];
	struct stat3 s[7];
	enum { M_IDX, M_LOCS, M_FLAT, M_LIMIT, I_IDX, I_FLAT, M_HASH };
	kvt_pool *pools[KVT_TIER_COUNT];
	uint32_t *tok = NULL, *copy = NULL;
	kvt_page_loc *locs = NULL;
	unsigned char *buf = NULL;
	struct flat f = { 0 };
	double mem_one = 0, mem_tree = 0, mem_hash = 0, touch_us = 0, replay_s = -1;
	uint64_t tree_pages = 0, tree_nodes = 0, np, sink = 0;
	kvt_index *x = NULL;
	kvt_index_stat st;
	char trace[512];
	int json = 0, c, err, rc = CLI_EXIT_FAIL;

	optind = 1;
	while ((c = getopt_long(argc, argv, "jh", lo, NULL)) != -1) {
		switch (c) {
		case 'j': json = 1; break;
		case 't': if (cli_u64("--tokens", optarg, 16, 1 << 24, &ntok)) return 2; break;
		case 'p': if (cli_u64("--page-tokens", optarg, 1, 4096, &P)) return 2; break;
		case 'r': if (cli_u64("--repeat", optarg, 11, MAXREP, &rep)) return 2; break;
		case 'h':
			printf("usage: kvtier bench index [--json] [--tokens N] "
			       "[--page-tokens P] [--repeat R]\n"
			       "  match/insert of an N-token prompt (default "
			       "32768, P 16) vs a flat block-hash map and a\n"
			       "  read of the prompt; index memory per page; "
			       "trace replay when the shared traces exist\n");
			return 0;
		default: return CLI_EXIT_USAGE;
		}
	}
	if (optind < argc)
		return cli_usage("bench index", "unexpected argument '%s'",
				 argv[optind]);
	np = ntok / P;
	if (!np)
		return cli_usage("bench index", "--tokens below one page");
	tok = malloc(np * P * sizeof(*tok));
	copy = malloc(np * P * sizeof(*tok));
	locs = malloc(np * sizeof(*locs));
	buf = malloc(16 + P * 4);
	for (f.cap = 64; f.cap < np * 2; f.cap *= 2)
		;
	f.k = calloc(f.cap, sizeof(*f.k));
	f.v = calloc(f.cap, sizeof(*f.v));
	if (!tok || !copy || !locs || !buf || !f.k || !f.v)
		goto out;
	for (uint64_t i = 0; i < np * P; i++)
		tok[i] = (uint32_t)((i * 2654435761u) % 128000);
	memcpy(copy, tok, np * P * sizeof(*tok));

	/* insert: an empty index each time (setup untimed) */
	for (uint64_t r = 0; r < rep; r++) {
		kvt_prefix px = { .tokens = tok, .ntokens = np * P };
		uint64_t t0;
		if ((err = mk_index(&x, pools, (uint32_t)P, np)))
			goto fail;
		t0 = kvt_now_ns();
		err = kvt_index_insert(x, &px, KVT_TIER_HBM, 0, r, NULL, NULL, 0);
		tm[I_IDX][r] = (kvt_now_ns() - t0) / 1e3;
		if (err)
			goto fail;
		if (r == 0) {
			kvt_index_stat_get(x, &st);
			mem_one = (double)st.mem_bytes / (double)st.pages;
		}
		rm_index(x, pools);
		x = NULL;
		memset(f.k, 0, f.cap * sizeof(*f.k));
		t0 = kvt_now_ns();
		flat_insert(&f, tok, np, (uint32_t)P, buf);
		tm[I_FLAT][r] = (kvt_now_ns() - t0) / 1e3;
	}

	/* match: one index holding the prompt */
	{
		kvt_prefix px = { .tokens = tok, .ntokens = np * P };
		kvt_match m;
		double touch[MAXREP];

		if ((err = mk_index(&x, pools, (uint32_t)P, np)) ||
		    (err = kvt_index_insert(x, &px, KVT_TIER_HBM, 0, 0, NULL,
					    NULL, 0)))
			goto fail;
		for (uint64_t r = 0; r < rep; r++) {
			uint64_t t0 = kvt_now_ns();
			err = kvt_index_match(x, &px, 0, 0, &m, NULL, 0);
			tm[M_IDX][r] = (kvt_now_ns() - t0) / 1e3;
			if (err || m.pages != np)
				goto fail;
			t0 = kvt_now_ns();
			err = kvt_index_match(x, &px, 0, 0, &m, locs, np);
			tm[M_LOCS][r] = (kvt_now_ns() - t0) / 1e3;
			sink += locs[np - 1].slot;
			t0 = kvt_now_ns();
			sink += flat_match(&f, tok, np, (uint32_t)P, buf);
			tm[M_FLAT][r] = (kvt_now_ns() - t0) / 1e3;
			t0 = kvt_now_ns();
			sink += (uint64_t)memcmp(tok, copy, np * P * 4);
			tm[M_LIMIT][r] = (kvt_now_ns() - t0) / 1e3;
			t0 = kvt_now_ns();
			err = kvt_index_insert(x, &px, KVT_TIER_HBM, 0, r + 1,
					       NULL, NULL, 0);
			touch[r] = (kvt_now_ns() - t0) / 1e3;
			if (err)
				goto fail;
		}
		if (kvt_index_check(x))
			goto fail;
		touch_us = cli_median(touch, (int)rep);
		rm_index(x, pools);
		x = NULL;
	}
	/* hash mode: the engine hands over its block hashes */
	{
		kvt_page_key *keys = malloc(np * sizeof(*keys));
		kvt_prefix px = { .keys = keys, .nkeys = np };
		kvt_match m;

		if (!keys)
			goto fail;
		if ((err = mk_index_mode(&x, pools, (uint32_t)P, np,
					 KVT_KEY_HASH)) ||
		    (err = kvt_index_hash_tokens(x, 0, tok, np * P, keys)) ||
		    (err = kvt_index_insert(x, &px, KVT_TIER_HBM, 0, 0, NULL,
					    NULL, 0))) {
			free(keys);
			goto fail;
		}
		for (uint64_t r = 0; r < rep && !err; r++) {
			uint64_t t0 = kvt_now_ns();
			err = kvt_index_match(x, &px, 0, 0, &m, locs, np);
			tm[M_HASH][r] = (kvt_now_ns() - t0) / 1e3;
			if (m.pages != np)
				err = KVT_ECORRUPT;
		}
		kvt_index_stat_get(x, &st);
		mem_hash = (double)st.mem_bytes / (double)st.pages;
		free(keys);
		rm_index(x, pools);
		x = NULL;
		if (err)
			goto fail;
	}
	for (int i = 0; i < 7; i++)
		s[i] = summarize(tm[i], (int)rep);
	if ((err = tree_mem((uint32_t)P, np / 8 ? np / 8 : 1, 256, &mem_tree,
			    &tree_pages, &tree_nodes)))
		goto fail;
	if (find_trace(trace, sizeof(trace))) {
		kvt_trace *t;
		uint64_t t0 = kvt_now_ns(), u;
		kvt_replay_result rr;
		if ((err = kvt_trace_open(&t, trace)))
			goto fail;
		u = kvt_trace_unique_blocks(t);
		uint64_t caps[4] = { u / 32, u / 8, u / 2, 0 };
		for (int i = 0; i < 4 && !err; i++)
			err = kvt_index_replay(t, caps[i], KVT_EVICT_LRU, &rr);
		kvt_trace_close(t);
		if (err)
			goto fail;
		replay_s = (kvt_now_ns() - t0) / 1e9;
	}

	if (json) {
		cJSON *root = cJSON_CreateObject(), *o;
		cJSON_AddNumberToObject(root, "tokens", (double)(np * P));
		cJSON_AddNumberToObject(root, "page_tokens", (double)P);
		cJSON_AddNumberToObject(root, "pages", (double)np);
		cJSON_AddNumberToObject(root, "repeat", (double)rep);
		o = cJSON_AddObjectToObject(root, "match");
		cJSON_AddItemToObject(o, "index", stat_json(s[M_IDX]));
		cJSON_AddItemToObject(o, "index_locs", stat_json(s[M_LOCS]));
		cJSON_AddItemToObject(o, "flat_hash", stat_json(s[M_FLAT]));
		cJSON_AddItemToObject(o, "read_limit", stat_json(s[M_LIMIT]));
		cJSON_AddItemToObject(o, "index_hash_keys", stat_json(s[M_HASH]));
		cJSON_AddNumberToObject(o, "flat_over_index",
					s[M_FLAT].med / s[M_LOCS].med);
		cJSON_AddBoolToObject(o, "target_20us_met", s[M_LOCS].med <= 20);
		o = cJSON_AddObjectToObject(root, "insert");
		cJSON_AddItemToObject(o, "index", stat_json(s[I_IDX]));
		cJSON_AddItemToObject(o, "flat_hash", stat_json(s[I_FLAT]));
		cJSON_AddNumberToObject(o, "cached_touch_median_us", touch_us);
		cJSON_AddBoolToObject(o, "target_50us_met", s[I_IDX].med <= 50);
		o = cJSON_AddObjectToObject(root, "memory");
		cJSON_AddNumberToObject(o, "bytes_per_page_one_prompt", mem_one);
		cJSON_AddNumberToObject(o, "bytes_per_page_tree", mem_tree);
		cJSON_AddNumberToObject(o, "bytes_per_page_hash_keys", mem_hash);
		cJSON_AddNumberToObject(o, "tree_pages", (double)tree_pages);
		cJSON_AddNumberToObject(o, "tree_nodes", (double)tree_nodes);
		cJSON_AddNumberToObject(o, "tiers", 3);
		cJSON_AddBoolToObject(o, "target_96B_met",
				      mem_one <= 96 && mem_tree <= 96);
		o = cJSON_AddObjectToObject(root, "replay");
		if (replay_s >= 0) {
			cJSON_AddStringToObject(o, "trace", trace);
			cJSON_AddNumberToObject(o, "seconds_4_capacities",
						replay_s);
			cJSON_AddBoolToObject(o, "target_1s_met", replay_s < 1);
		} else {
			cJSON_AddStringToObject(o, "skipped", "no conversation_"
						"trace.jsonl (set KVT_TRACE_DIR)");
		}
		cli_json_print(root);
	} else {
		printf("prompt: %llu tokens, %llu pages of %llu; medians of "
		       "%llu (p10-p90)\n", (unsigned long long)(np * P),
		       (unsigned long long)np, (unsigned long long)P,
		       (unsigned long long)rep);
#define ROW(name, i) printf("  %-34s %9.2f us  (%.2f-%.2f)\n", name, \
			    s[i].med, s[i].lo, s[i].hi)
		ROW("match, index (counts only)", M_IDX);
		ROW("match, index (+ page locations)", M_LOCS);
		ROW("match, hash keys (+ locations)", M_HASH);
		ROW("match, flat block-hash map", M_FLAT);
		ROW("read the prompt once (limit)", M_LIMIT);
		ROW("insert, index (empty index)", I_IDX);
		ROW("insert, flat block-hash map", I_FLAT);
		printf("  %-34s %9.2f us\n", "insert, index (already cached)",
		       touch_us);
		printf("flat/index match: %.1fx; target match <= 20 us: %s, "
		       "insert <= 50 us: %s\n", s[M_FLAT].med / s[M_LOCS].med,
		       s[M_LOCS].med <= 20 ? "met" : "MISSED",
		       s[I_IDX].med <= 50 ? "met" : "MISSED");
		printf("memory per page (3 tiers): %.1f B one prompt, %.1f B "
		       "tree of %llu pages in %llu edges, %.1f B with hash "
		       "keys (target 96 B)\n", mem_one, mem_tree,
		       (unsigned long long)tree_pages,
		       (unsigned long long)tree_nodes, mem_hash);
		if (replay_s >= 0)
			printf("replay of %s at 4 capacities: %.3f s (target "
			       "< 1 s)\n", trace, replay_s);
		else
			printf("replay: skipped (no conversation_trace.jsonl; "
			       "set KVT_TRACE_DIR)\n");
	}
	rc = sink == 0xdeadbeef ? 1 : 0;
	goto out;
fail:
	rc = cli_fail("bench index", err ? err : KVT_ECORRUPT);
out:
	if (x)
		rm_index(x, pools);
	free(tok);
	free(copy);
	free(locs);
	free(buf);
	free(f.k);
	free(f.v);
	return rc;
}
