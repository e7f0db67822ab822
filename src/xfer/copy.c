/*
 * copy.c — the cpu lane's non-temporal copy.
 *
 * A KV load writes far more than any cache holds, and whoever reads the
 * destination next is another agent (the GPU, or a later step), so caching
 * the destination only costs: every ordinary store first reads the line it
 * writes (read-for-ownership). Streaming stores skip that read and the
 * cache. glibc's memcpy switches to them by itself only above a threshold
 * sized from the last-level cache (tens to hundreds of MiB), so a KV chunk
 * of 32 KiB never gets them. Small copies do better through the cache
 * (write-combining buffers need whole lines), so the engine uses these only
 * for runs of at least 16 KiB in large jobs (kvt_xfer_config.nt).
 *
 *   dst  |head: memcpy to 32-byte alignment|stream 128 B per step...|tail|
 *
 * Small chunks scattered at random (a 1-token page is 64 chunks of 2 KiB
 * on the GPU side) are bound by how many cache misses one core keeps in
 * flight, not by bandwidth: one 2 KiB memcpy after another reaches about
 * half of a contiguous copy. kvti_copy_multi() copies up to 8 chunks of
 * one size at once, a 64-byte line of each in turn, so independent
 * streams of misses overlap, while it prefetches the sources of the next
 * batch line by line (software pipelining: two batches in flight):
 *
 *   line i of c0 c1 c2 c3 (load, stream-store), prefetch line i of the
 *   next batch's c0' .. c3'; then line i+1 ...
 *
 * The cpu lane uses batches of four: for random 2 KiB chunks they lift
 * two cores from ~0.3 to ~0.7 of the same bytes copied contiguously on
 * the dev machine, and 16-64 KiB chunks from ~0.8 to ~1.0.
 *
 * After the last streaming store of a unit of work, kvti_copy_fence()
 * orders them before the atomic that publishes the unit as done.
 */
#include "xfer/xfer_impl.h"

#include <string.h>

#if defined(__x86_64__)
#include <immintrin.h>

static void copy_nt_sse2(void *dst, const void *src, size_t n)
{
	char *d = dst;
	const char *s = src;
	size_t head = (size_t)(-(uintptr_t)d & 15);

	if (n < 256) {
		memcpy(d, s, n);
		return;
	}
	memcpy(d, s, head);
	d += head, s += head, n -= head;
	for (; n >= 64; n -= 64, d += 64, s += 64) {
		__m128i a = _mm_loadu_si128((const __m128i *)s);
		__m128i b = _mm_loadu_si128((const __m128i *)(s + 16));
		__m128i c = _mm_loadu_si128((const __m128i *)(s + 32));
		__m128i e = _mm_loadu_si128((const __m128i *)(s + 48));
		_mm_stream_si128((__m128i *)d, a);
		_mm_stream_si128((__m128i *)(d + 16), b);
		_mm_stream_si128((__m128i *)(d + 32), c);
		_mm_stream_si128((__m128i *)(d + 48), e);
	}
	memcpy(d, s, n);
}

__attribute__((target("avx2"))) static void copy_nt_avx2(void *dst,
							  const void *src,
							  size_t n)
{
	char *d = dst;
	const char *s = src;
	size_t head = (size_t)(-(uintptr_t)d & 31);

	if (n < 256) {
		memcpy(d, s, n);
		return;
	}
	memcpy(d, s, head);
	d += head, s += head, n -= head;
	for (; n >= 128; n -= 128, d += 128, s += 128) {
		__m256i a = _mm256_loadu_si256((const __m256i *)s);
		__m256i b = _mm256_loadu_si256((const __m256i *)(s + 32));
		__m256i c = _mm256_loadu_si256((const __m256i *)(s + 64));
		__m256i e = _mm256_loadu_si256((const __m256i *)(s + 96));
		_mm256_stream_si256((__m256i *)d, a);
		_mm256_stream_si256((__m256i *)(d + 32), b);
		_mm256_stream_si256((__m256i *)(d + 64), c);
		_mm256_stream_si256((__m256i *)(d + 96), e);
	}
	memcpy(d, s, n);
}

static void multi_sse2(char *const *d, const char *const *s, int nb, size_t n,
		       int nt, const char *const *pf, int npf)
{
	for (size_t i = 0; i < n; i += 64) {
		__m128i v[KVTI_MULTI_MAX][4];

		for (int k = 0; k < npf; k++)
			_mm_prefetch(pf[k] + i, _MM_HINT_T0);
		for (int k = 0; k < nb; k++)
			for (int q = 0; q < 4; q++)
				v[k][q] = _mm_loadu_si128(
					(const __m128i *)(s[k] + i + 16 * q));
		for (int k = 0; k < nb; k++)
			for (int q = 0; q < 4; q++) {
				__m128i *p = (__m128i *)(d[k] + i + 16 * q);
				if (nt)
					_mm_stream_si128(p, v[k][q]);
				else
					_mm_storeu_si128(p, v[k][q]);
			}
	}
}

__attribute__((target("avx2"))) static void multi_avx2(char *const *d,
							const char *const *s,
							int nb, size_t n, int nt,
							const char *const *pf,
							int npf)
{
	for (size_t i = 0; i < n; i += 64) {
		__m256i a[KVTI_MULTI_MAX], b[KVTI_MULTI_MAX];

		for (int k = 0; k < npf; k++)
			_mm_prefetch(pf[k] + i, _MM_HINT_T0);
		for (int k = 0; k < nb; k++) {
			a[k] = _mm256_loadu_si256((const __m256i *)(s[k] + i));
			b[k] = _mm256_loadu_si256((const __m256i *)(s[k] + i + 32));
		}
		if (nt) {
			for (int k = 0; k < nb; k++) {
				_mm256_stream_si256((__m256i *)(d[k] + i), a[k]);
				_mm256_stream_si256((__m256i *)(d[k] + i + 32), b[k]);
			}
		} else {
			for (int k = 0; k < nb; k++) {
				_mm256_storeu_si256((__m256i *)(d[k] + i), a[k]);
				_mm256_storeu_si256((__m256i *)(d[k] + i + 32), b[k]);
			}
		}
	}
}

static xfer_multi_fn multi_fn = multi_sse2;

xfer_copy_fn kvti_copy_nt_pick(const char **isa)
{
	__builtin_cpu_init();
	if (__builtin_cpu_supports("avx2")) {
		*isa = "avx2";
		multi_fn = multi_avx2;
		return copy_nt_avx2;
	}
	*isa = "sse2";
	return copy_nt_sse2;
}

void kvti_copy_multi(char *const *d, const char *const *s, int nb, size_t n,
		     int nt, const char *const *pf, int npf)
{
	multi_fn(d, s, nb, n, nt, pf, npf);
}

void kvti_copy_fence(void)
{
	_mm_sfence();
}

#else /* no streaming stores we know of: plain memcpy */

static void copy_plain(void *dst, const void *src, size_t n)
{
	memcpy(dst, src, n);
}

xfer_copy_fn kvti_copy_nt_pick(const char **isa)
{
	*isa = "memcpy";
	return copy_plain;
}

void kvti_copy_fence(void)
{
	atomic_thread_fence(memory_order_seq_cst);
}

void kvti_copy_multi(char *const *d, const char *const *s, int nb, size_t n,
		     int nt, const char *const *pf, int npf)
{
	for (int k = 0; k < nb; k++)
		memcpy(d[k], s[k], n);
}

#endif
