/*
 * cuda.c — the CUDA device (dev.h): the thin calls, one per operation.
 *
 *   memory       cudaMalloc / cudaFree; export: cudaIpcGetMemHandle of the
 *                allocation's base (cuMemGetAddressRange) and the offset
 *   import       legacy IPC: cudaIpcOpenMemHandle (lazy peer access);
 *                a VMM allocation's POSIX fd: cuMemImportFromShareableHandle,
 *                cuMemAddressReserve, cuMemMap, cuMemSetAccess (read-write
 *                for this device)
 *   host memory  cudaHostRegister Portable|Mapped, plus IoMemory for a
 *                device mapping (devdax, BAR) and ReadOnly for a page
 *                mapped read-only; cudaHostAlloc Portable|Mapped for the
 *                lanes' descriptors and results
 *   streams      cudaStreamCreateWithPriority (non-blocking)
 *   copies       cudaMemcpyAsync; cudaMemcpyBatchAsync (CUDA 12.8+; the
 *                12.8 form with failIdx, the 13 form without)
 *   kernels      cuda_kern.cu: the gather and the checksum
 *   events       cudaEventCreateWithFlags(DisableTiming | BlockingSync
 *                [| Interprocess]); IPC: cudaIpcGetEventHandle /
 *                cudaIpcOpenEventHandle
 *   value wait   cuStreamWaitValue32(GEQ) on the device pointer of
 *                registered host memory
 *
 * Driver-API calls are looked up at open with cudaGetDriverEntryPoint, so
 * the library links only libcudart (a CUDA build still loads on a machine
 * without the driver); a call whose entry point is missing reports
 * -EOPNOTSUPP and the capability stays off.
 *
 * The runtime's primary context is the one context per device: every
 * entry point makes the device current on the calling thread first.
 *
 * UNTESTED HERE: no GPU has run this file (see docs/PERFORMANCE.md and
 * scripts/gpu-check, which runs test_dev on every CUDA device).
 */
#include "dev/dev.h"

#include <errno.h>
#include <sched.h>
#include <stdio.h>
#include <string.h>

#ifdef KVT_HAVE_CUDA
#include <cuda.h>
#include <cuda_runtime_api.h>

/* cuda_kern.cu */
int kvti_cuk_gather(cudaStream_t st, const void *const *src, void *const *dst,
		    size_t n, size_t bytes, unsigned blocks);
int kvti_cuk_sum(cudaStream_t st, const void *const *seg, uint32_t nseg,
		 uint64_t seg_len, size_t nitems, uint64_t *out,
		 unsigned blocks);
unsigned kvti_cuk_sum_maxseg(void);

typedef CUresult (*pfn_wait32)(CUstream, CUdeviceptr, cuuint32_t, unsigned);
typedef CUresult (*pfn_range)(CUdeviceptr *, size_t *, CUdeviceptr);
typedef CUresult (*pfn_import)(CUmemGenericAllocationHandle *, void *,
			       CUmemAllocationHandleType);
typedef CUresult (*pfn_reserve)(CUdeviceptr *, size_t, size_t, CUdeviceptr,
				unsigned long long);
typedef CUresult (*pfn_map)(CUdeviceptr, size_t, size_t,
			    CUmemGenericAllocationHandle, unsigned long long);
typedef CUresult (*pfn_access)(CUdeviceptr, size_t, const CUmemAccessDesc *,
			       size_t);
typedef CUresult (*pfn_unmap)(CUdeviceptr, size_t);
typedef CUresult (*pfn_free)(CUdeviceptr, size_t);
typedef CUresult (*pfn_release)(CUmemGenericAllocationHandle);

struct cu {
	pfn_wait32 wait32;
	pfn_range range;
	pfn_import vmm_import;
	pfn_reserve reserve;
	pfn_map map;
	pfn_access access;
	pfn_unmap unmap;
	pfn_free vafree;
	pfn_release release;
};

struct vmm_imp {
	CUmemGenericAllocationHandle h;
	size_t len;
};

struct kvti_dev_stream {
	kvti_dev *d;
	cudaStream_t s;
	int wrapped;             /* the caller's: not destroyed here */
};

struct kvti_dev_event {
	kvti_dev *d;
	cudaEvent_t e;
	int ipc, imported;
};

static struct cu *C(kvti_dev *d)
{
	return d->priv;
}

static int cerr(kvti_dev *d, cudaError_t e, const char *what)
{
	int code = e == cudaErrorMemoryAllocation ? -ENOMEM : -EIO;

	cudaGetLastError(); /* clear a non-sticky error */
	return kvti_fail(code, "%s: %s: %s", d->name, what,
			 cudaGetErrorString(e));
}

static int drverr(kvti_dev *d, CUresult r, const char *what)
{
	return kvti_fail(r == CUDA_ERROR_OUT_OF_MEMORY ? -ENOMEM : -EIO,
			 "%s: %s: CUresult %d", d->name, what, (int)r);
}

static int use(kvti_dev *d)
{
	cudaError_t e = cudaSetDevice(d->index);

	return e == cudaSuccess ? 0 : cerr(d, e, "cudaSetDevice");
}

static void *entry(const char *sym)
{
	void *fn = NULL;
#if CUDART_VERSION >= 12050
	enum cudaDriverEntryPointQueryResult q;

	if (cudaGetDriverEntryPointByVersion(sym, &fn, 12000, cudaEnableDefault,
					     &q) != cudaSuccess ||
	    q != cudaDriverEntryPointSuccess)
		fn = NULL;
#elif CUDART_VERSION >= 12000
	enum cudaDriverEntryPointQueryResult q;

	if (cudaGetDriverEntryPoint(sym, &fn, cudaEnableDefault, &q) !=
		    cudaSuccess || q != cudaDriverEntryPointSuccess)
		fn = NULL;
#else
	if (cudaGetDriverEntryPoint(sym, &fn, cudaEnableDefault) != cudaSuccess)
		fn = NULL;
#endif
	cudaGetLastError();
	return fn;
}

static int cu_open(kvti_dev *d)
{
	struct cudaDeviceProp p;
	struct cu *c;
	int n = 0, err;
	cudaError_t e;

	if ((e = cudaGetDeviceCount(&n)) != cudaSuccess) {
		cudaGetLastError();
		return kvti_fail(KVT_ENODEV, "cuda:%d: no GPU (%s)", d->index,
				 cudaGetErrorString(e));
	}
	if (d->index >= n)
		return kvti_fail(KVT_ENODEV, "cuda:%d: no such GPU (%d found)",
				 d->index, n);
	if ((err = use(d)))
		return err;
	if ((e = cudaGetDeviceProperties(&p, d->index)) != cudaSuccess)
		return cerr(d, e, "cudaGetDeviceProperties");
	if (!(c = kvt_calloc(1, sizeof(*c))))
		return -ENOMEM;
	c->wait32 = (pfn_wait32)entry("cuStreamWaitValue32");
	c->range = (pfn_range)entry("cuMemGetAddressRange");
	c->vmm_import = (pfn_import)entry("cuMemImportFromShareableHandle");
	c->reserve = (pfn_reserve)entry("cuMemAddressReserve");
	c->map = (pfn_map)entry("cuMemMap");
	c->access = (pfn_access)entry("cuMemSetAccess");
	c->unmap = (pfn_unmap)entry("cuMemUnmap");
	c->vafree = (pfn_free)entry("cuMemAddressFree");
	c->release = (pfn_release)entry("cuMemRelease");
	d->priv = c;
	d->caps = KVTI_DEV_CAP_IPC_EVENT | KVTI_DEV_CAP_IOMEM;
	d->sum_maxseg = kvti_cuk_sum_maxseg();
#if CUDART_VERSION >= 12080
	d->caps |= KVTI_DEV_CAP_BATCH;
#endif
	/* stream memory operations are on by default since CUDA 12 */
	if (c->wait32)
		d->caps |= KVTI_DEV_CAP_WAIT_VALUE;
	snprintf(d->name, sizeof(d->name), "cuda:%d %s", d->index, p.name);
	memcpy(d->uuid, &p.uuid, sizeof(d->uuid));
	return 0;
}

int kvti_dev_cuda_find(const uint8_t uuid[16], int *ordinal)
{
	struct cudaDeviceProp p;
	int n = 0;

	if (cudaGetDeviceCount(&n) != cudaSuccess) {
		cudaGetLastError();
		n = 0;
	}
	for (int i = 0; i < n; i++)
		if (cudaGetDeviceProperties(&p, i) == cudaSuccess &&
		    !memcmp(&p.uuid, uuid, 16)) {
			*ordinal = i;
			return 0;
		}
	cudaGetLastError();
	return kvti_fail(KVT_ENODEV, "no GPU here has the UUID the engine "
			 "named (%d GPUs visible to the daemon: check "
			 "CUDA_VISIBLE_DEVICES)", n);
}

static void cu_close(kvti_dev *d)
{
	kvt_free(d->priv);
}

static int cu_alloc(kvti_dev *d, size_t len, void **p)
{
	cudaError_t e;
	int err;

	if ((err = use(d)))
		return err;
	if (kvti_fault())
		return -ENOMEM;
	if ((e = cudaMalloc(p, len)) != cudaSuccess)
		return cerr(d, e, "cudaMalloc");
	return 0;
}

static void cu_free(kvti_dev *d, void *p)
{
	if (!use(d))
		cudaFree(p);
}

static int cu_export_mem(kvti_dev *d, void *p, kvti_dev_handle *h,
			 uint64_t *off)
{
	CUdeviceptr base = 0;
	size_t size = 0;
	cudaIpcMemHandle_t ih;
	cudaError_t e;
	CUresult r;
	int err;

	if ((err = use(d)))
		return err;
	if (!C(d)->range)
		return kvti_fail(-EOPNOTSUPP, "%s: cuMemGetAddressRange missing",
				 d->name);
	if ((r = C(d)->range(&base, &size, (CUdeviceptr)(uintptr_t)p)))
		return drverr(d, r, "cuMemGetAddressRange");
	if ((e = cudaIpcGetMemHandle(&ih, (void *)(uintptr_t)base)) !=
	    cudaSuccess)
		return cerr(d, e, "cudaIpcGetMemHandle");
	memset(h, 0, sizeof(*h));
	h->kind = KVTI_DEV_H_CUDA_IPC;
	h->fd = -1;
	h->bytes = size;
	memcpy(h->data, &ih, sizeof(ih) < sizeof(h->data) ? sizeof(ih) :
							     sizeof(h->data));
	*off = (uint64_t)((uintptr_t)p - (uintptr_t)base);
	return 0;
}

static int vmm_import(kvti_dev *d, const kvti_dev_handle *h, void **base,
		      void **priv)
{
	struct cu *c = C(d);
	CUmemAccessDesc a;
	struct vmm_imp *v;
	CUdeviceptr va = 0;
	CUresult r;

	if (!c->vmm_import || !c->reserve || !c->map || !c->access)
		return kvti_fail(-EOPNOTSUPP, "%s: the driver lacks the virtual "
				 "memory calls a POSIX-fd import needs", d->name);
	if (!(v = kvt_calloc(1, sizeof(*v))))
		return -ENOMEM;
	v->len = (size_t)h->bytes;
	if ((r = c->vmm_import(&v->h, (void *)(uintptr_t)h->fd,
			       CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR))) {
		kvt_free(v);
		return drverr(d, r, "cuMemImportFromShareableHandle");
	}
	if ((r = c->reserve(&va, v->len, 0, 0, 0)))
		goto err_release;
	if ((r = c->map(va, v->len, 0, v->h, 0)))
		goto err_free;
	memset(&a, 0, sizeof(a));
	a.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
	a.location.id = d->index;
	a.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
	if ((r = c->access(va, v->len, &a, 1))) {
		c->unmap(va, v->len);
		goto err_free;
	}
	*base = (void *)(uintptr_t)va;
	*priv = v;
	return 0;
err_free:
	c->vafree(va, v->len);
err_release:
	c->release(v->h);
	kvt_free(v);
	return drverr(d, r, "mapping a POSIX-fd allocation");
}

static int cu_import(kvti_dev *d, const kvti_dev_handle *h, void **base,
		     void **priv)
{
	cudaIpcMemHandle_t ih;
	cudaError_t e;
	int err;

	if ((err = use(d)))
		return err;
	*priv = NULL;
	switch (h->kind) {
	case KVTI_DEV_H_CUDA_IPC: {
		CUdeviceptr b = 0;
		size_t size = 0;

		memcpy(&ih, h->data, sizeof(ih));
		if ((e = cudaIpcOpenMemHandle(base, ih,
					      cudaIpcMemLazyEnablePeerAccess)) !=
		    cudaSuccess)
			return cerr(d, e, "cudaIpcOpenMemHandle");
		/* the engine said how big it is: believe the driver */
		if (C(d)->range &&
		    !C(d)->range(&b, &size, (CUdeviceptr)(uintptr_t)*base) &&
		    h->bytes > size) {
			cudaIpcCloseMemHandle(*base);
			return kvti_fail(-EINVAL, "%s: the engine named %llu "
					 "bytes of an allocation of %zu",
					 d->name, (unsigned long long)h->bytes,
					 size);
		}
		return 0;
	}
	case KVTI_DEV_H_VMM_FD:
		return vmm_import(d, h, base, priv);
	default:
		return kvti_fail(-EINVAL, "%s: cannot import handle kind %d",
				 d->name, h->kind);
	}
}

static void cu_release(kvti_dev *d, void *base, void *priv)
{
	struct vmm_imp *v = priv;
	struct cu *c = C(d);

	if (use(d))
		return;
	if (!v) {
		cudaIpcCloseMemHandle(base);
		return;
	}
	c->unmap((CUdeviceptr)(uintptr_t)base, v->len);
	c->vafree((CUdeviceptr)(uintptr_t)base, v->len);
	c->release(v->h);
	kvt_free(v);
}

static int cu_host_register(kvti_dev *d, void *p, size_t len, unsigned flags)
{
	unsigned f = cudaHostRegisterPortable | cudaHostRegisterMapped;
	cudaError_t e;
	int err;

	if ((err = use(d)))
		return err;
	if (flags & KVTI_DEV_HOST_IOMEM)
		f |= cudaHostRegisterIoMemory;
	if (flags & KVTI_DEV_HOST_READONLY)
		f |= cudaHostRegisterReadOnly;
	e = cudaHostRegister(p, len, f);
	if (e == cudaErrorHostMemoryAlreadyRegistered) {
		cudaGetLastError();
		return kvti_fail(-EEXIST, "%s: host memory at %p is already "
				 "registered", d->name, p);
	}
	return e == cudaSuccess ? 0 : cerr(d, e, "cudaHostRegister");
}

static void cu_host_unregister(kvti_dev *d, void *p)
{
	if (!use(d))
		cudaHostUnregister(p);
}

static int cu_host_devptr(kvti_dev *d, void *host, void **dev)
{
	cudaError_t e;
	int err;

	if ((err = use(d)))
		return err;
	if ((e = cudaHostGetDevicePointer(dev, host, 0)) != cudaSuccess) {
		cudaGetLastError();
		return kvti_fail(-EINVAL, "%s: host memory at %p is not "
				 "registered with CUDA: %s", d->name, host,
				 cudaGetErrorString(e));
	}
	return 0;
}

static int cu_host_alloc(kvti_dev *d, size_t len, void **p)
{
	cudaError_t e;
	int err;

	if ((err = use(d)))
		return err;
	e = cudaHostAlloc(p, len ? len : 64,
			  cudaHostAllocPortable | cudaHostAllocMapped);
	return e == cudaSuccess ? 0 : cerr(d, e, "cudaHostAlloc");
}

static void cu_host_free(kvti_dev *d, void *p)
{
	if (p)
		cudaFreeHost(p);
}

static int cu_stream_create(kvti_dev *d, int high, kvti_dev_stream **out)
{
	kvti_dev_stream *s;
	int lo, hi, err;
	cudaError_t e;

	if ((err = use(d)))
		return err;
	if (!(s = kvt_calloc(1, sizeof(*s))))
		return -ENOMEM;
	s->d = d;
	if ((e = cudaDeviceGetStreamPriorityRange(&lo, &hi)) != cudaSuccess ||
	    (e = cudaStreamCreateWithPriority(&s->s, cudaStreamNonBlocking,
					      high ? hi : lo)) != cudaSuccess) {
		kvt_free(s);
		return cerr(d, e, "cudaStreamCreateWithPriority");
	}
	*out = s;
	return 0;
}

static void cu_stream_destroy(kvti_dev_stream *s)
{
	if (!s)
		return;
	if (!s->wrapped && !use(s->d)) {
		cudaStreamSynchronize(s->s);
		cudaStreamDestroy(s->s);
	}
	kvt_free(s);
}

static int cu_stream_wrap(kvti_dev *d, void *native, kvti_dev_stream **out)
{
	kvti_dev_stream *s = kvt_calloc(1, sizeof(*s));

	if (!s)
		return -ENOMEM;
	s->d = d;
	s->s = (cudaStream_t)native;
	s->wrapped = 1;
	*out = s;
	return 0;
}

static int cu_stream_sync(kvti_dev_stream *s)
{
	cudaError_t e;
	int err;

	if ((err = use(s->d)))
		return err;
	e = cudaStreamSynchronize(s->s);
	return e == cudaSuccess ? 0 : cerr(s->d, e, "cudaStreamSynchronize");
}

static int cu_copy(kvti_dev_stream *s, void *dst, const void *src, size_t n)
{
	cudaError_t e;
	int err;

	if ((err = use(s->d)))
		return err;
	if ((e = cudaMemcpyAsync(dst, src, n, cudaMemcpyDefault, s->s)) !=
	    cudaSuccess)
		return cerr(s->d, e, "cudaMemcpyAsync");
	kvti_dev_count(s->d, DST_CE_BYTES, n);
	kvti_dev_count(s->d, DST_CE_OPS, 1);
	return 0;
}

static int cu_copy_sync(kvti_dev *d, void *dst, const void *src, size_t n)
{
	cudaError_t e;
	int err;

	if ((err = use(d)))
		return err;
	if ((e = cudaMemcpy(dst, src, n, cudaMemcpyDefault)) != cudaSuccess)
		return cerr(d, e, "cudaMemcpy");
	kvti_dev_count(d, DST_CE_BYTES, n);
	kvti_dev_count(d, DST_CE_OPS, 1);
	return 0;
}

#if CUDART_VERSION >= 12080
static int cu_copy_batch(kvti_dev_stream *s, void *const *dst,
			 const void *const *src, const size_t *n, size_t count)
{
	struct cudaMemcpyAttributes attr;
	size_t idx = 0, bytes = 0;
	cudaError_t e;
	int err;

	if (!count)
		return 0;
	if ((err = use(s->d)))
		return err;
	memset(&attr, 0, sizeof(attr));
	attr.srcAccessOrder = cudaMemcpySrcAccessOrderStream;
	attr.flags = cudaMemcpyFlagPreferOverlapWithCompute;
#if CUDART_VERSION >= 13000
	e = cudaMemcpyBatchAsync(dst, src, n, count, &attr, &idx, 1, s->s);
#else
	{
		size_t fail = SIZE_MAX;

		e = cudaMemcpyBatchAsync((void **)dst, (void **)src, (size_t *)n,
					 count, &attr, &idx, 1, &fail, s->s);
	}
#endif
	if (e != cudaSuccess)
		return cerr(s->d, e, "cudaMemcpyBatchAsync");
	for (size_t i = 0; i < count; i++)
		bytes += n[i];
	kvti_dev_count(s->d, DST_CE_BYTES, bytes);
	kvti_dev_count(s->d, DST_CE_OPS, count);
	return 0;
}
#endif

static int cu_gather(kvti_dev_stream *s, const kvti_dev_gather *g)
{
	cudaError_t e;
	int err;

	if ((err = use(s->d)))
		return err;
	e = (cudaError_t)kvti_cuk_gather(s->s, g->src, g->dst, g->n, g->bytes,
					 g->blocks);
	if (e != cudaSuccess)
		return cerr(s->d, e, "gather kernel launch");
	kvti_dev_count(s->d, DST_KERNEL_BYTES, g->n * g->bytes);
	kvti_dev_count(s->d, DST_KERNEL_OPS, 1);
	return 0;
}

static int cu_sum(kvti_dev_stream *s, const kvti_dev_sum *g)
{
	cudaError_t e;
	int err;

	if (g->nseg > kvti_cuk_sum_maxseg())
		return kvti_fail(-EOPNOTSUPP, "%s: the checksum kernel takes at "
				 "most %u segments per item, not %u", s->d->name,
				 kvti_cuk_sum_maxseg(), g->nseg);
	if ((err = use(s->d)))
		return err;
	e = (cudaError_t)kvti_cuk_sum(s->s, g->seg, g->nseg, g->seg_len,
				      g->nitems, g->out, g->blocks);
	if (e != cudaSuccess)
		return cerr(s->d, e, "checksum kernel launch");
	kvti_dev_count(s->d, DST_SUM_BYTES, g->nitems * g->nseg * g->seg_len);
	kvti_dev_count(s->d, DST_SUM_ITEMS, g->nitems);
	return 0;
}

static int cu_event_create(kvti_dev *d, unsigned flags, kvti_dev_event **out)
{
	unsigned f = cudaEventDisableTiming | cudaEventBlockingSync;
	kvti_dev_event *ev;
	cudaError_t e;
	int err;

	if ((err = use(d)))
		return err;
	if (!(ev = kvt_calloc(1, sizeof(*ev))))
		return -ENOMEM;
	ev->d = d;
	if (flags & KVTI_DEV_EV_IPC) {
		f |= cudaEventInterprocess;
		ev->ipc = 1;
	}
	if ((e = cudaEventCreateWithFlags(&ev->e, f)) != cudaSuccess) {
		kvt_free(ev);
		return cerr(d, e, "cudaEventCreateWithFlags");
	}
	*out = ev;
	return 0;
}

static void cu_event_destroy(kvti_dev_event *ev)
{
	if (!ev)
		return;
	if (!use(ev->d))
		cudaEventDestroy(ev->e);
	kvt_free(ev);
}

static int cu_event_record(kvti_dev_event *ev, kvti_dev_stream *s)
{
	cudaError_t e;
	int err;

	if ((err = use(s->d)))
		return err;
	e = cudaEventRecord(ev->e, s->s);
	return e == cudaSuccess ? 0 : cerr(s->d, e, "cudaEventRecord");
}

static int cu_event_query(kvti_dev_event *ev)
{
	cudaError_t e;
	int err;

	if ((err = use(ev->d)))
		return err;
	e = cudaEventQuery(ev->e);
	if (e == cudaSuccess)
		return 1;
	if (e == cudaErrorNotReady) {
		cudaGetLastError();
		return 0;
	}
	return cerr(ev->d, e, "cudaEventQuery");
}

static int cu_event_sync(kvti_dev_event *ev, int64_t timeout_ns)
{
	uint64_t end;
	cudaError_t e;
	int err, q;

	if ((err = use(ev->d)))
		return err;
	if (timeout_ns < 0) {
		e = cudaEventSynchronize(ev->e);
		return e == cudaSuccess ? 0 :
		       cerr(ev->d, e, "cudaEventSynchronize");
	}
	end = kvt_now_ns() + (uint64_t)timeout_ns;
	while ((q = cu_event_query(ev)) == 0) {
		if (kvt_now_ns() >= end)
			return kvti_fail(-ETIMEDOUT, "%s: event not complete "
					 "after %lld ns", ev->d->name,
					 (long long)timeout_ns);
		sched_yield();
	}
	return q < 0 ? q : 0;
}

static int cu_stream_wait_event(kvti_dev_stream *s, kvti_dev_event *ev)
{
	cudaError_t e;
	int err;

	if ((err = use(s->d)))
		return err;
	e = cudaStreamWaitEvent(s->s, ev->e, 0);
	return e == cudaSuccess ? 0 : cerr(s->d, e, "cudaStreamWaitEvent");
}

static int cu_event_export(kvti_dev_event *ev, kvti_dev_handle *h)
{
	cudaIpcEventHandle_t ih;
	cudaError_t e;
	int err;

	if (!ev->ipc || ev->imported)
		return kvti_fail(-EINVAL, "%s: only an IPC event this process "
				 "created can be exported", ev->d->name);
	if ((err = use(ev->d)))
		return err;
	if ((e = cudaIpcGetEventHandle(&ih, ev->e)) != cudaSuccess)
		return cerr(ev->d, e, "cudaIpcGetEventHandle");
	memset(h, 0, sizeof(*h));
	h->kind = KVTI_DEV_H_EVENT_CUDA;
	h->fd = -1;
	memcpy(h->data, &ih, sizeof(ih));
	return 0;
}

static int cu_event_import(kvti_dev *d, const kvti_dev_handle *h,
			   kvti_dev_event **out)
{
	cudaIpcEventHandle_t ih;
	kvti_dev_event *ev;
	cudaError_t e;
	int err;

	if (h->kind != KVTI_DEV_H_EVENT_CUDA)
		return kvti_fail(-EINVAL, "%s: not a CUDA IPC event (handle kind "
				 "%d)", d->name, h->kind);
	if ((err = use(d)))
		return err;
	if (!(ev = kvt_calloc(1, sizeof(*ev))))
		return -ENOMEM;
	memcpy(&ih, h->data, sizeof(ih));
	if ((e = cudaIpcOpenEventHandle(&ev->e, ih)) != cudaSuccess) {
		kvt_free(ev);
		return cerr(d, e, "cudaIpcOpenEventHandle");
	}
	ev->d = d;
	ev->imported = 1;
	*out = ev;
	return 0;
}

static int cu_stream_wait_value(kvti_dev_stream *s, const uint32_t *addr,
				uint32_t value)
{
	void *dp = NULL;
	CUresult r;
	int err;

	if ((err = cu_host_devptr(s->d, (void *)addr, &dp)))
		return err;
	r = C(s->d)->wait32((CUstream)s->s, (CUdeviceptr)(uintptr_t)dp, value,
			    CU_STREAM_WAIT_VALUE_GEQ);
	return r == CUDA_SUCCESS ? 0 : drverr(s->d, r, "cuStreamWaitValue32");
}

static void host_fn_tramp(void *arg)
{
	void **a = arg;
	void (*fn)(void *) = (void (*)(void *))a[0];

	fn(a[1]);
	kvt_free(a);
}

static int cu_host_fn(kvti_dev_stream *s, void (*fn)(void *), void *arg)
{
	void **a = kvt_malloc(2 * sizeof(void *));
	cudaError_t e;
	int err;

	if (!a)
		return -ENOMEM;
	a[0] = (void *)fn;
	a[1] = arg;
	if ((err = use(s->d))) {
		kvt_free(a);
		return err;
	}
	if ((e = cudaLaunchHostFunc(s->s, host_fn_tramp, a)) != cudaSuccess) {
		kvt_free(a);
		return cerr(s->d, e, "cudaLaunchHostFunc");
	}
	return 0;
}

const struct kvti_dev_ops kvti_dev_cuda_ops = {
	.name = "cuda",
	.open = cu_open,
	.close = cu_close,
	.alloc = cu_alloc,
	.free = cu_free,
	.export_mem = cu_export_mem,
	.import = cu_import,
	.release = cu_release,
	.host_register = cu_host_register,
	.host_unregister = cu_host_unregister,
	.host_devptr = cu_host_devptr,
	.host_alloc = cu_host_alloc,
	.host_free = cu_host_free,
	.stream_create = cu_stream_create,
	.stream_destroy = cu_stream_destroy,
	.stream_wrap = cu_stream_wrap,
	.stream_sync = cu_stream_sync,
	.copy = cu_copy,
	.copy_sync = cu_copy_sync,
#if CUDART_VERSION >= 12080
	.copy_batch = cu_copy_batch,
#endif
	.gather = cu_gather,
	.sum = cu_sum,
	.event_create = cu_event_create,
	.event_destroy = cu_event_destroy,
	.event_record = cu_event_record,
	.event_query = cu_event_query,
	.event_sync = cu_event_sync,
	.stream_wait_event = cu_stream_wait_event,
	.event_export = cu_event_export,
	.event_import = cu_event_import,
	.stream_wait_value = cu_stream_wait_value,
	.host_fn = cu_host_fn,
};

#else /* !KVT_HAVE_CUDA */

static int cu_open(kvti_dev *d)
{
	return kvti_fail(KVT_ENOTBUILT, "cuda:%d: this kvtier was built "
			 "without CUDA (use an emulated device, emu:N)",
			 d->index);
}

static void cu_close(kvti_dev *d)
{
}

int kvti_dev_cuda_find(const uint8_t uuid[16], int *ordinal)
{
	return kvti_fail(KVT_ENOTBUILT, "GPU memory needs a CUDA build of the "
			 "daemon");
}

/* never reached: open fails, so no device of this kind exists */
const struct kvti_dev_ops kvti_dev_cuda_ops = {
	.name = "cuda",
	.open = cu_open,
	.close = cu_close,
};

#endif
