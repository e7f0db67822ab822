/*
 * xfer_cuda.cu — the cuda lane's three ways of moving a layer's chunks
 * between pinned host memory and the GPU (see xfer_cuda.h for the flow):
 *
 *   chunk   one cudaMemcpyAsync per chunk: what vLLM's swap_blocks does,
 *           the baseline; ~2-3 us of CPU per call, small DMAs.
 *   batch   one cudaMemcpyBatchAsync per layer: copy engines, no SMs.
 *           CUDA 12.8 introduced it with a failIdx argument; CUDA 13
 *           dropped that argument and made the arrays const. Both are
 *           handled by CUDART_VERSION; older toolkits report not built.
 *   kernel  kvt_xfer_gather: one warp per chunk, each lane moving 16 bytes
 *           per access (four accesses in flight per lane per step, to
 *           cover PCIe latency), loads and stores with the streaming
 *           cache hint (ld.global.cs / st.global.cs: touched once, evict
 *           first), launched with 1-2 blocks of 1024 threads so it takes
 *           almost no SMs from the model. The host side must be
 *           registered (cudaHostRegister, the tier option 'pin'): the GPU
 *           reads and writes it directly, no bounce buffer.
 *
 * Chunks whose addresses or size are not 16-byte multiples take a byte
 * loop (correct, slow; no real geometry has them).
 */
#include <kvtier.h>
#include "xfer/cuda/xfer_cuda.h"

#include <cuda_runtime.h>
#include <errno.h>
#include <string.h>

extern "C" int kvti_fail(int err, const char *fmt, ...);

#define KERNEL_THREADS 1024

struct kvti_cu {
	int dev;
	cudaStream_t stream;
	size_t cap;              /* pairs the staging holds */
	void **h_dst;            /* pinned */
	const void **h_src;
	size_t *h_size;
	void **d_dst;            /* device copies for the kernel */
	const void **d_src;
	cudaEvent_t *ev;
	uint32_t nev;
};

static int cu_err(cudaError_t e, const char *what)
{
	return kvti_fail(e == cudaErrorMemoryAllocation ? -ENOMEM : -EIO,
			 "%s: %s", what, cudaGetErrorString(e));
}

__global__ void __launch_bounds__(KERNEL_THREADS)
kvt_xfer_gather(const char *const *__restrict__ src,
		char *const *__restrict__ dst, size_t n, size_t bytes)
{
	const unsigned lane = threadIdx.x & 31;
	const size_t nwarps = ((size_t)gridDim.x * blockDim.x) >> 5;

	for (size_t w = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
	     w < n; w += nwarps) {
		const char *s = src[w];
		char *d = dst[w];

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
	}
}

extern "C" int kvti_cu_batch_built(void)
{
#if CUDART_VERSION >= 12080
	return 1;
#else
	return 0;
#endif
}

extern "C" int kvti_cu_open(struct kvti_cu **out, int dev, int high_prio)
{
	struct kvti_cu *c;
	int lo, hi;
	cudaError_t e;

	if ((e = cudaSetDevice(dev)) != cudaSuccess)
		return cu_err(e, "cudaSetDevice");
	c = (struct kvti_cu *)kvt_calloc(1, sizeof(*c));
	if (!c)
		return -ENOMEM;
	c->dev = dev;
	if ((e = cudaDeviceGetStreamPriorityRange(&lo, &hi)) != cudaSuccess ||
	    (e = cudaStreamCreateWithPriority(&c->stream, cudaStreamNonBlocking,
					      high_prio ? hi : lo)) !=
		    cudaSuccess) {
		kvt_free(c);
		return cu_err(e, "cudaStreamCreateWithPriority");
	}
	*out = c;
	return 0;
}

extern "C" int kvti_cu_bind(struct kvti_cu *c)
{
	cudaError_t e = cudaSetDevice(c->dev);

	return e == cudaSuccess ? 0 : cu_err(e, "cudaSetDevice");
}

static void stage_free(struct kvti_cu *c)
{
	cudaFreeHost(c->h_dst);
	cudaFreeHost((void *)c->h_src);
	cudaFreeHost(c->h_size);
	cudaFree(c->d_dst);
	cudaFree((void *)c->d_src);
	c->h_dst = NULL;
	c->h_src = NULL;
	c->h_size = NULL;
	c->d_dst = NULL;
	c->d_src = NULL;
	c->cap = 0;
}

extern "C" void kvti_cu_close(struct kvti_cu *c)
{
	if (!c)
		return;
	cudaSetDevice(c->dev);
	cudaStreamSynchronize(c->stream);
	stage_free(c);
	for (uint32_t i = 0; i < c->nev; i++)
		cudaEventDestroy(c->ev[i]);
	kvt_free(c->ev);
	cudaStreamDestroy(c->stream);
	kvt_free(c);
}

extern "C" int kvti_cu_host_devptr(struct kvti_cu *c, void *host, void **dev)
{
	cudaError_t e = cudaHostGetDevicePointer(dev, host, 0);

	if (e != cudaSuccess) {
		cudaGetLastError();
		return kvti_fail(-EINVAL, "host memory at %p is not registered "
				 "with CUDA (open its tier with 'pin'): %s", host,
				 cudaGetErrorString(e));
	}
	return 0;
}

static int events_grow(struct kvti_cu *c, uint32_t nev)
{
	cudaEvent_t *ev;
	cudaError_t e;

	if (nev <= c->nev)
		return 0;
	ev = (cudaEvent_t *)kvt_realloc(c->ev, nev * sizeof(*ev));
	if (!ev)
		return -ENOMEM;
	c->ev = ev;
	for (; c->nev < nev; c->nev++) {
		e = cudaEventCreateWithFlags(&c->ev[c->nev],
					     cudaEventDisableTiming |
						     cudaEventBlockingSync);
		if (e != cudaSuccess)
			return cu_err(e, "cudaEventCreate");
	}
	return 0;
}

extern "C" int kvti_cu_stage(struct kvti_cu *c, size_t n, uint32_t nev,
			     void ***dsts, const void ***srcs)
{
	cudaError_t e;
	int err;

	if ((err = events_grow(c, nev)))
		return err;
	if (n > c->cap) {
		size_t cap = n + n / 4;

		stage_free(c);
		if ((e = cudaMallocHost((void **)&c->h_dst, cap * sizeof(void *))) ||
		    (e = cudaMallocHost((void **)&c->h_src, cap * sizeof(void *))) ||
		    (e = cudaMallocHost((void **)&c->h_size, cap * sizeof(size_t))) ||
		    (e = cudaMalloc((void **)&c->d_dst, cap * sizeof(void *))) ||
		    (e = cudaMalloc((void **)&c->d_src, cap * sizeof(void *)))) {
			stage_free(c);
			return cu_err(e, "staging chunk pointers");
		}
		c->cap = cap;
	}
	*dsts = c->h_dst;
	*srcs = c->h_src;
	return 0;
}

static int enqueue_batch(struct kvti_cu *c, size_t first, size_t n,
			 size_t bytes)
{
#if CUDART_VERSION >= 12080
	struct cudaMemcpyAttributes attr;
	size_t idx = 0;
	cudaError_t e;

	for (size_t i = 0; i < n; i++)
		c->h_size[first + i] = bytes;
	memset(&attr, 0, sizeof(attr));
	attr.srcAccessOrder = cudaMemcpySrcAccessOrderStream;
	attr.flags = cudaMemcpyFlagPreferOverlapWithCompute;
#if CUDART_VERSION >= 13000
	e = cudaMemcpyBatchAsync(c->h_dst + first, c->h_src + first,
				 c->h_size + first, n, &attr, &idx, 1, c->stream);
#else
	size_t fail = SIZE_MAX;
	e = cudaMemcpyBatchAsync(c->h_dst + first, (void **)(c->h_src + first),
				 c->h_size + first, n, &attr, &idx, 1, &fail,
				 c->stream);
#endif
	if (e != cudaSuccess)
		return cu_err(e, "cudaMemcpyBatchAsync");
	return 0;
#else
	return kvti_fail(KVT_ENOTBUILT, "cudaMemcpyBatchAsync needs CUDA 12.8 "
			 "or later (this build: CUDA runtime %d)", CUDART_VERSION);
#endif
}

static int enqueue_kernel(struct kvti_cu *c, size_t first, size_t n,
			  size_t bytes, unsigned blocks)
{
	cudaError_t e;

	if ((e = cudaMemcpyAsync(c->d_dst + first, c->h_dst + first,
				 n * sizeof(void *), cudaMemcpyHostToDevice,
				 c->stream)) != cudaSuccess ||
	    (e = cudaMemcpyAsync((void *)(c->d_src + first), c->h_src + first,
				 n * sizeof(void *), cudaMemcpyHostToDevice,
				 c->stream)) != cudaSuccess)
		return cu_err(e, "cudaMemcpyAsync (chunk pointers)");
	kvt_xfer_gather<<<blocks, KERNEL_THREADS, 0, c->stream>>>(
		(const char *const *)(c->d_src + first),
		(char *const *)(c->d_dst + first), n, bytes);
	if ((e = cudaGetLastError()) != cudaSuccess)
		return cu_err(e, "kvt_xfer_gather launch");
	return 0;
}

extern "C" int kvti_cu_enqueue(struct kvti_cu *c, int method, size_t first,
			       size_t n, size_t bytes, unsigned blocks)
{
	cudaError_t e;

	if (!n)
		return 0;
	switch (method) {
	case KVT_XFER_CUDA_CHUNK:
		for (size_t i = first; i < first + n; i++) {
			e = cudaMemcpyAsync(c->h_dst[i], c->h_src[i], bytes,
					    cudaMemcpyDefault, c->stream);
			if (e != cudaSuccess)
				return cu_err(e, "cudaMemcpyAsync");
		}
		return 0;
	case KVT_XFER_CUDA_BATCH:
		return enqueue_batch(c, first, n, bytes);
	case KVT_XFER_CUDA_KERNEL:
		return enqueue_kernel(c, first, n, bytes, blocks);
	default:
		return kvti_fail(-EINVAL, "not a cuda method: %d", method);
	}
}

extern "C" int kvti_cu_mark(struct kvti_cu *c, uint32_t ev)
{
	cudaError_t e = cudaEventRecord(c->ev[ev], c->stream);

	return e == cudaSuccess ? 0 : cu_err(e, "cudaEventRecord");
}

extern "C" int kvti_cu_query(struct kvti_cu *c, uint32_t ev)
{
	cudaError_t e = cudaEventQuery(c->ev[ev]);

	if (e == cudaSuccess)
		return 1;
	if (e == cudaErrorNotReady)
		return 0;
	return cu_err(e, "cudaEventQuery");
}

extern "C" int kvti_cu_wait(struct kvti_cu *c, uint32_t ev)
{
	cudaError_t e = cudaEventSynchronize(c->ev[ev]);

	return e == cudaSuccess ? 0 : cu_err(e, "cudaEventSynchronize");
}

extern "C" int kvti_cu_sync(struct kvti_cu *c)
{
	cudaError_t e = cudaStreamSynchronize(c->stream);

	return e == cudaSuccess ? 0 : cu_err(e, "cudaStreamSynchronize");
}

extern "C" int kvti_cu_contig(int dev, void *dst, const void *src, size_t n,
			      double *seconds)
{
	cudaEvent_t a, b;
	cudaError_t e;
	float ms = 0;

	if ((e = cudaSetDevice(dev)) != cudaSuccess)
		return cu_err(e, "cudaSetDevice");
	if ((e = cudaEventCreate(&a)) != cudaSuccess)
		return cu_err(e, "cudaEventCreate");
	if ((e = cudaEventCreate(&b)) != cudaSuccess) {
		cudaEventDestroy(a);
		return cu_err(e, "cudaEventCreate");
	}
	cudaDeviceSynchronize();
	if ((e = cudaEventRecord(a, 0)) == cudaSuccess &&
	    (e = cudaMemcpyAsync(dst, src, n, cudaMemcpyDefault, 0)) ==
		    cudaSuccess &&
	    (e = cudaEventRecord(b, 0)) == cudaSuccess &&
	    (e = cudaEventSynchronize(b)) == cudaSuccess)
		e = cudaEventElapsedTime(&ms, a, b);
	cudaEventDestroy(a);
	cudaEventDestroy(b);
	if (e != cudaSuccess)
		return cu_err(e, "contiguous cudaMemcpy");
	*seconds = ms / 1e3;
	return 0;
}
