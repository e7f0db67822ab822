/*
 * kvtier/xfer.h — the transfer engine (data plane) and the memory
 * stressor. Included by <kvtier.h>.
 *
 * THE ENGINE
 *
 * A job moves a list of pages between two tiers: page i goes from slot
 * src_slots[i] of the source tier to slot dst_slots[i] of the destination,
 * converting the layout on the way (page-first on host tiers and ssd,
 * layer-first vLLM or SGLang on hbm/hostdev; see kvtier/geom.h). The bytes
 * that land are exactly those kvt_layout_convert_ref() would write.
 *
 *   submit ─► queue (per lane, per priority) ─► lane threads ─► done
 *                                                  │             ├ poll / wait
 *     lane    moves                     how        │             ├ eventfd
 *     cpu     host ⇄ host (incl.        worker     │             └ callback
 *             hostdev)                  threads    └─► per-layer progress
 *     io      ssd ⇄ host                io_uring (pread/pwrite fallback)
 *     dev     hbm ⇄ host, hbm ⇄ hbm     per device (a GPU, or the emulated
 *                                       device): one thread and stream per
 *                                       direction: the gather kernel,
 *                                       batched DMA or one copy per chunk
 *
 * Submission returns at once. Work is taken highest priority first, so a
 * load queued behind a long backup starts as soon as the piece of the
 * backup under way (one task: a few MiB on the cpu lane, one page on the io
 * lane) is done. Loads into layer-first memory move layer by layer and
 * report each layer as it lands (kvt_xfer_wait_layer()): a consumer can run
 * layer i while layer i+1 is still moving.
 *
 * A job ends in exactly one way: 0 when every byte of every page is in
 * place (and, with KVT_XFER_DURABLE, flushed), or an error: -ECANCELED,
 * -EIO and other -errno from the I/O path (a short read or write is -EIO),
 * KVT_ECORRUPT when a checksum does not match. A failed or cancelled job
 * leaves the destination slots undefined (some pages or layers may have
 * landed, others not); it never reports success for bytes that did not
 * land. Layers reported ready before a failure did land.
 *
 * CHECKSUMS
 *
 * With KVT_XFER_SUM the engine writes XXH3-64 (seed 0) of each page, taken
 * over the page in page-first byte order, into sums[i]; with
 * KVT_XFER_VERIFY it checks each page against sums[i] and fails the job
 * with KVT_ECORRUPT (kvt_xfer_status.bad_page names the first bad page).
 * The value does not depend on where the page lives or which path moved
 * it, so a sum taken on store verifies the load from any tier. Jobs with
 * checksums hash whole pages, so their layers become ready all at once,
 * at the end, once every page is hashed (and verified). The io lane
 * hashes on the host side (after a read, before a write); the device lane
 * hashes on the device, over the device side (below).
 *
 * LAYER SUMS. With KVT_XFER_LSUM / KVT_XFER_LVERIFY the sums are per page
 * and layer instead: sums[i * L + l] is the XXH3-64 of layer l of page i
 * (its K then V chunks, page-first byte order, L*kv*chunk / L bytes), so a
 * load can report layer l ready as soon as layer l is verified. The cpu
 * lane hashes what landed in the destination, chunk by chunk right after
 * copying it (still in cache); the io lane hashes the page-first buffer the
 * I/O used (the slot itself, or its bounce buffer); the device lane
 * hashes with a checksum kernel on the device side: what landed in device
 * memory for a load (after that layer's copy, before the layer is
 * reported), the device's blocks for a store — no CPU thread reads a page
 * byte there (the same function bit for bit: src/dev/xxh3.h). With @bad
 * given, a page that fails
 * LVERIFY is marked there (bad[i] = 1) and the job goes on with the other
 * pages (its layers are still reported: the caller must not use a bad
 * page); without @bad it fails the job with KVT_ECORRUPT like VERIFY.
 *
 * THREADS
 *
 * The engine is fully thread-safe: any thread may submit, wait, poll and
 * cancel. A job handle belongs to the caller until kvt_xfer_job_free().
 * Completion order: layer callbacks, then the done callback, then waiters
 * wake (kvt_xfer_wait() returns after the done callback has returned),
 * then the eventfd ticks. Callbacks run on an engine thread (or in
 * kvt_xfer_cancel(), see there) and must not block for long, wait on other
 * jobs or destroy the engine; they may submit new jobs, and a done
 * callback may poll and free its own job.
 *
 * Tier contents: the engine takes no slot ownership and no locks on tiers.
 * While a job runs, its source slots must not change and nothing else may
 * touch its destination slots — the owner (the index) arranges that.
 *
 * THE STRESSOR
 *
 * N threads each copying continuously between two buffers of B bytes:
 * the CPU memory-bandwidth contention of agentic workloads (tokenizers,
 * RAG, orchestration). kvtier stress, kvtier bench xfer --stress and the
 * demo's --stress all use it. It always stops by itself after its duration
 * when one is given, and within one copy block (16 MiB) of a stop request.
 */
#ifndef KVTIER_XFER_H
#define KVTIER_XFER_H

#include <kvtier.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct kvt_xfer kvt_xfer;
typedef struct kvt_xfer_job kvt_xfer_job;

/** How a job's bytes move. AUTO picks by the two tiers (see kvt_xfer_desc). */
typedef enum kvt_xfer_method {
	KVT_XFER_AUTO = 0,
	KVT_XFER_CPU,         /* worker threads, merged runs, NT stores */
	KVT_XFER_URING,       /* ssd: io_uring, O_DIRECT, queue depth */
	KVT_XFER_PREAD,       /* ssd: pread/pwrite, one page at a time */
	KVT_XFER_CUDA_CHUNK,  /* one cudaMemcpyAsync per chunk (vLLM) */
	KVT_XFER_CUDA_BATCH,  /* cudaMemcpyBatchAsync per layer */
	KVT_XFER_CUDA_KERNEL, /* gather/scatter kernel, 1-2 blocks */
	KVT_XFER_METHOD_COUNT
	/* the three device methods mean the same operations on the emulated
	 * device (one copy each, one batched call, the gather "kernel") */
} kvt_xfer_method;

/** "auto", "cpu", "uring", "pread", "cuda-chunk", "cuda-batch",
 *  "cuda-kernel"; "?" for a bad value. */
KVT_API const char *kvt_xfer_method_name(int method);
/** Parse such a name: 0, or -EINVAL naming the known ones. */
KVT_API int kvt_xfer_method_parse(const char *s, int *method);

/** Priorities: work is taken highest first, FIFO within one. DEFAULT means
 *  HIGH for loads (into a faster tier) and LOW for stores. */
enum kvt_xfer_prio {
	KVT_XFER_PRIO_DEFAULT = 0,
	KVT_XFER_PRIO_HIGH = 1,
	KVT_XFER_PRIO_NORMAL = 2,
	KVT_XFER_PRIO_LOW = 3,
};

/** Non-temporal stores on the cpu lane. */
enum kvt_xfer_nt {
	KVT_XFER_NT_AUTO = 0, /* for chunks >= 16 KiB in jobs >= 4 MiB */
	KVT_XFER_NT_ON = 1,
	KVT_XFER_NT_OFF = 2,
};

/**
 * struct kvt_xfer_config - engine settings; zero means "the default" for
 * every field, so `kvt_xfer_config c = {0};` is a valid configuration.
 */
typedef struct kvt_xfer_config {
	unsigned cpu_threads;  /* cpu lane workers; default min(CPUs, 4) */
	uint64_t task_bytes;   /* cpu work unit; default 4 MiB */
	int nt;                /* enum kvt_xfer_nt */
	int ssd_io;            /* AUTO (io_uring, else pread), URING (error if
				  io_uring is unavailable) or PREAD */
	unsigned uring_depth;  /* I/Os in flight; default 32, at most 4096 */
	uint64_t bounce_bytes; /* io lane bounce memory cap; default 256 MiB.
				  The lane's first bounced I/O takes one
				  huge-page region of min(uring_depth,
				  bounce_bytes / slot) slots for good (O_DIRECT
				  into 4 KiB pages reads at half the rate) */
	int cuda_load;         /* method for host -> hbm; default KERNEL */
	int cuda_store;        /* method for hbm -> host; default BATCH */
	unsigned cuda_blocks;  /* kernel thread blocks; default 2, max 64 */
	int cuda_device;       /* > 0: the only device the engine serves;
				  default: every device jobs name (up to 8) */
} kvt_xfer_config;

/**
 * kvt_xfer_create() - start an engine.
 * @cfg: settings, or NULL for the defaults; copied.
 *
 * Starts the cpu workers now; the io lane and each device's lanes start
 * with their first job. Returns 0 and *@out, -EINVAL for a bad field (kvt_errdetail() names
 * it), KVT_ENODEV if ssd_io is URING and io_uring does not work here,
 * -ENOMEM, -EAGAIN (no threads). Free with kvt_xfer_destroy().
 */
KVT_API int kvt_xfer_create(kvt_xfer **out, const kvt_xfer_config *cfg);

/**
 * kvt_xfer_destroy() - stop the engine: cancel every job that has not
 * started, wait for the work under way, join the threads, free. Every job
 * is done when it returns (its callback has run); handles stay valid until
 * kvt_xfer_job_free(). NULL is fine. Must not be called from a callback.
 */
KVT_API void kvt_xfer_destroy(kvt_xfer *x);

/** What an engine runs on, for reports. Strings live as long as @x. */
typedef struct kvt_xfer_info {
	unsigned cpu_threads;
	uint64_t task_bytes;
	int nt;                  /* the setting (enum kvt_xfer_nt) */
	const char *copy_isa;    /* "avx2", "sse2" or "memcpy": NT copy used */
	int ssd_io;              /* KVT_XFER_URING or KVT_XFER_PREAD */
	const char *ssd_io_note; /* why pread, if it is; "" otherwise */
	unsigned uring_depth;
	int cuda;                /* 1: CUDA built and a GPU found */
	const char *cuda_note;   /* why not, or the device */
	int cuda_load, cuda_store;
	unsigned cuda_blocks;
	int cuda_batch;          /* 1: cudaMemcpyBatchAsync built in */
} kvt_xfer_info;
KVT_API void kvt_xfer_info_get(kvt_xfer *x, kvt_xfer_info *info);

/* Job flags. */
#define KVT_XFER_SUM     0x1u /* write each page's XXH3-64 into sums[] */
#define KVT_XFER_VERIFY  0x2u /* check each page against sums[] */
#define KVT_XFER_DURABLE 0x4u /* ssd writes: fdatasync before done */
#define KVT_XFER_LSUM    0x8u /* write per-layer sums: sums[i * L + l] */
#define KVT_XFER_LVERIFY 0x10u/* check them, layer by layer */

typedef void (*kvt_xfer_done_fn)(kvt_xfer_job *job, int err, void *arg);
typedef void (*kvt_xfer_layer_fn)(kvt_xfer_job *job, uint32_t layer,
				  void *arg);

/**
 * struct kvt_xfer_desc - one job.
 *
 * Tiers: any two tiers of the same KV shape (kvt_geom_same_shape()).
 *   host ⇄ host (dram, fabric, hostdev)  cpu lane          (AUTO: CPU)
 *   ssd  ⇄ host                          io lane  (AUTO: URING or PREAD,
 *                                                  as configured)
 *   hbm  ⇄ host, hbm ⇄ hbm               dev lane   (AUTO: cuda_load for
 *   (hbm: a GPU's memory or the          of the     host -> hbm, cuda_store for
 *   emulated device's)                   device     hbm -> host, CHUNK for
 *                                                   hbm -> hbm)
 *   ssd ⇄ ssd, ssd ⇄ hbm                 -EOPNOTSUPP: stage through a host
 *                                        tier
 * The device lane moves only host memory registered with the device (CUDA:
 * a tier opened with 'pin'; KVT_ENODEV/-EINVAL otherwise, kvt_errdetail()
 * says which tier): the copy engines would bounce pageable memory through
 * the driver, and the kernel cannot reach it.
 *
 * Slots: @npages slots on each side, in range for the tier. Destination
 * slots must be distinct, and when @src == @dst no slot may be both read
 * and written. Both arrays are copied at submit.
 */
typedef struct kvt_xfer_desc {
	kvt_tier *src, *dst;
	const uint32_t *src_slots, *dst_slots;
	size_t npages;           /* 0 is fine: the job completes empty */
	int prio;                /* enum kvt_xfer_prio */
	int method;              /* KVT_XFER_AUTO or one to force */
	unsigned flags;          /* KVT_XFER_SUM | VERIFY | DURABLE */
	uint64_t *sums;          /* npages sums (SUM, VERIFY); caller-owned,
				    must stay valid until the job is done */
	kvt_xfer_done_fn done;   /* optional: called once when done */
	kvt_xfer_layer_fn layer; /* optional: called as each layer lands, in
				    layer order, on engine threads */
	void *arg;               /* for both callbacks */
	uint8_t *bad;            /* LVERIFY: optional, npages flags set to 1
				    for pages that failed (caller-owned; read
				    with atomic loads while the job runs) */
	void *wait;              /* device lane jobs: a device event
				    (libkvtier's, src/dev/dev.h) the lane's
				    stream waits for before the job's first
				    copy; must stay valid until the job is
				    done. NULL: none */
} kvt_xfer_desc;

/**
 * kvt_xfer_submit() - queue a job; returns at once.
 *
 * Returns 0 and *@out (the caller owns it: kvt_xfer_job_free()), or, with
 * nothing queued and no callback run: -EINVAL (NULL tiers or arrays, more
 * than one of SUM, VERIFY, LSUM, LVERIFY, sums missing, bad without
 * LVERIFY, duplicate destination slots, a slot both
 * read and written), -ERANGE (a slot out of range; kvt_errdetail() names
 * the page), KVT_EGEOM (tiers of different KV shape), -EOPNOTSUPP (no path
 * between these tiers, or a forced method that cannot move them),
 * KVT_ENOTBUILT (a CUDA method in a build without CUDA), KVT_ENODEV (no
 * GPU; io_uring asked for and unavailable), -ESHUTDOWN (the engine is being
 * destroyed), -ENOMEM, -EAGAIN (a lane thread could not start).
 */
KVT_API int kvt_xfer_submit(kvt_xfer *x, const kvt_xfer_desc *d,
			    kvt_xfer_job **out);

/**
 * kvt_xfer_poll() - 0 if the job is done and succeeded, -EINPROGRESS while
 * it runs, else its error (with kvt_errdetail() saying what failed).
 */
KVT_API int kvt_xfer_poll(kvt_xfer_job *job);

/**
 * kvt_xfer_wait() - block until the job is done, or @timeout_ns passed
 * (negative: no limit). Returns as kvt_xfer_poll(), or -ETIMEDOUT.
 */
KVT_API int kvt_xfer_wait(kvt_xfer_job *job, int64_t timeout_ns);

/**
 * kvt_xfer_wait_layer() - block until layer @layer of every page is in
 * place. 0 once it is; the job's error if the job failed before it landed;
 * -ETIMEDOUT; -ERANGE if @layer >= the geometry's layers.
 */
KVT_API int kvt_xfer_wait_layer(kvt_xfer_job *job, uint32_t layer,
				int64_t timeout_ns);

/**
 * kvt_xfer_cancel() - ask a job to stop. Work not yet started is dropped;
 * pieces under way finish. The job then ends with -ECANCELED (or with the
 * result it had already reached). If none of it had started, it ends here,
 * in this thread, and its callback runs before this call returns.
 * Returns 0, or -EALREADY if the job was already done.
 */
KVT_API int kvt_xfer_cancel(kvt_xfer_job *job);

/** Release a job handle. A job that is not done is cancelled and waited
 *  for first. NULL is fine. Callbacks may free their own job. */
KVT_API void kvt_xfer_job_free(kvt_xfer_job *job);

enum kvt_xfer_state {
	KVT_XFER_QUEUED = 0,
	KVT_XFER_RUNNING = 1,
	KVT_XFER_DONE = 2,
};

/** A snapshot of one job. */
typedef struct kvt_xfer_status {
	int state;             /* enum kvt_xfer_state */
	int err;               /* the result once DONE; 0 before */
	int method;            /* the method chosen */
	int lane_direction;    /* 1: a load (into a faster tier), 0: a store */
	uint64_t bytes;        /* page bytes the job moves */
	uint64_t bytes_done;   /* page bytes moved so far */
	size_t npages;
	uint32_t layers;       /* L */
	uint32_t layers_ready; /* leading layers in place for every page */
	size_t bad_page;       /* KVT_ECORRUPT: first page that failed; else
				  SIZE_MAX */
	uint64_t submit_ns, start_ns, end_ns; /* kvt_now_ns() clock; 0 = not yet */
} kvt_xfer_status;
KVT_API void kvt_xfer_status_get(kvt_xfer_job *job, kvt_xfer_status *st);

/** Who moved a job's bytes (kvt_xfer_stat). */
enum kvt_xfer_mover {
	KVT_XFER_MOVER_CPU = 0,         /* the CPU: cpu lane workers */
	KVT_XFER_MOVER_IO = 1,          /* storage: io_uring / pread (ssd) */
	KVT_XFER_MOVER_COPY_ENGINE = 2, /* a device's copy engines (chunk,
					   batch methods) */
	KVT_XFER_MOVER_KERNEL = 3,      /* a device kernel (the gather) */
	KVT_XFER_MOVER_COUNT = 4
};
/** Where a job's bytes went. */
enum kvt_xfer_flow {
	KVT_XFER_FLOW_RESTORE = 0, /* into engine memory (an hbm tier): the
				      restore path */
	KVT_XFER_FLOW_SAVE = 1,    /* out of engine memory */
	KVT_XFER_FLOW_TIER = 2,    /* between host tiers and ssd */
	KVT_XFER_FLOW_COUNT = 3
};
/** "cpu", "io", "copy_engine", "kernel"; "restore", "save", "tier". */
KVT_API const char *kvt_xfer_mover_name(int mover);
KVT_API const char *kvt_xfer_flow_name(int flow);

/**
 * struct kvt_xfer_stat - what the engine moved, since it was created
 * (relaxed counters: each field is exact, the set a moment's view).
 * On the emulated device "copy_engine" and "kernel" bytes are CPU copies
 * made by its stream threads, counted as the device's.
 */
typedef struct kvt_xfer_stat {
	uint64_t bytes[KVT_XFER_MOVER_COUNT][KVT_XFER_FLOW_COUNT];
				/* page bytes of jobs that succeeded */
	uint64_t cpu_hashed[KVT_XFER_FLOW_COUNT]; /* page bytes a CPU thread
				   read to checksum them */
	uint64_t dev_hashed[KVT_XFER_FLOW_COUNT]; /* page bytes a device's
				   checksum kernel read */
	uint64_t dev_verified;  /* page layers (or pages) checksummed on a
				   device */
	uint64_t dev_failed;    /* of which did not match (loads) */
	uint64_t jobs, failed_jobs;
	uint64_t method_substituted; /* device jobs whose method the engine
				   chose and could not use there (cuda-batch
				   without cudaMemcpyBatchAsync: one copy per
				   chunk instead, still device DMA; said once
				   per device at warning level) */
} kvt_xfer_stat;
KVT_API void kvt_xfer_stat_get(kvt_xfer *x, kvt_xfer_stat *st);

/** The devices the engine's lanes run on (opened by their first job): up
 *  to @max of their ids into @ids and what each did into @st (either may
 *  be NULL); returns how many there are. */
struct kvt_dev_stat;
KVT_API int kvt_xfer_devices(kvt_xfer *x, int *ids, struct kvt_dev_stat *st,
			     int max);

/**
 * struct kvt_xfer_rate - the rate the engine has recently reached moving
 * pages from one tier kind to another (kvt_tier_kind_of() of the job's
 * source and destination; an engine's registered memory is KVT_TIER_HBM):
 * bytes of the jobs that completed without error over the time at least
 * one of them was running (overlapping jobs counted once: an aggregate
 * rate, queueing excluded), both decayed with a time constant of 2 s so
 * the figure follows the machine's load. A plain value.
 * @gbps:   bytes / busy time, GB/s (1e9 bytes/s); 0 while nothing has
 *          been measured.
 * @bytes, @busy_s: the decayed sums behind it.
 * @jobs:   jobs measured since the engine was created.
 * @total_bytes: their bytes, not decayed.
 */
typedef struct kvt_xfer_rate {
	double gbps;
	double bytes;
	double busy_s;
	uint64_t jobs;
	double total_bytes;
} kvt_xfer_rate;

/**
 * kvt_xfer_rate_get() - the measured rate from @src to @dst (above). For a
 * scheduler that prices loads by tier (kvt_sched_state.tier_gbps). Cheap:
 * one small lock. Returns 0, or -EINVAL for a kind out of range.
 */
KVT_API int kvt_xfer_rate_get(kvt_xfer *x, kvt_tier_kind src,
			      kvt_tier_kind dst, kvt_xfer_rate *out);

/**
 * kvt_xfer_eventfd() - an eventfd (nonblocking, close-on-exec) the engine
 * adds 1 to whenever a job completes, for poll/epoll loops. Owned by the
 * engine; do not close it. Read it to reset the count, then poll jobs.
 */
KVT_API int kvt_xfer_eventfd(kvt_xfer *x);

/**
 * kvt_xfer_pause() - @paused != 0: lane threads start no new work (work
 * under way finishes); 0: resume. Submission still works while paused.
 * For quiescing an engine, and for deterministic tests.
 */
KVT_API void kvt_xfer_pause(kvt_xfer *x, int paused);

/**
 * kvt_xfer_contig_copy() - the practical limit, for benchmarks: copy the
 * first @bytes of @src's backing memory to the first @bytes of @dst's as
 * one contiguous copy. Host tiers: with @threads == 1 one memcpy() call;
 * with more (0: the engine's cpu_threads) 4 MiB pieces taken in turn by
 * that many threads, each copied with streaming stores. One cudaMemcpy
 * when either side is hbm.
 * Ignores layouts and slots: it destroys the destination's contents.
 * *@seconds gets the time it took. Returns 0, -EINVAL if a tier is ssd or
 * smaller than @bytes, KVT_ENOTBUILT/KVT_ENODEV for hbm without CUDA/GPU.
 */
KVT_API int kvt_xfer_contig_copy(kvt_xfer *x, kvt_tier *src, kvt_tier *dst,
				 uint64_t bytes, unsigned threads,
				 double *seconds);

/* ------------------------------------------------------------------------
 * The memory stressor
 * ------------------------------------------------------------------------ */
typedef struct kvt_stress kvt_stress;

#define KVT_STRESS_MAX_THREADS 256

/** Per-thread and total copy rates. "Copied" bytes: each is read once and
 *  written once, so memory traffic is twice the figure. */
typedef struct kvt_stress_stat {
	unsigned threads;
	double seconds;          /* since the stressors started copying */
	double gbps;             /* all threads, copied GB/s (1e9 bytes) */
	double thread_gbps[KVT_STRESS_MAX_THREADS];
	uint64_t bytes;          /* copied bytes, all threads */
	int running;             /* threads still copying */
} kvt_stress_stat;

/**
 * kvt_stress_start() - start @threads stressor threads (1..256), each
 * copying back and forth between two buffers of @buffer_bytes (at least
 * 1 MiB; the published experiment used 4 GiB). Returns once every thread
 * has its buffers in memory and is copying. @seconds > 0: each thread stops
 * by itself after that long; 0: until kvt_stress_stop().
 *
 * Returns 0 and *@out, -EINVAL for bad counts or sizes, -ENOMEM when the
 * 2 * threads * buffer_bytes do not fit in the memory available now
 * (kvt_errdetail() says how much is), -EAGAIN (no threads). On failure no
 * thread is left running and nothing is mapped.
 */
KVT_API int kvt_stress_start(kvt_stress **out, unsigned threads,
			     uint64_t buffer_bytes, double seconds);
/** Rates so far (thread-safe with respect to the stressors). */
KVT_API void kvt_stress_sample(kvt_stress *s, kvt_stress_stat *st);
/** Stop every thread (within one 16 MiB block), join, unmap and free;
 *  @final (may be NULL) gets the last rates. NULL @s is fine. */
KVT_API void kvt_stress_stop(kvt_stress *s, kvt_stress_stat *final);

#ifdef __cplusplus
}
#endif

#endif /* KVTIER_XFER_H */
