/*
 * xfer_cuda.h — the boundary between the cuda lane (C, cuda_lane.c) and
 * the CUDA code (xfer_cuda.cu, C++ compiled by nvcc). Plain C types only:
 * the lane computes every chunk's address with the same kvt_layout_chunk()
 * the cpu lane and the reference use, and hands this side arrays of
 * (dst, src) pointers per layer; this side only moves them.
 *
 *   lane (C)                                  xfer_cuda.cu
 *   kvti_cu_stage(n)  -> pinned dst[], src[]  (grown as needed)
 *   fill layer l's pointers at [l*m, l*m+m)
 *   kvti_cu_enqueue(method, l*m, m, bytes) -> chunk:  m cudaMemcpyAsync
 *                                             batch:  cudaMemcpyBatchAsync
 *                                             kernel: pointers to the GPU,
 *                                                     then one launch
 *   kvti_cu_mark(l)   -> event l recorded on the stream
 *   kvti_cu_query(l) / kvti_cu_wait(l)      -> layer l landed
 *
 * One kvti_cu per lane thread (its own stream); not thread-safe. Every
 * call returns 0 or a negative error with kvt_errdetail() set.
 */
#ifndef KVT_XFER_CUDA_H
#define KVT_XFER_CUDA_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

struct kvti_cu;

/* A stream on device @dev, high or low priority. */
int kvti_cu_open(struct kvti_cu **out, int dev, int high_prio);
void kvti_cu_close(struct kvti_cu *c);
/* Make @c's device current in the calling thread (the lane thread calls
 * it once: the current device is per thread). */
int kvti_cu_bind(struct kvti_cu *c);
/* Device address of registered (pinned) host memory; -EINVAL if @host is
 * not registered. */
int kvti_cu_host_devptr(struct kvti_cu *c, void *host, void **dev);
/* Room for @n pointer pairs (and events for @nev layers); the pinned
 * arrays to fill. Valid until the next kvti_cu_stage(). */
int kvti_cu_stage(struct kvti_cu *c, size_t n, uint32_t nev, void ***dsts,
		  const void ***srcs);
/* Enqueue copies [first, first+n) of @bytes each with @method
 * (KVT_XFER_CUDA_*), @blocks thread blocks for the kernel. */
int kvti_cu_enqueue(struct kvti_cu *c, int method, size_t first, size_t n,
		    size_t bytes, unsigned blocks);
int kvti_cu_mark(struct kvti_cu *c, uint32_t ev);
/* 1 done, 0 not yet, or an error. */
int kvti_cu_query(struct kvti_cu *c, uint32_t ev);
int kvti_cu_wait(struct kvti_cu *c, uint32_t ev);
int kvti_cu_sync(struct kvti_cu *c);
/* One cudaMemcpy of @n bytes on device @dev, timed. */
int kvti_cu_contig(int dev, void *dst, const void *src, size_t n,
		   double *seconds);
/* 1 if cudaMemcpyBatchAsync was available at build time. */
int kvti_cu_batch_built(void);

#ifdef __cplusplus
}
#endif

#endif
