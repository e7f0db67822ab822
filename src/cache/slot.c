/*
 * slot.c — the state of every slot of every owned tier, its fences and
 * the persistence hooks at each change (cache_impl.h: struct meta; every
 * call here runs with c->smu held unless it says otherwise).
 *
 * STATE PER SLOT (struct meta)
 *
 *   sums[slot * L + l]  XXH3-64 of layer l of the page the slot should hold
 *   state[slot]         NONE  nothing known (free, or reserved by a store
 *                             that has not started)
 *                       PEND  bytes on their way: a store or a demotion is
 *                             writing it; never served, counted in flight
 *                       OK    committed: bytes in place, sums verified
 *                       BAD   a copy into it failed or did not verify:
 *                             never served, and out of the index at once
 *                             (kvti_cache_reclaim(): the page loses the
 *                             copy, the slot goes back to its pool)
 *   rd[slot], wr[slot]  batches still reading / writing the slot (the
 *                       fences). The index frees a demoted page's source
 *                       slot as soon as it decides; anyone who writes a
 *                       slot first waits for rd == wr == 0 (a real,
 *                       counted wait).
 *   pby[slot]           PEND: the batch writing it (0: a store), so a
 *                       batch commits only the slots it made PEND.
 *
 *        store / move decided            copy landed, verified
 *   NONE ---------------------> PEND -----------------------> OK
 *     ^                          |  copy failed, did not verify  |
 *     |  released: reclaimed     v                               |
 *     +--(at once) or evicted-- BAD <-------- load found it bad -+
 *
 * A BAD slot never counts as its page's copy for long: it is queued as it
 * goes BAD (smu) and the next hold of c->mu that reclaims (a store, a job's
 * end, a background pass, the end of a batch with failed copies) drops it
 * from the index (kvt_index_drop_copy). So a disk that fills up costs the
 * failed copies, not the room: once writes succeed again, pages demote
 * into the slots as before.
 *
 * PERSISTENCE (persist.c, an ssd tier opened 'persist'): a slot going PEND
 * loses its record before any byte is written, a slot committing OK gets
 * its record, a slot released or marked BAD loses it.
 */
#include "cache/cache_impl.h"

#include <errno.h>
#include <string.h>

int kvti_cache_meta_init(kvt_cache *c, int t)
{
	struct meta *m = &c->m[t];

	m->n = kvt_pool_slots(kvt_tier_pool(c->tiers[t]));
	m->sums = kvt_calloc(m->n * c->L, sizeof(uint64_t));
	m->state = kvt_calloc(m->n, 1);
	m->rd = kvt_calloc(m->n, sizeof(uint16_t));
	m->wr = kvt_calloc(m->n, sizeof(uint16_t));
	m->pby = kvt_calloc(m->n, sizeof(uint32_t));
	if (!m->sums || !m->state || !m->rd || !m->wr || !m->pby)
		return -ENOMEM;
	return 0;
}

void kvti_cache_meta_free(struct meta *m)
{
	kvt_free(m->sums);
	kvt_free(m->state);
	kvt_free(m->rd);
	kvt_free(m->wr);
	kvt_free(m->pby);
	memset(m, 0, sizeof(*m));
}

/* Wait until no batch still reads or writes slot @s of @t: before a store
 * writes it (the index may hand out a slot a background demotion is still
 * copying from). */
void kvti_cache_slot_settle(kvt_cache *c, int t, uint32_t s)
{
	struct meta *m = &c->m[t];

	while (m->rd[s] || m->wr[s])
		pthread_cond_wait(&c->scv, &c->smu);
}

/* Slot @s of @t is about to be written, failed, or left the index: a
 * persistent ssd slot loses its record first. */
void kvti_cache_persist_gone(kvt_cache *c, int t, uint32_t s)
{
	if (c->persist && t == KVT_TIER_SSD)
		kvtp_drop(c->persist, s);
}

/* Slot @s of @t just committed (bytes in place, verified): record it. */
void kvti_cache_persist_ok(kvt_cache *c, int t, uint32_t s)
{
	if (c->persist && t == KVT_TIER_SSD)
		kvtp_commit(c->persist, s, c->m[t].sums + (uint64_t)s * c->L);
}

/* Mark slot @s of @t as being written by batch @batch (0: a store). */
void kvti_cache_slot_pend(kvt_cache *c, int t, uint32_t s, uint32_t batch)
{
	kvti_cache_persist_gone(c, t, s);
	c->m[t].state[s] = ST_PEND;
	c->m[t].pby[s] = batch;
}

/* The fastest committed copy of a page: its tier, or -1; with *pend set
 * when a copy is on its way. */
int kvti_cache_best_copy(kvt_cache *c, const kvt_page_info *pi, int *pend)
{
	*pend = 0;
	for (int t = 0; t < KVT_TIER_COUNT; t++) {
		uint32_t s = pi->slot[t];

		if (!c->tiers[t] || s == KVT_SLOT_NONE)
			continue;
		if (c->m[t].state[s] == ST_OK)
			return t;
		*pend |= c->m[t].state[s] == ST_PEND;
	}
	return -1;
}

void kvti_cache_slot_bad(kvt_cache *c, int t, uint32_t s)
{
	c->m[t].state[s] = ST_BAD;
	kvti_cache_persist_gone(c, t, s);
	if (kvti_grow((void **)&c->bad, &c->badcap, c->nbad + 1,
		      sizeof(*c->bad), 64)) {
		/* no memory to queue it: eviction takes it in time */
		kvti_warn("cache: %s slot %u failed; no memory to reclaim it "
			  "at once", kvt_tier_kind_name((kvt_tier_kind)t), s);
		return;
	}
	c->bad[c->nbad].slot = s;
	c->bad[c->nbad].tier = (uint8_t)t;
	c->nbad++;
}

void kvti_cache_reclaim(kvt_cache *c)
{
	struct badslot *q;
	size_t n, keep = 0;

	pthread_mutex_lock(&c->smu);
	q = c->bad;
	n = c->nbad;
	c->bad = NULL;
	c->nbad = c->badcap = 0;
	pthread_mutex_unlock(&c->smu);
	for (size_t i = 0; i < n; i++) {
		int t = q[i].tier, err;
		uint8_t st;

		/* still BAD (under c->mu nobody else writes it over) */
		pthread_mutex_lock(&c->smu);
		st = c->m[t].state[q[i].slot];
		pthread_mutex_unlock(&c->smu);
		if (st != ST_BAD)
			continue;
		err = kvt_index_drop_copy(c->idx, (kvt_tier_kind)t, q[i].slot);
		if (err == KVT_EBUSY) /* a leased page's only copy: later */
			q[keep++] = q[i];
	}
	pthread_mutex_lock(&c->smu);
	for (size_t i = 0; i < keep; i++)
		if (!kvti_grow((void **)&c->bad, &c->badcap, c->nbad + 1,
			       sizeof(*c->bad), 64))
			c->bad[c->nbad++] = q[i];
	pthread_mutex_unlock(&c->smu);
	kvt_free(q);
}
