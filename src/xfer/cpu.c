/*
 * cpu.c — the cpu lane: worker threads that move pages between host tiers
 * (dram, fabric, hostdev) by memcpy and streaming stores.
 *
 * A job is cut into tasks of about task_bytes. Two orders:
 *
 *   ORDER_LAYER (to or from layer-first memory; no page sums)
 *     task = (layer l, pages [a, b)); tasks run layer by layer, so layer l
 *     of every page lands before layer l+1 starts, and layer_left[l]
 *     reaching 0 reports layer l ready. With per-layer sums (LSUM,
 *     LVERIFY) each page's layer is copied and hashed in one pass, from
 *     the registers the streaming stores write (layer_sums_task()). Stores use it too: several pages'
 *     chunks of one layer at a time beat several chunks of one page
 *     (about 0.8 vs 0.5 of memcpy for 1-token pages on the dev machine).
 *
 *         page-first src            layer-first dst (vLLM, layer l)
 *         p0 [L0K L0V L1K ..]  --.   K: [s(p0)] [s(p1)] ...
 *         p1 [L0K L0V L1K ..]  --+-> V: [s(p0)] [s(p1)] ...
 *         within a task: all K chunks of [a, b), then all V chunks
 *
 *   ORDER_PAGE (page-first on both sides, or checksums) task = pages
 *     [a, b), all layers: page by page when both sides are page-first
 *     (consecutive slots merge into one copy), layer by layer within the
 *     range when checksums are taken (below). Layers are reported ready
 *     only when the whole job is done.
 *
 * Contiguous runs merge: a chunk whose source and destination both follow
 * the previous one on from where it ended extends it (consecutive slots of
 * page-first ⇄ page-first copies become one memcpy; so do consecutive
 * slots of one layer between two layer-first tiers). Runs under 128 KiB
 * are copied four at a time, interleaved, with the next four prefetched
 * (copy.c: scattered small chunks are latency-bound, not bandwidth-bound).
 * With checksums (ORDER_PAGE), each task first hashes its source pages
 * where they are page-first, then copies its pages layer by layer, then
 * hashes the destination pages where only they are page-first: the hash
 * always covers a page in page-first byte order.
 *
 * Locking: a worker claims a task under x->mu (xfer_impl.h), runs it with
 * no lock, then counts it down through atomics.
 */
#include "xfer/xfer_impl.h"

#include "xfer/xxh.h"
#include "geom/rows.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#define NT_MIN_RUN (16u << 10)
#define NT_MIN_JOB (4u << 20)

int kvti_cpu_plan(struct kvt_xfer *x, struct kvt_xfer_job *j)
{
	size_t n = j->d.npages;
	const kvt_layout *l = j->sl;
	uint64_t unit;

	if (x->cfg.nt == KVT_XFER_NT_ON)
		j->nt_min = 0;
	else if (x->cfg.nt == KVT_XFER_NT_OFF || j->bytes < NT_MIN_JOB)
		j->nt_min = SIZE_MAX;
	else
		j->nt_min = NT_MIN_RUN;
	j->nt_small = j->nt_min != SIZE_MAX;
	if (!n) { /* one empty task: the job completes on a worker */
		j->order = ORDER_PAGE;
		j->ppt = 1;
		j->ntasks = 1;
		atomic_init(&j->units_left, 1);
		return 0;
	}
	if ((j->dl->kind != KVT_LAYOUT_PAGE_FIRST ||
	     j->sl->kind != KVT_LAYOUT_PAGE_FIRST) &&
	    !(j->d.flags & XFER_PAGE_SUMS))
		j->order = ORDER_LAYER;
	unit = j->order == ORDER_LAYER ? l->kv * l->chunk_bytes : l->page_bytes;
	j->ppt = (size_t)KVT_MAX(x->cfg.task_bytes / unit, 1);
	if (j->order == ORDER_LAYER) {
		j->tasks_per_layer = (n + j->ppt - 1) / j->ppt;
		j->ntasks = j->tasks_per_layer * j->layers;
		j->layer_left = kvt_calloc(j->layers, sizeof(*j->layer_left));
		if (!j->layer_left)
			return -ENOMEM;
		for (uint32_t i = 0; i < j->layers; i++)
			atomic_init(&j->layer_left[i], j->tasks_per_layer);
	} else {
		j->ntasks = (n + j->ppt - 1) / j->ppt;
	}
	atomic_init(&j->units_left, j->ntasks);
	return 0;
}

/* ---- runs and batches ---------------------------------------------- */

/*
 * Copies flow: chunk -> run (merged while both sides continue) -> emit:
 * a run under 128 KiB made of whole cache lines joins a batch of four
 * same-size copies done together by kvti_copy_multi(), two batches deep:
 * when the filling batch is full, the ready one is copied while the
 * filling one's sources are prefetched. Anything else is copied on its
 * own, with streaming stores from nt_min bytes. Deferring a copy is safe:
 * a job's sources and destinations never overlap (kvt_xfer_submit).
 */
#define MULTI_BELOW (128u << 10)
#define MULTI_WIDTH 4 /* measured best for 2-64 KiB chunks (8 is as good
			 for 2 KiB, worse above; see docs/PERFORMANCE.md) */

struct batch {
	char *d[KVTI_MULTI_MAX];
	const char *s[KVTI_MULTI_MAX];
	int n;
};

struct run {
	char *d;
	const char *s;
	size_t n;
	xfer_copy_fn nt;
	size_t nt_min;
	int nt_small;
	struct batch b[2];   /* [0] ready, [1] filling */
	size_t bn;           /* size of every batched copy */
};

static void copy_one(struct run *r, char *d, const char *s, size_t n)
{
	if (n >= r->nt_min)
		r->nt(d, s, n);
	else
		memcpy(d, s, n);
}

/* Copy the ready batch, prefetching the filling one. */
static void batch_copy_ready(struct run *r)
{
	struct batch *a = &r->b[0], *f = &r->b[1];

	if (a->n == 1 && !f->n)
		copy_one(r, a->d[0], a->s[0], r->bn);
	else if (a->n)
		kvti_copy_multi(a->d, a->s, a->n, r->bn, r->nt_small,
				f->s, f->n);
	a->n = 0;
}

static void batch_drain(struct run *r)
{
	batch_copy_ready(r);
	r->b[0] = r->b[1];
	r->b[1].n = 0;
	batch_copy_ready(r);
}

static void emit(struct run *r, char *d, const char *s, size_t n)
{
	struct batch *f = &r->b[1];

	if (n < MULTI_BELOW && n % 64 == 0 &&
	    (!r->nt_small || ((uintptr_t)d & 31) == 0)) {
		if ((r->b[0].n || f->n) && r->bn != n)
			batch_drain(r);
		r->bn = n;
		f->d[f->n] = d;
		f->s[f->n] = s;
		if (++f->n == MULTI_WIDTH) {
			batch_copy_ready(r);
			r->b[0] = *f;
			f->n = 0;
		}
		return;
	}
	batch_drain(r);
	copy_one(r, d, s, n);
}

static void run_flush(struct run *r)
{
	if (r->n)
		emit(r, r->d, r->s, r->n);
	r->n = 0;
}

/* End of a task: everything copied. */
static void run_done(struct run *r)
{
	run_flush(r);
	batch_drain(r);
}

static inline void run_add(struct run *r, char *d, const char *s, size_t n)
{
	if (r->n && r->d + r->n == d && r->s + r->n == s) {
		r->n += n;
		return;
	}
	run_flush(r);
	r->d = d;
	r->s = s;
	r->n = n;
}

static inline char *chunk_at(const kvt_layout *l, void *const *bufs,
			     uint32_t slot, uint32_t layer, uint32_t kv)
{
	kvt_chunk_loc c = kvt_layout_chunk(l, slot, layer, kv);
	return (char *)bufs[c.buf] + c.off;
}

/* One chunk into the run: whole when both sides keep it in one piece,
 * else row by row in [P][H][D] order (runs still merge where both sides
 * continue). */
static inline void chunk_add(struct run *r, const kvt_layout *dl, char *d,
			     const kvt_layout *sl, const char *s)
{
	uint64_t row = (uint64_t)sl->geom.head_dim * sl->geom.dtype_bytes;
	uint32_t n = sl->geom.page_tokens * sl->geom.kv_heads;

	if (kvti_chunk_packed(dl, sl)) {
		run_add(r, d, s, sl->chunk_bytes);
		return;
	}
	for (uint32_t i = 0; i < n; i++)
		run_add(r, d + kvt_layout_row_off(dl, i),
			s + kvt_layout_row_off(sl, i), row);
}

/* ---- tasks ---------------------------------------------------------- */

/*
 * Layer @layer of pages [a, b) with per-layer sums of what landed.
 *
 * By default each page's layer is copied with streaming stores and hashed
 * in the same pass from the registers the stores write (kvti_copy_xxh3()):
 * the hash is of exactly the bytes that landed, and nothing is read twice
 * — no read for ownership of the destination (plain stores), no read back
 * of it from memory (after streaming stores), no second read of the
 * source. What this does not see is a byte that changes in memory after it
 * was written (ECC's job) or a store to the wrong place (the layout tests
 * compare every path with the byte-at-a-time reference).
 *
 * The variants measured against it stay selectable, for benchmarks and
 * tests only (KVT_XFER_VERIFY_VARIANT; docs/PERFORMANCE.md, "Copy and
 * verify"): 1 one chunk at a time, memcpy then a hash of what landed while
 * in cache (the code before); 2 batches of MULTI_WIDTH chunks with plain
 * stores, each batch's pages hashed after it, from L2; 3 the same with
 * streaming stores and the destination read back. Pages the fused copy
 * cannot take (no AVX2, chunks not whole 64-byte stripes, 240 bytes or
 * less, unaligned destinations) go one chunk at a time.
 */
static int verify_variant = -1;

static int lsum_variant(void)
{
	int v = __atomic_load_n(&verify_variant, __ATOMIC_RELAXED);

	if (v < 0) {
		const char *e = getenv("KVT_XFER_VERIFY_VARIANT");

		v = e && *e >= '0' && *e <= '3' ? *e - '0' : 0;
		__atomic_store_n(&verify_variant, v, __ATOMIC_RELAXED);
	}
	return v;
}

/* One chunk at a time: memcpy, then hash it where it landed. */
static void layer_sums_each(struct kvt_xfer_job *j, uint32_t layer, size_t a,
			    size_t b)
{
	const kvt_layout *sl = j->sl, *dl = j->dl;
	XXH3_state_t h;

	for (size_t p = a; p < b && !kvti_job_stopped(j); p++) {
		uint32_t ds = job_dst_slot(j, p), ss = job_src_slot(j, p);

		XXH3_64bits_reset(&h);
		for (uint32_t k = 0; k < sl->kv; k++) {
			char *d = chunk_at(dl, j->dbufs, ds, layer, k);

			kvti_chunk_copy(dl, d, sl,
					chunk_at(sl, j->sbufs, ss, layer, k));
			/* hashed where it landed while still in L1/L2 */
			kvti_chunk_hash(&h, dl, d);
		}
		kvti_job_lsum(j, p, layer, XXH3_64bits_digest(&h));
	}
}

/* The chunks of pages [p, p + np) into @d / @s; returns how many. */
static int batch_fill(struct kvt_xfer_job *j, uint32_t layer, size_t p,
		      size_t np, char **d, const char **s)
{
	const kvt_layout *sl = j->sl, *dl = j->dl;
	int n = 0;

	for (size_t i = p; i < p + np; i++)
		for (uint32_t k = 0; k < sl->kv; k++) {
			if (d)
				d[n] = chunk_at(dl, j->dbufs,
						job_dst_slot(j, i), layer, k);
			s[n++] = chunk_at(sl, j->sbufs, job_src_slot(j, i),
					  layer, k);
		}
	return n;
}

/* Variants 2 and 3: batches of MULTI_WIDTH chunks (plain stores; @want_nt:
 * streaming stores, the destination read back from memory), each batch's
 * pages hashed after it. */
static void layer_sums_batched(struct kvt_xfer_job *j, uint32_t layer,
			       size_t a, size_t b, int want_nt)
{
	const kvt_layout *sl = j->sl, *dl = j->dl;
	size_t ppb = KVT_MAX(MULTI_WIDTH / sl->kv, 1);
	char *d[KVTI_MULTI_MAX];
	const char *s[KVTI_MULTI_MAX], *pf[KVTI_MULTI_MAX];
	XXH3_state_t h;

	for (size_t p = a; p < b && !kvti_job_stopped(j); p += ppb) {
		size_t np = KVT_MIN(ppb, b - p), nn = 0;
		int n = batch_fill(j, layer, p, np, d, s), npf = 0, nt = want_nt;

		if (p + np < b) {
			nn = KVT_MIN(ppb, b - p - np);
			npf = batch_fill(j, layer, p + np, nn, NULL, pf);
		}
		for (int i = 0; nt && i < n; i++)
			nt = ((uintptr_t)d[i] & 31) == 0;
		kvti_copy_multi(d, s, n, sl->chunk_bytes, nt, pf, npf);
		if (nt)
			kvti_copy_fence();
		for (size_t i = 0; i < np; i++) {
			XXH3_64bits_reset(&h);
			for (uint32_t k = 0; k < sl->kv; k++)
				XXH3_64bits_update(&h, chunk_at(dl, j->dbufs,
						   job_dst_slot(j, p + i),
						   layer, k), sl->chunk_bytes);
			kvti_job_lsum(j, p + i, layer, XXH3_64bits_digest(&h));
		}
	}
}

/* The default: each page's layer copied with streaming stores and hashed
 * from the registers the stores write (kvti_copy_xxh3()); a page it
 * cannot take goes one chunk at a time. */
static void layer_sums_fused(struct kvt_xfer_job *j, uint32_t layer, size_t a,
			     size_t b)
{
	const kvt_layout *sl = j->sl;
	char *d[2];
	const char *s[2];
	uint64_t h;

	for (size_t p = a; p < b && !kvti_job_stopped(j); p++) {
		batch_fill(j, layer, p, 1, d, s);
		if (kvti_copy_xxh3(d, s, (int)sl->kv, sl->chunk_bytes, &h))
			layer_sums_each(j, layer, p, p + 1);
		else
			kvti_job_lsum(j, p, layer, h);
	}
	kvti_copy_fence();
}

static void layer_sums_task(struct kvt_xfer_job *j, uint32_t layer, size_t a,
			    size_t b)
{
	const kvt_layout *sl = j->sl;
	int v = lsum_variant();

	/* the fused and batched copies take whole chunks: strided rows
	 * (kvt_layout_init_rows()) go one chunk at a time, row by row */
	if (!kvti_chunk_packed(j->dl, sl))
		layer_sums_each(j, layer, a, b);
	else if (v == 0 && sl->kv <= 2)
		layer_sums_fused(j, layer, a, b);
	else if (v == 1 || sl->chunk_bytes % 64) /* batches: whole lines */
		layer_sums_each(j, layer, a, b);
	else
		layer_sums_batched(j, layer, a, b, v == 3);
	atomic_fetch_add(&j->bytes_done, (b - a) * sl->kv * sl->chunk_bytes);
}

static void layer_task(struct kvt_xfer *x, struct kvt_xfer_job *j,
		       uint32_t layer, size_t a, size_t b)
{
	const kvt_layout *sl = j->sl, *dl = j->dl;
	struct run r = { .nt = x->copy_nt, .nt_min = j->nt_min,
			 .nt_small = j->nt_small };

	if (j->d.flags & XFER_LAYER_SUMS) {
		layer_sums_task(j, layer, a, b);
		return;
	}

	for (uint32_t k = 0; k < sl->kv; k++)
		for (size_t p = a; p < b; p++)
			chunk_add(&r, dl, chunk_at(dl, j->dbufs,
						   job_dst_slot(j, p), layer, k),
				  sl, chunk_at(sl, j->sbufs, job_src_slot(j, p),
					       layer, k));
	run_done(&r);
	atomic_fetch_add(&j->bytes_done, (b - a) * sl->kv * sl->chunk_bytes);
}

/* XXH3 of page @p as it now stands on the job's page-first side, the
 * source's if both are (or, for two layer-first tiers, of the
 * destination's chunks in order). */
static uint64_t page_hash(struct kvt_xfer_job *j, size_t p)
{
	if (j->sl->kind == KVT_LAYOUT_PAGE_FIRST)
		return XXH3_64bits(chunk_at(j->sl, j->sbufs, job_src_slot(j, p),
					    0, 0), j->sl->page_bytes);
	if (j->dl->kind == KVT_LAYOUT_PAGE_FIRST)
		return XXH3_64bits(chunk_at(j->dl, j->dbufs, job_dst_slot(j, p),
					    0, 0), j->dl->page_bytes);
	return kvti_page_sum(j->dl, j->dbufs, job_dst_slot(j, p));
}

/* Checksummed pages, a task's range at a time: hash the source pages
 * first when they are page-first (a sequential read that leaves them in
 * cache for the copy), copy the range layer by layer like an unchecked
 * job (batched, streaming stores), then, when only the destination is
 * page-first (or neither side is), hash what landed there. Measured
 * against hashing and copying 64 KiB pieces in page order, this costs the
 * same for loads and less for stores, at every page size. */
static void sums_task(struct kvt_xfer *x, struct kvt_xfer_job *j, size_t a,
		      size_t b)
{
	const kvt_layout *sl = j->sl, *dl = j->dl;
	int src_pf = sl->kind == KVT_LAYOUT_PAGE_FIRST;
	struct run r = { .nt = x->copy_nt, .nt_min = j->nt_min,
			 .nt_small = j->nt_small };

	for (size_t p = a; src_pf && p < b; p++)
		kvti_job_sum(j, p, page_hash(j, p));
	if (kvti_job_stopped(j))
		return;
	for (uint32_t layer = 0; layer < sl->geom.layers; layer++)
		for (uint32_t k = 0; k < sl->kv; k++)
			for (size_t p = a; p < b; p++)
				chunk_add(&r, dl,
					  chunk_at(dl, j->dbufs,
						   job_dst_slot(j, p), layer, k),
					  sl,
					  chunk_at(sl, j->sbufs,
						   job_src_slot(j, p), layer, k));
	run_done(&r);
	for (size_t p = a; !src_pf && p < b; p++)
		kvti_job_sum(j, p, page_hash(j, p));
	atomic_fetch_add(&j->bytes_done, (b - a) * sl->page_bytes);
}

/* Whole pages in page order (page-first on both sides): consecutive slots
 * merge into one copy. */
static void page_task(struct kvt_xfer *x, struct kvt_xfer_job *j, size_t a,
		      size_t b)
{
	const kvt_layout *sl = j->sl, *dl = j->dl;
	struct run r = { .nt = x->copy_nt, .nt_min = j->nt_min,
			 .nt_small = j->nt_small };

	if (j->d.flags & XFER_PAGE_SUMS) {
		sums_task(x, j, a, b);
		return;
	}
	for (size_t p = a; p < b && !kvti_job_stopped(j); p++) {
		uint32_t ss = job_src_slot(j, p), ds = job_dst_slot(j, p);

		for (uint32_t layer = 0; layer < sl->geom.layers; layer++)
			for (uint32_t k = 0; k < sl->kv; k++)
				chunk_add(&r, dl,
					  chunk_at(dl, j->dbufs, ds, layer, k),
					  sl,
					  chunk_at(sl, j->sbufs, ss, layer, k));
		atomic_fetch_add(&j->bytes_done, sl->page_bytes);
	}
	run_done(&r);
	if (!(j->d.flags & XFER_LAYER_SUMS))
		return;
	/* per-layer sums of what landed (both sides are page-first here) */
	kvti_copy_fence();
	for (size_t p = a; p < b && !kvti_job_stopped(j); p++)
		kvti_job_sum_pf(j, p, chunk_at(dl, j->dbufs, job_dst_slot(j, p),
					       0, 0));
}

static void run_task(struct kvt_xfer *x, struct kvt_xfer_job *j, size_t t)
{
	uint32_t layer = 0;
	size_t a, b;

	if (t == 0)
		kvti_job_started(j);
	if (j->order == ORDER_LAYER) {
		layer = (uint32_t)(t / j->tasks_per_layer);
		a = t % j->tasks_per_layer * j->ppt;
	} else {
		a = t * j->ppt;
	}
	b = KVT_MIN(a + j->ppt, j->d.npages);
	if (!kvti_job_stopped(j)) {
		if (j->order == ORDER_LAYER)
			layer_task(x, j, layer, a, b);
		else
			page_task(x, j, a, b);
		kvti_copy_fence();
	}
	if (j->order == ORDER_LAYER &&
	    atomic_fetch_sub(&j->layer_left[layer], 1) == 1)
		kvti_job_layer_landed(j, layer);
	kvti_job_units_done(j, 1);
}

void *kvti_cpu_worker(void *arg)
{
	struct kvt_xfer *x = arg;

	kvti_thread_nice(x->nice);
	pthread_mutex_lock(&x->mu);
	for (;;) {
		struct kvt_xfer_job *j = x->paused ? NULL :
				       kvti_queue_head(x, LANE_CPU);
		size_t t;

		if (!j) {
			if (x->stopping)
				break;
			pthread_cond_wait(&x->cpu_cv, &x->mu);
			continue;
		}
		t = j->next_task++;
		if (j->next_task >= j->ntasks)
			kvti_queue_remove(x, j);
		pthread_mutex_unlock(&x->mu);
		run_task(x, j, t);
		pthread_mutex_lock(&x->mu);
	}
	pthread_mutex_unlock(&x->mu);
	return NULL;
}

/* ---- whole pages, for the io lane's bounce buffers ------------------ */

void kvti_page_convert(const kvt_layout *l, void *const *bufs, uint32_t slot,
		       void *pf, int to_pf, void *h)
{
	char *p = pf;

	for (uint32_t layer = 0; layer < l->geom.layers; layer++)
		for (uint32_t k = 0; k < l->kv; k++, p += l->chunk_bytes) {
			char *c = chunk_at(l, bufs, slot, layer, k);

			kvti_chunk_pack(l, c, p, to_pf);
			if (h)
				XXH3_64bits_update(h, p, l->chunk_bytes);
		}
}

uint64_t kvti_page_sum(const kvt_layout *l, void *const *bufs, uint32_t slot)
{
	XXH3_state_t h;

	XXH3_64bits_reset(&h);
	for (uint32_t layer = 0; layer < l->geom.layers; layer++)
		for (uint32_t k = 0; k < l->kv; k++)
			kvti_chunk_hash(&h, l, chunk_at(l, bufs, slot, layer, k));
	return XXH3_64bits_digest(&h);
}
