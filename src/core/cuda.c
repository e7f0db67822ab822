/*
 * cuda.c — thin C wrappers over the CUDA runtime (see cuda.h). The file is
 * compiled in every build; the CUDA half only when KVT_HAVE_CUDA is set.
 */
#include "core/core.h"
#include "core/cuda.h"

#include <errno.h>
#include <stdio.h>

#ifdef KVT_HAVE_CUDA
#include <cuda_runtime_api.h>

static int cuda_err(cudaError_t e, const char *what)
{
	return kvti_fail(e == cudaErrorMemoryAllocation ? -ENOMEM : -EIO,
			 "%s: %s", what, cudaGetErrorString(e));
}

int kvti_cuda_built(void)
{
	return 1;
}

int kvti_cuda_batch_built(void)
{
	return CUDART_VERSION >= 12080;
}

int kvti_cuda_device_count(int *n, char *note, size_t len)
{
	cudaError_t e = cudaGetDeviceCount(n);

	if (e != cudaSuccess) {
		*n = 0;
		if (note)
			snprintf(note, len, "cudaGetDeviceCount: %s",
				 cudaGetErrorString(e));
		cudaGetLastError(); /* clear the sticky-free error */
		return 0;
	}
	if (*n == 0 && note)
		snprintf(note, len, "no CUDA device");
	else if (note && len)
		note[0] = '\0';
	return 0;
}

int kvti_cuda_device_info(int dev, char *name, size_t len, size_t *mem,
			  int *major, int *minor)
{
	struct cudaDeviceProp p;
	cudaError_t e = cudaGetDeviceProperties(&p, dev);

	if (e != cudaSuccess)
		return cuda_err(e, "cudaGetDeviceProperties");
	kvti_strlcpy(name, p.name, len);
	*mem = p.totalGlobalMem;
	*major = p.major;
	*minor = p.minor;
	return 0;
}

static int have_gpu(void)
{
	int n = 0;
	char note[128];

	kvti_cuda_device_count(&n, note, sizeof(note));
	if (n <= 0)
		return kvti_fail(KVT_ENODEV, "%s", note);
	return 0;
}

int kvti_cuda_host_register(void *p, size_t len)
{
	cudaError_t e;
	int err = have_gpu();

	if (err)
		return err;
	e = cudaHostRegister(p, len, cudaHostRegisterPortable |
				     cudaHostRegisterMapped);
	if (e != cudaSuccess)
		return cuda_err(e, "cudaHostRegister");
	return 0;
}

void kvti_cuda_host_unregister(void *p)
{
	cudaHostUnregister(p);
}

int kvti_cuda_malloc(int dev, size_t len, void **p)
{
	cudaError_t e;
	int err = have_gpu();

	if (err)
		return err;
	if (kvti_fault())
		return -ENOMEM;
	e = cudaSetDevice(dev);
	if (e != cudaSuccess)
		return cuda_err(e, "cudaSetDevice");
	e = cudaMalloc(p, len);
	if (e != cudaSuccess)
		return cuda_err(e, "cudaMalloc");
	return 0;
}

void kvti_cuda_free(void *p)
{
	cudaFree(p);
}

int kvti_cuda_h2d(void *dst, const void *src, size_t n)
{
	cudaError_t e = cudaMemcpy(dst, src, n, cudaMemcpyHostToDevice);
	return e == cudaSuccess ? 0 : cuda_err(e, "cudaMemcpy");
}

int kvti_cuda_d2h(void *dst, const void *src, size_t n)
{
	cudaError_t e = cudaMemcpy(dst, src, n, cudaMemcpyDeviceToHost);
	return e == cudaSuccess ? 0 : cuda_err(e, "cudaMemcpy");
}

#else /* !KVT_HAVE_CUDA */

static int not_built(void)
{
	return kvti_fail(KVT_ENOTBUILT, "this kvtier was built without CUDA");
}

int kvti_cuda_built(void)
{
	return 0;
}

int kvti_cuda_batch_built(void)
{
	return 0;
}

int kvti_cuda_device_count(int *n, char *note, size_t len)
{
	*n = 0;
	if (note)
		snprintf(note, len, "built without CUDA");
	return 0;
}

int kvti_cuda_device_info(int dev, char *name, size_t len, size_t *mem,
			  int *major, int *minor)
{
	return not_built();
}

int kvti_cuda_host_register(void *p, size_t len)
{
	return not_built();
}

void kvti_cuda_host_unregister(void *p)
{
}

int kvti_cuda_malloc(int dev, size_t len, void **p)
{
	return not_built();
}

void kvti_cuda_free(void *p)
{
}

int kvti_cuda_h2d(void *dst, const void *src, size_t n)
{
	return not_built();
}

int kvti_cuda_d2h(void *dst, const void *src, size_t n)
{
	return not_built();
}

#endif
