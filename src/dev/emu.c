/*
 * emu.c — the emulated device (dev.h): the whole GPU flow without a GPU.
 *
 *   memory      alloc: a sealed memfd mapped shared; its handle is the fd
 *               (KVTI_DEV_H_EMU_FD), which another process imports by
 *               mapping it: two processes see one "device memory"
 *   streams     a thread each, running a FIFO of operations in order
 *   copy, batch memcpy on the stream thread    (counted as copy engine)
 *   gather      memcpy of each chunk            (counted as kernel)
 *   sum         xxh3.h over each item's segments: the same function as
 *               the CUDA checksum kernel and the CPU
 *   events      a small shared record {recorded, completed, status}: a
 *               record bumps `recorded` now and `completed` when the
 *               stream reaches it; a wait waits for the `recorded` seen
 *               when it was enqueued. IPC events live in a memfd page,
 *               so a wait in one process orders after work in another.
 *   waits       stream waits on events and on 32-bit values (the job
 *               slot's stream word) block the stream thread on a futex;
 *               they give up after the wait limit (60 s, KVT_EMU_WAIT_MS)
 *               with -ETIMEDOUT, so a dead peer cannot stall a stream for
 *               ever
 *
 * THE ACCESS CHECK. Every operation, when it runs, checks each address it
 * touches against the memory the device knows: its allocations, its live
 * imports, registered host memory (read-only ranges are not written). An
 * address outside all of them is refused (-EFAULT, counted in faults) —
 * what a GPU page fault would be — instead of being written. The ranges
 * are held read-locked while the operation runs and write-locked by
 * release, so memory is never unmapped under a copy: release waits for
 * the copy, and an operation still queued after its memory was released
 * faults. Tests use this to show the daemon never writes into memory an
 * engine has unregistered or lost.
 *
 * TIME. With a delay set (kvti_dev_emu_set_delay(), KVT_EMU_DELAY_NS_PER_MIB)
 * a copy or gather first spends its "DMA time", then its bytes land, so a
 * peer that reads without waiting for the copy's event reads the old
 * bytes — the missing-synchronisation case is deterministic in tests.
 *
 * DAMAGE. kvti_dev_emu_set_damage(d, n): the next n copies (a copy, one
 * copy of a batch, one chunk of a gather) land with their first byte
 * flipped, the source untouched — a link that damages data in flight. A
 * checksum of the source passes such a copy; only one of what landed
 * catches it (the device lane's, dev_lane.c).
 *
 * These copies are CPU copies made by the stream threads: the transfer
 * engine counts them as the device's (copy engine, kernel), as it would a
 * GPU's, and the emulated device says it is one (KVTI_DEV_CAP_EMULATED).
 *
 * Locking: e->rw guards the ranges (read: running operations and lookups;
 * write: map and unmap). A stream's mu guards its queue and counters; a
 * stream thread holds no lock while it runs an operation except e->rw
 * (read). Events are lock-free (atomics and futexes).
 */
#include "dev/dev.h"
#include "dev/xxh3.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <linux/futex.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

enum { R_ALLOC, R_IMPORT, R_HOST, R_HOSTALLOC };

struct emu_range {
	char *base;
	size_t len;
	int kind;
	unsigned flags;          /* KVTI_DEV_HOST_* */
	int fd;                  /* R_ALLOC: the memfd */
	struct emu_range *next;
};

struct emu {
	pthread_rwlock_t rw;
	struct emu_range *ranges;
	_Atomic uint64_t delay;      /* ns per MiB moved */
	_Atomic uint64_t wait_limit; /* ns */
	_Atomic uint64_t damage;     /* copies still to land damaged */
};

#define EV_BYTES 4096u

/* An event's shared part: a private allocation, or a memfd page. */
struct emu_shev {
	_Atomic uint64_t recorded;
	_Atomic uint64_t completed;
	_Atomic int32_t status;
	_Atomic uint32_t futex;
	char detail[200];
};

struct kvti_dev_event {
	kvti_dev *d;
	struct emu_shev *sh;
	_Atomic int refs;
	int fd;                  /* IPC: the memfd; -1 */
	int imported;            /* a peer's: wait on it, never record */
	int mapped;              /* sh is a mapping (IPC, imported) */
};

enum { OP_COPY, OP_BATCH, OP_GATHER, OP_SUM, OP_RECORD, OP_WAIT_EVENT,
       OP_WAIT_VALUE, OP_FN, OP_SYNC };

struct emu_sync {
	int done, err;
	char detail[200];
};

struct emu_op {
	int type;
	union {
		struct { void *dst; const void *src; size_t n; } copy;
		struct { void *const *dst; const void *const *src;
			 const size_t *n; size_t count; } batch;
		kvti_dev_gather gather;
		kvti_dev_sum sum;
		struct { kvti_dev_event *e; uint64_t seq; } ev;
		struct { const uint32_t *addr; uint32_t value; } wv;
		struct { void (*fn)(void *); void *arg; } fn;
		struct emu_sync *sync;
	} u;
	struct emu_op *next;
};

struct kvti_dev_stream {
	kvti_dev *d;
	struct emu *e;
	pthread_t th;
	pthread_mutex_t mu;
	pthread_cond_t cv;        /* work arrived; an operation finished */
	struct emu_op *head, *tail;
	int stop;
	int err;                  /* thread: first failure since a record */
	char detail[200];
};

static struct emu *E(kvti_dev *d)
{
	return d->priv;
}

/* ---- futexes (shared: the words may live in memory of two processes) --- */

static void fwait(const void *addr, uint32_t val, int64_t ns)
{
	struct timespec ts = { .tv_sec = ns / 1000000000, .tv_nsec = ns % 1000000000 };

	syscall(SYS_futex, addr, FUTEX_WAIT, val, &ts, NULL, 0);
}

static void fwake(void *addr)
{
	syscall(SYS_futex, addr, FUTEX_WAKE, INT_MAX, NULL, NULL, 0);
}

/* ---- ranges ------------------------------------------------------------------ */

/* rw held (read or write). */
static struct emu_range *range_of(struct emu *e, const void *p, size_t n)
{
	uintptr_t a = (uintptr_t)p;

	for (struct emu_range *r = e->ranges; r; r = r->next) {
		uintptr_t b = (uintptr_t)r->base;

		if (a >= b && n <= r->len && a - b <= r->len - n)
			return r;
	}
	return NULL;
}

/* The access check (rw read-held). */
static int access_ok(kvti_dev *d, const void *p, size_t n, int write)
{
	struct emu_range *r = range_of(E(d), p, n);

	if (r && !(write && (r->flags & KVTI_DEV_HOST_READONLY)))
		return 0;
	kvti_dev_count(d, DST_FAULTS, 1);
	return kvti_fail(-EFAULT, "%s: %s of %zu bytes at %p: %s", d->name,
			 write ? "write" : "read", n, p,
			 r ? "read-only memory" : "not device memory, an import "
			 "or registered host memory (released?)");
}

static int range_add(struct emu *e, void *base, size_t len, int kind,
		     unsigned flags, int fd, struct emu_range **out)
{
	struct emu_range *r = kvt_calloc(1, sizeof(*r));

	if (!r)
		return -ENOMEM;
	r->base = base;
	r->len = len;
	r->kind = kind;
	r->flags = flags;
	r->fd = fd;
	pthread_rwlock_wrlock(&e->rw);
	r->next = e->ranges;
	e->ranges = r;
	pthread_rwlock_unlock(&e->rw);
	if (out)
		*out = r;
	return 0;
}

/* Take the range starting at @base of @kind out (waits for running
 * operations); NULL if none. */
static struct emu_range *range_take(struct emu *e, const void *base, int kind)
{
	struct emu_range *r = NULL;

	pthread_rwlock_wrlock(&e->rw);
	for (struct emu_range **p = &e->ranges; *p; p = &(*p)->next)
		if ((*p)->base == base && (*p)->kind == kind) {
			r = *p;
			*p = r->next;
			break;
		}
	pthread_rwlock_unlock(&e->rw);
	return r;
}

/* ---- open / close --------------------------------------------------------- */

static uint64_t env_u64(const char *name, uint64_t def)
{
	const char *v = getenv(name);
	char *end;
	unsigned long long x;

	if (!v || !*v)
		return def;
	errno = 0;
	x = strtoull(v, &end, 10);
	if (errno || *end) {
		kvti_warn("%s='%.30s' is not a number: ignored", name, v);
		return def;
	}
	return x;
}

static int emu_open(kvti_dev *d)
{
	struct emu *e = kvt_calloc(1, sizeof(*e));
	pthread_rwlockattr_t a;

	if (!e)
		return -ENOMEM;
	/* a release waiting for the write lock goes before the next copy:
	 * operations queued behind it find their memory gone (a fault) */
	pthread_rwlockattr_init(&a);
	pthread_rwlockattr_setkind_np(&a,
		PTHREAD_RWLOCK_PREFER_WRITER_NONRECURSIVE_NP);
	pthread_rwlock_init(&e->rw, &a);
	pthread_rwlockattr_destroy(&a);
	atomic_init(&e->delay, env_u64("KVT_EMU_DELAY_NS_PER_MIB", 0));
	atomic_init(&e->wait_limit,
		    env_u64("KVT_EMU_WAIT_MS", 60000) * 1000000ull);
	d->priv = e;
	d->caps = KVTI_DEV_CAP_BATCH | KVTI_DEV_CAP_WAIT_VALUE |
		  KVTI_DEV_CAP_IPC_EVENT | KVTI_DEV_CAP_IOMEM |
		  KVTI_DEV_CAP_EMULATED;
	d->sum_maxseg = KVT_XXH3_MAXSEG;
	snprintf(d->name, sizeof(d->name), "emu:%d", d->index);
	return 0;
}

static void emu_close(kvti_dev *d)
{
	struct emu *e = E(d);

	while (e->ranges) {
		struct emu_range *r = e->ranges;

		e->ranges = r->next;
		if (r->kind == R_ALLOC) {
			kvti_warn("%s closed with %zu bytes still allocated: "
				  "freed", d->name, r->len);
			munmap(r->base, r->len);
			close(r->fd);
		} else if (r->kind == R_HOSTALLOC) {
			kvt_free(r->base);
		}
		kvt_free(r);
	}
	pthread_rwlock_destroy(&e->rw);
	kvt_free(e);
}

void kvti_dev_emu_set_delay(kvti_dev *d, uint64_t ns_per_mib)
{
	if (d->ops == &kvti_dev_emu_ops)
		atomic_store(&E(d)->delay, ns_per_mib);
}

void kvti_dev_emu_set_wait_limit(kvti_dev *d, uint64_t ns)
{
	if (d->ops == &kvti_dev_emu_ops)
		atomic_store(&E(d)->wait_limit, ns);
}

void kvti_dev_emu_set_damage(kvti_dev *d, uint64_t ncopies)
{
	if (d->ops == &kvti_dev_emu_ops)
		atomic_store(&E(d)->damage, ncopies);
}

/* ---- memory ------------------------------------------------------------------ */

static int emu_alloc(kvti_dev *d, size_t len, void **out)
{
	char name[32];
	void *p;
	int fd, err;

	if (!len)
		return kvti_fail(-EINVAL, "%s: allocation of 0 bytes", d->name);
	snprintf(name, sizeof(name), "kvtier-emu%d", d->index);
	fd = memfd_create(name, MFD_CLOEXEC | MFD_ALLOW_SEALING);
	if (fd < 0)
		return kvti_fail(-errno, "%s: memfd_create: %s", d->name,
				 strerror(errno));
	if (ftruncate(fd, (off_t)len) ||
	    fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL)) {
		err = kvti_fail(-errno, "%s: sizing %zu bytes of device memory: "
				"%s", d->name, len, strerror(errno));
		close(fd);
		return err;
	}
	p = kvti_mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	if (p == MAP_FAILED) {
		err = kvti_fail(-errno, "%s: mapping %zu bytes of device "
				"memory: %s", d->name, len, strerror(errno));
		close(fd);
		return err;
	}
	if ((err = range_add(E(d), p, len, R_ALLOC, 0, fd, NULL))) {
		munmap(p, len);
		close(fd);
		return err;
	}
	*out = p;
	return 0;
}

static void emu_free(kvti_dev *d, void *p)
{
	struct emu_range *r;

	if (!p)
		return;
	if (!(r = range_take(E(d), p, R_ALLOC))) {
		kvti_warn("%s: free of %p, which it did not allocate", d->name, p);
		return;
	}
	munmap(r->base, r->len);
	close(r->fd);
	kvt_free(r);
}

static int emu_export_mem(kvti_dev *d, void *p, kvti_dev_handle *h,
			  uint64_t *off)
{
	struct emu *e = E(d);
	struct emu_range *r;
	int err = 0;

	pthread_rwlock_rdlock(&e->rw);
	r = range_of(e, p, 1);
	if (!r || r->kind != R_ALLOC) {
		err = kvti_fail(-EINVAL, "%s: %p is not memory this process "
				"allocated on the device", d->name, p);
	} else {
		memset(h, 0, sizeof(*h));
		h->kind = KVTI_DEV_H_EMU_FD;
		h->fd = r->fd;
		h->bytes = r->len;
		*off = (uint64_t)((char *)p - r->base);
	}
	pthread_rwlock_unlock(&e->rw);
	return err;
}

static int emu_import(kvti_dev *d, const kvti_dev_handle *h, void **base,
		      void **priv)
{
	struct stat st;
	struct emu_range *r;
	int seals, err;
	void *p;

	if (h->kind != KVTI_DEV_H_EMU_FD)
		return kvti_fail(-EINVAL, "%s: can only import emulated device "
				 "memory (a memfd), not handle kind %d", d->name,
				 h->kind);
	if (fstat(h->fd, &st))
		return kvti_fail(-errno, "%s: import: fstat: %s", d->name,
				 strerror(errno));
	seals = fcntl(h->fd, F_GET_SEALS);
	if (!S_ISREG(st.st_mode) || seals < 0 || !(seals & F_SEAL_SHRINK))
		return kvti_fail(-EINVAL, "%s: import: the descriptor must be a "
				 "memfd sealed against shrinking (it could "
				 "shrink under the device's copies)", d->name);
	if (!h->bytes || h->bytes > (uint64_t)st.st_size)
		return kvti_fail(-EINVAL, "%s: import of %llu bytes from a memfd "
				 "of %lld", d->name,
				 (unsigned long long)h->bytes,
				 (long long)st.st_size);
	p = kvti_mmap(NULL, (size_t)h->bytes, PROT_READ | PROT_WRITE,
		      MAP_SHARED, h->fd, 0);
	if (p == MAP_FAILED)
		return kvti_fail(-errno, "%s: import: mmap of %llu bytes: %s",
				 d->name, (unsigned long long)h->bytes,
				 strerror(errno));
	if ((err = range_add(E(d), p, (size_t)h->bytes, R_IMPORT, 0, -1, &r))) {
		munmap(p, (size_t)h->bytes);
		return err;
	}
	*base = p;
	*priv = r;
	return 0;
}

static void emu_release(kvti_dev *d, void *base, void *priv)
{
	struct emu_range *r = range_take(E(d), base, R_IMPORT);

	(void)priv;
	if (!r)
		return;
	munmap(r->base, r->len);
	kvt_free(r);
}

static int emu_host_register(kvti_dev *d, void *p, size_t len, unsigned flags)
{
	struct emu *e = E(d);
	int busy;

	if (!p || !len)
		return kvti_fail(-EINVAL, "%s: registering an empty range", d->name);
	pthread_rwlock_rdlock(&e->rw);
	busy = 0;
	for (struct emu_range *r = e->ranges; r; r = r->next)
		if ((r->kind == R_HOST || r->kind == R_HOSTALLOC) &&
		    (char *)p < r->base + r->len && r->base < (char *)p + len)
			busy = 1;
	pthread_rwlock_unlock(&e->rw);
	if (busy) /* as cudaErrorHostMemoryAlreadyRegistered */
		return kvti_fail(-EEXIST, "%s: host memory at %p is already "
				 "registered", d->name, p);
	return range_add(e, p, len, R_HOST, flags, -1, NULL);
}

static void emu_host_unregister(kvti_dev *d, void *p)
{
	kvt_free(range_take(E(d), p, R_HOST));
}

/* Registered host memory is reached at its own address; refuse memory
 * that is not registered (the lane's check before it moves a tier). */
static int emu_host_devptr(kvti_dev *d, void *host, void **dev)
{
	struct emu *e = E(d);
	struct emu_range *r;

	pthread_rwlock_rdlock(&e->rw);
	r = range_of(e, host, 1);
	pthread_rwlock_unlock(&e->rw);
	if (!r || (r->kind != R_HOST && r->kind != R_HOSTALLOC))
		return kvti_fail(-EINVAL, "%s: host memory at %p is not "
				 "registered with the device", d->name, host);
	*dev = host;
	return 0;
}

static int emu_host_alloc(kvti_dev *d, size_t len, void **out)
{
	void *p = kvti_aligned_alloc(64, len ? len : 64);
	int err;

	if (!p)
		return -ENOMEM;
	if ((err = range_add(E(d), p, len ? len : 64, R_HOSTALLOC, 0, -1,
			     NULL))) {
		kvt_free(p);
		return err;
	}
	*out = p;
	return 0;
}

static void emu_host_free(kvti_dev *d, void *p)
{
	struct emu_range *r;

	if (!p)
		return;
	if ((r = range_take(E(d), p, R_HOSTALLOC))) {
		kvt_free(r);
		kvt_free(p);
	}
}

/* ---- events ---------------------------------------------------------------- */

static int emu_event_create(kvti_dev *d, unsigned flags, kvti_dev_event **out)
{
	kvti_dev_event *ev = kvt_calloc(1, sizeof(*ev));
	int err;

	if (!ev)
		return -ENOMEM;
	ev->d = d;
	ev->fd = -1;
	atomic_init(&ev->refs, 1);
	if (flags & KVTI_DEV_EV_IPC) {
		ev->fd = memfd_create("kvtier-emu-event", MFD_CLOEXEC |
				      MFD_ALLOW_SEALING);
		if (ev->fd < 0 || ftruncate(ev->fd, EV_BYTES) ||
		    fcntl(ev->fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW)) {
			err = kvti_fail(-errno, "%s: IPC event: %s", d->name,
					strerror(errno));
			goto fail;
		}
		ev->sh = kvti_mmap(NULL, EV_BYTES, PROT_READ | PROT_WRITE,
				   MAP_SHARED, ev->fd, 0);
		if (ev->sh == MAP_FAILED) {
			ev->sh = NULL;
			err = kvti_fail(-errno, "%s: IPC event: mmap: %s",
					d->name, strerror(errno));
			goto fail;
		}
		ev->mapped = 1;
	} else if (!(ev->sh = kvt_calloc(1, sizeof(*ev->sh)))) {
		err = -ENOMEM;
		goto fail;
	}
	*out = ev;
	return 0;
fail:
	if (ev->fd >= 0)
		close(ev->fd);
	kvt_free(ev);
	return err;
}

static void event_put(kvti_dev_event *ev)
{
	if (atomic_fetch_sub(&ev->refs, 1) != 1)
		return;
	if (ev->mapped)
		munmap(ev->sh, EV_BYTES);
	else
		kvt_free(ev->sh);
	if (ev->fd >= 0)
		close(ev->fd);
	kvt_free(ev);
}

static void emu_event_destroy(kvti_dev_event *ev)
{
	if (ev)
		event_put(ev);
}

static int emu_event_export(kvti_dev_event *ev, kvti_dev_handle *h)
{
	if (ev->fd < 0 || ev->imported)
		return kvti_fail(-EINVAL, "%s: only an IPC event this process "
				 "created can be exported", ev->d->name);
	memset(h, 0, sizeof(*h));
	h->kind = KVTI_DEV_H_EVENT_EMU;
	h->fd = ev->fd;
	h->bytes = EV_BYTES;
	return 0;
}

static int emu_event_import(kvti_dev *d, const kvti_dev_handle *h,
			    kvti_dev_event **out)
{
	kvti_dev_event *ev;
	struct stat st;

	if (h->kind != KVTI_DEV_H_EVENT_EMU || h->fd < 0)
		return kvti_fail(-EINVAL, "%s: not an emulated IPC event "
				 "(handle kind %d)", d->name, h->kind);
	if (fstat(h->fd, &st) || !S_ISREG(st.st_mode) ||
	    st.st_size < (off_t)EV_BYTES || fcntl(h->fd, F_GET_SEALS) < 0 ||
	    !(fcntl(h->fd, F_GET_SEALS) & F_SEAL_SHRINK))
		return kvti_fail(-EINVAL, "%s: an IPC event must be a sealed "
				 "memfd of %u bytes", d->name, EV_BYTES);
	if (!(ev = kvt_calloc(1, sizeof(*ev))))
		return -ENOMEM;
	/* read only: this side waits, the owner records */
	ev->sh = kvti_mmap(NULL, EV_BYTES, PROT_READ, MAP_SHARED, h->fd, 0);
	if (ev->sh == MAP_FAILED) {
		int err = kvti_fail(-errno, "%s: IPC event: mmap: %s", d->name,
				    strerror(errno));
		kvt_free(ev);
		return err;
	}
	ev->d = d;
	ev->fd = -1;
	ev->imported = 1;
	ev->mapped = 1;
	atomic_init(&ev->refs, 1);
	*out = ev;
	return 0;
}

static int ev_result(kvti_dev_event *ev)
{
	int st = atomic_load(&ev->sh->status);
	char det[sizeof(ev->sh->detail)];

	if (!st)
		return 1;
	memcpy(det, ev->sh->detail, sizeof(det));
	det[sizeof(det) - 1] = 0;
	return kvti_fail(st, "%s", det[0] ? det : "device operation failed");
}

static int emu_event_query(kvti_dev_event *ev)
{
	uint64_t target = atomic_load(&ev->sh->recorded);

	return atomic_load(&ev->sh->completed) >= target ? ev_result(ev) : 0;
}

static int emu_event_sync(kvti_dev_event *ev, int64_t timeout_ns)
{
	uint64_t target = atomic_load(&ev->sh->recorded);
	uint64_t end = timeout_ns < 0 ? UINT64_MAX : kvt_now_ns() + timeout_ns;

	while (atomic_load(&ev->sh->completed) < target) {
		uint32_t f = atomic_load(&ev->sh->futex);

		if (atomic_load(&ev->sh->completed) >= target)
			break;
		if (kvt_now_ns() >= end)
			return kvti_fail(-ETIMEDOUT, "%s: event not complete "
					 "after %lld ns", ev->d->name,
					 (long long)timeout_ns);
		fwait(&ev->sh->futex, f, 10 * 1000 * 1000);
	}
	return ev_result(ev) == 1 ? 0 : atomic_load(&ev->sh->status);
}

/* ---- streams ------------------------------------------------------------- */

static void stream_fail(kvti_dev_stream *s, int err)
{
	if (s->err)
		return;
	s->err = err;
	snprintf(s->detail, sizeof(s->detail), "%s", kvt_errdetail());
}

static void delay(struct emu *e, uint64_t bytes)
{
	uint64_t per = atomic_load_explicit(&e->delay, memory_order_relaxed);
	struct timespec ts;
	uint64_t ns;

	if (!per || !bytes)
		return;
	ns = (uint64_t)((double)bytes * (double)per / (1024.0 * 1024.0));
	ts.tv_sec = (time_t)(ns / 1000000000u);
	ts.tv_nsec = (long)(ns % 1000000000u);
	nanosleep(&ts, NULL);
}

/* Take one damaged landing if any is left (DAMAGE above). */
static int damage_one(struct emu *e)
{
	uint64_t n = atomic_load_explicit(&e->damage, memory_order_relaxed);

	while (n && !atomic_compare_exchange_weak(&e->damage, &n, n - 1))
		;
	return n != 0;
}

static int do_copy(kvti_dev_stream *s, void *dst, const void *src, size_t n)
{
	int err;

	if ((err = access_ok(s->d, src, n, 0)) ||
	    (err = access_ok(s->d, dst, n, 1)))
		return err;
	memcpy(dst, src, n);
	if (n && damage_one(s->e))
		*(volatile unsigned char *)dst ^= 0x5a;
	return 0;
}

/* A synchronous copy: device memory on one side at least, the other may
 * be any host memory (pageable, as CUDA allows). */
static int emu_copy_sync(kvti_dev *d, void *dst, const void *src, size_t n)
{
	struct emu *e = E(d);
	struct emu_range *rs, *rd;
	int err = 0;

	pthread_rwlock_rdlock(&e->rw);
	rs = range_of(e, src, n);
	rd = range_of(e, dst, n);
	if ((!rs || rs->kind >= R_HOST) && (!rd || rd->kind >= R_HOST))
		err = kvti_fail(-EINVAL, "%s: a copy between two host buffers "
				"(%p -> %p) is not the device's", d->name, src,
				dst);
	else if (rd && (rd->flags & KVTI_DEV_HOST_READONLY))
		err = access_ok(d, dst, n, 1);
	if (!err)
		memcpy(dst, src, n);
	pthread_rwlock_unlock(&e->rw);
	if (!err) {
		kvti_dev_count(d, DST_CE_BYTES, n);
		kvti_dev_count(d, DST_CE_OPS, 1);
	}
	return err;
}

static int run_sum(kvti_dev_stream *s, const kvti_dev_sum *g)
{
	int err;

	if (g->nseg == 0 || g->nseg > s->d->sum_maxseg || !g->seg_len)
		return kvti_fail(-EINVAL, "%s: sum of %u segments of %llu bytes",
				 s->d->name, g->nseg,
				 (unsigned long long)g->seg_len);
	if ((err = access_ok(s->d, g->out, g->nitems * sizeof(uint64_t), 1)))
		return err;
	for (size_t i = 0; i < g->nitems; i++) {
		const uint8_t *const *segs =
			(const uint8_t *const *)(g->seg + i * g->nseg);
		kvt_xxh3_src src = { .seg = segs, .seg_len = g->seg_len,
				     .nseg = g->nseg };

		for (uint32_t k = 0; k < g->nseg; k++)
			if ((err = access_ok(s->d, segs[k], g->seg_len, 0)))
				return err;
		g->out[i] = kvt_xxh3_src_64(&src, 0, NULL);
	}
	kvti_dev_count(s->d, DST_SUM_BYTES, g->nitems * g->nseg * g->seg_len);
	kvti_dev_count(s->d, DST_SUM_ITEMS, g->nitems);
	return 0;
}

/* Wait (stream thread) until @ready; -ETIMEDOUT after the wait limit, or
 * when the stream is being destroyed. */
static int wait_event(kvti_dev_stream *s, struct emu_shev *sh, uint64_t target)
{
	uint64_t end = kvt_now_ns() + atomic_load(&s->e->wait_limit);

	while (atomic_load(&sh->completed) < target) {
		uint32_t f = atomic_load(&sh->futex);
		int stop;

		if (atomic_load(&sh->completed) >= target)
			break;
		pthread_mutex_lock(&s->mu);
		stop = s->stop;
		pthread_mutex_unlock(&s->mu);
		if (stop || kvt_now_ns() >= end)
			return kvti_fail(-ETIMEDOUT, "%s: stream wait for an "
					 "event: %s", s->d->name, stop ?
					 "the stream is being destroyed" :
					 "not complete within the wait limit");
		fwait(&sh->futex, f, 10 * 1000 * 1000);
	}
	return 0;
}

static int wait_value(kvti_dev_stream *s, const uint32_t *addr, uint32_t value)
{
	uint64_t end = kvt_now_ns() + atomic_load(&s->e->wait_limit);
	int err;

	pthread_rwlock_rdlock(&s->e->rw);
	err = access_ok(s->d, addr, sizeof(*addr), 0);
	pthread_rwlock_unlock(&s->e->rw);
	if (err)
		return err;
	for (;;) {
		uint32_t v = __atomic_load_n(addr, __ATOMIC_ACQUIRE);
		int stop;

		if ((int32_t)(v - value) >= 0)
			return 0;
		pthread_mutex_lock(&s->mu);
		stop = s->stop;
		pthread_mutex_unlock(&s->mu);
		if (stop || kvt_now_ns() >= end)
			return kvti_fail(-ETIMEDOUT, "%s: stream wait for the "
					 "value at %p to reach %u (it is %u): %s",
					 s->d->name, (const void *)addr, value, v,
					 stop ? "the stream is being destroyed" :
					 "not within the wait limit");
		/* the daemon wakes the word's futex; poll too, a writer
		 * need not */
		fwait(addr, v, 2 * 1000 * 1000);
	}
}

static void ev_complete(kvti_dev_stream *s, kvti_dev_event *ev, uint64_t seq)
{
	struct emu_shev *sh = ev->sh;
	uint64_t c = atomic_load(&sh->completed);

	snprintf(sh->detail, sizeof(sh->detail), "%s", s->err ? s->detail : "");
	atomic_store(&sh->status, s->err);
	s->err = 0;
	while (c < seq && !atomic_compare_exchange_weak(&sh->completed, &c, seq))
		;
	atomic_fetch_add(&sh->futex, 1);
	fwake(&sh->futex);
}

static void run_op(kvti_dev_stream *s, struct emu_op *op)
{
	struct emu *e = s->e;
	uint64_t bytes = 0;
	int err = 0;

	switch (op->type) {
	case OP_COPY:
		/* a copy takes its time, then its bytes land (a peer that
		 * does not wait for it reads the old bytes) */
		delay(e, op->u.copy.n);
		pthread_rwlock_rdlock(&e->rw);
		err = do_copy(s, op->u.copy.dst, op->u.copy.src, op->u.copy.n);
		pthread_rwlock_unlock(&e->rw);
		if (!err) {
			kvti_dev_count(s->d, DST_CE_BYTES, op->u.copy.n);
			kvti_dev_count(s->d, DST_CE_OPS, 1);
		}
		break;
	case OP_BATCH:
		for (size_t i = 0; i < op->u.batch.count; i++)
			bytes += op->u.batch.n[i];
		delay(e, bytes);
		pthread_rwlock_rdlock(&e->rw);
		for (size_t i = 0; i < op->u.batch.count && !err; i++)
			err = do_copy(s, op->u.batch.dst[i], op->u.batch.src[i],
				      op->u.batch.n[i]);
		pthread_rwlock_unlock(&e->rw);
		if (!err) {
			kvti_dev_count(s->d, DST_CE_BYTES, bytes);
			kvti_dev_count(s->d, DST_CE_OPS, op->u.batch.count);
		}
		break;
	case OP_GATHER: {
		const kvti_dev_gather *g = &op->u.gather;

		delay(e, g->n * g->bytes);
		pthread_rwlock_rdlock(&e->rw);
		for (size_t i = 0; i < g->n && !err; i++)
			err = do_copy(s, g->dst[i], g->src[i], g->bytes);
		pthread_rwlock_unlock(&e->rw);
		if (!err) {
			kvti_dev_count(s->d, DST_KERNEL_BYTES, g->n * g->bytes);
			kvti_dev_count(s->d, DST_KERNEL_OPS, 1);
		}
		break;
	}
	case OP_SUM:
		pthread_rwlock_rdlock(&e->rw);
		err = run_sum(s, &op->u.sum);
		pthread_rwlock_unlock(&e->rw);
		break;
	case OP_RECORD:
		ev_complete(s, op->u.ev.e, op->u.ev.seq);
		event_put(op->u.ev.e);
		break;
	case OP_WAIT_EVENT:
		err = wait_event(s, op->u.ev.e->sh, op->u.ev.seq);
		event_put(op->u.ev.e);
		break;
	case OP_WAIT_VALUE:
		err = wait_value(s, op->u.wv.addr, op->u.wv.value);
		break;
	case OP_FN:
		op->u.fn.fn(op->u.fn.arg);
		break;
	case OP_SYNC:
		pthread_mutex_lock(&s->mu);
		op->u.sync->err = s->err;
		snprintf(op->u.sync->detail, sizeof(op->u.sync->detail), "%s",
			 s->detail);
		s->err = 0;
		op->u.sync->done = 1;
		pthread_cond_broadcast(&s->cv);
		pthread_mutex_unlock(&s->mu);
		break;
	}
	if (err)
		stream_fail(s, err);
}

static void *stream_main(void *arg)
{
	kvti_dev_stream *s = arg;

	pthread_mutex_lock(&s->mu);
	for (;;) {
		struct emu_op *op = s->head;

		if (!op) {
			if (s->stop)
				break;
			pthread_cond_wait(&s->cv, &s->mu);
			continue;
		}
		s->head = op->next;
		if (!s->head)
			s->tail = NULL;
		pthread_mutex_unlock(&s->mu);
		run_op(s, op);
		kvt_free(op);
		pthread_mutex_lock(&s->mu);
	}
	pthread_mutex_unlock(&s->mu);
	return NULL;
}

static int push(kvti_dev_stream *s, const struct emu_op *o)
{
	struct emu_op *op = kvt_malloc(sizeof(*op));

	if (!op)
		return -ENOMEM;
	*op = *o;
	op->next = NULL;
	pthread_mutex_lock(&s->mu);
	if (s->tail)
		s->tail->next = op;
	else
		s->head = op;
	s->tail = op;
	pthread_cond_broadcast(&s->cv);
	pthread_mutex_unlock(&s->mu);
	return 0;
}

static int emu_stream_create(kvti_dev *d, int high_prio, kvti_dev_stream **out)
{
	kvti_dev_stream *s = kvt_calloc(1, sizeof(*s));
	int e;

	(void)high_prio; /* threads of equal priority: recorded only */
	if (!s)
		return -ENOMEM;
	s->d = d;
	s->e = E(d);
	pthread_mutex_init(&s->mu, NULL);
	pthread_cond_init(&s->cv, NULL);
	e = kvti_fault() ? EAGAIN : pthread_create(&s->th, NULL, stream_main, s);
	if (e) {
		pthread_cond_destroy(&s->cv);
		pthread_mutex_destroy(&s->mu);
		kvt_free(s);
		return kvti_fail(-e, "%s: stream thread: %s", d->name,
				 strerror(e));
	}
	*out = s;
	return 0;
}

static void emu_stream_destroy(kvti_dev_stream *s)
{
	if (!s)
		return;
	pthread_mutex_lock(&s->mu);
	s->stop = 1; /* the thread runs what is queued, then leaves */
	pthread_cond_broadcast(&s->cv);
	pthread_mutex_unlock(&s->mu);
	pthread_join(s->th, NULL);
	pthread_cond_destroy(&s->cv);
	pthread_mutex_destroy(&s->mu);
	kvt_free(s);
}

static int emu_stream_sync(kvti_dev_stream *s)
{
	struct emu_sync sy = { 0 };
	struct emu_op op = { .type = OP_SYNC, .u.sync = &sy };
	int err;

	if ((err = push(s, &op)))
		return err;
	pthread_mutex_lock(&s->mu);
	while (!sy.done)
		pthread_cond_wait(&s->cv, &s->mu);
	pthread_mutex_unlock(&s->mu);
	if (sy.err)
		return kvti_fail(sy.err, "%s", sy.detail);
	return 0;
}

static int emu_copy(kvti_dev_stream *s, void *dst, const void *src, size_t n)
{
	struct emu_op op = { .type = OP_COPY };

	op.u.copy.dst = dst;
	op.u.copy.src = src;
	op.u.copy.n = n;
	return push(s, &op);
}

static int emu_copy_batch(kvti_dev_stream *s, void *const *dst,
			  const void *const *src, const size_t *n, size_t count)
{
	struct emu_op op = { .type = OP_BATCH };

	op.u.batch.dst = dst;
	op.u.batch.src = src;
	op.u.batch.n = n;
	op.u.batch.count = count;
	return push(s, &op);
}

static int emu_gather(kvti_dev_stream *s, const kvti_dev_gather *g)
{
	struct emu_op op = { .type = OP_GATHER };

	op.u.gather = *g;
	return push(s, &op);
}

static int emu_sum(kvti_dev_stream *s, const kvti_dev_sum *g)
{
	struct emu_op op = { .type = OP_SUM };

	op.u.sum = *g;
	return push(s, &op);
}

static int emu_event_record(kvti_dev_event *ev, kvti_dev_stream *s)
{
	struct emu_op op = { .type = OP_RECORD };
	int err;

	if (ev->imported)
		return kvti_fail(-EINVAL, "%s: recording an imported event "
				 "(only its owner records it)", ev->d->name);
	atomic_fetch_add(&ev->refs, 1);
	op.u.ev.e = ev;
	op.u.ev.seq = atomic_fetch_add(&ev->sh->recorded, 1) + 1;
	if ((err = push(s, &op))) {
		/* nothing will complete this record: complete it failed */
		atomic_store(&ev->sh->status, err);
		atomic_store(&ev->sh->completed, op.u.ev.seq);
		event_put(ev);
	}
	return err;
}

static int emu_stream_wait_event(kvti_dev_stream *s, kvti_dev_event *ev)
{
	struct emu_op op = { .type = OP_WAIT_EVENT };
	int err;

	atomic_fetch_add(&ev->refs, 1);
	op.u.ev.e = ev;
	op.u.ev.seq = atomic_load(&ev->sh->recorded);
	if ((err = push(s, &op)))
		event_put(ev);
	return err;
}

static int emu_stream_wait_value(kvti_dev_stream *s, const uint32_t *addr,
				 uint32_t value)
{
	struct emu_op op = { .type = OP_WAIT_VALUE };

	op.u.wv.addr = addr;
	op.u.wv.value = value;
	return push(s, &op);
}

static int emu_host_fn(kvti_dev_stream *s, void (*fn)(void *), void *arg)
{
	struct emu_op op = { .type = OP_FN };

	op.u.fn.fn = fn;
	op.u.fn.arg = arg;
	return push(s, &op);
}

const struct kvti_dev_ops kvti_dev_emu_ops = {
	.name = "emu",
	.open = emu_open,
	.close = emu_close,
	.alloc = emu_alloc,
	.free = emu_free,
	.export_mem = emu_export_mem,
	.import = emu_import,
	.release = emu_release,
	.host_register = emu_host_register,
	.host_unregister = emu_host_unregister,
	.host_devptr = emu_host_devptr,
	.host_alloc = emu_host_alloc,
	.host_free = emu_host_free,
	.stream_create = emu_stream_create,
	.stream_destroy = emu_stream_destroy,
	.stream_sync = emu_stream_sync,
	.copy = emu_copy,
	.copy_sync = emu_copy_sync,
	.copy_batch = emu_copy_batch,
	.gather = emu_gather,
	.sum = emu_sum,
	.event_create = emu_event_create,
	.event_destroy = emu_event_destroy,
	.event_record = emu_event_record,
	.event_query = emu_event_query,
	.event_sync = emu_event_sync,
	.stream_wait_event = emu_stream_wait_event,
	.event_export = emu_event_export,
	.event_import = emu_event_import,
	.stream_wait_value = emu_stream_wait_value,
	.host_fn = emu_host_fn,
};
