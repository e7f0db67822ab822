/*
 * kvtier/dev.h — devices as an engine process sees them: the few calls an
 * engine needs beside its own framework to hand device memory to kvtier
 * and to order its work against kvtier's. Included by <kvtier.h>.
 *
 * A device is a CUDA GPU or the emulated device (kvtier.h "Devices"). On a
 * GPU most engines already have memory, streams and events from their
 * framework (PyTorch): they need only kvt_dev_stream_wrap() (a stream of
 * theirs, for kvt_client_job_stream_wait()) and, for C engines, the
 * client's kvt_client_register_ptrs(). On the emulated device — CI, and
 * machines without a GPU — these calls are the device: its memory is
 * shared memory (a memfd) that the engine's process reads and writes at
 * the address kvt_dev_alloc() gives (the emulated "kernels" are the
 * engine's own CPU code), its streams are threads, its events order work
 * across processes. The daemon opens the same memory by handle and moves
 * pages with the same calls a GPU gets.
 *
 *   engine process                               kvtierd
 *   kvt_dev_alloc() ──── handle (fd / IPC) ────> imported, device copies
 *   kvt_dev_event_record(ev, stream) ── EVENT ─> its stream waits on ev
 *   kvt_client_job_stream_wait(job, l, stream) <─ the job slot's word
 *
 * Every call returns 0 or a negative code with kvt_errdetail() set.
 * Handles are freed by their _destroy/_close/_free call; a device stays
 * open while any of its streams, events or allocations does.
 */
#ifndef KVTIER_DEV_H
#define KVTIER_DEV_H

#include <kvtier.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct kvt_dev kvt_dev;
typedef struct kvt_dev_stream kvt_dev_stream;
typedef struct kvt_dev_event kvt_dev_event;

/** Open device @device (a CUDA ordinal or KVT_DEVICE_EMU + n): 0,
 *  KVT_ENODEV, KVT_ENOTBUILT (a GPU in a build without CUDA), -EINVAL. */
KVT_API int kvt_dev_open(int device, kvt_dev **out);
KVT_API void kvt_dev_close(kvt_dev *d);
/** "cuda:0 NVIDIA H200", "emu:0". */
KVT_API const char *kvt_dev_name(const kvt_dev *d);
/** 1 for the emulated device. */
KVT_API int kvt_dev_emulated(const kvt_dev *d);

/** Device memory. On the emulated device *@p is also a CPU address of
 *  this process (shared memory). */
KVT_API int kvt_dev_alloc(kvt_dev *d, size_t len, void **p);
KVT_API void kvt_dev_free(kvt_dev *d, void *p);
/** A synchronous copy; either side may be device memory, the other any
 *  host memory. */
KVT_API int kvt_dev_memcpy(kvt_dev *d, void *dst, const void *src, size_t n);

/** How another process opens the allocation holding @p (the daemon does,
 *  at kvt_client_register_dev()): *@kind is a KVT_CLIENT_SEG_* kind,
 *  *@fd the allocation's descriptor for fd kinds (owned by the device:
 *  valid while the allocation lives; -1 otherwise), @handle[64] the CUDA
 *  IPC handle, *@bytes the allocation's size, *@off where @p lies in it. */
KVT_API int kvt_dev_export(kvt_dev *d, void *p, uint32_t *kind, int *fd,
			   uint64_t *bytes, uint8_t handle[64], uint64_t *off);
/** The GPU's UUID (16 bytes; zeros on the emulated device): the daemon
 *  finds the same GPU by it, whatever its ordinal there. */
KVT_API void kvt_dev_uuid(const kvt_dev *d, uint8_t uuid[16]);

/** Streams: FIFO queues of device work. */
KVT_API int kvt_dev_stream_create(kvt_dev *d, kvt_dev_stream **out);
/** A stream the caller owns (CUDA: a cudaStream_t, e.g. PyTorch's
 *  torch.cuda.current_stream().cuda_stream), for kvtier to enqueue waits
 *  on; destroying the wrapper leaves it alone. -EOPNOTSUPP on the
 *  emulated device. */
KVT_API int kvt_dev_stream_wrap(kvt_dev *d, void *native,
				kvt_dev_stream **out);
KVT_API void kvt_dev_stream_destroy(kvt_dev_stream *s);
/** Wait until everything queued on @s is done: 0 or its first error. */
KVT_API int kvt_dev_stream_sync(kvt_dev_stream *s);
/** An asynchronous copy on @s (host memory must be registered). */
KVT_API int kvt_dev_stream_memcpy(kvt_dev_stream *s, void *dst,
				  const void *src, size_t n);
/** Call @fn(@arg) on a host thread when @s reaches this point: the
 *  emulated device's "kernels" (an engine writing its KV) are these. */
KVT_API int kvt_dev_stream_host_fn(kvt_dev_stream *s, void (*fn)(void *),
				   void *arg);

/** Page-lock and map host memory for the device's copies. */
KVT_API int kvt_dev_host_register(kvt_dev *d, void *p, size_t len);
KVT_API void kvt_dev_host_unregister(kvt_dev *d, void *p);

/** Events. @ipc: exportable to the daemon (kvt_client_event_new()). */
KVT_API int kvt_dev_event_create(kvt_dev *d, int ipc, kvt_dev_event **out);
KVT_API void kvt_dev_event_destroy(kvt_dev_event *e);
KVT_API int kvt_dev_event_record(kvt_dev_event *e, kvt_dev_stream *s);
/** 1 done, 0 not yet, < 0 the error of work before it. */
KVT_API int kvt_dev_event_query(kvt_dev_event *e);
KVT_API int kvt_dev_event_sync(kvt_dev_event *e, int64_t timeout_ns);

/** What a device did (plain values). On the emulated device every byte
 *  was copied by its stream threads (CPU copies, counted as the device's). */
typedef struct kvt_dev_stat {
	uint64_t copy_engine_bytes, copy_engine_ops;
	uint64_t kernel_bytes, kernel_ops;   /* the gather kernel */
	uint64_t sum_bytes, sum_items;       /* the checksum kernel */
	uint64_t faults;        /* emulated: accesses outside known memory,
				   refused (a GPU would fault) */
	uint64_t imports, releases, live_imports;
} kvt_dev_stat;
KVT_API void kvt_dev_stat_get(kvt_dev *d, kvt_dev_stat *st);

/** The emulated device only (a test hook; nothing elsewhere): every copy
 *  spends @ns_per_mib per MiB before its bytes land. */
KVT_API void kvt_dev_set_delay(kvt_dev *d, uint64_t ns_per_mib);

#ifdef __cplusplus
}
#endif

#endif /* KVTIER_DEV_H */
