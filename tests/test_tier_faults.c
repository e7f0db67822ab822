/*
 * test_tier_faults — fail the N-th allocation (heap, mapping or disk
 * reservation) along each tier's setup path, for every N until setup
 * succeeds: each failure must be a clean error that leaks no memory, no
 * mapping, no file descriptor and no file (the rax-oom-test idea).
 */
#include "harness.h"

#include <dirent.h>
#include <unistd.h>

static void walk(const char *spec, const kvt_geom *g, const char *dir)
{
	kvt_tier_spec s[1];
	kvt_tier *t = NULL;
	uint64_t before, points;
	size_t ns;
	int failed = 0;

	CHECK_OK(kvt_tier_spec_parse(spec, s, 1, &ns));
	/* a clean open counts the acquisitions along the path */
	before = kvt_alloc_count();
	CHECK_OK(kvt_tier_open(&t, s, g));
	points = kvt_alloc_count() - before;
	kvt_tier_close(t);

	for (uint64_t n = 1; n <= points; n++) {
		int64_t live = kvt_alloc_live();
		int maps = test_count_lines("/proc/self/maps");
		int fds = test_count_entries("/proc/self/fd");
		int files = test_count_entries(dir);
		int err;

		kvt_alloc_fail_at(n);
		err = kvt_tier_open(&t, s, g);
		kvt_alloc_fail_at(0);
		if (!err) { /* a failure the path tolerates (e.g. a probe) */
			kvt_tier_close(t);
			continue;
		}
		failed++;
		if (err != -ENOMEM && err != -ENOSPC) {
			fprintf(stderr, "%s: failure %llu gave %s (%s)\n", spec,
				(unsigned long long)n, kvt_strerror(err),
				kvt_errdetail());
			CHECK(0);
		}
		if (kvt_alloc_live() != live || test_count_lines("/proc/self/maps") != maps ||
		    test_count_entries("/proc/self/fd") != fds ||
		    test_count_entries(dir) != files) {
			fprintf(stderr, "%s: failure %llu leaked (heap %lld->%lld, "
				"maps %d->%d, fds %d->%d, files %d->%d)\n", spec,
				(unsigned long long)n, (long long)live,
				(long long)kvt_alloc_live(), maps,
				test_count_lines("/proc/self/maps"), fds,
				test_count_entries("/proc/self/fd"), files,
				test_count_entries(dir));
			CHECK(0);
		}
	}
	fprintf(stderr, "%-40s %llu acquisitions, %d failures injected\n", spec,
		(unsigned long long)points, failed);
	CHECK(failed >= 3); /* every path has a few */
}

int main(void)
{
	const char *dir = test_dir("tier-faults");
	char spec[600];
	kvt_geom g;

	CHECK_OK(kvt_geom_preset(&g, "llama-3.1-8b", 4, 1, 0));
	walk("dram:16M", &g, dir);
	walk("dram:16M,mlock", &g, dir);
	walk("fabric:memfd,16M", &g, dir);
	snprintf(spec, sizeof(spec), "fabric:file=%s/fab,16M,temp", dir);
	walk(spec, &g, dir);
	snprintf(spec, sizeof(spec), "ssd:%s/ssd,16M,files=3,temp", dir);
	walk(spec, &g, dir);
	walk("hostdev:16M", &g, dir);
	walk("hostdev:16M,layout=sglang", &g, dir);
	TEST_DONE();
}
