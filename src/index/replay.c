/*
 * replay.c — replay a Mooncake trace through the index (hit rate against
 * capacity and eviction policy). One hbm pool of @capacity slots with no
 * memory behind it, an index keyed by the trace's hash ids, no mover.
 */
#include "index/index_impl.h"

#include <errno.h>

int kvt_index_replay(const kvt_trace *t, uint64_t capacity, int policy,
		     kvt_replay_result *res)
{
	kvt_index_config cfg = { .page_tokens = 512, .key_mode = KVT_KEY_HASH,
				 .evict = policy };
	uint64_t slots = kvt_trace_unique_blocks(t);
	kvt_page_key *keys = NULL;
	kvt_replay_result r = { .capacity = capacity };
	kvt_index_stat st;
	kvt_pool *pool = NULL;
	kvt_index *x = NULL;
	size_t maxk = 1;
	int err;

	kvti_errclear();
	if (policy != KVT_EVICT_LRU && policy != KVT_EVICT_LFU)
		return kvti_fail(-EINVAL, "replay policy %d unknown", policy);
	if (capacity > KVT_POOL_MAX_SLOTS)
		return kvti_fail(-E2BIG, "capacity of %llu blocks: at most %u",
				 (unsigned long long)capacity,
				 KVT_POOL_MAX_SLOTS);
	if (capacity && capacity < slots)
		slots = capacity;
	if (!slots)
		slots = 1;
	for (size_t i = 0; i < kvt_trace_count(t); i++)
		if (kvt_trace_get(t, i)->nhash > maxk)
			maxk = kvt_trace_get(t, i)->nhash;
	keys = kvt_calloc(maxk, sizeof(*keys));
	if (!keys)
		return -ENOMEM;
	if ((err = kvt_pool_create(&pool, slots, 1)))
		goto out;
	cfg.pools[KVT_TIER_HBM] = pool;
	if ((err = kvt_index_create(&x, &cfg)))
		goto out;
	r.slots = slots;
	for (size_t i = 0; i < kvt_trace_count(t); i++) {
		const kvt_trace_req *q = kvt_trace_get(t, i);
		kvt_prefix px = { .keys = keys, .nkeys = q->nhash };
		kvt_match m;

		if (!q->nhash) {
			r.requests++;
			continue;
		}
		for (uint32_t j = 0; j < q->nhash; j++)
			keys[j].lo = q->hash_ids[j];
		if ((err = kvt_index_match(x, &px, 0, 0, &m, NULL, 0)))
			goto out;
		err = kvt_index_insert(x, &px, KVT_TIER_HBM, KVT_INSERT_PARTIAL,
				       q->time_ns, NULL, NULL, 0);
		if (err)
			goto out;
		r.requests++;
		r.blocks += q->nhash;
		r.hit_blocks += m.pages;
	}
	kvt_index_stat_get(x, &st);
	r.evicted = st.evicted[KVT_TIER_HBM];
	r.mem_bytes = st.mem_bytes;
	r.hit_rate = r.blocks ? (double)r.hit_blocks / (double)r.blocks : 0;
	*res = r;
out:
	if (err)
		kvti_errctx("replay at capacity %llu",
			    (unsigned long long)capacity);
	kvt_index_destroy(x);
	kvt_pool_destroy(pool);
	kvt_free(keys);
	return err;
}
