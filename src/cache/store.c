/*
 * store.c — kvt_cache_store(): place the prefix's new pages by room and
 * copy them out of the engine's blocks.
 *
 *   under c->mu    the index places every page that has no copy
 *                  (kvt_index_insert, KVT_INSERT_SPILL | PIN | PARTIAL):
 *                  into the top tier while it has room after eviction, the
 *                  rest into the next tiers down, leading pages first;
 *                  pages that have a copy anywhere keep it (nothing is
 *                  promoted back up); what fits nowhere is cut off. Under
 *                  c->smu: one sub per destination tier (engine -> tier),
 *                  each fresh slot PEND.
 *   then          the transfers are submitted, at once when the
 *                  placement decided no copy and no fresh slot is still
 *                  read or written by one; otherwise the job joins the
 *                  room queue (kvti_cache_room_defer()) and the call
 *                  returns: the room thread runs the eviction copies that
 *                  made room, waits out each fresh slot's fences (both
 *                  counted in wait_s), then submits. The caller's thread
 *                  never waits for room.
 *
 * A store never fails whole for want of room: the blocks of pages that fit
 * nowhere (everything else pinned, or over the tenant's quotas) go on the
 * job's failed list with KVT_EFULL, as a load's absent pages do, and the
 * pages before them are stored. The pages commit when the job is finished
 * (job_finish.c).
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

/* The pages before @first must have a copy somewhere (c->mu held). */
static int parents_cached(kvt_cache *c, kvt_cache_job *j)
{
	kvt_page_info *info = NULL;
	size_t found = 0, i = 0;
	int err;

	if (!j->first)
		return 0;
	err = kvti_cache_inspect(c, j->tenant, j->keys, j->first, &info,
				 &found);
	while (!err && i < found && info[i].resident)
		i++;
	kvt_free(info);
	if (!err && i < j->first)
		err = kvti_fail(KVT_ENOTFOUND, "cache store: page %zu (before "
				"first %zu) is not in the cache: store it too",
				i, j->first);
	return err;
}

/* Place the pages (c->mu held): locs[0..nkeys) for the placed ones, the
 * rest of the request's blocks failed. */
static int place(kvt_cache *c, kvt_cache_job *j, kvt_page_loc *locs)
{
	const unsigned fl = KVT_INSERT_SPILL | KVT_INSERT_PIN;
	kvt_insert_result res;
	size_t placed;
	int err;

	kvti_cache_reclaim(c); /* failed copies give their room back first */
	if (j->pin_each) {
		/* each page its own prefix; one that finds no room fails
		 * alone (the call fails only for the tenant) */
		for (size_t i = 0; i < j->nkeys; i++) {
			kvt_prefix px = kvti_cache_page_prefix(j->tenant,
							       j->keys + i);

			err = kvt_index_insert(c->idx, &px,
					       (kvt_tier_kind)c->top, fl,
					       kvt_now_ns(), &res, locs + i, 1);
			if (err == KVT_ENOTFOUND && !i)
				return err; /* no such tenant */
			if (err)
				kvti_cache_job_fail_page(j, i, err);
			else
				j->pin_each[i] = j->pinned = 1;
		}
		return 0;
	}
	if ((err = parents_cached(c, j)))
		return err;
	{
		kvt_prefix px = kvti_cache_prefix(j, j->nkeys);

		err = kvt_index_insert(c->idx, &px, (kvt_tier_kind)c->top,
				       fl | KVT_INSERT_PARTIAL, kvt_now_ns(),
				       &res, locs, j->nkeys);
	}
	if (err && err != KVT_EFULL)
		return err;
	/* KVT_EFULL: not even the first page fits (first is 0) */
	placed = err ? 0 : (size_t)res.pages;
	if (placed < j->nkeys) {
		/* pages [placed, nkeys) fit in no tier: their blocks fail */
		size_t from = KVT_MAX(placed, j->first);
		int e = kvti_fail(KVT_EFULL, "cache store: %zu of %zu pages "
				  "found no room in any tier (the rest pinned, "
				  "or over tenant %u's quotas)", j->nkeys - from,
				  j->nkeys, j->tenant);

		for (size_t p = from; p < j->nkeys; p++)
			kvti_cache_job_fail_page(j, p - j->first, e);
	}
	j->pinned = placed > 0;
	j->nkeys = placed; /* the lease (and what a commit makes visible) */
	return 0;
}

int kvt_cache_store_ex(kvt_cache *c, uint32_t tenant,
		       const kvt_page_key *keys, size_t nkeys, size_t first,
		       const uint32_t *blocks, const kvt_cache_io *io,
		       kvt_cache_job **out)
{
	kvt_page_loc *locs = NULL;
	kvt_cache_job *j;
	size_t nplaced, copied = 0;
	int err, fenced = 0;

	kvti_errclear();
	if (!out)
		return kvti_fail(-EINVAL, "cache store: no job handle to fill");
	if ((err = kvti_cache_job_new(c, JOB_STORE, tenant, keys, nkeys, first,
				      blocks, io, &j)))
		return err;
	/* sub t: engine -> owned tier t */
	for (int t = 0; t < KVT_TIER_COUNT; t++) {
		j->sub[t].cj = j;
		j->sub[t].src = ENGINE;
		j->sub[t].dst = t;
		if (c->tiers[t] && (err = kvti_cache_sub_alloc(c, &j->sub[t],
							       j->n)))
			goto fail;
	}
	j->sub[HOLD].cj = j;
	j->nsub = KVT_TIER_COUNT;
	locs = kvt_malloc((nkeys ? nkeys : 1) * sizeof(*locs));
	if (!locs) {
		err = -ENOMEM;
		goto fail;
	}
	if (!nkeys)
		goto start;

	pthread_mutex_lock(&c->mu);
	if ((err = place(c, j, locs))) {
		kvti_cache_unlock(c); /* the eviction it did stays */
		goto fail;
	}
	nplaced = j->pin_each ? nkeys : j->pinned ? j->nkeys : 0;
	/* which pages get bytes, and where; their slots go PEND */
	pthread_mutex_lock(&c->smu);
	for (size_t p = first; p < nplaced; p++) {
		kvt_page_loc *l = &locs[p];
		struct sub *sp;
		uint8_t st;

		if (j->pin_each && !j->pin_each[p])
			continue; /* failed above: no slot */
		st = c->m[l->tier].state[l->slot];
		if (!l->fresh && (st == ST_OK || st == ST_PEND))
			continue; /* cached, or being stored or moved */
		/* fresh, or a copy that failed (BAD): written again */
		sp = &j->sub[l->tier];
		sp->ss[sp->n] = blocks[p - first];
		sp->ds[sp->n] = l->slot;
		sp->pg[sp->n] = p - first;
		sp->n++;
		copied++;
		fenced |= c->m[l->tier].rd[l->slot] ||
			  c->m[l->tier].wr[l->slot];
		kvti_cache_slot_pend(c, l->tier, l->slot, 0);
		if (c->persist)
			kvtp_ident_set(c->persist, l->tier, l->slot, tenant,
				       j->pin_each ? keys + p : keys,
				       j->pin_each ? 0 : p);
	}
	j->st.skipped = j->n - copied - j->st.failed;
	/* device memory into ssd: through the page-locked bounce (a worker
	 * runs it), summed on the device */
	{
		kvt_tier_desc ed;

		kvt_tier_info(j->mem->t, &ed);
		j->sub[KVT_TIER_SSD].staged = !ed.hostdev &&
					      j->sub[KVT_TIER_SSD].n > 0;
	}
	pthread_mutex_unlock(&c->smu);
	if (c->batch || fenced) {
		/* the evictions that made room must copy first, and each
		 * fresh slot wait until no copy still reads or writes it:
		 * the room thread does both, then submits (mover.c) */
		kvti_cache_room_defer(c, j);
		kvt_free(locs);
		*out = j;
		return 0;
	}
	kvti_cache_unlock(c); /* (decided no copy: nothing to run) */
start:
	kvt_free(locs);
	kvti_cache_job_start(c, j);
	*out = j;
	return 0;
fail:
	kvt_free(locs);
	kvti_cache_job_abort(c, j);
	return err;
}
