/*
 * cuda_kern.cu — the CUDA device's two kernels (dev.h: gather, sum), and
 * the C launchers cuda.c calls.
 *
 *   kvt_dev_gather  one warp per chunk, each lane moving 16 bytes per
 *                   access with four accesses in flight (to cover PCIe
 *                   latency), loads and stores with the streaming cache
 *                   hint (ld.global.cs / st.global.cs: touched once),
 *                   launched on 1-2 blocks of 1024 threads so it takes
 *                   almost no SMs from the model. Host memory is read and
 *                   written directly (registered, mapped). The pointer
 *                   arrays live in page-locked host memory; a warp loads
 *                   the next chunk's pointers before copying the current
 *                   one. Chunks whose addresses or size are not 16-byte
 *                   multiples take a byte loop (correct, slow; no real
 *                   geometry has them).
 *   kvt_dev_sum     XXH3-64 (xxh3.h, the same function as the CPU's) of
 *                   each item — nseg equal segments hashed as one input —
 *                   one warp per item. The segment pointers are copied
 *                   into shared memory first. Long inputs use the
 *                   block-parallel form: lane t sums the words t, t+32,
 *                   t+64, t+96 of each 1 KiB block (four blocks in flight),
 *                   shuffles reduce them to S(b), and lanes 0-7 (acc[0..7])
 *                   add and scramble block by block; lane 0 merges and
 *                   writes the result to page-locked host memory. Short
 *                   inputs (<= 240 bytes) are hashed by lane 0.
 *
 * Nothing here has run on a GPU in this repository's CI; the arithmetic
 * is xxh3.h's, checked on the CPU (tests/test_dev_xxh3.c), and
 * scripts/gpu-check runs the kernels against the CPU (test_dev).
 */
#include "dev/xxh3.h"

#include <cuda_runtime.h>
#include <stdint.h>

#define GATHER_THREADS 1024
#define SUM_WARPS 4
#define SUM_MAXSEG 256

__global__ void __launch_bounds__(GATHER_THREADS)
kvt_dev_gather(const char *const *__restrict__ src,
	       char *const *__restrict__ dst, size_t n, size_t bytes)
{
	const unsigned lane = threadIdx.x & 31;
	const size_t nwarps = ((size_t)gridDim.x * blockDim.x) >> 5;
	size_t w = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
	const char *s = w < n ? src[w] : NULL;
	char *d = w < n ? dst[w] : NULL;

	for (; w < n; w += nwarps) {
		size_t nx = w + nwarps;
		const char *ns = nx < n ? src[nx] : NULL;
		char *nd = nx < n ? dst[nx] : NULL;

		if ((((uintptr_t)s | (uintptr_t)d | bytes) & 15) == 0) {
			const int4 *s4 = (const int4 *)s;
			int4 *d4 = (int4 *)d;
			const size_t n4 = bytes >> 4;
			size_t k = lane;

			for (; k + 96 < n4; k += 128) {
				int4 a = __ldcs(s4 + k);
				int4 b = __ldcs(s4 + k + 32);
				int4 c = __ldcs(s4 + k + 64);
				int4 e = __ldcs(s4 + k + 96);
				__stcs(d4 + k, a);
				__stcs(d4 + k + 32, b);
				__stcs(d4 + k + 64, c);
				__stcs(d4 + k + 96, e);
			}
			for (; k < n4; k += 32)
				__stcs(d4 + k, __ldcs(s4 + k));
		} else {
			for (size_t k = lane; k < bytes; k += 32)
				d[k] = s[k];
		}
		s = ns;
		d = nd;
	}
}

/* Warp reduction of (m, d) to S[t % 8] on every lane t. */
__device__ static uint64_t warp_block_sum(uint64_t m, uint64_t d, unsigned t)
{
	m += __shfl_xor_sync(0xffffffffu, m, 8);
	m += __shfl_xor_sync(0xffffffffu, m, 16);
	d += __shfl_xor_sync(0xffffffffu, d, 8);
	d += __shfl_xor_sync(0xffffffffu, d, 16);
	/* S[i] = M[i] + D[i ^ 1]: lane i ^ 1 holds D[i ^ 1] */
	return m + __shfl_sync(0xffffffffu, d, (t & 7) ^ 1);
}

/* Lane t's part of block @b when the block lies inside one segment at
 * @p (8-byte aligned): its words t, t+32, t+64, t+96 of @ns stripes. */
__device__ static void lane_fast(const uint8_t *p, uint64_t ns, unsigned t,
				 const uint8_t *sec, uint64_t *m, uint64_t *d)
{
	*m = 0;
	*d = 0;
	for (unsigned w = t; w < 8 * ns; w += 32)
		kvt_xxh3_word(__ldcs((const unsigned long long *)p + w),
			      sec + 8 * (w >> 3), w & 7, m, d);
}

__global__ void __launch_bounds__(SUM_WARPS * 32)
kvt_dev_sum(const uint8_t *const *__restrict__ seg, uint32_t nseg,
	    uint64_t seg_len, size_t nitems, uint64_t *__restrict__ out)
{
	__shared__ const uint8_t *segs[SUM_WARPS][SUM_MAXSEG];
	const unsigned t = threadIdx.x & 31, wb = threadIdx.x >> 5;
	const size_t nwarps = (size_t)gridDim.x * SUM_WARPS;
	const uint8_t *sec = KVT_XXH3_KSECRET;
	const uint64_t len = (uint64_t)nseg * seg_len;
	int fast = seg_len % KVT_XXH3_BLOCK == 0;

	for (size_t it = (size_t)blockIdx.x * SUM_WARPS + wb; it < nitems;
	     it += nwarps) {
		kvt_xxh3_src src = { segs[wb], seg_len, nseg };
		uint64_t acc = kvt_xxh3_init_acc(t), n, nb;

		for (unsigned k = t; k < nseg; k += 32) {
			segs[wb][k] = seg[it * nseg + k];
			fast &= ((uintptr_t)segs[wb][k] & 7) == 0;
		}
		__syncwarp();
		fast = __all_sync(0xffffffffu, fast);
		if (len <= KVT_XXH3_MIDSIZE_MAX) {
			if (t == 0)
				out[it] = kvt_xxh3_src_64(&src, 0, NULL);
			__syncwarp();
			continue;
		}
		n = (len - 1) / KVT_XXH3_STRIPE;
		nb = (n + KVT_XXH3_BLOCK_STRIPES - 1) / KVT_XXH3_BLOCK_STRIPES;
		for (uint64_t b0 = 0; b0 < nb; b0 += 4) {
			uint64_t m[4], d[4];

			/* four blocks' loads in flight, then the chain */
			for (int j = 0; j < 4; j++) {
				uint64_t b = b0 + j;

				m[j] = d[j] = 0;
				if (b >= nb)
					continue;
				if (fast) {
					uint64_t off = b * KVT_XXH3_BLOCK;
					uint64_t ns = n - b * KVT_XXH3_BLOCK_STRIPES;

					lane_fast(segs[wb][off / seg_len] +
						  off % seg_len,
						  ns < 16 ? ns : 16, t, sec,
						  &m[j], &d[j]);
				} else {
					kvt_xxh3_lane(&src, b, n, t, sec, &m[j],
						      &d[j]);
				}
			}
			for (int j = 0; j < 4 && b0 + j < nb; j++) {
				uint64_t s = warp_block_sum(m[j], d[j], t);

				acc += s;
				if ((b0 + j + 1) * KVT_XXH3_BLOCK_STRIPES <= n)
					acc = kvt_xxh3_scramble1(acc, t & 7, sec);
			}
		}
		/* the last stripe: lane i (< 8) reads word i */
		{
			uint64_t self = 0, swap = 0;

			if (t < 8)
				kvt_xxh3_word(kvt_xxh3_src_rd64(&src, len - 64 + 8 * t),
					      sec + KVT_XXH3_LAST_SECRET, t, &self,
					      &swap);
			acc += self + __shfl_sync(0xffffffffu, swap, (t & 7) ^ 1);
		}
		{
			uint64_t a[8];

			for (int i = 0; i < 8; i++)
				a[i] = __shfl_sync(0xffffffffu, acc, i);
			if (t == 0)
				out[it] = kvt_xxh3_merge(a, len, sec);
		}
		__syncwarp();
	}
}

extern "C" int kvti_cuk_gather(cudaStream_t st, const void *const *src,
			       void *const *dst, size_t n, size_t bytes,
			       unsigned blocks)
{
	if (!n)
		return 0;
	kvt_dev_gather<<<blocks ? blocks : 2, GATHER_THREADS, 0, st>>>(
		(const char *const *)src, (char *const *)dst, n, bytes);
	return (int)cudaGetLastError();
}

extern "C" int kvti_cuk_sum(cudaStream_t st, const void *const *seg,
			    uint32_t nseg, uint64_t seg_len, size_t nitems,
			    uint64_t *out, unsigned blocks)
{
	size_t want = (nitems + SUM_WARPS - 1) / SUM_WARPS;

	if (!nitems)
		return 0;
	if (nseg > SUM_MAXSEG)
		return (int)cudaErrorInvalidValue;
	if (blocks && want > blocks)
		want = blocks;
	if (want > 65535)
		want = 65535;
	kvt_dev_sum<<<(unsigned)want, SUM_WARPS * 32, 0, st>>>(
		(const uint8_t *const *)seg, nseg, seg_len, nitems, out);
	return (int)cudaGetLastError();
}

extern "C" unsigned kvti_cuk_sum_maxseg(void)
{
	return SUM_MAXSEG;
}
