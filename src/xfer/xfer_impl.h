/*
 * xfer_impl.h — inside the transfer engine: jobs, lanes, queues.
 *
 * THE PICTURE
 *
 *   kvt_xfer_submit()                  lanes (threads)
 *     check, copy slots  ──►  q[lane][prio]  ──► cpu   N workers take one task
 *     pick lane + method      (x->mu)             at a time (a layer × page
 *                                                 range, or a page range)
 *                                            ──► io    one thread, one ring:
 *                                                 one I/O per page, up to
 *                                                 uring_depth in flight
 *                                            ──► dev   per device (a GPU or
 *                                                 the emulated device): two
 *                                                 threads (load, store), one
 *                                                 stream each, one whole job
 *                                                 at a time (dev_lane.c)
 *
 *   a job's units of work:   cpu: tasks  io: pages  dev: the whole job
 *   done when units_left hits 0 ──► job_finish(): state DONE, wake waiters,
 *   eventfd +1, done callback, engine's unfinished count -1, drop a ref.
 *
 * INVARIANTS
 *
 * - A job sits in at most one queue, q[j->lane][j->prio], while it has
 *   units nobody has claimed (cpu: next_task < ntasks; io: next_page <
 *   npages; cuda: not yet taken). Claiming happens under x->mu.
 * - units_left counts units not yet finished (claimed or not). Whoever
 *   brings it to 0 finishes the job — a lane thread, or kvt_xfer_cancel()
 *   retiring unclaimed units. So every job finishes exactly once.
 * - Once err or cancel is set, no further layer is reported ready and no
 *   unit does work; units still count down so the job finishes.
 * - x->unfinished counts jobs submitted and not finished; destroy waits
 *   for it to reach 0. A job touches its engine for the last time when it
 *   decrements that count.
 * - A job is freed when its refs (the caller's and the engine's) are gone.
 *
 * THE FILES
 *
 *   xfer.c      create/destroy, the queues, info, pause (x->mu)
 *   submit.c    kvt_xfer_submit: checks, lane and method, plan, queueing
 *   job.c       a job's life: layers landed, units done, the one finish,
 *               the counters; poll, wait, cancel, status, free
 *   sum.c       checksums: record or verify, per page or per layer
 *   cpu.c, io.c, dev_lane.c   the lanes; copy.c the copy routines;
 *   rate.c      measured rates; contig.c the one-copy limit; stress.c
 *               the memory stressor
 *
 * LOCKING
 *
 * x->mu guards the queues, claiming (next_task, next_page, queued),
 * paused, stopping, unfinished and lazy lane start. j->mu guards state,
 * layers_ready and the waiters' condition. j->cb_mu serialises layer
 * callbacks so they arrive in layer order. Order: x->mu before j->mu;
 * j->cb_mu is never held with either. Counters that lane threads bump
 * (units_left, layer_left, bytes_done, err, cancel) are atomics.
 */
#ifndef KVT_XFER_IMPL_H
#define KVT_XFER_IMPL_H

#include "core/core.h"
#include "tier/tier_impl.h"

#include <pthread.h>

#define XFER_NPRIO 3

/* Lanes (queues): the cpu lane, the io lane, then two per device slot
 * (load, store): LANE_DEV0 + 2 * slot + store. */
#define XFER_MAX_DEVS 8
enum xfer_lane { LANE_CPU, LANE_IO, LANE_DEV0 };
#define LANE_COUNT (LANE_DEV0 + 2 * XFER_MAX_DEVS)
static inline int lane_is_dev(int lane)
{
	return lane >= LANE_DEV0;
}
enum xfer_order { ORDER_PAGE, ORDER_LAYER };

struct xfer_io;
struct xfer_dev;

struct kvt_xfer_job {
	/* set at submit, read-only afterwards */
	struct kvt_xfer *x;          /* valid until the job finishes */
	kvt_xfer_desc d;             /* d.src_slots/dst_slots point at slots */
	uint32_t *slots;             /* src[npages], then dst[npages] */
	const kvt_layout *sl, *dl;   /* source / destination layout */
	void *const *sbufs;          /* source buffers (NULL for ssd) */
	void *const *dbufs;
	int method;                  /* kvt_xfer_method, never AUTO */
	int method_auto;             /* chosen by the engine, not the caller */
	int lane;                    /* enum xfer_lane (+ device slot) */
	int dev_id;                  /* device lanes: the device's id */
	int mover;                   /* enum kvt_xfer_mover */
	int flow;                    /* enum kvt_xfer_flow */
	int prio;                    /* 0 (high) .. XFER_NPRIO-1 */
	int load;                    /* 1: into a faster tier */
	int order;                   /* enum xfer_order (cpu lane) */
	int io_direct;               /* io lane: I/O straight into the slot */
	int io_write;                /* io lane: memory -> ssd */
	uint64_t bytes;              /* page bytes moved */
	uint32_t layers;

	/* cpu lane */
	size_t ppt;                  /* pages per task */
	size_t tasks_per_layer;      /* ORDER_LAYER */
	size_t ntasks;
	size_t next_task;            /* x->mu */
	atomic_size_t *layer_left;   /* [layers]: tasks left per layer */
	size_t nt_min;               /* copies this long or longer use NT
					stores; SIZE_MAX: never */
	int nt_small;                /* batched small copies use NT stores */

	/* io lane */
	size_t next_page;            /* x->mu */

	/* queues */
	struct kvt_xfer_job *qnext;  /* x->mu */
	int queued;                  /* x->mu */

	/* progress and outcome */
	atomic_size_t units_left;
	atomic_int err;
	atomic_int cancel;
	atomic_uint_fast64_t bytes_done;
	atomic_size_t bad_page;
	char detail[384];            /* written by the setter of err, before
					its unit counts down */
	pthread_mutex_t mu;
	pthread_cond_t cv;
	int state;                   /* mu: enum kvt_xfer_state */
	int result;                  /* mu: final error once finishing */
	int finishing;               /* mu: result set, done callback runs */
	pthread_t cb_thread;         /* mu: the thread running it */
	uint32_t layers_ready;       /* mu */
	pthread_mutex_t cb_mu;
	uint32_t layers_told;        /* cb_mu: layer callbacks delivered */
	uint64_t t_submit, t_start, t_end;
	atomic_int refs;
};

struct job_queue {
	struct kvt_xfer_job *head, *tail;
};

typedef void (*xfer_copy_fn)(void *dst, const void *src, size_t n);

struct kvt_xfer {
	kvt_xfer_config cfg;         /* defaults filled in */
	pthread_mutex_t mu;
	pthread_cond_t cpu_cv;       /* cpu workers wait for work */
	pthread_cond_t idle_cv;      /* destroy waits for unfinished == 0 */
	struct job_queue q[LANE_COUNT][XFER_NPRIO];
	int paused, stopping;
	unsigned unfinished;
	pthread_t *workers;
	int nice;                    /* every thread's nice value (0: as is) */
	unsigned nworkers;
	int efd;
	xfer_copy_fn copy_nt;        /* non-temporal copy + kvti_copy_fence() */
	const char *copy_isa;
	int ssd_io;                  /* resolved: URING or PREAD */
	char ssd_note[160];
	struct xfer_io *io;          /* x->mu: started with the first ssd job */
	struct xfer_dev *dev[XFER_MAX_DEVS]; /* x->mu: device lanes, started
					with each device's first job */
	char cuda_note[160];
	int cuda_state;              /* 0 unknown, 1 usable, -1 not */

	/* kvt_xfer_stat (relaxed atomics) */
	_Atomic uint64_t moved[KVT_XFER_MOVER_COUNT][KVT_XFER_FLOW_COUNT];
	_Atomic uint64_t cpu_hashed[KVT_XFER_FLOW_COUNT];
	_Atomic uint64_t dev_hashed[KVT_XFER_FLOW_COUNT];
	_Atomic uint64_t dev_verified, dev_failed, jobs, failed_jobs;
	_Atomic uint64_t method_substituted;

	/* measured rates per (source kind, destination kind) (rate.c) */
	pthread_mutex_t rmu;
	struct xfer_rate {
		uint64_t mark_ns;    /* busy time accounted up to here */
		uint64_t decay_ns;   /* sums decayed up to here */
		double bytes, busy;  /* decayed sums */
		uint64_t jobs;
		double total;
	} rates[KVT_TIER_COUNT][KVT_TIER_COUNT];

	/* test hook (kvti_xfer_io_fault) */
	atomic_uint_fast64_t io_fault_at;  /* I/O completion count that fails */
	atomic_uint_fast64_t io_count;
	atomic_int io_fault_err;
	atomic_int io_fail_writes;         /* every write fails with this */
};

/* ---- the engine (xfer.c): queues, x->mu held ------------------------- */

/* Bump one of the engine's relaxed counters (kvt_xfer_stat). */
#define XFER_ADD(a, v) \
	atomic_fetch_add_explicit(&(a), (v), memory_order_relaxed)

/* Append @j to its queue, q[j->lane][j->prio]. */
void kvti_queue_push(struct kvt_xfer *x, struct kvt_xfer_job *j);
struct kvt_xfer_job *kvti_queue_head(struct kvt_xfer *x, int lane);
void kvti_queue_remove(struct kvt_xfer *x, struct kvt_xfer_job *j);
/* Claim the next unit of an io lane job, x->mu held: the page index, the
 * job leaving its queue when its last page is claimed. */
size_t kvti_io_claim(struct kvt_xfer *x, struct kvt_xfer_job *j);
/* Take the units of @j nobody claimed out of its queue; their count (the
 * caller counts them down with kvti_job_units_done() after x->mu). */
size_t kvti_retire_unclaimed(struct kvt_xfer *x, struct kvt_xfer_job *j);
/* Wake the threads of @lane. */
void kvti_lane_kick(struct kvt_xfer *x, int lane);
/* Find out once whether CUDA works here: x->cuda_state (1 usable, -1 not)
 * and x->cuda_note, for reports. Starts nothing. */
void kvti_cuda_probe(struct kvt_xfer *x);

/* A tier's name, for messages. */
static inline const char *kvti_xfer_tier_name(kvt_tier *t)
{
	kvt_tier_desc d;

	kvt_tier_info(t, &d);
	return d.name;
}

/* A tier in a GPU's memory (not host memory standing in for one). */
static inline int kvti_xfer_is_gpu(kvt_tier *t)
{
	kvt_tier_desc d;

	kvt_tier_info(t, &d);
	return d.kind == KVT_TIER_HBM && !d.hostdev;
}

/* ---- a job's life (job.c) --------------------------------------------- */

/* Record @err as the job's error (the first one wins) with a detail. */
void kvti_job_fail(struct kvt_xfer_job *j, int err, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));
/* True once the job should do no more work (error or cancel). */
static inline bool kvti_job_stopped(struct kvt_xfer_job *j)
{
	return atomic_load_explicit(&j->err, memory_order_relaxed) ||
	       atomic_load_explicit(&j->cancel, memory_order_relaxed);
}
/* Mark the job running (first unit started). */
void kvti_job_started(struct kvt_xfer_job *j);
/* @n units finished (or skipped); finishes the job at zero. */
void kvti_job_units_done(struct kvt_xfer_job *j, size_t n);
/* Every page of layer @layer landed (ORDER_LAYER jobs and the cuda lane):
 * advance layers_ready and deliver callbacks in order. */
void kvti_job_layer_landed(struct kvt_xfer_job *j, uint32_t layer);
/* Drop a reference; the last one frees the job. */
void kvti_job_put(struct kvt_xfer_job *j);
/* @n page layers (or pages) were checksummed on a device. */
void kvti_xfer_count_dev_sums(struct kvt_xfer_job *j, uint64_t n);

/* Page i's source and destination slots. */
static inline uint32_t job_src_slot(const struct kvt_xfer_job *j, size_t i)
{
	return j->slots[i];
}
static inline uint32_t job_dst_slot(const struct kvt_xfer_job *j, size_t i)
{
	return j->slots[j->d.npages + i];
}

/* ---- checksums (sum.c) ------------------------------------------------ */

/* Check/record page @i's sum; KVT_ECORRUPT recorded on mismatch. */
void kvti_job_sum(struct kvt_xfer_job *j, size_t i, uint64_t h);
/* Per-layer sum @h of layer @layer of page @i (LSUM: record; LVERIFY:
 * check, marking d.bad or failing the job). */
void kvti_job_lsum(struct kvt_xfer_job *j, size_t i, uint32_t layer,
		   uint64_t h);
/* Record or check page @i's sums, page or per layer as the job's flags
 * say, from the page-first bytes at @pf. */
void kvti_job_sum_pf(struct kvt_xfer_job *j, size_t i, const void *pf);
/* The same from the page as held by side (@l, @bufs) at @slot. */
void kvti_job_sum_side(struct kvt_xfer_job *j, size_t i, const kvt_layout *l,
		       void *const *bufs, uint32_t slot);
/* XXH3-64 of layer @layer of the page at @slot of (@l, @bufs): its kv
 * chunks in order. */
uint64_t kvti_layer_sum(const kvt_layout *l, void *const *bufs, uint32_t slot,
			uint32_t layer);
#define XFER_PAGE_SUMS (KVT_XFER_SUM | KVT_XFER_VERIFY)
#define XFER_LAYER_SUMS (KVT_XFER_LSUM | KVT_XFER_LVERIFY)
#define XFER_ANY_SUMS (XFER_PAGE_SUMS | XFER_LAYER_SUMS)

/* ---- measured rates (rate.c) ------------------------------------------ */

/* Account a job that ended without error (t_start / t_end set). */
void kvti_rate_job_done(struct kvt_xfer *x, const struct kvt_xfer_job *j);

/* ---- cpu lane (cpu.c) ------------------------------------------------ */

/* Fill in the task split of a cpu lane job. 0 or -ENOMEM. */
int kvti_cpu_plan(struct kvt_xfer *x, struct kvt_xfer_job *j);
/* Worker thread body. */
void *kvti_cpu_worker(void *arg);
/* Copy one page between a page-first buffer @pf and its place in the
 * job's layer-first (or other) side: @to_pf gathers into @pf. Used by the
 * io lane for bounce buffers. @h: optional XXH3 state updated in
 * page-first order (NULL: none). */
void kvti_page_convert(const kvt_layout *l, void *const *bufs, uint32_t slot,
		       void *pf, int to_pf, void *h);
/* XXH3-64 of page-first page @i's bytes as held by side (@l, @bufs, slot). */
uint64_t kvti_page_sum(const kvt_layout *l, void *const *bufs, uint32_t slot);
/* ---- copies (copy.c) --------------------------------------------------- */

/* The best non-temporal copy this CPU has; *@isa names it. */
xfer_copy_fn kvti_copy_nt_pick(const char **isa);
/* Order non-temporal stores before what follows (sfence on x86). */
void kvti_copy_fence(void);
/* Copy @nb (<= KVTI_MULTI_MAX) chunks of @n bytes at once, a cache line
 * of each in turn, prefetching the first @n bytes of each of @npf more
 * sources @pf on the way. Needs n % 64 == 0, and with @nt every d[k]
 * 32-byte aligned. */
#define KVTI_MULTI_MAX 8
typedef void (*xfer_multi_fn)(char *const *d, const char *const *s, int nb,
			      size_t n, int nt, const char *const *pf,
			      int npf);
void kvti_copy_multi(char *const *d, const char *const *s, int nb, size_t n,
		     int nt, const char *const *pf, int npf);
/* Copy @nseg segments of @n bytes, s[k] -> d[k], with streaming stores,
 * and hash them on the way: *@h = XXH3-64 (seed 0) of s[0] .. s[nseg-1]
 * concatenated, taken from the registers the stores write (what landed).
 * 0, or -1 where this CPU or these arguments cannot (n % 64, a total of
 * 240 bytes or less, a destination not 32-byte aligned, no AVX2): the
 * caller copies and hashes another way. Then kvti_copy_fence(). */
int kvti_copy_xxh3(char *const *d, const char *const *s, int nseg, size_t n,
		   uint64_t *h);

/* ---- io lane (io.c) ---------------------------------------------------- */

/* Decide URING or PREAD at create (cfg->ssd_io); fills x->ssd_io and
 * x->ssd_note. KVT_ENODEV if URING was demanded and does not work. */
int kvti_io_probe(struct kvt_xfer *x);
/* Start the lane (x->mu held). 0, -ENOMEM, -EAGAIN. */
int kvti_io_start(struct kvt_xfer *x);
/* Wake the io thread (x->mu held). */
void kvti_io_kick(struct kvt_xfer *x);
/* Stop and free (x->mu not held; queues empty). */
void kvti_io_stop(struct kvt_xfer *x);
/* All pages of an io lane job are done (one unit left): flush for
 * KVT_XFER_DURABLE, then count the last unit down. */
void kvti_io_final(struct kvt_xfer_job *j);
/* Plan an io lane job (direct or bounce). */
int kvti_io_plan(struct kvt_xfer *x, struct kvt_xfer_job *j);

/* Test hook: the @nth data I/O completing from now fails with @err
 * (negative errno), or comes back short (half its bytes) if @err is 0.
 * nth = 0 disarms. */
void kvti_xfer_io_fault(kvt_xfer *x, uint64_t nth, int err);
/* Test hook: every ssd write completing from now fails with @err (a full
 * disk: -ENOSPC) until called again with 0. */
void kvti_xfer_io_fail_writes(kvt_xfer *x, int err);

/* ---- device lanes (dev_lane.c) ---------------------------------------- */

/* Device-independent checks of a device lane job (no lock). */
int kvti_dev_plan(struct kvt_xfer *x, struct kvt_xfer_job *j);
/* Start (or find) the lanes of device @id (x->mu held): *@slot gets its
 * slot. KVT_ENOTBUILT, KVT_ENODEV, -ENOSPC (too many devices), -ENOMEM,
 * -EAGAIN. */
int kvti_dev_lane_start(struct kvt_xfer *x, int id, int *slot);
/* Checks that need the open device (x->mu held): batched copies built,
 * host memory registered with it, checksum segment limits. */
int kvti_dev_check(struct kvt_xfer *x, struct kvt_xfer_job *j, int slot);
void kvti_dev_kick(struct kvt_xfer *x, int lane);
/* Stop every device lane (queues empty). */
void kvti_dev_stop(struct kvt_xfer *x);
/* One synchronous copy on device @id, timed (the device's limit). */
int kvti_dev_contig(int id, void *dst, const void *src, uint64_t n,
		    double *seconds);
#endif
