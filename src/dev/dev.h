/*
 * dev.h — the device interface: what kvtier's data path asks of an
 * accelerator, behind one vtable (after ggml's backends), with two
 * implementations:
 *
 *   cuda  (cuda.c, cuda_kern.cu)  the thin CUDA runtime and driver calls:
 *                                 cudaIpcOpenMemHandle, cuMemMap of a
 *                                 POSIX-fd export, cudaHostRegister (I/O
 *                                 memory for device mappings), streams with
 *                                 priorities, cudaMemcpyAsync and
 *                                 cudaMemcpyBatchAsync, the SM-capped
 *                                 gather kernel, the checksum kernel, IPC
 *                                 events, cuStreamWaitValue32
 *   emu   (emu*.c)                an emulated device for CI and for machines
 *                                 without a GPU: its memory is a memfd
 *                                 shared between processes (the IPC handle
 *                                 is that fd, passed by SCM_RIGHTS), a
 *                                 stream is a worker thread with a FIFO
 *                                 queue, events and stream waits really
 *                                 order work (across processes too), and
 *                                 "kernels" are C functions run on the
 *                                 stream thread. Its copies are CPU copies
 *                                 made by its stream threads; they are
 *                                 counted as the device's (copy engine or
 *                                 kernel), never as the caller's.
 *
 * Everything above this interface — the transfer lane (src/xfer/
 * dev_lane.c), the daemon's device registration, the client's stream
 * waits — is the same code for both, so CI runs the whole GPU flow on the
 * emulated device and only the calls in cuda.c are left to a GPU.
 *
 * DEVICE IDS (kvtier.h): 0..KVT_DEVICE_EMU-1 are CUDA ordinals,
 * KVT_DEVICE_EMU + n the emulated device n, KVT_DEVICE_HOST (-1) is host
 * memory. kvti_dev_get() opens a device once per process (one context per
 * device: CUDA's primary context) and counts references.
 *
 * THE CALLS (struct kvti_dev_ops; "optional" members may be NULL, and the
 * wrapper below says what happens then)
 *
 *   member             req.  what
 *   open, close        yes   set up / tear down the device (priv)
 *   alloc, free        yes   device memory (hbm tiers, tests, the
 *                            engine side of the emulated device)
 *   export_mem         no    the handle another process imports an
 *                            allocation by, and the offset of a pointer
 *                            in it; default -EOPNOTSUPP
 *   import, release    yes   a peer's allocation by handle into this
 *                            process's device address space; release
 *                            unmaps it (the caller has waited for every
 *                            operation that touches it)
 *   host_register,     yes   make host memory reachable by the device's
 *   host_unregister          copies and kernels (PORTABLE: dram; IOMEM: a
 *                            devdax or BAR mapping; READONLY: a page the
 *                            process maps read-only)
 *   host_devptr        no    the address registered host memory has for
 *                            the device's kernels; default: the same
 *   host_alloc,        yes   page-locked, device-visible host memory for
 *   host_free                descriptors and results (kernels read and
 *                            write it by the same address)
 *   stream_create,     yes   a FIFO of work, high or low priority
 *   stream_destroy,
 *   stream_sync
 *   stream_wrap        no    a native stream someone else owns (CUDA: a
 *                            cudaStream_t), left alone by destroy;
 *                            default -EOPNOTSUPP
 *   copy               yes   one async copy (copy engine); host memory
 *                            must be registered (or host_alloc'd)
 *   copy_sync          no    a synchronous copy for plain paths (tier
 *                            read/write, tests): one side device memory,
 *                            the other any host memory, pageable too;
 *                            default: copy on a private stream and sync
 *   copy_batch         no    many async copies in one call (copy engines:
 *                            cudaMemcpyBatchAsync); default: one copy
 *                            each, counted the same
 *   gather             yes   the SM-capped gather/scatter kernel: n chunks
 *                            of equal size, pointer arrays in host_alloc
 *                            memory
 *   sum                yes   the checksum kernel: XXH3-64 (xxh3.h) of each
 *                            item, an item being nseg equal segments
 *                            hashed as one input; results into host_alloc
 *                            memory
 *   event_create,      yes   events: record on a stream, query, wait on
 *   event_destroy,           the CPU, make another stream wait
 *   event_record,
 *   event_query,
 *   event_sync,
 *   stream_wait_event
 *   event_export,      no    an IPC event's handle / open a peer's; a
 *   event_import             wait on an imported event waits for the
 *                            record its owner made last before the wait
 *                            was enqueued; default -EOPNOTSUPP
 *   stream_wait_value  no    the stream waits until (int32_t)(*addr -
 *                            value) >= 0 for a 32-bit word in registered
 *                            host memory (cuStreamWaitValue32, GEQ);
 *                            default -EOPNOTSUPP (KVTI_DEV_CAP_WAIT_VALUE
 *                            says whether it works)
 *   host_fn            no    call fn(arg) on the host when the stream
 *                            reaches it (cudaLaunchHostFunc; the emulated
 *                            device's "kernels"); default -EOPNOTSUPP
 *
 * LIFETIMES. Pointer arrays, descriptors and result buffers handed to an
 * asynchronous call must stay valid and unchanged until an event recorded
 * after the call has completed (the CUDA kernels read them from page-
 * locked memory while they run). Memory given to copy/gather/sum must be
 * device memory of this device (allocated or imported) or host memory
 * registered with it.
 *
 * ERRORS. Every call returns 0 or a negative code with kvt_errdetail()
 * set. An asynchronous operation that fails later (a fault, a wait that
 * timed out) makes the next event recorded on its stream complete with
 * that error: event_query/event_sync return it. The emulated device also
 * refuses (-EFAULT, counted in kvti_dev_stat.faults) any copy that
 * touches memory it does not know — what a GPU page fault would be.
 *
 * THREADS. A device and its streams may be used from any thread; one
 * stream's calls are serialised by its caller (a lane owns its stream).
 * Events may be recorded by one thread and waited on by others.
 */
#ifndef KVT_DEV_DEV_H
#define KVT_DEV_DEV_H

#include "core/core.h"

#include <stdint.h>

typedef struct kvti_dev kvti_dev;
typedef struct kvti_dev_stream kvti_dev_stream;
typedef struct kvti_dev_event kvti_dev_event;

/* ---- handles ------------------------------------------------------------ */

enum kvti_dev_handle_kind {
	KVTI_DEV_H_NONE = 0,
	KVTI_DEV_H_CUDA_IPC = 1, /* cudaIpcMemHandle_t of an allocation's base
				    (legacy IPC: what PyTorch's storage
				    sharing gives), in data[] */
	KVTI_DEV_H_VMM_FD = 2,   /* a cuMemCreate allocation exported as a
				    POSIX fd (cuMemExportToShareableHandle) */
	KVTI_DEV_H_EMU_FD = 3,   /* emulated device memory: its memfd */
	KVTI_DEV_H_EVENT_CUDA = 4, /* cudaIpcEventHandle_t in data[] */
	KVTI_DEV_H_EVENT_EMU = 5,  /* an emulated event's memfd */
};
#define KVTI_DEV_HANDLE_BYTES 64

/* A peer's allocation (or event) as it travels. @fd belongs to whoever
 * filled it in (import does not take it). */
typedef struct kvti_dev_handle {
	int kind;                /* enum kvti_dev_handle_kind */
	int fd;                  /* *_FD kinds; -1 otherwise */
	uint64_t bytes;          /* the allocation's size */
	uint8_t data[KVTI_DEV_HANDLE_BYTES];
} kvti_dev_handle;

/* ---- descriptors ----------------------------------------------------------- */

/* gather: n chunks of @bytes each, dst[i] <- src[i]. */
typedef struct kvti_dev_gather {
	void *const *dst;
	const void *const *src;
	size_t n;
	size_t bytes;
	unsigned blocks;         /* thread blocks the kernel may use (SM cap) */
} kvti_dev_gather;

/* sum: out[i] = XXH3-64 of seg[i*nseg .. i*nseg+nseg) (seg_len bytes
 * each), hashed as one input. */
typedef struct kvti_dev_sum {
	const void *const *seg;
	uint32_t nseg;
	uint64_t seg_len;
	size_t nitems;
	uint64_t *out;
	unsigned blocks;         /* 0: as many as the items want */
} kvti_dev_sum;

/* host_register flags */
enum {
	KVTI_DEV_HOST_PORTABLE = 1u << 0, /* visible to every context */
	KVTI_DEV_HOST_IOMEM = 1u << 1,    /* a device mapping (devdax, BAR):
					     cudaHostRegisterIoMemory */
	KVTI_DEV_HOST_READONLY = 1u << 2, /* mapped read-only here */
};

/* event_create flags */
enum {
	KVTI_DEV_EV_IPC = 1u << 0,      /* exportable to another process */
};

/* capabilities (kvti_dev.caps) */
enum {
	KVTI_DEV_CAP_BATCH = 1u << 0,      /* copy_batch is native */
	KVTI_DEV_CAP_WAIT_VALUE = 1u << 1, /* stream_wait_value works */
	KVTI_DEV_CAP_IPC_EVENT = 1u << 2,  /* event_export/_import work */
	KVTI_DEV_CAP_IOMEM = 1u << 3,      /* IOMEM registration works */
	KVTI_DEV_CAP_EMULATED = 1u << 4,   /* no hardware: CPU threads */
};

/* What a device did (relaxed counters). */
typedef struct kvti_dev_stat {
	uint64_t ce_bytes, ce_ops;         /* copy / copy_batch */
	uint64_t kernel_bytes, kernel_ops; /* gather */
	uint64_t sum_bytes, sum_items;     /* sum */
	uint64_t faults;                   /* emu: accesses outside known
					      memory, refused */
	uint64_t imports, releases;        /* import / release calls */
	uint64_t live_imports;
} kvti_dev_stat;

/* ---- the vtable ------------------------------------------------------------- */

struct kvti_dev_ops {
	const char *name;
	int (*open)(kvti_dev *d);
	void (*close)(kvti_dev *d);
	int (*alloc)(kvti_dev *d, size_t len, void **p);
	void (*free)(kvti_dev *d, void *p);
	int (*export_mem)(kvti_dev *d, void *p, kvti_dev_handle *h,
			  uint64_t *off);
	int (*import)(kvti_dev *d, const kvti_dev_handle *h, void **base,
		      void **priv);
	void (*release)(kvti_dev *d, void *base, void *priv);
	int (*host_register)(kvti_dev *d, void *p, size_t len, unsigned flags);
	void (*host_unregister)(kvti_dev *d, void *p);
	int (*host_devptr)(kvti_dev *d, void *host, void **dev);
	int (*host_alloc)(kvti_dev *d, size_t len, void **p);
	void (*host_free)(kvti_dev *d, void *p);
	int (*stream_create)(kvti_dev *d, int high_prio, kvti_dev_stream **s);
	void (*stream_destroy)(kvti_dev_stream *s);
	int (*stream_wrap)(kvti_dev *d, void *native, kvti_dev_stream **s);
	int (*stream_sync)(kvti_dev_stream *s);
	int (*copy)(kvti_dev_stream *s, void *dst, const void *src, size_t n);
	int (*copy_sync)(kvti_dev *d, void *dst, const void *src, size_t n);
	int (*copy_batch)(kvti_dev_stream *s, void *const *dst,
			  const void *const *src, const size_t *n, size_t count);
	int (*gather)(kvti_dev_stream *s, const kvti_dev_gather *g);
	int (*sum)(kvti_dev_stream *s, const kvti_dev_sum *g);
	int (*event_create)(kvti_dev *d, unsigned flags, kvti_dev_event **e);
	void (*event_destroy)(kvti_dev_event *e);
	int (*event_record)(kvti_dev_event *e, kvti_dev_stream *s);
	int (*event_query)(kvti_dev_event *e);  /* 1 done, 0 not, <0 error */
	int (*event_sync)(kvti_dev_event *e, int64_t timeout_ns);
	int (*stream_wait_event)(kvti_dev_stream *s, kvti_dev_event *e);
	int (*event_export)(kvti_dev_event *e, kvti_dev_handle *h);
	int (*event_import)(kvti_dev *d, const kvti_dev_handle *h,
			    kvti_dev_event **e);
	int (*stream_wait_value)(kvti_dev_stream *s, const uint32_t *addr,
				 uint32_t value);
	int (*host_fn)(kvti_dev_stream *s, void (*fn)(void *), void *arg);
};

/* A device as the common layer keeps it. */
struct kvti_dev {
	const struct kvti_dev_ops *ops;
	int id;                  /* kvtier device id */
	int index;               /* the backend's own number */
	unsigned caps;           /* KVTI_DEV_CAP_* */
	unsigned sum_maxseg;     /* the most segments sum takes per item */
	uint8_t uuid[16];        /* CUDA: the GPU's UUID (ordinals differ
				    between processes); emu: zeros */
	char name[96];           /* "cuda:0 NVIDIA H200", "emu:0" */
	void *priv;              /* the backend's */
	int refs;                /* registry lock */
	pthread_mutex_t mu;      /* imports */
	struct kvti_dev_imp *imps; /* live imports (deduplicated) */
	_Atomic uint64_t st[10]; /* kvti_dev_stat, in its field order */
	kvti_dev *next;          /* registry */
};

/* Counter slots in kvti_dev.st (kvti_dev_stat's field order). */
enum { DST_CE_BYTES, DST_CE_OPS, DST_KERNEL_BYTES, DST_KERNEL_OPS,
       DST_SUM_BYTES, DST_SUM_ITEMS, DST_FAULTS, DST_IMPORTS, DST_RELEASES,
       DST_LIVE };
static inline void kvti_dev_count(kvti_dev *d, int k, uint64_t v)
{
	atomic_fetch_add_explicit(&d->st[k], v, memory_order_relaxed);
}

extern const struct kvti_dev_ops kvti_dev_emu_ops;
extern const struct kvti_dev_ops kvti_dev_cuda_ops;

/* Every backend's event and stream begin with their device. */
static inline kvti_dev *kvti_dev_event_dev(const void *e)
{
	return *(kvti_dev *const *)e;
}

/* ---- the common layer (dev.c) ----------------------------------------------- */

/* Open (or take another reference to) device @id: 0, KVT_ENODEV (no such
 * GPU / emulated index out of range), KVT_ENOTBUILT (a CUDA id in a build
 * without CUDA), -EINVAL (not a device id), -ENOMEM. */
int kvti_dev_get(int id, kvti_dev **out);
/* Drop a reference; the last one closes the device. NULL is fine. */
void kvti_dev_put(kvti_dev *d);
/* The CUDA ordinal of the GPU with @uuid in this process: 0, KVT_ENODEV
 * (none), KVT_ENOTBUILT. */
int kvti_dev_cuda_find(const uint8_t uuid[16], int *ordinal);
/* 1 if @id names an emulated device. */
static inline int kvti_dev_is_emu(int id)
{
	return id >= KVT_DEVICE_EMU && id < KVT_DEVICE_EMU + KVT_DEVICE_EMU_MAX;
}
void kvti_dev_stat_get(kvti_dev *d, kvti_dev_stat *st);

/*
 * kvti_dev_import() - open a peer's allocation @h on @d, once per process
 * however often it is imported (the same CUDA IPC handle, the same memfd
 * inode): *@base is its address in this process's device address space,
 * the import is counted; -EINVAL for a bad kind, the backend's errors.
 * kvti_dev_unimport() drops one count and releases the mapping with the
 * last; the caller must have waited for every operation touching it.
 */
int kvti_dev_import(kvti_dev *d, const kvti_dev_handle *h, void **base);
void kvti_dev_unimport(kvti_dev *d, void *base);

/* The wrappers: the defaults of the optional members. */
static inline int kvti_dev_copy_batch(kvti_dev *d, kvti_dev_stream *s,
				      void *const *dst, const void *const *src,
				      const size_t *n, size_t count)
{
	int err = 0;

	if (d->ops->copy_batch)
		return d->ops->copy_batch(s, dst, src, n, count);
	for (size_t i = 0; i < count && !err; i++)
		err = d->ops->copy(s, dst[i], src[i], n[i]);
	return err;
}
int kvti_dev_event_export(kvti_dev *d, kvti_dev_event *e, kvti_dev_handle *h);
int kvti_dev_event_import(kvti_dev *d, const kvti_dev_handle *h,
			  kvti_dev_event **e);
int kvti_dev_stream_wait_value(kvti_dev *d, kvti_dev_stream *s,
			       const uint32_t *addr, uint32_t value);
int kvti_dev_host_fn(kvti_dev *d, kvti_dev_stream *s, void (*fn)(void *),
		     void *arg);
int kvti_dev_export_mem(kvti_dev *d, void *p, kvti_dev_handle *h,
			uint64_t *off);
static inline int kvti_dev_host_devptr(kvti_dev *d, void *host, void **dev)
{
	if (d->ops->host_devptr)
		return d->ops->host_devptr(d, host, dev);
	*dev = host;
	return 0;
}
/* A synchronous copy (plain paths: tier read/write, tests): copy_sync,
 * or a copy on a private stream. */
int kvti_dev_copy_sync(kvti_dev *d, void *dst, const void *src, size_t n);

/* The backend objects behind include/kvtier/dev.h's (api.c). */
struct kvt_dev_stream;
struct kvt_dev_event;
kvti_dev_stream *kvti_dev_stream_of(struct kvt_dev_stream *s, kvti_dev **d);
kvti_dev_event *kvti_dev_event_of(struct kvt_dev_event *e, kvti_dev **d);

/* ---- the emulated device's test hooks (emu.c) ------------------------------ */

/* Every copy and gather of @d's streams sleeps this long per MiB moved
 * (0: none), so tests can kill a process while a copy is under way; also
 * KVT_EMU_DELAY_NS_PER_MIB in the environment at open. */
void kvti_dev_emu_set_delay(kvti_dev *d, uint64_t ns_per_mib);
/* How long a stream waits for an event or a value before the wait fails
 * (default 60 s; KVT_EMU_WAIT_MS). */
void kvti_dev_emu_set_wait_limit(kvti_dev *d, uint64_t ns);
/* The next @ncopies copies of @d's streams (a copy, one copy of a batch,
 * one chunk of a gather) land with their first byte flipped, their source
 * untouched: data damaged in flight, which only a checksum of what landed
 * catches (0: none). */
void kvti_dev_emu_set_damage(kvti_dev *d, uint64_t ncopies);

#endif /* KVT_DEV_DEV_H */
