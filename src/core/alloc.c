/*
 * alloc.c — the one allocation wrapper, with fault injection.
 *
 * Every heap block and every mapping libkvtier makes is counted here. A
 * test arms the injector with kvt_alloc_fail_at(n); the n-th counted
 * acquisition from then fails as the system would (NULL / MAP_FAILED with
 * ENOMEM), once. Walking n = 1, 2, ... over a setup path visits every
 * failure point of it (the rax-oom-test idea). Counters are atomics: the
 * injector is process-wide and thread-safe.
 */
#include "core/core.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

static atomic_uint_fast64_t alloc_count;   /* acquisitions ever */
static atomic_uint_fast64_t fail_target;   /* count value that fails; 0 off */
static atomic_int_fast64_t live_blocks;    /* heap blocks outstanding */

void kvt_alloc_fail_at(uint64_t n)
{
	atomic_store(&fail_target, n ? atomic_load(&alloc_count) + n : 0);
}

uint64_t kvt_alloc_count(void)
{
	return atomic_load(&alloc_count);
}

int64_t kvt_alloc_live(void)
{
	return atomic_load(&live_blocks);
}

bool kvti_fault(void)
{
	uint64_t n = atomic_fetch_add(&alloc_count, 1) + 1;
	uint64_t t = atomic_load_explicit(&fail_target, memory_order_relaxed);

	if (KVT_UNLIKELY(t && n == t)) {
		atomic_store(&fail_target, 0);
		return true;
	}
	return false;
}

void *kvt_malloc(size_t n)
{
	void *p;

	if (kvti_fault()) {
		errno = ENOMEM;
		return NULL;
	}
	p = malloc(n ? n : 1);
	if (p)
		atomic_fetch_add(&live_blocks, 1);
	return p;
}

void *kvt_calloc(size_t nmemb, size_t size)
{
	void *p;

	if (kvti_fault()) {
		errno = ENOMEM;
		return NULL;
	}
	p = calloc(nmemb ? nmemb : 1, size ? size : 1);
	if (p)
		atomic_fetch_add(&live_blocks, 1);
	return p;
}

void *kvt_realloc(void *p, size_t n)
{
	void *q;

	if (kvti_fault()) {
		errno = ENOMEM;
		return NULL;
	}
	q = realloc(p, n ? n : 1);
	if (q && !p)
		atomic_fetch_add(&live_blocks, 1);
	return q;
}

char *kvt_strdup(const char *s)
{
	size_t n = strlen(s) + 1;
	char *d = kvt_malloc(n);

	if (d)
		memcpy(d, s, n);
	return d;
}

void kvt_free(void *p)
{
	if (!p)
		return;
	atomic_fetch_sub(&live_blocks, 1);
	free(p);
}

void *kvti_mmap(void *addr, size_t len, int prot, int flags, int fd,
		off_t off)
{
	if (kvti_fault()) {
		errno = ENOMEM;
		return MAP_FAILED;
	}
	return mmap(addr, len, prot, flags, fd, off);
}

void *kvti_aligned_alloc(size_t align, size_t n)
{
	void *p;

	if (kvti_fault()) {
		errno = ENOMEM;
		return NULL;
	}
	if (posix_memalign(&p, align, n ? n : 1)) {
		errno = ENOMEM;
		return NULL;
	}
	atomic_fetch_add(&live_blocks, 1);
	return p;
}

int kvti_grow(void **p, size_t *cap, size_t need, size_t elem, size_t first)
{
	size_t n = *cap ? *cap : first;
	void *q;

	if (need <= *cap)
		return 0;
	while (n < need)
		n *= 2;
	q = kvt_realloc(*p, n * elem);
	if (!q)
		return -ENOMEM;
	*p = q;
	*cap = n;
	return 0;
}
