/*
 * test_xfer_faults — fail the N-th acquisition (allocation, mapping,
 * thread, io_uring) along each setup path of the transfer engine and the
 * stressor, for every N until the path succeeds: each failure is a clean
 * error, leaks no memory, fd or thread, queues nothing, and the engine
 * keeps working afterwards (the rax-oom-test idea).
 */
#include "xfer_util.h"

#include <dirent.h>
#include <unistd.h>

struct snap {
	int64_t live;
	int fds, threads;
};

/* Jobs are freed by whichever of the caller and the engine lets go last,
 * so right after a wait the engine may still hold a finished job for a
 * moment: let the heap count settle before taking a snapshot. */
static void settle(void)
{
	int64_t last = kvt_alloc_live();

	for (int stable = 0, i = 0; stable < 3 && i < 1000; i++) {
		usleep(1000);
		stable = kvt_alloc_live() == last ? stable + 1 : 0;
		last = kvt_alloc_live();
	}
}

static struct snap snap(void)
{
	settle();
	struct snap s = { kvt_alloc_live(), test_count_entries("/proc/self/fd"),
			  test_count_entries("/proc/self/task") };
	return s;
}

static int same(struct snap a, struct snap b, const char *what, uint64_t n)
{
	if (a.live == b.live && a.fds == b.fds && a.threads == b.threads)
		return 1;
	fprintf(stderr, "%s: failure %llu leaked (heap %lld->%lld, fds %d->%d, "
		"threads %d->%d)\n", what, (unsigned long long)n,
		(long long)a.live, (long long)b.live, a.fds, b.fds, a.threads,
		b.threads);
	return 0;
}

static int ok_err(int err)
{
	return err == -ENOMEM || err == -EAGAIN;
}

/* Walk kvt_xfer_create(). */
static void walk_create(const kvt_xfer_config *cfg)
{
	uint64_t before = kvt_alloc_count(), points;
	kvt_xfer *x;
	int failed = 0;

	CHECK_OK(kvt_xfer_create(&x, cfg));
	points = kvt_alloc_count() - before;
	kvt_xfer_destroy(x);
	for (uint64_t n = 1; n <= points; n++) {
		struct snap a = snap();
		int err;

		kvt_alloc_fail_at(n);
		err = kvt_xfer_create(&x, cfg);
		kvt_alloc_fail_at(0);
		if (!err) {
			kvt_xfer_destroy(x);
			continue;
		}
		failed++;
		CHECK(ok_err(err));
		CHECK(same(a, snap(), "create", n));
	}
	fprintf(stderr, "create: %llu acquisitions, %d failures injected\n",
		(unsigned long long)points, failed);
	CHECK(failed >= 3);
}

/* Walk one submit (and, for the first ssd job, the io lane's start). */
static void walk_submit(kvt_xfer *x, kvt_xfer_desc *d, const char *what,
			int fresh_engine, const kvt_xfer_config *cfg)
{
	uint64_t points = 0;
	int failed = 0;

	for (uint64_t n = 1;; n++) {
		kvt_xfer *e = x;
		kvt_xfer_job *j = NULL;
		struct snap a;
		uint64_t before;
		int err;

		if (fresh_engine)
			CHECK_OK(kvt_xfer_create(&e, cfg));
		a = snap();
		before = kvt_alloc_count();
		kvt_alloc_fail_at(n);
		err = kvt_xfer_submit(e, d, &j);
		kvt_alloc_fail_at(0);
		if (!err) {
			points = kvt_alloc_count() - before;
			CHECK_OK(kvt_xfer_wait(j, -1));
			kvt_xfer_job_free(j);
			if (fresh_engine)
				kvt_xfer_destroy(e);
			break;
		}
		failed++;
		CHECK(ok_err(err));
		CHECK(j == NULL);
		CHECK(same(a, snap(), what, n));
		/* the engine works after the failure */
		CHECK_OK(kvt_xfer_submit(e, d, &j));
		CHECK_OK(kvt_xfer_wait(j, -1));
		kvt_xfer_job_free(j);
		if (fresh_engine)
			kvt_xfer_destroy(e);
	}
	fprintf(stderr, "%s: %llu acquisitions, %d failures injected\n", what,
		(unsigned long long)points, failed);
	CHECK(failed >= 2);
}

static void walk_stress(void)
{
	uint64_t before = kvt_alloc_count(), points;
	kvt_stress *s;
	int failed = 0;

	CHECK_OK(kvt_stress_start(&s, 2, 1 << 20, 0));
	points = kvt_alloc_count() - before;
	kvt_stress_stop(s, NULL);
	for (uint64_t n = 1; n <= points; n++) {
		struct snap a = snap();
		int err;

		kvt_alloc_fail_at(n);
		err = kvt_stress_start(&s, 2, 1 << 20, 0);
		kvt_alloc_fail_at(0);
		if (!err) {
			kvt_stress_stop(s, NULL);
			continue;
		}
		failed++;
		CHECK(ok_err(err));
		CHECK(same(a, snap(), "stress", n));
	}
	fprintf(stderr, "stress: %llu acquisitions, %d failures injected\n",
		(unsigned long long)points, failed);
	CHECK(failed >= 3);
}

int main(void)
{
	kvt_xfer_config three = { .cpu_threads = 3 };
	kvt_xfer_config uring = { .ssd_io = KVT_XFER_URING, .uring_depth = 8 };
	kvt_geom g, mla;
	kvt_tier *a, *b, *s, *m1, *m2;
	char spec[400];
	uint32_t ss[6] = { 5, 1, 3, 0, 2, 4 }, ds[6] = { 0, 1, 2, 3, 4, 5 };
	kvt_xfer *x;
	int64_t live = kvt_alloc_live();

	CHECK_OK(kvt_geom_preset(&g, "llama-3.1-8b", 16, 8, 0));
	CHECK_OK(kvt_geom_preset(&mla, "deepseek-v3", 1, 1, 0));
	a = tier_open("dram:6M", &g);
	b = tier_open("hostdev:6M", &g);
	snprintf(spec, sizeof(spec), "ssd:%s/s,6M,temp", test_dir("xfer-faults"));
	s = tier_open(spec, &g);
	m1 = tier_open("dram:1M", &mla);
	snprintf(spec, sizeof(spec), "ssd:%s/m,1M,temp", test_dir("xfer-faults2"));
	m2 = tier_open(spec, &mla);
	if (!a || !b || !s || !m1 || !m2)
		goto out;

	walk_create(NULL);
	walk_create(&three);
	CHECK_OK(kvt_xfer_create(&x, NULL));
	kvt_xfer_desc load = { .src = a, .dst = b, .src_slots = ss,
			       .dst_slots = ds, .npages = 6 };
	kvt_xfer_desc store = { .src = a, .dst = s, .src_slots = ss,
				.dst_slots = ds, .npages = 6 };
	kvt_xfer_desc bounce = { .src = m1, .dst = m2, .src_slots = ss,
				 .dst_slots = ds, .npages = 6 };
	walk_submit(x, &load, "cpu load", 0, NULL);
	walk_submit(x, &store, "first ssd job (io lane start)", 1, &uring);
	walk_submit(x, &bounce, "ssd job with bounce buffers", 0, NULL);
	kvt_xfer_destroy(x);

	/* the huge-page bounce region the io thread cannot get: it warns and
	 * reads into buffers of its own — the job still succeeds */
	CHECK_OK(kvt_xfer_create(&x, NULL));
	{
		kvt_xfer_job *j;
		kvt_xfer_pause(x, 1);
		CHECK_OK(kvt_xfer_submit(x, &bounce, &j));
		kvt_alloc_fail_at(1);
		kvt_xfer_pause(x, 0);
		CHECK_OK(kvt_xfer_wait(j, -1));
		kvt_alloc_fail_at(0);
		kvt_xfer_job_free(j);
	}
	kvt_xfer_destroy(x);

	/* a bounce buffer the io thread cannot get (a page longer than the
	 * region's slices: llama-3.1-8b's 2 MiB pages after MLA's): a job
	 * error, not a crash; the next job gets it */
	CHECK_OK(kvt_xfer_create(&x, NULL));
	{
		kvt_xfer_desc big = { .src = s, .dst = b, .src_slots = ds,
				      .dst_slots = ss, .npages = 6 };
		kvt_xfer_job *j;

		CHECK_OK(kvt_xfer_submit(x, &store, &j));
		CHECK_OK(kvt_xfer_wait(j, -1));
		kvt_xfer_job_free(j);
		CHECK_OK(kvt_xfer_submit(x, &bounce, &j)); /* slices: MLA's */
		CHECK_OK(kvt_xfer_wait(j, -1));
		kvt_xfer_job_free(j);
		kvt_xfer_pause(x, 1);
		CHECK_OK(kvt_xfer_submit(x, &big, &j));
		kvt_alloc_fail_at(1);
		kvt_xfer_pause(x, 0);
		CHECK_ERR(kvt_xfer_wait(j, -1), -ENOMEM);
		kvt_alloc_fail_at(0);
		CHECK(strstr(kvt_errdetail(), "bounce buffer") != NULL);
		kvt_xfer_job_free(j);
		CHECK_OK(kvt_xfer_submit(x, &big, &j));
		CHECK_OK(kvt_xfer_wait(j, -1));
		kvt_xfer_job_free(j);
	}
	kvt_xfer_destroy(x);
	walk_stress();
out:
	kvt_tier_close(a);
	kvt_tier_close(b);
	kvt_tier_close(s);
	kvt_tier_close(m1);
	kvt_tier_close(m2);
	CHECK_EQ(kvt_alloc_live(), live);
	TEST_DONE();
}
