/*
 * fault.c — fault hooks for tests, besides the allocation injector
 * (alloc.c): a cache job held as a stuck disk or device would hold it
 * (kvt_fault_hold_jobs(), kvtier.h).
 *
 * Compiled into every build and off by default; armed only by a call in
 * the process (a test, or a daemon a test forked after arming it): the
 * daemon never calls it and nothing a client sends reaches it. The cache's
 * finishing workers ask kvti_fault_hold() for each job (cache/job_finish.c)
 * and wait there, the room thread before a store's demotions
 * (cache/mover.c); the settings are atomics, read without a lock.
 */
#include "core/core.h"

static atomic_uint_fast32_t hold_ms;
static atomic_uint hold_flags;

void kvt_fault_hold_jobs(uint32_t ms, unsigned flags)
{
	atomic_store(&hold_flags, flags);
	atomic_store(&hold_ms, ms);
}

uint64_t kvti_fault_hold(unsigned kind, int *stuck)
{
	uint32_t ms = (uint32_t)atomic_load_explicit(&hold_ms,
						     memory_order_relaxed);
	unsigned f;

	if (KVT_LIKELY(!ms))
		return 0;
	f = atomic_load(&hold_flags);
	if (!(f & kind))
		return 0;
	*stuck = (f & KVT_FAULT_STUCK) != 0;
	return (uint64_t)ms * 1000000ull;
}
