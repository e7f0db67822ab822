/*
 * emu.c — the emulated device (dev.h): the whole GPU flow without a GPU.
 * This file: the device, its memory and the access check; events are in
 * emu_event.c, streams in emu_stream.c (emu_impl.h shares their structs).
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
#include "dev/emu_impl.h"

/* ---- ranges ------------------------------------------------------------------ */

/* rw held (read or write). */
struct emu_range *kvti_emu_range_of(struct emu *e, const void *p, size_t n)
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
int kvti_emu_access_ok(kvti_dev *d, const void *p, size_t n, int write)
{
	struct emu_range *r = kvti_emu_range_of(E(d), p, n);

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
	r = kvti_emu_range_of(e, p, 1);
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
	r = kvti_emu_range_of(e, host, 1);
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
	.stream_create = kvti_emu_stream_create,
	.stream_destroy = kvti_emu_stream_destroy,
	.stream_sync = kvti_emu_stream_sync,
	.copy = kvti_emu_copy,
	.copy_sync = kvti_emu_copy_sync,
	.copy_batch = kvti_emu_copy_batch,
	.gather = kvti_emu_gather,
	.sum = kvti_emu_sum,
	.event_create = kvti_emu_event_create,
	.event_destroy = kvti_emu_event_destroy,
	.event_record = kvti_emu_event_record,
	.event_query = kvti_emu_event_query,
	.event_sync = kvti_emu_event_sync,
	.stream_wait_event = kvti_emu_stream_wait_event,
	.event_export = kvti_emu_event_export,
	.event_import = kvti_emu_event_import,
	.stream_wait_value = kvti_emu_stream_wait_value,
	.host_fn = kvti_emu_host_fn,
};
