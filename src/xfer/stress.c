/*
 * stress.c — the memory stressor: N threads, each copying back and forth
 * between its own two buffers of B bytes, as fast as it can.
 *
 *   thread i:  a_i ──copy 16 MiB at a time──► b_i, then b_i ──► a_i, ...
 *              bytes_i += 16 MiB after each block; stop checked after each
 *
 * It reproduces the CPU memory-bandwidth contention of the published
 * dedicated-tier experiment (stressor threads each copying between two
 * 4 GB buffers). Copies use the engine's streaming stores, as glibc's
 * memcpy does for copies that large, so each copied byte costs one read
 * and one write of DRAM bandwidth. Buffers are mapped by kvt_stress_start()
 * (all or nothing) and faulted in by their own thread (first touch puts
 * them on that thread's NUMA node); start returns once every thread is
 * copying.
 *
 * Locking: s->mu guards the ready count; the counters are atomics read by
 * kvt_stress_sample() from any thread.
 */
#include "xfer/xfer_impl.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#define STRESS_BLOCK (16u << 20)

struct stress_thread {
	struct kvt_stress *s;
	pthread_t th;
	char *a, *b;
	atomic_uint_fast64_t bytes;
	atomic_uint_fast64_t t0, t1; /* copying began / ended, ns */
	int started;
};

struct kvt_stress {
	unsigned n;
	uint64_t len;
	double seconds;
	xfer_copy_fn copy;
	atomic_int stop;
	pthread_mutex_t mu;
	pthread_cond_t cv;
	unsigned ready;
	uint64_t t0;
	struct stress_thread t[];
};

static void *stress_main(void *arg)
{
	struct stress_thread *t = arg;
	struct kvt_stress *s = t->s;
	uint64_t end;
	char *a = t->a, *b = t->b;

	memset(a, 0x5a, s->len);
	memset(b, 0xa5, s->len);
	atomic_store(&t->t0, kvt_now_ns());
	end = s->seconds > 0 ? atomic_load(&t->t0) +
				       (uint64_t)(s->seconds * 1e9) : UINT64_MAX;
	pthread_mutex_lock(&s->mu);
	s->ready++;
	pthread_cond_broadcast(&s->cv);
	pthread_mutex_unlock(&s->mu);
	while (!atomic_load_explicit(&s->stop, memory_order_relaxed)) {
		for (uint64_t o = 0; o < s->len; o += STRESS_BLOCK) {
			uint64_t m = KVT_MIN(s->len - o, STRESS_BLOCK);

			s->copy(b + o, a + o, m);
			atomic_fetch_add_explicit(&t->bytes, m,
						  memory_order_relaxed);
			if (atomic_load_explicit(&s->stop, memory_order_relaxed) ||
			    kvt_now_ns() >= end)
				goto out;
		}
		char *tmp = a;
		a = b;
		b = tmp;
	}
out:
	kvti_copy_fence();
	atomic_store(&t->t1, kvt_now_ns());
	return NULL;
}

static uint64_t mem_available(void)
{
	char *text, *p;
	uint64_t v = 0;

	if (kvti_read_file("/proc/meminfo", 1 << 16, &text, NULL))
		return 0;
	p = strstr(text, "MemAvailable:");
	if (p)
		v = strtoull(p + 13, NULL, 10) * 1024;
	kvt_free(text);
	return v;
}

static void stress_free(struct kvt_stress *s)
{
	for (unsigned i = 0; i < s->n; i++) {
		if (s->t[i].a)
			munmap(s->t[i].a, s->len);
		if (s->t[i].b)
			munmap(s->t[i].b, s->len);
	}
	pthread_cond_destroy(&s->cv);
	pthread_mutex_destroy(&s->mu);
	kvt_free(s);
}

static void stress_join(struct kvt_stress *s)
{
	atomic_store(&s->stop, 1);
	for (unsigned i = 0; i < s->n; i++)
		if (s->t[i].started)
			pthread_join(s->t[i].th, NULL);
}

static char *stress_map(uint64_t len)
{
	char *p = kvti_mmap(NULL, len, PROT_READ | PROT_WRITE,
			    MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);

	if (p == MAP_FAILED)
		return NULL;
	madvise(p, len, MADV_HUGEPAGE);
	return p;
}

int kvt_stress_start(kvt_stress **out, unsigned threads, uint64_t buffer_bytes,
		     double seconds)
{
	struct kvt_stress *s;
	uint64_t need, avail;
	const char *isa;
	char a[32], b[32], c[32];
	int err = 0;

	kvti_errclear();
	if (threads < 1 || threads > KVT_STRESS_MAX_THREADS)
		return kvti_fail(-EINVAL, "stressor threads: %u (1..%d)", threads,
				 KVT_STRESS_MAX_THREADS);
	if (buffer_bytes < (1u << 20) || buffer_bytes > (1ull << 46))
		return kvti_fail(-EINVAL, "stressor buffer: %llu bytes (1 MiB to "
				 "64 TiB)", (unsigned long long)buffer_bytes);
	if (!(seconds >= 0) || seconds > 1e7)
		return kvti_fail(-EINVAL, "stressor duration: %g s", seconds);
	need = 2ull * threads * buffer_bytes;
	avail = mem_available();
	if (avail && need > avail / 10 * 9)
		return kvti_fail(-ENOMEM, "%u stressor threads need %s (two "
				 "buffers of %s each) but only %s of memory is "
				 "available", threads,
				 kvt_size_format(need, a, sizeof(a)),
				 kvt_size_format(buffer_bytes, b, sizeof(b)),
				 kvt_size_format(avail, c, sizeof(c)));
	s = kvt_calloc(1, sizeof(*s) + threads * sizeof(s->t[0]));
	if (!s)
		return -ENOMEM;
	s->n = threads;
	s->len = buffer_bytes;
	s->seconds = seconds;
	s->copy = kvti_copy_nt_pick(&isa);
	pthread_mutex_init(&s->mu, NULL);
	pthread_cond_init(&s->cv, NULL);
	for (unsigned i = 0; i < threads; i++) {
		s->t[i].s = s;
		if (!(s->t[i].a = stress_map(buffer_bytes)) ||
		    !(s->t[i].b = stress_map(buffer_bytes))) {
			err = kvti_fail(-ENOMEM, "stressor %u: mapping %s: %s", i,
					kvt_size_format(buffer_bytes, a, sizeof(a)),
					strerror(errno));
			goto err_free;
		}
	}
	s->t0 = kvt_now_ns();
	for (unsigned i = 0; i < threads; i++) {
		int e = kvti_fault() ? EAGAIN :
			pthread_create(&s->t[i].th, NULL, stress_main, &s->t[i]);
		if (e) {
			err = kvti_fail(-e, "starting stressor %u: %s", i,
					strerror(e));
			goto err_join;
		}
		s->t[i].started = 1;
	}
	pthread_mutex_lock(&s->mu);
	while (s->ready < threads)
		pthread_cond_wait(&s->cv, &s->mu);
	pthread_mutex_unlock(&s->mu);
	*out = s;
	return 0;

err_join:
	stress_join(s);
err_free:
	stress_free(s);
	return err;
}

void kvt_stress_sample(kvt_stress *s, kvt_stress_stat *st)
{
	uint64_t now = kvt_now_ns(), first = UINT64_MAX;

	memset(st, 0, sizeof(*st));
	st->threads = s->n;
	for (unsigned i = 0; i < s->n; i++) {
		struct stress_thread *t = &s->t[i];
		uint64_t t0 = atomic_load(&t->t0), t1 = atomic_load(&t->t1);
		uint64_t bytes = atomic_load(&t->bytes);
		double sec = ((t1 ? t1 : now) - t0) / 1e9;

		st->thread_gbps[i] = sec > 0 ? bytes / sec / 1e9 : 0;
		st->gbps += st->thread_gbps[i];
		st->bytes += bytes;
		st->running += !t1;
		first = KVT_MIN(first, t0);
	}
	st->seconds = first < now ? (now - first) / 1e9 : 0;
}

void kvt_stress_stop(kvt_stress *s, kvt_stress_stat *final)
{
	if (!s)
		return;
	stress_join(s);
	if (final)
		kvt_stress_sample(s, final);
	stress_free(s);
}
