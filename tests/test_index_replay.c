/*
 * test_index_replay — kvt_index_replay() on generated traces: unbounded
 * and oversized capacities against a plain reference (a set of
 * (previous id, id) pairs: a block hits when its whole prefix was seen);
 * bounded runs against a second plain reference, a flat LRU list of
 * blocks with the same leaves-first rule; determinism; bad arguments.
 */
#include "harness.h"

/* A trace of conversations: each new turn extends an earlier one. */
static char *gen(uint64_t seed, int nreq, size_t *len)
{
	size_t cap = 4 << 20, n = 0;
	char *buf = malloc(cap);
	uint64_t r = seed, next = 1;
	static uint64_t conv[64][40];
	static int clen[64];

	memset(clen, 0, sizeof(clen));
	for (int i = 0; i < nreq; i++) {
		int c = (int)(test_rand(&r) % 64), add = 1 + (int)(test_rand(&r) % 4);
		if (clen[c] + add > 40 || test_rand(&r) % 8 == 0)
			clen[c] = 0; /* a new conversation */
		for (int k = 0; k < add; k++)
			conv[c][clen[c]++] = next++;
		n += (size_t)snprintf(buf + n, cap - n, "{\"timestamp\": %d, "
				      "\"input_length\": %d, \"output_length\": "
				      "1, \"hash_ids\": [", i / 3, clen[c] * 512);
		for (int k = 0; k < clen[c]; k++)
			n += (size_t)snprintf(buf + n, cap - n, "%s%llu",
					      k ? ", " : "",
					      (unsigned long long)conv[c][k]);
		n += (size_t)snprintf(buf + n, cap - n, "]}\n");
	}
	*len = n;
	return buf;
}

/* Plain reference, bounded LRU with leaves first: blocks in a flat
 * array; a block is evictable when no cached block names it as parent. */
struct blk {
	uint64_t id, parent, last;
	int used;
};

static uint64_t ref_hits(const kvt_trace *t, uint64_t cap)
{
	size_t nb = kvt_trace_unique_blocks(t) + 1, used = 0;
	struct blk *b = calloc(nb, sizeof(*b));
	uint64_t hits = 0, clock = 0;

	for (size_t i = 0; i < kvt_trace_count(t); i++) {
		const kvt_trace_req *q = kvt_trace_get(t, i);
		size_t idx[64];
		uint64_t miss = 0, got = 0;
		int hit = 1;

		clock++;
		for (uint32_t j = 0; j < q->nhash; j++) {
			uint64_t par = j ? q->hash_ids[j - 1] : 0;
			size_t k;
			for (k = 0; k < nb; k++)
				if (b[k].used && b[k].id == q->hash_ids[j] &&
				    b[k].parent == par)
					break;
			idx[j] = k;
			if (hit && k < nb)
				hits++;
			else
				hit = 0;
			if (k < nb)
				b[k].last = clock; /* touched, and protected */
			else
				miss++;
		}
		/* evict LRU leaves outside this request until it fits */
		while (cap && cap - used < miss) {
			size_t v = nb;
			for (size_t k = 0; k < nb; k++) {
				int leaf = 1;
				if (!b[k].used || b[k].last == clock)
					continue;
				for (size_t m = 0; m < nb && leaf; m++)
					leaf = !(b[m].used &&
						 b[m].parent == b[k].id);
				if (leaf && (v == nb || b[k].last < b[v].last))
					v = k;
			}
			if (v == nb)
				break;
			b[v].used = 0;
			used--;
		}
		/* the leading missing blocks that fit go in */
		for (uint32_t j = 0; j < q->nhash; j++) {
			if (idx[j] < nb)
				continue;
			if (cap && got == cap - used)
				break;
			for (size_t k = 0; k < nb; k++)
				if (!b[k].used) {
					b[k].used = 1;
					b[k].id = q->hash_ids[j];
					b[k].parent = j ? q->hash_ids[j - 1] : 0;
					b[k].last = clock;
					break;
				}
			got++;
		}
		used += got;
	}
	free(b);
	return hits;
}

int main(void)
{
	size_t len;
	char *text = gen(3, 400, &len);
	kvt_replay_result a, b;
	kvt_trace *t;
	int64_t live = kvt_alloc_live();

	CHECK_OK(kvt_trace_parse(&t, text, len, "gen"));
	CHECK_OK(kvt_index_replay(t, 0, KVT_EVICT_LRU, &a));
	CHECK_EQ(a.requests, 400);
	CHECK_EQ(a.blocks, kvt_trace_blocks(t));
	CHECK_EQ(a.hit_blocks, ref_hits(t, 0));
	CHECK(a.hit_blocks > a.blocks / 4);
	CHECK_EQ(a.evicted, 0);
	CHECK_OK(kvt_index_replay(t, 1000000, KVT_EVICT_LRU, &b));
	CHECK_EQ(b.hit_blocks, a.hit_blocks);
	CHECK_EQ(b.slots, kvt_trace_unique_blocks(t));
	for (uint64_t cap = 8; cap <= 512; cap *= 4) {
		CHECK_OK(kvt_index_replay(t, cap, KVT_EVICT_LRU, &a));
		CHECK(a.evicted > 0);
		CHECK_EQ(a.hit_blocks, ref_hits(t, cap));
		CHECK_OK(kvt_index_replay(t, cap, KVT_EVICT_LRU, &b));
		CHECK_EQ(b.hit_blocks, a.hit_blocks); /* deterministic */
		CHECK_OK(kvt_index_replay(t, cap, KVT_EVICT_LFU, &b));
		fprintf(stderr, "capacity %4llu: lru %llu, lfu %llu hits of "
			"%llu\n", (unsigned long long)cap,
			(unsigned long long)a.hit_blocks,
			(unsigned long long)b.hit_blocks,
			(unsigned long long)a.blocks);
	}
	CHECK_ERR(kvt_index_replay(t, 1ull << 40, KVT_EVICT_LRU, &a), -E2BIG);
	CHECK_ERR(kvt_index_replay(t, 8, 5, &a), -EINVAL);
	kvt_trace_close(t);
	free(text);
	CHECK_EQ(kvt_alloc_live(), live);
	TEST_DONE();
}
