/*
 * test_ssd_faults — the ssd tier on a real, small, misbehaving file
 * system: a 40 MiB ext4 image loop-mounted here (needs root and a kernel
 * that lets us mount; exit 77 otherwise). Through the tier and the
 * transfer engine (what the cache and the daemon use):
 *
 *   - a set larger than the free space: -ENOSPC at open, naming sizes, no
 *     file left behind;
 *   - the disk filled by someone else after open: stores into the set
 *     still succeed (its space was reserved at open) and read back exact;
 *   - a slot file truncated mid-run on the full disk: stores into the cut
 *     part fail with -ENOSPC naming the page, loads of it fail (short read
 *     or checksum), none reports success;
 *   - a slot overwritten mid-run: the verified load fails KVT_ECORRUPT
 *     naming the page; the other pages still load exact;
 *   - the file system read-only when the set is opened again: -EROFS with
 *     a clear message (a read-only remount under open files is refused by
 *     the kernel, so this is the state a restart finds);
 *   - reopening the cut set later: refused (shorter than its header says).
 *
 * No job that lost or mangled a page may report success, and no page a job
 * reports loaded may differ from what was stored (issue 10).
 */
#include "xfer_util.h"

#include <fcntl.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <unistd.h>

enum { N = 8 };

static char img[512], mnt[512];
static int mounted;

static void unmount(void)
{
	if (mounted)
		umount2(mnt, MNT_DETACH);
	mounted = 0;
	unlink(img);
	rmdir(mnt);
}

static int sh(const char *fmt, const char *a, const char *b)
{
	char cmd[1400];

	snprintf(cmd, sizeof(cmd), fmt, a, b);
	return system(cmd);
}

/* A fresh 40 MiB ext4 mounted at mnt; 0, or 77 to skip. */
static int mount_image(void)
{
	const char *dir = test_dir("ssd-faults");

	if (geteuid() != 0)
		return 77;
	snprintf(img, sizeof(img), "%s/ext4.img", dir);
	snprintf(mnt, sizeof(mnt), "%s/mnt", dir);
	if (mkdir(mnt, 0700) && errno != EEXIST)
		return 77;
	if (sh("truncate -s 40M %s && mkfs.ext4 -q -F -m 0 %s >/dev/null 2>&1",
	       img, img))
		return 77;
	if (sh("mount -o loop %s %s 2>/dev/null", img, mnt))
		return 77;
	mounted = 1;
	atexit(unmount);
	return 0;
}

/* Fill the file system up with a file of its own; returns its fd. */
static int fill_disk(const char *path)
{
	int fd = open(path, O_RDWR | O_CREAT | O_TRUNC, 0600);
	off_t off = 0;

	CHECK(fd >= 0);
	for (off_t step = 1 << 20; fd >= 0 && step >= 4096; step /= 2)
		while (posix_fallocate(fd, off, step) == 0)
			off += step;
	return fd;
}

/* @n pages of @got equal @want's at these slots */
static int same_pages(kvt_tier *want, const uint32_t *ws, kvt_tier *got,
		      const uint32_t *gs, size_t n)
{
	for (size_t i = 0; i < n; i++)
		if (page_xxh3(want, ws[i]) != page_xxh3(got, gs[i]))
			return 0;
	return 1;
}

int main(void)
{
	uint32_t all[N], first[N / 2], last[N / 2];
	uint64_t sums[N], lsums[N / 2];
	char spec[700], path[700];
	kvt_tier *src, *ssd, *back, *t;
	kvt_tier_spec s[1];
	kvt_xfer *x;
	kvt_geom g;
	uint64_t page, slot;
	size_t n;
	int rc = mount_image(), fill, fd;

	if (rc)
		SKIP("needs root, mkfs.ext4 and a loop mount");
	CHECK_OK(kvt_geom_preset(&g, "llama-3.2-1b", 16, 1, 0));
	page = kvt_geom_page_bytes(&g);
	slot = (page + 4095) / 4096 * 4096;
	for (uint32_t i = 0; i < N; i++) {
		all[i] = i;
		if (i < N / 2)
			first[i] = i;
		else
			last[i - N / 2] = i;
	}

	/* more than the disk holds: a clear -ENOSPC, nothing left behind */
	snprintf(spec, sizeof(spec), "ssd:%s/big,64M", mnt);
	CHECK_OK(kvt_tier_spec_parse(spec, s, 1, &n));
	CHECK_ERR(kvt_tier_open(&t, s, &g), -ENOSPC);
	CHECK(strstr(kvt_errdetail(), "only") && strstr(kvt_errdetail(), "free"));
	snprintf(path, sizeof(path), "%s/big", mnt);
	CHECK(access(path, F_OK) != 0);

	/* one file, 8 slots; then someone fills the disk */
	snprintf(spec, sizeof(spec), "ssd:%s/set,%llu,files=1", mnt,
		 (unsigned long long)(N * slot));
	ssd = tier_open(spec, &g);
	snprintf(spec, sizeof(spec), "dram:%llu", (unsigned long long)(N * page));
	src = tier_open(spec, &g);
	back = tier_open(spec, &g);
	CHECK_OK(kvt_xfer_create(&x, NULL));
	if (!ssd || !src || !back || !x)
		TEST_DONE();
	tier_fill(src, 5);
	snprintf(path, sizeof(path), "%s/filler", mnt);
	fill = fill_disk(path);

	/* stores into reserved space succeed on a full disk */
	{
		kvt_xfer_desc out = { .src = src, .dst = ssd, .src_slots = all,
				      .dst_slots = all, .npages = N,
				      .flags = KVT_XFER_SUM | KVT_XFER_DURABLE,
				      .sums = sums };
		kvt_xfer_desc in = { .src = ssd, .dst = back, .src_slots = all,
				     .dst_slots = all, .npages = N,
				     .flags = KVT_XFER_VERIFY, .sums = sums };

		CHECK_OK(run_job(x, &out));
		CHECK_OK(run_job(x, &in));
		CHECK(same_pages(src, all, back, all, N));
	}

	/* the slot file cut after 4 slots, the disk still full: stores into
	 * the cut part need blocks the disk no longer has */
	snprintf(path, sizeof(path), "%s/set/kvtier-ssd-000.kvt", mnt);
	fd = open(path, O_RDWR);
	CHECK(fd >= 0);
	CHECK_EQ(ftruncate(fd, (off_t)(4096 + (N / 2) * slot)), 0);
	if (fill >= 0) /* take back what the cut freed */
		for (off_t step = 1 << 20, off = lseek(fill, 0, SEEK_END);
		     step >= 4096; step /= 2)
			while (posix_fallocate(fill, off, step) == 0)
				off += step;
	tier_fill(src, 77); /* new contents: a stale page must not pass */
	{
		kvt_xfer_desc out = { .src = src, .dst = ssd, .src_slots = last,
				      .dst_slots = last, .npages = N / 2,
				      .flags = KVT_XFER_SUM | KVT_XFER_DURABLE,
				      .sums = lsums };
		kvt_xfer_desc in = { .src = ssd, .dst = back, .src_slots = last,
				     .dst_slots = last, .npages = N / 2,
				     .flags = KVT_XFER_VERIFY, .sums = lsums };
		int err = run_job(x, &out);

		fprintf(stderr, "store into the cut file: %s\n", kvt_errdetail());
		CHECK(err == -ENOSPC || err == -EIO);
		CHECK(strstr(kvt_errdetail(), "ssd write of page") ||
		      strstr(kvt_errdetail(), "short ssd write"));
		if (err == -ENOSPC)
			CHECK(strstr(kvt_errdetail(), "No space left"));
		/* what did land there is not what was stored: no success */
		err = run_job(x, &in);
		fprintf(stderr, "load from the cut file: %s\n", kvt_errdetail());
		CHECK(err == -EIO || err == KVT_ECORRUPT);
		/* the first half, before the cut, still loads exact */
		in.src_slots = in.dst_slots = first;
		in.sums = sums;
		tier_fill(back, 1);
		CHECK_OK(run_job(x, &in));
		CHECK(page_xxh3(back, first[0]) != 0);
	}
	tier_fill(src, 5); /* the contents of the first store again */
	CHECK(same_pages(src, first, back, first, N / 2));

	/* a slot overwritten mid-run: the verified load names it */
	{
		kvt_xfer_desc in = { .src = ssd, .dst = back, .src_slots = first,
				     .dst_slots = first, .npages = N / 2,
				     .flags = KVT_XFER_VERIFY, .sums = sums };
		char junk[4096];

		memset(junk, 0x5a, sizeof(junk));
		CHECK_EQ(pwrite(fd, junk, sizeof(junk),
				(off_t)(4096 + 2 * slot + 8192)), 4096);
		fsync(fd);
		CHECK_ERR(run_job(x, &in), KVT_ECORRUPT);
		fprintf(stderr, "load of an overwritten slot: %s\n",
			kvt_errdetail());
		CHECK(strstr(kvt_errdetail(), "failed its checksum"));
		CHECK(strstr(kvt_errdetail(), "slot 2"));
		in.npages = 2; /* the pages before it are fine */
		CHECK_OK(run_job(x, &in));
	}
	close(fd);

	kvt_xfer_destroy(x);
	kvt_tier_close(ssd);
	/* the cut set is refused when it is opened again */
	if (fill >= 0)
		close(fill);
	snprintf(path, sizeof(path), "%s/filler", mnt);
	unlink(path);
	snprintf(spec, sizeof(spec), "ssd:%s/set,%llu,files=1", mnt,
		 (unsigned long long)(N * slot));
	CHECK_OK(kvt_tier_spec_parse(spec, s, 1, &n));
	/* read-only (remounted so after errors, say): a clear refusal. The
	 * kernel refuses a read-only remount while the tier holds its files
	 * open for writing, so this is the state a restart finds. */
	if (sh("mount -o remount,ro %s %s", mnt, "2>/dev/null") == 0) {
		CHECK_ERR(kvt_tier_open(&t, s, &g), -EROFS);
		fprintf(stderr, "open on a read-only mount: %s\n",
			kvt_errdetail());
		CHECK(strstr(kvt_errdetail(), "Read-only file system"));
		CHECK_EQ(sh("mount -o remount,rw %s %s", mnt, "2>/dev/null"), 0);
	} else {
		fprintf(stderr, "note: remount read-only refused; not tested\n");
		kvt_test_failures++;
	}
	CHECK_ERR(kvt_tier_open(&t, s, &g), KVT_ECORRUPT);
	fprintf(stderr, "reopening the cut set: %s\n", kvt_errdetail());
	CHECK(strstr(kvt_errdetail(), "shorter than"));
	kvt_tier_close(src);
	kvt_tier_close(back);
	TEST_DONE();
}
