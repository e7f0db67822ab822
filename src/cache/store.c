/*
 * store.c — kvt_cache_store(): insert the prefix into the top tier under
 * c->mu (a full tier evicts: the index decides, the copies wait), then
 * under c->smu decide which pages get bytes and from where — the engine's
 * blocks, or a parent promoted from a lower tier — and make their slots
 * PEND. Then, without c->mu: the eviction copies run (kvti_cache_unlock(),
 * counted in wait_s), each fresh slot waits until no copy holds a mark on
 * it (counted too), and the transfers are submitted. The pages commit
 * when the job is finished (job_finish.c).
 */
#include "cache/cache_impl.h"

#include <errno.h>
#include <string.h>

int kvt_cache_store(kvt_cache *c, uint32_t tenant, const kvt_page_key *keys,
		    size_t nkeys, size_t first, const uint32_t *blocks,
		    kvt_cache_job **out)
{
	return kvt_cache_store_ex(c, tenant, keys, nkeys, first, blocks, NULL,
				  out);
}

int kvt_cache_store_ex(kvt_cache *c, uint32_t tenant,
		       const kvt_page_key *keys, size_t nkeys, size_t first,
		       const uint32_t *blocks, const kvt_cache_io *io,
		       kvt_cache_job **out)
{
	kvt_page_loc *locs = NULL;
	kvt_page_info *info = NULL;
	kvt_insert_result res;
	kvt_cache_job *j;
	struct sub *eng;
	size_t found = 0;
	uint64_t t0;
	int err;

	kvti_errclear();
	if (!out)
		return kvti_fail(-EINVAL, "cache store: no job handle to fill");
	if ((err = kvti_cache_job_new(c, JOB_STORE, tenant, keys, nkeys, first,
				      blocks, io, &j)))
		return err;
	/* sub 0: engine -> top tier; sub 1 + t: a parent promoted from t */
	for (int k = 0; k < MAX_SUBS; k++) {
		j->sub[k].cj = j;
		j->sub[k].src = k ? k - 1 : ENGINE;
		j->sub[k].dst = c->top;
	}
	j->nsub = 1 + KVT_TIER_COUNT;
	eng = &j->sub[0];
	if ((err = kvti_cache_sub_alloc(c, eng, j->n)))
		goto fail;
	locs = kvt_malloc((nkeys ? nkeys : 1) * sizeof(*locs));
	if (!locs) {
		err = -ENOMEM;
		goto fail;
	}
	if (!nkeys)
		goto start;

	pthread_mutex_lock(&c->mu);
	if (j->pin_each) {
		/* each page its own prefix; one that finds no room fails
		 * alone (the call fails only for the tenant) */
		for (size_t i = 0; !err && i < nkeys; i++) {
			kvt_prefix px = kvti_cache_page_prefix(tenant,
							       keys + i);
			int e = kvt_index_insert(c->idx, &px,
						 (kvt_tier_kind)c->top,
						 KVT_INSERT_PIN, kvt_now_ns(),
						 &res, locs + i, 1);

			if (e == KVT_ENOTFOUND && !i)
				err = e; /* no such tenant */
			else if (e)
				kvti_cache_job_fail_page(j, i, e);
			else
				j->pin_each[i] = j->pinned = 1;
		}
	} else {
		err = kvti_cache_inspect(c, tenant, keys, nkeys, &info, &found);
	}
	if (!err && !j->pin_each) {
		size_t i = 0;
		while (i < first && i < found && info[i].resident)
			i++;
		if (i < first)
			err = kvti_fail(KVT_ENOTFOUND, "cache store: page %zu "
					"(before first %zu) is not in the cache: "
					"store it too", i, first);
	}
	for (int t = 0; !err && first && t < KVT_TIER_COUNT; t++)
		if (c->tiers[t] && t != c->top)
			err = kvti_cache_sub_alloc(c, &j->sub[1 + t], first);
	if (!err && !j->pin_each) {
		kvt_prefix px = kvti_cache_prefix(j, nkeys);

		err = kvt_index_insert(c->idx, &px, (kvt_tier_kind)c->top,
				       KVT_INSERT_PIN, kvt_now_ns(), &res, locs,
				       nkeys);
		j->pinned = !err;
	}
	if (err) {
		kvti_cache_unlock(c); /* the eviction it did stays */
		goto fail;
	}
	/* which pages get bytes, and from where; their slots go PEND */
	pthread_mutex_lock(&c->smu);
	for (size_t p = 0; p < nkeys; p++) {
		if (j->pin_each && !j->pin_each[p])
			continue; /* failed above: no slot */
		struct meta *m = &c->m[c->top];
		uint32_t slot = locs[p].slot;
		uint8_t st = m->state[slot];
		struct sub *sp = eng;
		int t = ENGINE;

		if (!locs[p].fresh && (st == ST_OK || st == ST_PEND))
			continue; /* cached, or being stored or moved */
		if (p < first) {
			/* a parent promoted into the top tier, from its
			 * fastest committed copy below */
			int pend;

			t = kvti_cache_best_copy(c, &info[p], &pend);
			if (t < 0 || t == c->top) {
				m->state[slot] = ST_BAD;
				continue;
			}
			sp = &j->sub[1 + t];
		}
		sp->ss[sp->n] = t == ENGINE ? blocks[p - first] :
					      info[p].slot[t];
		sp->ds[sp->n] = slot;
		sp->pg[sp->n] = t == ENGINE ? p - first : SIZE_MAX;
		if (t != ENGINE)
			memcpy(sp->sums + sp->n * c->L,
			       c->m[t].sums + (uint64_t)info[p].slot[t] * c->L,
			       c->L * sizeof(uint64_t));
		sp->n++;
		kvti_cache_slot_pend(c, c->top, slot, 0);
		if (c->persist)
			kvtp_ident_set(c->persist, c->top, slot, tenant,
				       j->pin_each ? keys + p : keys,
				       j->pin_each ? 0 : p);
	}
	j->st.skipped = j->n - eng->n - j->st.failed;
	/* device memory into an ssd top tier: through the page-locked
	 * bounce (the worker runs it), summed on the device */
	{
		kvt_tier_desc ed;

		kvt_tier_info(j->mem->t, &ed);
		eng->staged = !ed.hostdev && c->top == KVT_TIER_SSD;
	}
	pthread_mutex_unlock(&c->smu);
	/* the evictions that made room copy now, without c->mu; then each
	 * fresh slot waits until no copy still reads or writes it */
	j->st.wait_s += kvti_cache_unlock(c);
	t0 = kvt_now_ns();
	pthread_mutex_lock(&c->smu);
	for (int k = 0; k < j->nsub; k++)
		for (size_t i = 0; i < j->sub[k].n; i++)
			kvti_cache_slot_settle(c, j->sub[k].dst,
					       j->sub[k].ds[i]);
	pthread_mutex_unlock(&c->smu);
	j->st.wait_s += kvti_cache_secs(t0);
start:
	kvt_free(locs);
	kvt_free(info);
	kvti_cache_job_start(c, j);
	*out = j;
	return 0;
fail:
	kvt_free(locs);
	kvt_free(info);
	kvti_cache_job_abort(c, j);
	return err;
}
