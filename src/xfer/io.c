/*
 * io.c — the io lane: pages between the ssd tier and host memory, one
 * whole-slot O_DIRECT read or write per page, up to uring_depth in flight
 * on one io_uring; or pread/pwrite one at a time where io_uring does not
 * work (probed at kvt_xfer_create(), warned about, shown in
 * kvt_xfer_info.ssd_io_note — never silent).
 *
 *   queue (by priority) ──claim page──► req ──SQE──► kernel ──CQE──► done
 *                                        │ direct: the host slot itself
 *                                        └ bounce: an aligned buffer, for
 *                                          layer-first tiers, pages that are
 *                                          not whole 4 KiB multiples, or
 *                                          slots that are not aligned
 *
 * An ssd slot is the page rounded up to 4 KiB (src/tier/ssd.c). The I/O
 * always covers the whole slot; it goes straight into the host slot only
 * when the two have the same size and the host slot is 4 KiB aligned.
 * Bounce memory in flight is capped (bounce_bytes; one page may exceed it).
 *
 * Bounce buffers live in huge pages. An O_DIRECT read pins its buffer's
 * pages in the kernel (get_user_pages) before the bio goes out, on the io
 * thread; into 4 KiB pages that is 128 pins for a 512 KiB page, and it
 * halved the lane (perf: gup_fast_fallback 12 % of the run). Measured
 * 2026-12-07 on the 2-core VM, `kvtier bench cache --ssd --direct`
 * (32-page loads of llama-3.2-1b into layer-first host memory), three
 * runs each alternating: 1.21-1.32 GB/s into malloc'd buffers against
 * 2.47-2.92 into THP-backed ones. So the first bounced I/O carves one
 * 2 MiB-aligned MADV_HUGEPAGE region into a slice per request (the slot
 * rounded up to 4 KiB; as many as bounce_bytes holds, at least one). A
 * request without a slice, or whose I/O is longer than its slice, gets
 * its own aligned buffer as before. Where the region cannot be had or the
 * kernel refuses the advice, the lane says so once (kvti_warn).
 * (Tried, not kept: refilling the ring before draining what a reap took
 * off it — no difference measured, four runs each, 2.10-2.40 against
 * 2.10-2.65 GB/s.)
 *
 * A completion that failed (res < 0) or moved fewer bytes than asked
 * (short) fails the job with the page, slot, file offset and reason; the
 * rest of the job is skipped. A job is reported done only after every one
 * of its writes came back whole (and, with KVT_XFER_DURABLE, after an
 * fdatasync of every file of the tier). Checksums: taken on the page-first
 * bytes — before a write, after a read.
 *
 * Locking: one io thread owns the ring and the requests; x->mu guards the
 * queue, the free request list and the in-flight counts.
 */
#include "xfer/xfer_impl.h"

#include "xfer/xxh.h"

#include <errno.h>
#include <liburing.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#define IO_ALIGN 4096u

struct io_req {
	struct kvt_xfer_job *j;
	size_t page;
	int fd;
	uint64_t off, len;
	void *buf;         /* the I/O's memory: host slot or bounce */
	void *bounce;      /* cached bounce buffer of bounce_len, or NULL */
	uint64_t bounce_len;
	int in_arena;      /* bounce is this request's slice of io->arena */
	int bounced;       /* this I/O uses the bounce buffer */
	struct io_req *next;
};

struct xfer_io {
	pthread_t th;
	pthread_cond_t cv;
	int uring;
	struct io_uring ring;
	unsigned depth;
	struct io_req *reqs, *free;
	unsigned inflight;          /* x->mu */
	uint64_t bounce_used;       /* x->mu: bounce bytes in flight */
	uint64_t bounce_cached;     /* io thread: private bounce bytes */
	char *arena;                /* io thread: huge-page bounce slices */
	uint64_t stride;            /* each slice's bytes (0: not tried yet) */
	int stop;                   /* x->mu */
	int warned;
};

int kvti_io_probe(struct kvt_xfer *x)
{
	struct io_uring ring;
	int e;

	if (x->cfg.ssd_io == KVT_XFER_PREAD) {
		x->ssd_io = KVT_XFER_PREAD;
		snprintf(x->ssd_note, sizeof(x->ssd_note),
			 "pread/pwrite (configured)");
		return 0;
	}
	e = io_uring_queue_init(4, &ring, 0);
	if (e == 0) {
		io_uring_queue_exit(&ring);
		x->ssd_io = KVT_XFER_URING;
		x->ssd_note[0] = '\0';
		return 0;
	}
	snprintf(x->ssd_note, sizeof(x->ssd_note), "io_uring unavailable "
		 "(io_uring_queue_init: %s): pread/pwrite fallback", strerror(-e));
	if (x->cfg.ssd_io == KVT_XFER_URING)
		return kvti_fail(KVT_ENODEV, "transfer engine: %s", x->ssd_note);
	x->ssd_io = KVT_XFER_PREAD;
	kvti_warn("ssd transfers: %s", x->ssd_note);
	return 0;
}

void kvti_xfer_io_fault(kvt_xfer *x, uint64_t nth, int err)
{
	atomic_store(&x->io_fault_err, err);
	atomic_store(&x->io_fault_at, nth ? atomic_load(&x->io_count) + nth : 0);
}

void kvti_xfer_io_fail_writes(kvt_xfer *x, int err)
{
	atomic_store(&x->io_fail_writes, err);
}

/* ---- planning (submit) ---------------------------------------------- */

static kvt_tier *ssd_side(struct kvt_xfer_job *j)
{
	return j->io_write ? j->d.dst : j->d.src;
}

static kvt_tier *mem_side(struct kvt_xfer_job *j)
{
	return j->io_write ? j->d.src : j->d.dst;
}

int kvti_io_plan(struct kvt_xfer *x, struct kvt_xfer_job *j)
{
	kvt_tier_desc sd;
	const kvt_layout *ml;
	void *const *mb;

	j->io_write = kvt_tier_kind_of(j->d.dst) == KVT_TIER_SSD;
	kvt_tier_info(ssd_side(j), &sd);
	ml = kvt_tier_layout(mem_side(j));
	mb = kvt_tier_bufs(mem_side(j));
	j->io_direct = ml->kind == KVT_LAYOUT_PAGE_FIRST &&
		       ml->page_bytes == sd.slot_bytes &&
		       ml->page_bytes % IO_ALIGN == 0 &&
		       (uintptr_t)mb[0] % IO_ALIGN == 0;
	atomic_init(&j->units_left, j->d.npages + 1); /* + the final step */
	return 0;
}

/* ---- requests -------------------------------------------------------- */

static uint64_t job_len(struct kvt_xfer_job *j)
{
	kvt_tier_desc sd;

	kvt_tier_info(ssd_side(j), &sd);
	return sd.slot_bytes;
}

/* The host side's page in page-first order <-> the bounce buffer. */
static void bounce_fill(struct kvt_xfer_job *j, struct io_req *r)
{
	kvt_tier *m = mem_side(j);
	const kvt_layout *l = kvt_tier_layout(m);
	uint32_t slot = job_src_slot(j, r->page);

	if (l->kind == KVT_LAYOUT_PAGE_FIRST)
		memcpy(r->buf, kvt_tier_slot_ptr(m, slot), l->page_bytes);
	else
		kvti_page_convert(l, kvt_tier_bufs(m), slot, r->buf, 1, NULL);
	memset((char *)r->buf + l->page_bytes, 0, r->len - l->page_bytes);
}

static void bounce_drain(struct kvt_xfer_job *j, struct io_req *r)
{
	kvt_tier *m = mem_side(j);
	const kvt_layout *l = kvt_tier_layout(m);
	uint32_t slot = job_dst_slot(j, r->page);

	if (l->kind == KVT_LAYOUT_PAGE_FIRST)
		memcpy(kvt_tier_slot_ptr(m, slot), r->buf, l->page_bytes);
	else
		kvti_page_convert(l, kvt_tier_bufs(m), slot, r->buf, 0, NULL);
}

static int want_sums(struct kvt_xfer_job *j)
{
	return (j->d.flags & XFER_ANY_SUMS) != 0;
}

/* Give the request back and count the page (no lock held). */
static void req_release(struct kvt_xfer *x, struct io_req *r)
{
	struct kvt_xfer_job *j = r->j;
	struct xfer_io *io = x->io;

	if (r->bounced && !r->in_arena &&
	    io->bounce_cached > x->cfg.bounce_bytes) {
		io->bounce_cached -= r->bounce_len;
		kvt_free(r->bounce);
		r->bounce = NULL;
		r->bounce_len = 0;
	}
	pthread_mutex_lock(&x->mu);
	if (r->bounced)
		io->bounce_used -= r->len;
	io->inflight--;
	r->j = NULL;
	r->next = io->free;
	io->free = r;
	pthread_mutex_unlock(&x->mu);
	kvti_job_units_done(j, 1);
}

static void req_complete(struct kvt_xfer *x, struct io_req *r, int64_t res)
{
	struct kvt_xfer_job *j = r->j;
	uint64_t n = atomic_fetch_add(&x->io_count, 1) + 1;
	uint64_t at = atomic_load(&x->io_fault_at);
	const char *op = j->io_write ? "write" : "read";
	uint32_t slot = j->io_write ? job_dst_slot(j, r->page) :
				      job_src_slot(j, r->page);

	if (at && n == at)
		res = atomic_load(&x->io_fault_err) ?
			      atomic_load(&x->io_fault_err) : (int64_t)r->len / 2;
	if (j->io_write && atomic_load(&x->io_fail_writes))
		res = atomic_load(&x->io_fail_writes);
	if (res < 0) {
		kvti_job_fail(j, (int)res, "ssd %s of page %zu (slot %u, offset "
			      "%llu): %s", op, r->page, slot,
			      (unsigned long long)r->off, strerror((int)-res));
	} else if ((uint64_t)res < r->len) {
		kvti_job_fail(j, -EIO, "short ssd %s of page %zu (slot %u, "
			      "offset %llu): %lld of %llu bytes", op, r->page,
			      slot, (unsigned long long)r->off, (long long)res,
			      (unsigned long long)r->len);
	} else if (!j->io_write && !kvti_job_stopped(j)) {
		uint64_t pb = j->sl->page_bytes;
		if (want_sums(j))
			kvti_job_sum_pf(j, r->page, r->buf);
		if (r->bounced && !kvti_job_stopped(j))
			bounce_drain(j, r);
		atomic_fetch_add(&j->bytes_done, pb);
	} else if (j->io_write) {
		atomic_fetch_add(&j->bytes_done, j->sl->page_bytes);
	}
	req_release(x, r);
}

/* The huge-page region, carved at the first bounced I/O (of @len bytes):
 * a slice per request, as many as bounce_bytes holds (at least one). */
static void arena_open(struct kvt_xfer *x, uint64_t len)
{
	struct xfer_io *io = x->io;
	const uint64_t huge = 2u << 20;
	uint64_t stride = (len + IO_ALIGN - 1) / IO_ALIGN * IO_ALIGN, bytes;
	unsigned n = io->depth;

	if (stride * n > x->cfg.bounce_bytes)
		n = (unsigned)KVT_MAX(x->cfg.bounce_bytes / stride, 1);
	bytes = (stride * n + huge - 1) / huge * huge;
	io->stride = stride; /* tried once, whatever comes of it */
	io->arena = kvti_aligned_alloc(huge, bytes);
	if (!io->arena) {
		kvti_warn("ssd transfers: no memory for %llu bytes of huge-page "
			  "bounce buffers: each read gets its own buffer in "
			  "4 KiB pages (slower)", (unsigned long long)bytes);
		return;
	}
	if (madvise(io->arena, bytes, MADV_HUGEPAGE) < 0)
		kvti_warn("ssd transfers: MADV_HUGEPAGE refused for the bounce "
			  "buffers (%s): reads into 4 KiB pages, slower",
			  strerror(errno));
	/* This is the first bounced I/O: no request holds a private buffer
	 * yet, and one in flight now reads into its host slot. */
	for (unsigned i = 0; i < n; i++) {
		struct io_req *r = &io->reqs[i];

		r->bounce = io->arena + (uint64_t)i * stride;
		r->bounce_len = stride;
		r->in_arena = 1;
	}
}

/* Ready the request for page @p of @j. 0, or 1 when it needs no I/O
 * (the job stopped, or preparing it failed the job). */
static int req_prepare(struct kvt_xfer *x, struct io_req *r)
{
	struct kvt_xfer_job *j = r->j;
	struct xfer_io *io = x->io;
	uint32_t sslot = j->io_write ? job_dst_slot(j, r->page) :
				       job_src_slot(j, r->page);
	uint32_t mslot = j->io_write ? job_src_slot(j, r->page) :
				       job_dst_slot(j, r->page);

	if (kvti_job_stopped(j))
		return 1;
	kvt_tier_ssd_loc(ssd_side(j), sslot, &r->fd, &r->off);
	if (!r->bounced) {
		r->buf = kvt_tier_slot_ptr(mem_side(j), mslot);
	} else {
		if (!io->stride)
			arena_open(x, r->len);
		if (r->bounce_len < r->len) {
			if (!r->in_arena) {
				io->bounce_cached -= r->bounce_len;
				kvt_free(r->bounce);
			}
			r->in_arena = 0;
			r->bounce_len = 0;
			r->bounce = kvti_aligned_alloc(IO_ALIGN, r->len);
			if (!r->bounce) {
				kvti_job_fail(j, -ENOMEM, "ssd transfer: no "
					      "memory for a %llu-byte bounce "
					      "buffer", (unsigned long long)r->len);
				return 1;
			}
			r->bounce_len = r->len;
			io->bounce_cached += r->len;
		}
		r->buf = r->bounce;
		if (j->io_write)
			bounce_fill(j, r);
	}
	if (j->io_write && want_sums(j)) {
		kvti_job_sum_pf(j, r->page, r->buf);
		if (kvti_job_stopped(j))
			return 1; /* VERIFY failed: write nothing more */
	}
	return 0;
}

static ssize_t rw_all(struct io_req *r, int write)
{
	uint64_t done = 0;

	while (done < r->len) {
		ssize_t n = write ? pwrite(r->fd, (char *)r->buf + done,
					   r->len - done, (off_t)(r->off + done)) :
				    pread(r->fd, (char *)r->buf + done,
					  r->len - done, (off_t)(r->off + done));
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0)
			return -errno;
		if (n == 0)
			break;
		done += (uint64_t)n;
	}
	return (ssize_t)done;
}

static void req_issue(struct kvt_xfer *x, struct io_req *r)
{
	struct xfer_io *io = x->io;
	struct io_uring_sqe *sqe;

	if (req_prepare(x, r)) {
		req_release(x, r);
		return;
	}
	if (!io->uring) {
		req_complete(x, r, rw_all(r, r->j->io_write));
		return;
	}
	while (!(sqe = io_uring_get_sqe(&io->ring)))
		io_uring_submit(&io->ring);
	if (r->j->io_write)
		io_uring_prep_write(sqe, r->fd, r->buf, (unsigned)r->len, r->off);
	else
		io_uring_prep_read(sqe, r->fd, r->buf, (unsigned)r->len, r->off);
	io_uring_sqe_set_data(sqe, r);
}

/* Submit what is prepared, wait for one completion, handle them all. */
static void reap(struct kvt_xfer *x)
{
	struct xfer_io *io = x->io;
	struct io_uring_cqe *cqe;
	unsigned head, n = 0;
	int e = io_uring_submit_and_wait(&io->ring, 1);

	if (e < 0 && e != -EINTR && e != -EAGAIN && e != -EBUSY &&
	    e != -ETIME) {
		if (!io->warned++)
			kvti_warn("ssd transfers: io_uring_submit_and_wait: %s; "
				  "retrying", strerror(-e));
		usleep(1000);
	}
	io_uring_for_each_cqe(&io->ring, head, cqe) {
		struct io_req *r = io_uring_cqe_get_data(cqe);
		int64_t res = cqe->res;

		n++;
		io_uring_cq_advance(&io->ring, 1);
		req_complete(x, r, res);
	}
	(void)n;
}

static void *io_main(void *arg)
{
	struct kvt_xfer *x = arg;
	struct xfer_io *io = x->io;

	kvti_thread_nice(x->nice);
	pthread_mutex_lock(&x->mu);
	for (;;) {
		while (!x->paused && io->free) {
			struct kvt_xfer_job *j = kvti_queue_head(x, LANE_IO);
			struct io_req *r;
			uint64_t len;

			if (!j)
				break;
			len = job_len(j);
			if (!j->io_direct && io->inflight &&
			    io->bounce_used + len > x->cfg.bounce_bytes)
				break; /* wait for bounce memory */
			r = io->free;
			io->free = r->next;
			r->j = j;
			r->len = len;
			r->bounced = !j->io_direct;
			r->page = kvti_io_claim(x, j);
			if (r->bounced)
				io->bounce_used += len;
			io->inflight++;
			pthread_mutex_unlock(&x->mu);
			if (r->page == 0)
				kvti_job_started(j);
			req_issue(x, r);
			pthread_mutex_lock(&x->mu);
		}
		if (!io->inflight) {
			if (io->stop)
				break;
			pthread_cond_wait(&io->cv, &x->mu);
			continue;
		}
		pthread_mutex_unlock(&x->mu);
		if (io->uring)
			reap(x);
		pthread_mutex_lock(&x->mu);
	}
	pthread_mutex_unlock(&x->mu);
	return NULL;
}

void kvti_io_final(struct kvt_xfer_job *j)
{
	kvt_tier *t = j->d.dst;

	if (j->io_write && (j->d.flags & KVT_XFER_DURABLE) &&
	    !kvti_job_stopped(j)) {
		for (uint32_t f = 0; f < t->nfiles; f++)
			if (fdatasync(t->files[f].fd) < 0) {
				kvti_job_fail(j, -errno, "ssd: fdatasync of %s: "
					      "%s", t->files[f].path,
					      strerror(errno));
				break;
			}
	}
	kvti_job_units_done(j, 1);
}

/* ---- start / stop ----------------------------------------------------- */

static void io_free(struct xfer_io *io)
{
	if (io->reqs)
		for (unsigned i = 0; i < io->depth; i++)
			if (!io->reqs[i].in_arena)
				kvt_free(io->reqs[i].bounce);
	kvt_free(io->arena);
	kvt_free(io->reqs);
	kvt_free(io);
}

int kvti_io_start(struct kvt_xfer *x)
{
	struct xfer_io *io = kvt_calloc(1, sizeof(*io));
	int e;

	if (!io)
		return -ENOMEM;
	io->uring = x->ssd_io == KVT_XFER_URING;
	io->depth = io->uring ? x->cfg.uring_depth : 1;
	io->reqs = kvt_calloc(io->depth, sizeof(*io->reqs));
	if (!io->reqs) {
		io_free(io);
		return -ENOMEM;
	}
	for (unsigned i = io->depth; i-- > 0;) { /* reqs[0] first: the
						    arena's slices go first */
		io->reqs[i].next = io->free;
		io->free = &io->reqs[i];
	}
	if (io->uring) {
		e = kvti_fault() ? -ENOMEM :
				   io_uring_queue_init(io->depth, &io->ring, 0);
		if (e < 0) {
			unsigned depth = io->depth;
			io_free(io);
			return kvti_fail(e, "io_uring_queue_init(%u): %s", depth,
					 strerror(-e));
		}
	}
	pthread_cond_init(&io->cv, NULL);
	x->io = io;
	e = kvti_fault() ? EAGAIN : pthread_create(&io->th, NULL, io_main, x);
	if (e) {
		x->io = NULL;
		pthread_cond_destroy(&io->cv);
		if (io->uring)
			io_uring_queue_exit(&io->ring);
		io_free(io);
		return kvti_fail(-e, "transfer engine: starting the io thread: "
				 "%s", strerror(e));
	}
	return 0;
}

void kvti_io_kick(struct kvt_xfer *x)
{
	if (x->io)
		pthread_cond_signal(&x->io->cv);
}

void kvti_io_stop(struct kvt_xfer *x)
{
	struct xfer_io *io = x->io;

	if (!io)
		return;
	pthread_mutex_lock(&x->mu);
	io->stop = 1;
	pthread_cond_signal(&io->cv);
	pthread_mutex_unlock(&x->mu);
	pthread_join(io->th, NULL);
	pthread_cond_destroy(&io->cv);
	if (io->uring)
		io_uring_queue_exit(&io->ring);
	x->io = NULL;
	io_free(io);
}
