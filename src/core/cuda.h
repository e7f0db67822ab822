/*
 * cuda.h — the few CUDA runtime calls the core and the tiers need, behind
 * plain C functions that exist in every build. Without CUDA compiled in
 * they return KVT_ENOTBUILT; with CUDA but no usable GPU, KVT_ENODEV. The
 * transfer engine's kernels live in src/xfer/cuda/, not here.
 */
#ifndef KVT_CUDA_H
#define KVT_CUDA_H

#include <stddef.h>

/* 1 if this build has CUDA. */
int kvti_cuda_built(void);
/* 1 if cudaMemcpyBatchAsync is built in (CUDA 12.8 or later). */
int kvti_cuda_batch_built(void);
/* Number of usable GPUs into *n (0 with a reason in @note). Returns 0 or
 * KVT_ENOTBUILT. */
int kvti_cuda_device_count(int *n, char *note, size_t len);
/* Name, memory and compute capability of device @dev. */
int kvti_cuda_device_info(int dev, char *name, size_t len, size_t *mem,
			  int *major, int *minor);
/* cudaHostRegister(p, len, portable|mapped) / unregister. */
int kvti_cuda_host_register(void *p, size_t len);
void kvti_cuda_host_unregister(void *p);
/* cudaMalloc on device @dev / cudaFree. */
int kvti_cuda_malloc(int dev, size_t len, void **p);
void kvti_cuda_free(void *p);
/* Synchronous copies: host to device, device to host. */
int kvti_cuda_h2d(void *dst, const void *src, size_t n);
int kvti_cuda_d2h(void *dst, const void *src, size_t n);

#endif
