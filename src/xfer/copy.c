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
#include "dev/xxh3.h"

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

/*
 * Copy and hash in one pass (kvti_copy_xxh3): XXH3-64 (seed 0, the
 * default secret) of the concatenation of @nseg segments of @n bytes each,
 * s[0] .. s[nseg-1], each copied to d[k] with streaming stores; the hash
 * is accumulated from the very registers the stores write, so it is the
 * hash of what landed, with no second read of source or destination.
 * The long hash of XXH3 (src/dev/xxh3.h draws it): 64-byte stripes, 16 a
 * block, a scramble after each full block, the last stripe again with its
 * own secret, the merge; AVX2 does a stripe as two 256-bit lanes.
 */
__attribute__((target("avx2"))) static void acc_stripe(__m256i *acc,
						       __m256i v0, __m256i v1,
						       const uint8_t *sec)
{
	const __m256i k0 = _mm256_loadu_si256((const __m256i *)sec);
	const __m256i k1 = _mm256_loadu_si256((const __m256i *)(sec + 32));
	__m256i dk0 = _mm256_xor_si256(v0, k0), dk1 = _mm256_xor_si256(v1, k1);
	__m256i p0 = _mm256_mul_epu32(dk0, _mm256_srli_epi64(dk0, 32));
	__m256i p1 = _mm256_mul_epu32(dk1, _mm256_srli_epi64(dk1, 32));

	/* acc[i ^ 1] += v[i]: swap the 64-bit words of each 128-bit half */
	acc[0] = _mm256_add_epi64(acc[0], _mm256_add_epi64(p0,
				  _mm256_shuffle_epi32(v0, 0x4E)));
	acc[1] = _mm256_add_epi64(acc[1], _mm256_add_epi64(p1,
				  _mm256_shuffle_epi32(v1, 0x4E)));
}

__attribute__((target("avx2"))) static void acc_scramble(__m256i *acc,
							 const uint8_t *sec)
{
	const __m256i prime = _mm256_set1_epi32((int)KVT_P32_1);

	for (int h = 0; h < 2; h++) {
		__m256i a = acc[h];
		__m256i k = _mm256_loadu_si256((const __m256i *)(sec + 32 * h));
		__m256i lo, hi;

		a = _mm256_xor_si256(a, _mm256_srli_epi64(a, 47));
		a = _mm256_xor_si256(a, k);
		lo = _mm256_mul_epu32(a, prime);
		hi = _mm256_mul_epu32(_mm256_srli_epi64(a, 32), prime);
		acc[h] = _mm256_add_epi64(lo, _mm256_slli_epi64(hi, 32));
	}
}

__attribute__((target("avx2"))) static uint64_t copy_xxh3_avx2(
	char *const *d, const char *const *s, int nseg, size_t n)
{
	const uint8_t *sec = kvt_xxh3_ksecret_h;
	const size_t len = (size_t)nseg * n;
	const size_t nstripes = len / KVT_XXH3_STRIPE;
	uint64_t a[8];
	__m256i acc[2], v0 = _mm256_setzero_si256(), v1 = v0;
	size_t st = 0;

	for (unsigned i = 0; i < 8; i++)
		a[i] = kvt_xxh3_init_acc(i);
	acc[0] = _mm256_loadu_si256((const __m256i *)a);
	acc[1] = _mm256_loadu_si256((const __m256i *)(a + 4));
	for (int k = 0; k < nseg; k++)
		for (size_t o = 0; o < n; o += KVT_XXH3_STRIPE, st++) {
			v0 = _mm256_loadu_si256((const __m256i *)(s[k] + o));
			v1 = _mm256_loadu_si256((const __m256i *)(s[k] + o + 32));
			_mm256_stream_si256((__m256i *)(d[k] + o), v0);
			_mm256_stream_si256((__m256i *)(d[k] + o + 32), v1);
			/* every stripe but the last is in a block; the last
			 * is hashed below with the last stripe's secret */
			if (st + 1 == nstripes)
				break;
			acc_stripe(acc, v0, v1, sec + 8 * (st %
						   KVT_XXH3_BLOCK_STRIPES));
			if (st % KVT_XXH3_BLOCK_STRIPES ==
			    KVT_XXH3_BLOCK_STRIPES - 1)
				acc_scramble(acc, sec + KVT_XXH3_SECRET_BYTES -
					     KVT_XXH3_STRIPE);
		}
	acc_stripe(acc, v0, v1, sec + KVT_XXH3_LAST_SECRET);
	_mm256_storeu_si256((__m256i *)a, acc[0]);
	_mm256_storeu_si256((__m256i *)(a + 4), acc[1]);
	return kvt_xxh3_merge(a, len, sec);
}

static xfer_multi_fn multi_fn = multi_sse2;
static int have_avx2;

xfer_copy_fn kvti_copy_nt_pick(const char **isa)
{
	__builtin_cpu_init();
	if (__builtin_cpu_supports("avx2")) {
		*isa = "avx2";
		multi_fn = multi_avx2;
		have_avx2 = 1;
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

int kvti_copy_xxh3(char *const *d, const char *const *s, int nseg, size_t n,
		   uint64_t *h)
{
	const size_t len = (size_t)nseg * n;
	int aligned = 1;

	for (int k = 0; k < nseg; k++)
		aligned &= ((uintptr_t)d[k] & 31) == 0;
	/* whole stripes, a long input, 32-byte aligned destinations */
	if (!have_avx2 || n % KVT_XXH3_STRIPE || len <= KVT_XXH3_MIDSIZE_MAX ||
	    !aligned)
		return -1;
	*h = copy_xxh3_avx2(d, s, nseg, n);
	return 0;
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

int kvti_copy_xxh3(char *const *d, const char *const *s, int nseg, size_t n,
		   uint64_t *h)
{
	(void)d;
	(void)s;
	(void)nseg;
	(void)n;
	(void)h;
	return -1;
}

#endif
