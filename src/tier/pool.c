/*
 * pool.c — page pools: fixed-size slots handed out in O(1).
 *
 * The free slots are a stack; pos[] maps each slot to its place in the
 * stack, or NOT_FREE when allocated:
 *
 *      stack:  [ 7 | 3 | 5 | 2 | ... ]   nfree = 4, top = stack[3] = 2
 *      pos:    pos[2] = 3, pos[5] = 2, pos[3] = 1, pos[7] = 0,
 *              pos[s] = NOT_FREE for every allocated s
 *
 *   alloc:   pop the top.                          O(1)
 *   free:    push, after checking pos[s] == NOT_FREE (double free -> -EINVAL)
 *   reserve: swap s with the top, pop.             O(1)
 *
 * A fresh pool's stack holds nslots-1 ... 0, so slots go out lowest first.
 *
 * Locking: one spinlock guards stack, pos, nfree and the counters. The
 * eviction callback always runs outside the lock; in_evict (atomic) keeps it
 * from running twice at once or recursively. 'used' is mirrored into an
 * atomic so readers need no lock.
 */
#include "core/core.h"

#include <errno.h>
#include <string.h>

#define NOT_FREE UINT32_MAX

struct kvt_pool {
	kvti_spin lock;
	uint32_t nslots;
	uint32_t nfree;        /* guarded by lock */
	uint32_t *stack;       /* guarded by lock */
	uint32_t *pos;         /* guarded by lock */
	uint64_t slot_bytes;
	/* counters, guarded by lock */
	uint64_t peak, allocs, frees, full;
	atomic_uint_fast64_t used;       /* mirror of nslots - nfree */
	atomic_uint_fast64_t evict_calls;
	/* watermarks: set before concurrent use (kvt_pool_set_watermarks) */
	uint32_t high_slots, low_slots;
	kvt_pool_evict_fn evict;
	void *evict_arg;
	atomic_int in_evict;
};

int kvt_pool_create(kvt_pool **out, uint64_t nslots, uint64_t slot_bytes)
{
	kvt_pool *p;

	if (!nslots || !slot_bytes)
		return kvti_fail(-EINVAL, "pool of %llu slots of %llu bytes",
				 (unsigned long long)nslots,
				 (unsigned long long)slot_bytes);
	if (nslots > KVT_POOL_MAX_SLOTS)
		return kvti_fail(-E2BIG, "pool of %llu slots (at most %u): use "
				 "larger pages", (unsigned long long)nslots,
				 KVT_POOL_MAX_SLOTS);
	p = kvt_calloc(1, sizeof(*p));
	if (!p)
		return -ENOMEM;
	p->stack = kvt_malloc(nslots * sizeof(uint32_t));
	p->pos = kvt_malloc(nslots * sizeof(uint32_t));
	if (!p->stack || !p->pos) {
		kvt_free(p->stack);
		kvt_free(p->pos);
		kvt_free(p);
		return -ENOMEM;
	}
	p->nslots = (uint32_t)nslots;
	p->nfree = (uint32_t)nslots;
	p->slot_bytes = slot_bytes;
	for (uint32_t i = 0; i < p->nslots; i++) {
		uint32_t s = p->nslots - 1 - i;
		p->stack[i] = s;
		p->pos[s] = i;
	}
	p->high_slots = p->nslots; /* no watermark until one is set */
	p->low_slots = p->nslots;
	*out = p;
	return 0;
}

void kvt_pool_destroy(kvt_pool *p)
{
	if (!p)
		return;
	kvt_free(p->stack);
	kvt_free(p->pos);
	kvt_free(p);
}

/* Ask the owner for room. Returns 1 if the callback ran. */
static int pool_call_evict(kvt_pool *p, uint64_t want)
{
	int expect = 0;

	if (!p->evict || !atomic_compare_exchange_strong(&p->in_evict,
							 &expect, 1))
		return 0;
	atomic_fetch_add(&p->evict_calls, 1);
	p->evict(p, want, p->evict_arg);
	atomic_store(&p->in_evict, 0);
	return 1;
}

static uint64_t pool_want(kvt_pool *p, uint64_t used)
{
	return used > p->low_slots ? used - p->low_slots : 1;
}

int kvt_pool_alloc_n(kvt_pool *p, uint32_t *slots, size_t n)
{
	uint64_t used = 0;
	int over, tries = 0;

	if (!n)
		return 0;
retry:
	kvti_spin_lock(&p->lock);
	if (KVT_UNLIKELY(p->nfree < n)) {
		used = p->nslots - p->nfree;
		kvti_spin_unlock(&p->lock);
		if (tries++ == 0 &&
		    pool_call_evict(p, KVT_MAX(pool_want(p, used),
					       n - (p->nslots - used))))
			goto retry;
		kvti_spin_lock(&p->lock);
		p->full++;
		kvti_spin_unlock(&p->lock);
		return KVT_EFULL;
	}
	for (size_t i = 0; i < n; i++) {
		uint32_t s = p->stack[--p->nfree];
		p->pos[s] = NOT_FREE;
		slots[i] = s;
	}
	p->allocs += n;
	used = p->nslots - p->nfree;
	if (used > p->peak)
		p->peak = used;
	over = used > p->high_slots;
	atomic_store_explicit(&p->used, used, memory_order_relaxed);
	kvti_spin_unlock(&p->lock);
	if (KVT_UNLIKELY(over))
		pool_call_evict(p, pool_want(p, used));
	return 0;
}

int kvt_pool_alloc(kvt_pool *p, uint32_t *slot)
{
	return kvt_pool_alloc_n(p, slot, 1);
}

int kvt_pool_free(kvt_pool *p, uint32_t slot)
{
	if (KVT_UNLIKELY(slot >= p->nslots))
		return -EINVAL;
	kvti_spin_lock(&p->lock);
	if (KVT_UNLIKELY(p->pos[slot] != NOT_FREE)) {
		kvti_spin_unlock(&p->lock);
		return -EINVAL; /* double free */
	}
	p->pos[slot] = p->nfree;
	p->stack[p->nfree++] = slot;
	p->frees++;
	atomic_store_explicit(&p->used, p->nslots - p->nfree,
			      memory_order_relaxed);
	kvti_spin_unlock(&p->lock);
	return 0;
}

int kvt_pool_reserve(kvt_pool *p, uint32_t slot)
{
	uint32_t i, top;

	if (slot >= p->nslots)
		return -EINVAL;
	kvti_spin_lock(&p->lock);
	i = p->pos[slot];
	if (i == NOT_FREE) {
		kvti_spin_unlock(&p->lock);
		return KVT_EBUSY;
	}
	top = p->stack[p->nfree - 1];
	p->stack[i] = top;
	p->pos[top] = i;
	p->nfree--;
	p->pos[slot] = NOT_FREE;
	p->allocs++;
	if (p->nslots - p->nfree > p->peak)
		p->peak = p->nslots - p->nfree;
	atomic_store_explicit(&p->used, p->nslots - p->nfree,
			      memory_order_relaxed);
	kvti_spin_unlock(&p->lock);
	return 0;
}

int kvt_pool_is_used(kvt_pool *p, uint32_t slot)
{
	int used;

	if (slot >= p->nslots)
		return 0;
	kvti_spin_lock(&p->lock);
	used = p->pos[slot] == NOT_FREE;
	kvti_spin_unlock(&p->lock);
	return used;
}

int kvt_pool_set_watermarks(kvt_pool *p, double high, double low,
			    kvt_pool_evict_fn evict, void *arg)
{
	if (!(low > 0 && low <= high && high <= 1))
		return kvti_fail(-EINVAL, "watermarks need 0 < low <= high <= "
				 "1 (got high %g, low %g)", high, low);
	kvti_spin_lock(&p->lock);
	p->high_slots = (uint32_t)(high * p->nslots);
	p->low_slots = (uint32_t)(low * p->nslots);
	p->evict = evict;
	p->evict_arg = arg;
	kvti_spin_unlock(&p->lock);
	return 0;
}

void kvt_pool_stat_get(kvt_pool *p, kvt_pool_stat *st)
{
	kvti_spin_lock(&p->lock);
	st->slots = p->nslots;
	st->used = p->nslots - p->nfree;
	st->peak = p->peak;
	st->slot_bytes = p->slot_bytes;
	st->allocs = p->allocs;
	st->frees = p->frees;
	st->full = p->full;
	kvti_spin_unlock(&p->lock);
	st->evict_calls = atomic_load(&p->evict_calls);
}

uint64_t kvt_pool_used(kvt_pool *p)
{
	return atomic_load_explicit(&p->used, memory_order_relaxed);
}

uint64_t kvt_pool_slots(kvt_pool *p)
{
	return p->nslots;
}
