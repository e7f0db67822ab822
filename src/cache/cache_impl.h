/*
 * cache_impl.h — the node cache inside (not installed). The contract is
 * include/kvtier/cache.h; this file holds the structures every cache file
 * shares, which lock guards which field, and the kvti_cache_* calls
 * between files.
 *
 * THE FILES
 *
 *   cache.c       the cache: open, close, register / attach / detach,
 *                 tenants, lookup, accounting and verify
 *   slot.c        the state of every slot of every owned tier (NONE, PEND,
 *                 OK, BAD), its fences (rd / wr marks, settle waits) and
 *                 the persistence hooks at each state change
 *   mover.c       the copies the index asks for (the mover callbacks),
 *                 batches run in dependency waves, background demotion
 *   job.c         a job's life: creation, submission, progress from the
 *                 transfer engine, waiting, results, freeing
 *   job_finish.c  the worker threads: finishing jobs (commit or mark bad,
 *                 unpin) and running staged ssd loads
 *   load.c        kvt_cache_load(): lease, pick each page's copy, submit
 *   store.c       kvt_cache_store(): insert, reserve slots, submit
 *   cache_remote.c the remote tier, built on the cache's public calls and
 *                 cache_ext.h (its hooks); no cache file reaches into it
 *
 * THREADS AND LOCKS
 *
 *   c->mu   the index, the mover's current batch, tenants, the memory
 *           list: decisions and bookkeeping only. Never held across a
 *           copy or a wait for one: the copies an index call decides run
 *           after the lock is dropped (kvti_cache_unlock(), mover.c), and
 *           a store waits for its slots' fences without it.
 *   c->smu  the slot metadata (struct meta), the statistics, the live-job
 *           list and memory job counts, whose batch runs (run_next); a
 *           leaf lock (taken after mu, never the other way), with c->scv
 *           broadcast whenever a slot leaves PEND, a mark drops, a batch
 *           ends, a job ends or a memory's job count drops.
 *   c->wmu  the worker's queue and the background thread's kick; a leaf.
 *   c->rmu  the room thread's queue; a leaf, taken under mu (a store
 *           queues itself there before it drops mu, so the queue holds
 *           batches in the order of their ids).
 *   j->mu   a job's progress; a leaf too.
 *
 *   engine threads      lookup, load, store (setup under mu, then submit)
 *   xfer threads        layer callbacks -> job progress (j->mu only);
 *                       done callbacks -> queue the job for the worker
 *   worker threads      (KVTI_CACHE_WORKERS) finish jobs, several at
 *                       once (commit, unpin under mu, then the write-
 *                       through copies that decided, without it), run
 *                       staged ssd loads (one at a time: c->stage_mu)
 *   background thread   demotes above the high watermark: decides under
 *                       mu, copies without it, commits under smu
 *   room thread         runs the demotions a store's placement decided
 *                       and waits out its slots' fences, then submits the
 *                       store's transfers (mover.c): kvt_cache_store()
 *                       returns without waiting for room
 *
 * A job is finished only by the worker, once every transfer it issued is
 * done, so a job's pins and slot states change in one place.
 */
#ifndef KVT_CACHE_IMPL_H
#define KVT_CACHE_IMPL_H

#include "cache/cache_ext.h"
#include "cache/persist.h"
#include "core/core.h"

#include <pthread.h>
#include <stdint.h>

/* Slot states (struct meta.state); slot.c has the rules. */
enum { ST_NONE = 0, ST_PEND = 1, ST_OK = 2, ST_BAD = 3 };
enum { JOB_LOAD = 1, JOB_STORE = 2 };

#define ENGINE KVT_TIER_COUNT  /* "tier" index of the engine's memory */
#define STAGE_SLOTS KVT_CACHE_STAGE_SLOTS /* the ssd -> GPU bounce tier */
#define MAX_SUBS (KVT_TIER_COUNT + 2) /* load: one per source tier;
					 store: one per destination tier;
					 the last is the start hold */
#define HOLD (MAX_SUBS - 1)
#define KVTI_CACHE_WORKERS 4   /* threads finishing jobs, in parallel */

/* A device the cache serves: its host tiers registered with it
 * (devices.c). reg[k]: the base the cache registered (unregistered at
 * close), NULL when someone else had; done[k]: registered either way. */
#define KVTI_CACHE_MAX_DEVS 8
struct kvti_cache_dev {
	int id;
	struct kvti_dev *dev;
	void *reg[KVT_TIER_COUNT + 1];
	int done[KVT_TIER_COUNT + 1];
};

/* Per slot of one owned tier (c->smu). */
struct meta {
	uint64_t *sums;      /* [slot * L + l]: layer l's XXH3-64 */
	uint8_t *state;      /* ST_* */
	uint16_t *rd;        /* batches' pending reads of the slot */
	uint16_t *wr;        /* batches' pending writes to the slot */
	uint32_t *pby;       /* PEND: the batch writing it (0: a store) */
	uint64_t n;
};

/* A slot that went BAD, to be taken out of the index (slot.c). */
struct badslot {
	uint32_t slot;
	uint8_t tier;
};

/* One copy the index asked for (mover.c). */
struct move {
	uint8_t src, dst;    /* the source holds a page (committed or on its
				way): marks taken at decision */
	uint32_t ss, ds;
	uint32_t wave;
	uint8_t last;        /* the batch's last write of (dst, ds): the one
				that commits it (mover.c, move_end()) */
	int err;
};

/* The copies decided in one hold of c->mu (an index call or several, a
 * background pass), with each move's layer sums (L per move, taken when
 * the move was decided). */
struct batch {
	struct move *mv;
	uint64_t *sums;
	size_t n, cap, scap;
};

/* One transfer of a job: pages from one source to one destination. */
struct sub {
	kvt_cache_job *cj;
	kvt_xfer_job *xj;    /* j->mu once submitted */
	int src, dst;        /* tier kinds, or ENGINE */
	size_t n;
	uint32_t *ss, *ds;
	size_t *pg;          /* index of each page in the job's request */
	uint64_t *sums;      /* n * L */
	uint8_t *bad;        /* n; written by the transfer engine */
	uint32_t landed;     /* j->mu: layers landed */
	int err;             /* j->mu: the transfer's result once done */
	int done;            /* j->mu */
	int staged;          /* ssd -> stage -> engine, run by the worker */
};

struct kvt_cache_job {
	kvt_cache *c;
	int kind;            /* JOB_LOAD, JOB_STORE */
	uint32_t tenant;
	kvt_page_key *keys;
	size_t nkeys;        /* the prefix (pinned while the job runs; a
				store: the pages it placed) */
	int pinned;          /* c->mu */
	uint8_t *pin_each;   /* KVT_CACHE_IO_EACH: page i's own prefix pinned
				(NULL otherwise); c->mu */
	size_t first, n;     /* requested pages [first, first + n) */
	size_t absent;       /* load: pages failed at setup (not cached) */
	uint32_t *blocks;    /* n */
	uint8_t *failed;     /* n, final once done */
	struct sub sub[MAX_SUBS];
	int nsub;
	pthread_mutex_t mu;
	pthread_cond_t cv;
	int subs_left;       /* mu */
	int done;            /* mu */
	int result;          /* mu, once done */
	int cancel;          /* mu */
	int stage_todo;      /* mu: staged loads for the worker to run */
	int efd;
	kvt_cache_job_stat st;
	uint64_t rfail[KVT_TIER_COUNT]; /* load: read failures by tier */
	uint64_t t0;
	kvt_cache_mem *mem;  /* the engine memory it reads or writes */
	void *wait;          /* kvt_cache_io.wait: a device event the copies
				into / out of engine memory wait for */
	int memref;          /* c->smu: counted in mem->jobs */
	kvt_cache_progress_fn *progress; /* j->mu: kvt_cache_io */
	void *parg;
	uint32_t reported;   /* j->mu: layers last reported */
	uint64_t *ready_ns;  /* L: when each layer became ready (j->mu;
				0: not yet), kvt_cache_job_layer_ns() */
	uint32_t stamped;    /* j->mu: layers 0..stamped-1 have ready_ns */
	int freported;       /* j->mu: all-failed reported */
	kvt_cache_job *qnext; /* c->wmu: worker queue */
	struct batch rb;     /* a store waiting for room: the copies its */
	uint32_t rid;        /*  placement decided and their batch id (0:
				only fences to wait out), run by the room
				thread (mover.c) */
	kvt_cache_job *rnext; /* c->rmu: the room queue */
	kvt_cache_job *lprev, *lnext; /* c->smu: the cache's live jobs */
};

/* Engine memory: kvt_cache_register()'s, or one per kvt_cache_attach(). */
struct kvt_cache_mem {
	kvt_cache *c;
	kvt_tier *t;         /* the wrapped memory (layout + bases) */
	int jobs;            /* c->smu: jobs created on it, not finished */
	int gone;            /* c->smu: being detached: no new jobs */
	int quiet;           /* stores are not reported to c->ext (set
				before any job on it) */
	kvt_cache_mem *next; /* c->mu: c->mems */
};

struct kvt_cache {
	kvt_geom geom;
	uint32_t L;
	int verify, background, stage_ssd;
	int nice;                        /* its threads' nice value */
	double high, low;
	kvt_tier *tiers[KVT_TIER_COUNT]; /* owned: fabric, dram, ssd */
	int top;                         /* fastest owned tier */
	kvt_cache_mem *reg;              /* kvt_cache_register()'s, or NULL */
	kvt_cache_mem *mems;             /* mu: every attached memory */
	kvt_tier *stage;                 /* ssd -> GPU bounce, or NULL */
	kvt_xfer *x;
	struct kvti_cache_dev devs[KVTI_CACHE_MAX_DEVS]; /* mu */
	int ndevs;                       /* mu */

	pthread_mutex_t mu;
	kvt_index *idx;
	struct batch cur;                /* mu: copies decided in this hold
					    of mu, run once it is dropped */
	uint32_t batch, batch_seq;       /* mu: cur's id (0: none yet), the
					    last id taken */

	pthread_mutex_t smu;
	pthread_cond_t scv;
	struct meta m[KVT_TIER_COUNT];
	kvtp *persist;                   /* ssd records ('persist'), or NULL */
	struct badslot *bad;             /* slots gone BAD, not yet out of */
	size_t nbad, badcap;             /*  the index (kvti_cache_reclaim) */
	kvt_cache_stat st;
	uint32_t run_next;               /* the batch id whose turn it is */
	int jobs;                        /* jobs not yet finished */
	kvt_cache_job *live;             /* them, for kvt_cache_close() */

	pthread_mutex_t wmu;             /* worker and background queues */
	pthread_cond_t wcv, bgcv;
	kvt_cache_job *wq, *wq_tail;
	int stopping, bg_kick, bg_busy;
	pthread_t workers[KVTI_CACHE_WORKERS], bg;
	int nworkers, have_bg;
	pthread_mutex_t stage_mu;        /* one staged ssd load at a time */
	pthread_mutex_t rmu;             /* the room thread's queue */
	pthread_cond_t rcv;
	kvt_cache_job *rq, *rq_tail;     /* rmu: stores waiting for room */
	int rstop, have_room;            /* rmu: stop once rq is empty */
	pthread_t room;
	const struct kvti_cache_ext *ext; /* the remote tier's hooks, or
					    NULL (cache_ext.h); set at open */
	void *ext_arg;
};

/* ---- small helpers ------------------------------------------------------ */

static inline double kvti_cache_secs(uint64_t t0)
{
	return (double)(kvt_now_ns() - t0) / 1e9;
}

static inline uint64_t kvti_cache_page_bytes(const kvt_cache *c)
{
	return kvt_geom_page_bytes(&c->geom);
}

/* The tier a job's transfer reads or writes: an owned one, or the job's
 * engine memory. */
static inline kvt_tier *kvti_cache_side(const kvt_cache_job *j, int t)
{
	return t == ENGINE ? j->mem->t : j->c->tiers[t];
}

/* The job's prefix, its first @n keys. */
static inline kvt_prefix kvti_cache_prefix(const kvt_cache_job *j, size_t n)
{
	kvt_prefix px = { .tenant = j->tenant, .keys = j->keys, .nkeys = n };
	return px;
}

/* The prefix of one page of its own (KVT_LOOKUP_EACH, KVT_CACHE_IO_EACH). */
static inline kvt_prefix kvti_cache_page_prefix(uint32_t tenant,
						const kvt_page_key *key)
{
	kvt_prefix px = { .tenant = tenant, .keys = key, .nkeys = 1 };
	return px;
}

/* ---- slot.c: slot states, fences, persistence hooks --------------------- */

int kvti_cache_meta_init(kvt_cache *c, int t);
void kvti_cache_meta_free(struct meta *m);
void kvti_cache_slot_settle(kvt_cache *c, int t, uint32_t s);
void kvti_cache_persist_gone(kvt_cache *c, int t, uint32_t s);
void kvti_cache_persist_ok(kvt_cache *c, int t, uint32_t s);
void kvti_cache_slot_pend(kvt_cache *c, int t, uint32_t s, uint32_t batch);
int kvti_cache_best_copy(kvt_cache *c, const kvt_page_info *pi, int *pend);
/* c->smu held: slot @s of @t failed (a copy into it, or its check): BAD,
 * its record gone, queued to leave the index. */
void kvti_cache_slot_bad(kvt_cache *c, int t, uint32_t s);
/* c->mu held: the queued BAD slots leave the index at once (their pages
 * lose those copies, the slots go back to their pools); one that is a
 * leased page's only copy waits for the next call. */
void kvti_cache_reclaim(kvt_cache *c);

/* ---- mover.c: the index's copies, background demotion ------------------- */

/* The index's mover (kvt_index_config.mover; arg is the cache), called
 * with c->mu held: a copy joins c->cur, run by kvti_cache_unlock(). */
int kvti_cache_mover_copy(void *arg, const kvt_move *m);
void kvti_cache_mover_release(void *arg, kvt_tier_kind tier, uint32_t slot);
/* Drop c->mu, then run the copies decided while it was held (in turn
 * with other batches); the seconds that took. Every hold of c->mu that
 * may have called the index ends here. */
double kvti_cache_unlock(kvt_cache *c);
/* The background thread, and a wake-up for it (after a store). */
void *kvti_cache_bg_main(void *arg);
void kvti_cache_bg_kick(kvt_cache *c);
/* c->mu held: store @j waits for room off the caller's thread. It takes
 * the batch of this hold of mu (the demotions its placement decided),
 * joins the live jobs and the room queue, and drops mu; the room thread
 * runs the batch, waits out the fences of the job's fresh slots and
 * submits its transfers. */
void kvti_cache_room_defer(kvt_cache *c, kvt_cache_job *j);
void *kvti_cache_room_main(void *arg);

/* ---- job.c: a job's life ------------------------------------------------ */

/* A job for a checked request (load.c, store.c fill its subs); its blocks
 * and keys copied. 0, -EINVAL, -E2BIG, KVT_EBUSY, -ENOMEM. */
int kvti_cache_job_new(kvt_cache *c, int kind, uint32_t tenant,
		       const kvt_page_key *keys, size_t nkeys, size_t first,
		       const uint32_t *blocks, const kvt_cache_io *io,
		       kvt_cache_job **out);
int kvti_cache_sub_alloc(kvt_cache *c, struct sub *s, size_t cap);
/* Submit every sub; the job finishes on the worker once all are done. */
int kvti_cache_job_start(kvt_cache *c, kvt_cache_job *j);
/* kvti_cache_job_start() in its two halves: the job joins the live jobs
 * (kvt_cache_close() cancels and waits for it), then its transfers are
 * submitted (a job cancelled in between ends -ECANCELED, copying
 * nothing). */
void kvti_cache_job_link(kvt_cache *c, kvt_cache_job *j);
int kvti_cache_job_submit(kvt_cache *c, kvt_cache_job *j);
/* kvt_fault_hold_jobs() (tests): hold the job here while a hold of @kind
 * is armed (KVT_FAULT_LOADS / _STORES: as a stuck disk or device would,
 * before it finishes; KVT_FAULT_ROOM: before its room is made), up to the
 * hold's length, ending early at a cancel unless stuck. */
void kvti_cache_job_hold(kvt_cache_job *j, unsigned kind);
/* A job never started: unpin (takes c->mu), free. */
void kvti_cache_job_abort(kvt_cache *c, kvt_cache_job *j);
/* c->mu held: drop the job's leases. */
void kvti_cache_job_unpin(kvt_cache *c, kvt_cache_job *j);
/* Request page @i failed with @err (the first error is the result). */
void kvti_cache_job_fail_page(kvt_cache_job *j, size_t i, int err);
/* A transfer is done (xfer thread, or the worker for staged loads). */
void kvti_cache_sub_end(struct sub *s, int err);
/* j->mu held: layers landed in every sub; 1 when every block failed. */
uint32_t kvti_cache_job_ready(kvt_cache_job *j);
void kvti_cache_job_stamp(kvt_cache_job *j, int done);
int kvti_cache_job_all_failed(kvt_cache_job *j);
/* The transfer engine's layer callback of a sub (arg: the sub). */
void kvti_cache_sub_layer(kvt_xfer_job *xj, uint32_t layer, void *arg);
/* c->smu held: the job no longer counts against its memory. */
void kvti_cache_mem_unref(kvt_cache *c, kvt_cache_job *j);

/* ---- job_finish.c: the worker threads ----------------------------------- */

void *kvti_cache_worker_main(void *arg);

/* ---- devices.c: host tiers registered with the devices ------------------- */

/* c->mu held (or the cache not yet shared): register the host tiers (and
 * the stage, once open) with device @id, once. */
int kvti_cache_dev_use(kvt_cache *c, int id);
/* Unregister and let go of every device (close: the transfer engine has
 * stopped, the tiers are still mapped). */
void kvti_cache_dev_release(kvt_cache *c);
/* kvt_cache_config.devices at open. */
int kvti_cache_devices_open(kvt_cache *c, const char *list);

/* ---- cache.c ------------------------------------------------------------ */

/* Open the ssd bounce tier if there is an ssd tier and it is not open
 * (c->mu held or not yet shared). */
int kvti_cache_open_stage(kvt_cache *c);

/* c->mu held: per-page records of keys[0..n) (*info: kvt_free() it), and
 * how many are in the tree. */
int kvti_cache_inspect(kvt_cache *c, uint32_t tenant, const kvt_page_key *keys,
		       size_t n, kvt_page_info **info, size_t *found);

#endif
