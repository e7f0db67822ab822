/*
 * test_xfer_api — the engine's contract apart from the bytes: every
 * submit-time error (and that a refused job leaves nothing behind), empty
 * jobs, done and layer callbacks (in order, each layer's bytes in place
 * when it is announced and the next ones not yet), wait_layer, priorities
 * (a load overtakes a queued backup), FIFO within a priority, pause,
 * cancel (queued, from a layer callback, at destroy), free before done,
 * eventfd counts, timeouts, status, the contiguous-copy limit.
 */
#include "xfer_util.h"

#include <poll.h>
#include <pthread.h>
#include <unistd.h>

static kvt_geom geom(uint32_t p)
{
	kvt_geom g;

	CHECK_OK(kvt_geom_preset(&g, "llama-3.1-8b", p, 8, 0)); /* 4 KiB/chunk @16 */
	return g;
}

static kvt_tier *mem_tier(const char *kind, uint64_t slots, const kvt_geom *g)
{
	char spec[96];

	snprintf(spec, sizeof(spec), "%s:%llu", kind,
		 (unsigned long long)(slots * kvt_geom_page_bytes(g)));
	return tier_open(spec, g);
}

static void test_config(void)
{
	kvt_xfer_config bad[] = {
		{ .cpu_threads = 1000 }, { .task_bytes = 100 }, { .nt = 7 },
		{ .ssd_io = KVT_XFER_CPU }, { .uring_depth = 5000 },
		{ .cuda_load = KVT_XFER_CPU }, { .cuda_store = 42 },
		{ .cuda_blocks = 100 },
	};
	kvt_xfer_info info;
	kvt_xfer *x;
	int m;

	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		CHECK_ERR(kvt_xfer_create(&x, &bad[i]), -EINVAL);
		CHECK(kvt_errdetail()[0] != '\0');
	}
	CHECK_OK(kvt_xfer_create(&x, NULL));
	kvt_xfer_info_get(x, &info);
	CHECK(info.cpu_threads >= 1 && info.cpu_threads <= 4);
	CHECK_EQ(info.task_bytes, 4u << 20);
	CHECK_EQ(info.uring_depth, 32);
	CHECK(info.ssd_io == KVT_XFER_URING || info.ssd_io == KVT_XFER_PREAD);
	CHECK(info.copy_isa && info.copy_isa[0]);
	CHECK_EQ(info.cuda_load, KVT_XFER_CUDA_KERNEL);
	CHECK_EQ(info.cuda_store, KVT_XFER_CUDA_BATCH);
	CHECK_EQ(info.cuda_blocks, 2);
	CHECK(info.cuda_note != NULL);
	kvt_xfer_destroy(x);
	kvt_xfer_destroy(NULL);

	for (m = 0; m < KVT_XFER_METHOD_COUNT; m++) {
		int back = -1;
		CHECK_OK(kvt_xfer_method_parse(kvt_xfer_method_name(m), &back));
		CHECK_EQ(back, m);
	}
	CHECK_ERR(kvt_xfer_method_parse("warp-drive", &m), -EINVAL);
	CHECK(strstr(kvt_errdetail(), "cuda-kernel") != NULL);
	CHECK(!strcmp(kvt_xfer_method_name(99), "?"));
}

static void test_submit_errors(void)
{
	kvt_geom g = geom(16), g2 = geom(32);
	kvt_tier *a = mem_tier("dram", 8, &g), *b = mem_tier("hostdev", 8, &g),
		 *c = mem_tier("dram", 8, &g2), *s1, *s2;
	char spec[300];
	uint32_t ss[3] = { 0, 1, 2 }, ds[3] = { 3, 4, 5 }, bad[3] = { 0, 8, 1 },
		 dup[3] = { 1, 2, 1 }, ov[3] = { 5, 6, 0 };
	uint64_t sums[3];
	kvt_xfer_job *j = NULL;
	kvt_xfer *x;
	int64_t live;

	snprintf(spec, sizeof(spec), "ssd:%s/a,4M,temp", test_dir("xfer-api"));
	s1 = tier_open(spec, &g);
	snprintf(spec, sizeof(spec), "ssd:%s/b,4M,temp", test_dir("xfer-api2"));
	s2 = tier_open(spec, &g);
	CHECK_OK(kvt_xfer_create(&x, NULL));
	if (!a || !b || !c || !s1 || !s2)
		goto out;
	live = kvt_alloc_live();
	kvt_xfer_desc base = { .src = a, .dst = b, .src_slots = ss,
			       .dst_slots = ds, .npages = 3 }, d_;
	/* D(changes): the base job with some fields changed */
#define D(...) (d_ = base, __VA_ARGS__, &d_)
	CHECK_ERR(kvt_xfer_submit(x, D(d_.src = NULL), &j), -EINVAL);
	CHECK_ERR(kvt_xfer_submit(x, D(d_.dst = NULL), &j), -EINVAL);
	CHECK_ERR(kvt_xfer_submit(x, D(d_.src_slots = NULL), &j), -EINVAL);
	CHECK_ERR(kvt_xfer_submit(x, D(d_.flags = 0x80), &j), -EINVAL);
	CHECK_ERR(kvt_xfer_submit(x, D(d_.flags = KVT_XFER_SUM | KVT_XFER_VERIFY,
				       d_.sums = sums), &j), -EINVAL);
	CHECK_ERR(kvt_xfer_submit(x, D(d_.flags = KVT_XFER_SUM), &j), -EINVAL);
	CHECK_ERR(kvt_xfer_submit(x, D(d_.prio = 9), &j), -EINVAL);
	CHECK_ERR(kvt_xfer_submit(x, D(d_.method = 99), &j), -EINVAL);
	CHECK_ERR(kvt_xfer_submit(x, D(d_.dst = c), &j), KVT_EGEOM);
	CHECK_ERR(kvt_xfer_submit(x, D(d_.src_slots = bad), &j), -ERANGE);
	CHECK(strstr(kvt_errdetail(), "page 1: source slot 8") != NULL);
	CHECK_ERR(kvt_xfer_submit(x, D(d_.dst_slots = bad), &j), -ERANGE);
	CHECK(strstr(kvt_errdetail(), "destination slot 8") != NULL);
	CHECK_ERR(kvt_xfer_submit(x, D(d_.dst_slots = dup), &j), -EINVAL);
	CHECK(strstr(kvt_errdetail(), "slot 1 appears more than once") != NULL);
	CHECK_ERR(kvt_xfer_submit(x, D(d_.dst = a, d_.dst_slots = ov), &j), -EINVAL);
	CHECK(strstr(kvt_errdetail(), "slot 0 of dram is both") != NULL);
	CHECK_ERR(kvt_xfer_submit(x, D(d_.method = KVT_XFER_URING), &j),
		  -EOPNOTSUPP);
	CHECK_ERR(kvt_xfer_submit(x, D(d_.method = KVT_XFER_CUDA_KERNEL), &j),
		  -EOPNOTSUPP);
	CHECK_ERR(kvt_xfer_submit(x, D(d_.dst = s1, d_.method = KVT_XFER_CPU), &j),
		  -EOPNOTSUPP);
	CHECK_ERR(kvt_xfer_submit(x, D(d_.src = s2, d_.dst = s1), &j), -EOPNOTSUPP);
	CHECK(strstr(kvt_errdetail(), "stage the pages through a host tier"));
	CHECK(j == NULL);
	CHECK_EQ(kvt_alloc_live(), live); /* refused jobs leave nothing */
	/* same tier, no overlap: fine, and right */
	CHECK_OK(run_job(x, D(d_.dst = a)));
	for (int i = 0; i < 3; i++)
		CHECK(!memcmp(kvt_tier_slot_ptr(a, ss[i]), kvt_tier_slot_ptr(a, ds[i]),
			      kvt_geom_page_bytes(&g)));
#undef D
out:
	kvt_xfer_destroy(x);
	kvt_tier_close(a);
	kvt_tier_close(b);
	kvt_tier_close(c);
	kvt_tier_close(s1);
	kvt_tier_close(s2);
}

/* ---- callbacks and layer order -------------------------------------- */

struct watch {
	kvt_tier *src, *dst;
	const uint32_t *ss, *ds;
	size_t n;
	unsigned char *want;     /* expected destination region */
	uint32_t next_layer;     /* the layer we expect to be told next */
	int order_ok, bytes_ok, later_untouched;
	int done_calls, done_err;
	int cancel_at;           /* cancel from the callback of this layer */
	pthread_t done_thread;
};

/* Do layer @l's chunks of every moved page hold their final bytes? */
static int layer_matches(struct watch *w, uint32_t l)
{
	const kvt_layout *dl = kvt_tier_layout(w->dst);
	unsigned char *base = kvt_tier_bufs(w->dst)[0];

	for (size_t i = 0; i < w->n; i++)
		for (uint32_t k = 0; k < dl->kv; k++) {
			kvt_chunk_loc c = kvt_layout_chunk(dl, w->ds[i], l, k);
			uint64_t off = (uint64_t)((unsigned char *)kvt_tier_bufs(
				w->dst)[c.buf] - base) + c.off;
			if (memcmp(base + off, w->want + off, dl->chunk_bytes))
				return 0;
		}
	return 1;
}

static void on_layer(kvt_xfer_job *j, uint32_t l, void *arg)
{
	struct watch *w = arg;

	w->order_ok &= l == w->next_layer;
	w->next_layer = l + 1;
	w->bytes_ok &= layer_matches(w, l);
	if (l == 0)
		w->later_untouched = !layer_matches(
			w, kvt_tier_layout(w->dst)->geom.layers - 1);
	if ((int)l == w->cancel_at)
		CHECK_OK(kvt_xfer_cancel(j));
}

static void on_done(kvt_xfer_job *j, int err, void *arg)
{
	struct watch *w = arg;

	w->done_calls++;
	w->done_err = err;
	w->done_thread = pthread_self();
}

static void test_layers(void)
{
	kvt_geom g = geom(16);
	enum { N = 64 };
	kvt_tier *a = mem_tier("dram", N, &g), *b = mem_tier("hostdev", N, &g);
	kvt_xfer_config one = { .cpu_threads = 1, .task_bytes = 4096 };
	uint32_t ss[N], ds[N];
	uint64_t seed = 9;
	kvt_xfer_status st;
	kvt_xfer_job *j;
	kvt_xfer *x;

	CHECK_OK(kvt_xfer_create(&x, &one));
	if (!a || !b)
		goto out;
	tier_fill(a, 1);
	tier_fill(b, 2);
	pick_slots(&seed, ss, N, N, 0);
	pick_slots(&seed, ds, N, N, 0);
	struct watch w = { a, b, ss, ds, N, expect_region(a, b, ss, ds, N), 0,
			   1, 1, 0, 0, 0, -1, 0 };
	kvt_xfer_desc d = { .src = a, .dst = b, .src_slots = ss, .dst_slots = ds,
			    .npages = N, .done = on_done, .layer = on_layer,
			    .arg = &w };
	CHECK_OK(kvt_xfer_submit(x, &d, &j));
	for (uint32_t l = 0; l < g.layers; l++)
		CHECK_OK(kvt_xfer_wait_layer(j, l, -1));
	CHECK_ERR(kvt_xfer_wait_layer(j, g.layers, -1), -ERANGE);
	CHECK_OK(kvt_xfer_wait(j, -1));
	CHECK_EQ(w.next_layer, g.layers);
	CHECK(w.order_ok);
	CHECK(w.bytes_ok);          /* each layer in place when announced */
	CHECK(w.later_untouched);   /* ... and moved layer by layer */
	CHECK_EQ(w.done_calls, 1);
	CHECK_EQ(w.done_err, 0);
	CHECK(!pthread_equal(w.done_thread, pthread_self()));
	kvt_xfer_status_get(j, &st);
	CHECK_EQ(st.state, KVT_XFER_DONE);
	CHECK_EQ(st.layers_ready, g.layers);
	CHECK_EQ(st.bytes, N * kvt_geom_page_bytes(&g));
	CHECK_EQ(st.bytes_done, st.bytes);
	CHECK_EQ(st.npages, N);
	CHECK_EQ(st.method, KVT_XFER_CPU);
	CHECK_EQ(st.lane_direction, 1);
	CHECK(st.submit_ns <= st.start_ns && st.start_ns <= st.end_ns);
	CHECK_EQ(st.bad_page, SIZE_MAX);
	CHECK(!memcmp(kvt_tier_bufs(b)[0], w.want,
		      kvt_layout_region_bytes(kvt_tier_layout(b))));
	kvt_xfer_job_free(j);
	free(w.want);

	/* cancel from layer 0's callback: layer 0 landed and stays reported,
	 * nothing after it is announced, the job ends -ECANCELED */
	tier_fill(b, 3);
	w = (struct watch){ a, b, ss, ds, N, expect_region(a, b, ss, ds, N), 0,
			    1, 1, 0, 0, 0, 0, 0 };
	CHECK_OK(kvt_xfer_submit(x, &d, &j));
	CHECK_ERR(kvt_xfer_wait(j, -1), -ECANCELED);
	CHECK(strstr(kvt_errdetail(), "cancelled") != NULL);
	CHECK_OK(kvt_xfer_wait_layer(j, 0, -1));
	CHECK_ERR(kvt_xfer_wait_layer(j, 1, -1), -ECANCELED);
	kvt_xfer_status_get(j, &st);
	CHECK_EQ(st.layers_ready, 1);
	CHECK_EQ(w.next_layer, 1);
	CHECK(!layer_matches(&w, g.layers - 1));
	CHECK_EQ(w.done_err, -ECANCELED);
	CHECK_ERR(kvt_xfer_cancel(j), -EALREADY);
	kvt_xfer_job_free(j);
	free(w.want);
out:
	kvt_xfer_destroy(x);
	kvt_tier_close(a);
	kvt_tier_close(b);
}

/* ---- priorities, pause, cancel, free, destroy, eventfd --------------- */

static void test_scheduling(void)
{
	kvt_geom g = geom(16);
	enum { N = 32 };
	kvt_tier *a = mem_tier("dram", N, &g), *b = mem_tier("hostdev", N, &g);
	kvt_xfer_config one = { .cpu_threads = 1, .task_bytes = 4096 };
	uint32_t s[N];
	kvt_xfer_job *backup, *backup2, *load, *q1, *q2, *empty;
	kvt_xfer_status sb, sl, s1, s2;
	struct watch w = { 0 };
	uint64_t count = 0;
	kvt_xfer *x;

	CHECK_OK(kvt_xfer_create(&x, &one));
	if (!a || !b)
		goto out;
	for (int i = 0; i < N; i++)
		s[i] = (uint32_t)i;
	kvt_xfer_desc store = { .src = b, .dst = a, .src_slots = s,
				.dst_slots = s, .npages = N };
	kvt_xfer_desc ld = { .src = a, .dst = b, .src_slots = s,
			     .dst_slots = s, .npages = N / 2 };
	kvt_xfer_desc ld2 = ld;
	ld2.src_slots = s + N / 2;
	ld2.dst_slots = s + N / 2;

	/* a load submitted after a backup runs first */
	kvt_xfer_pause(x, 1);
	CHECK_OK(kvt_xfer_submit(x, &store, &backup));
	CHECK_OK(kvt_xfer_submit(x, &ld, &load));
	CHECK_ERR(kvt_xfer_poll(load), -EINPROGRESS);
	CHECK_ERR(kvt_xfer_wait(load, 1000000), -ETIMEDOUT);
	CHECK_ERR(kvt_xfer_wait_layer(load, 0, 1000000), -ETIMEDOUT);
	kvt_xfer_pause(x, 0);
	CHECK_OK(kvt_xfer_wait(load, -1));
	CHECK_OK(kvt_xfer_wait(backup, -1));
	kvt_xfer_status_get(backup, &sb);
	kvt_xfer_status_get(load, &sl);
	CHECK(sl.end_ns <= sb.start_ns);
	kvt_xfer_job_free(backup);
	kvt_xfer_job_free(load);

	/* FIFO within one priority */
	kvt_xfer_pause(x, 1);
	CHECK_OK(kvt_xfer_submit(x, &ld, &q1));
	CHECK_OK(kvt_xfer_submit(x, &ld2, &q2));
	kvt_xfer_pause(x, 0);
	CHECK_OK(kvt_xfer_wait(q2, -1));
	CHECK_OK(kvt_xfer_wait(q1, -1));
	kvt_xfer_status_get(q1, &s1);
	kvt_xfer_status_get(q2, &s2);
	CHECK(s1.end_ns <= s2.start_ns);
	kvt_xfer_job_free(q1);
	kvt_xfer_job_free(q2);

	/* explicit priorities: a LOW load waits behind a HIGH backup */
	kvt_xfer_pause(x, 1);
	ld.prio = KVT_XFER_PRIO_LOW;
	store.prio = KVT_XFER_PRIO_HIGH;
	CHECK_OK(kvt_xfer_submit(x, &ld, &load));
	CHECK_OK(kvt_xfer_submit(x, &store, &backup));
	kvt_xfer_pause(x, 0);
	CHECK_OK(kvt_xfer_wait(load, -1));
	kvt_xfer_status_get(backup, &sb);
	kvt_xfer_status_get(load, &sl);
	CHECK_EQ(sb.state, KVT_XFER_DONE);
	CHECK(sb.end_ns <= sl.start_ns);
	kvt_xfer_job_free(backup);
	kvt_xfer_job_free(load);
	ld.prio = store.prio = 0;

	/* a queued job cancelled ends at once, in the cancelling thread */
	kvt_xfer_pause(x, 1);
	store.done = on_done;
	store.arg = &w;
	CHECK_OK(kvt_xfer_submit(x, &store, &backup));
	CHECK_OK(kvt_xfer_cancel(backup));
	CHECK_EQ(w.done_calls, 1);
	CHECK_EQ(w.done_err, -ECANCELED);
	CHECK(pthread_equal(w.done_thread, pthread_self()));
	CHECK_ERR(kvt_xfer_poll(backup), -ECANCELED);
	kvt_xfer_job_free(backup);
	/* freeing a job that has not run cancels it */
	CHECK_OK(kvt_xfer_submit(x, &store, &backup));
	kvt_xfer_job_free(backup);
	CHECK_EQ(w.done_calls, 2);
	/* an empty job completes on a worker, with every layer ready */
	kvt_xfer_pause(x, 0);
	store.npages = 0;
	CHECK_OK(kvt_xfer_submit(x, &store, &empty));
	CHECK_OK(kvt_xfer_wait(empty, -1));
	CHECK_OK(kvt_xfer_wait_layer(empty, g.layers - 1, 0));
	CHECK_EQ(w.done_calls, 3);
	CHECK_EQ(w.done_err, 0);
	CHECK(!pthread_equal(w.done_thread, pthread_self()));
	kvt_xfer_job_free(empty);
	store.npages = N;

	/* the eventfd counts every completion: 9 so far (it ticks just
	 * after waiters are released, so give the last one a moment) */
	for (int i = 0; i < 1000 && count < 9; i++) {
		struct pollfd pfd = { kvt_xfer_eventfd(x), POLLIN, 0 };
		uint64_t v;
		if (poll(&pfd, 1, 1) == 1 && read(pfd.fd, &v, 8) == 8)
			count += v;
	}
	CHECK_EQ(count, 9);
	CHECK(read(kvt_xfer_eventfd(x), &count, 8) < 0); /* reset, nonblocking */

	/* destroy with queued jobs: they end cancelled; handles stay valid */
	kvt_xfer_pause(x, 1);
	CHECK_OK(kvt_xfer_submit(x, &store, &backup));
	CHECK_OK(kvt_xfer_submit(x, &ld, &backup2));
	kvt_xfer_destroy(x);
	x = NULL;
	CHECK_EQ(w.done_calls, 4);
	CHECK_ERR(kvt_xfer_poll(backup), -ECANCELED);
	CHECK_ERR(kvt_xfer_wait(backup2, -1), -ECANCELED);
	CHECK_ERR(kvt_xfer_cancel(backup), -EALREADY);
	kvt_xfer_job_free(backup);
	kvt_xfer_job_free(backup2);
out:
	kvt_xfer_destroy(x);
	kvt_tier_close(a);
	kvt_tier_close(b);
}

/* A callback may submit the next job and free its own. */
struct chain {
	kvt_xfer *x;
	kvt_xfer_desc next;
	kvt_xfer_job *second;
	int submitted;
};

static void chain_done(kvt_xfer_job *j, int err, void *arg)
{
	struct chain *c = arg;

	CHECK_EQ(err, 0);
	int ok = kvt_xfer_submit(c->x, &c->next, &c->second) == 0;

	__atomic_store_n(&c->submitted, ok ? 1 : -1, __ATOMIC_RELEASE);
	kvt_xfer_job_free(j);
}

static void test_chain(void)
{
	kvt_geom g = geom(1);
	kvt_tier *a = mem_tier("dram", 4, &g), *b = mem_tier("dram", 4, &g),
		 *c = mem_tier("hostdev", 4, &g);
	uint32_t s[4] = { 0, 1, 2, 3 };
	struct chain ch;
	kvt_xfer_job *j;

	CHECK_OK(kvt_xfer_create(&ch.x, NULL));
	if (!a || !b || !c)
		goto out;
	tier_fill(a, 11);
	ch.next = (kvt_xfer_desc){ .src = b, .dst = c, .src_slots = s,
				   .dst_slots = s, .npages = 4 };
	ch.submitted = 0;
	kvt_xfer_desc d = { .src = a, .dst = b, .src_slots = s, .dst_slots = s,
			    .npages = 4, .done = chain_done, .arg = &ch };
	CHECK_OK(kvt_xfer_submit(ch.x, &d, &j));
	while (!__atomic_load_n(&ch.submitted, __ATOMIC_ACQUIRE))
		usleep(100);
	CHECK_EQ(ch.submitted, 1);
	if (ch.submitted == 1) {
		CHECK_OK(kvt_xfer_wait(ch.second, -1));
		kvt_xfer_job_free(ch.second);
	}
	CHECK_EQ(page_xxh3(a, 2), page_xxh3(c, 2));
out:
	kvt_xfer_destroy(ch.x);
	kvt_tier_close(a);
	kvt_tier_close(b);
	kvt_tier_close(c);
}

static void test_contig(void)
{
	kvt_geom g = geom(16);
	kvt_tier *a = mem_tier("dram", 8, &g), *b = mem_tier("hostdev", 8, &g), *s;
	char spec[300];
	double sec = -1;
	kvt_xfer *x;
	uint64_t len, n;

	snprintf(spec, sizeof(spec), "ssd:%s/c,4M,temp", test_dir("xfer-contig"));
	s = tier_open(spec, &g);
	CHECK_OK(kvt_xfer_create(&x, NULL));
	if (!a || !b || !s)
		goto out;
	tier_fill(a, 3);
	n = 7 * kvt_geom_page_bytes(&g) + 123;
	CHECK_OK(kvt_xfer_contig_copy(x, a, b, n, 2, &sec));
	CHECK(sec >= 0);
	CHECK(!memcmp(tier_mem(a, &len), tier_mem(b, &len), n));
	CHECK_ERR(kvt_xfer_contig_copy(x, a, s, 4096, 0, &sec), -EINVAL);
	CHECK_ERR(kvt_xfer_contig_copy(x, a, b, 9 * kvt_geom_page_bytes(&g), 0,
				       &sec), -EINVAL);
out:
	kvt_xfer_destroy(x);
	kvt_tier_close(a);
	kvt_tier_close(b);
	kvt_tier_close(s);
}

int main(void)
{
	int64_t live = kvt_alloc_live();

	test_config();
	test_submit_errors();
	test_layers();
	test_scheduling();
	test_chain();
	test_contig();
	CHECK_EQ(kvt_alloc_live(), live);
	TEST_DONE();
}
