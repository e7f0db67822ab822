/*
 * test_xfer_ssd — the io lane, through io_uring and through the
 * pread/pwrite fallback: a round trip with checksums and DURABLE; an
 * injected I/O error on a read and on a write, a short read and a short
 * write (the engine's test hook) and a real short read (the slot file
 * truncated under the tier) all surface as job errors naming the page,
 * and no job that lost a page reports success; bounce-buffer pages
 * (not 4 KiB multiples, layer-first memory); cancel while paused; the
 * fallback is reported, never silent.
 */
#include "xfer_util.h"
#include "xfer/xfer_impl.h"

#include <fcntl.h>
#include <unistd.h>

enum { N = 12 };

struct rig {
	kvt_geom g;
	kvt_tier *mem, *ssd, *back;
	char dir[400];
	uint32_t ss[N], ds[N];
};

static int rig_open(struct rig *r, const char *preset, uint32_t p,
		    const char *name, const char *memkind)
{
	uint64_t page, slot;
	char spec[600];

	CHECK_OK(kvt_geom_preset(&r->g, preset, p, 8, 1));
	page = kvt_geom_page_bytes(&r->g);
	slot = (page + 4095) / 4096 * 4096;
	snprintf(r->dir, sizeof(r->dir), "%s", test_dir(name));
	snprintf(spec, sizeof(spec), "%s:%llu", memkind,
		 (unsigned long long)(N * page));
	r->mem = tier_open(spec, &r->g);
	r->back = tier_open(spec, &r->g);
	snprintf(spec, sizeof(spec), "ssd:%s/s,%llu,temp", r->dir,
		 (unsigned long long)(N * slot));
	r->ssd = tier_open(spec, &r->g);
	for (int i = 0; i < N; i++) {
		r->ss[i] = (uint32_t)((i * 5) % N);
		r->ds[i] = (uint32_t)(N - 1 - i);
	}
	if (!r->mem || !r->ssd || !r->back)
		return -1;
	tier_fill(r->mem, 17);
	return 0;
}

static void rig_close(struct rig *r)
{
	kvt_tier_close(r->mem);
	kvt_tier_close(r->ssd);
	kvt_tier_close(r->back);
}

static int submit_wait(kvt_xfer *x, kvt_xfer_desc *d, kvt_xfer_status *st)
{
	kvt_xfer_job *j;
	int err = kvt_xfer_submit(x, d, &j);

	if (err)
		return err;
	err = kvt_xfer_wait(j, -1);
	if (st)
		kvt_xfer_status_get(j, st);
	kvt_xfer_job_free(j);
	return err;
}

/* Out to the ssd and back, with sums and DURABLE. */
static void round_trip(kvt_xfer *x, struct rig *r)
{
	uint64_t sums[N], again[N];
	unsigned char *want, *got;
	const kvt_layout *l = kvt_tier_layout(r->back);
	kvt_xfer_desc out = { .src = r->mem, .dst = r->ssd, .src_slots = r->ss,
			      .dst_slots = r->ds, .npages = N,
			      .flags = KVT_XFER_SUM | KVT_XFER_DURABLE,
			      .sums = sums };
	kvt_xfer_desc in = { .src = r->ssd, .dst = r->back, .src_slots = r->ds,
			     .dst_slots = r->ss, .npages = N,
			     .flags = KVT_XFER_VERIFY, .sums = sums };

	CHECK_OK(submit_wait(x, &out, NULL));
	for (int i = 0; i < N; i++)
		CHECK(sums[i] == page_xxh3(r->mem, r->ss[i]));
	CHECK_OK(submit_wait(x, &in, NULL));
	want = tier_pages(r->mem);
	got = tier_pages(r->back);
	CHECK(!memcmp(want, got, l->slots * l->page_bytes));
	free(want);
	free(got);
	out.flags = KVT_XFER_SUM;
	out.sums = again;
	CHECK_OK(submit_wait(x, &out, NULL));
	CHECK(!memcmp(sums, again, sizeof(sums)));
}

static void faults(kvt_xfer *x, struct rig *r, const char *mode)
{
	kvt_xfer_desc out = { .src = r->mem, .dst = r->ssd, .src_slots = r->ss,
			      .dst_slots = r->ds, .npages = N };
	kvt_xfer_desc in = { .src = r->ssd, .dst = r->back, .src_slots = r->ds,
			     .dst_slots = r->ss, .npages = N };
	kvt_xfer_status st;
	char path[600];
	int fd;

	CHECK_OK(submit_wait(x, &out, NULL));
	/* an I/O error on the 4th read */
	kvti_xfer_io_fault(x, 4, -EIO);
	CHECK_ERR(submit_wait(x, &in, &st), -EIO);
	CHECK(strstr(kvt_errdetail(), "ssd read of page") != NULL);
	CHECK(st.bytes_done < st.bytes);
	CHECK(st.layers_ready < st.layers);
	/* the same on the 2nd write: the store is not reported done */
	kvti_xfer_io_fault(x, 2, -ENOSPC);
	CHECK_ERR(submit_wait(x, &out, &st), -ENOSPC);
	CHECK(strstr(kvt_errdetail(), "ssd write of page") != NULL);
	CHECK(st.bytes_done < st.bytes);
	/* short read, short write */
	kvti_xfer_io_fault(x, 1, 0);
	CHECK_ERR(submit_wait(x, &in, NULL), -EIO);
	CHECK(strstr(kvt_errdetail(), "short ssd read of page") != NULL);
	kvti_xfer_io_fault(x, 7, 0);
	CHECK_ERR(submit_wait(x, &out, NULL), -EIO);
	CHECK(strstr(kvt_errdetail(), "short ssd write") != NULL);
	/* the engine still works afterwards */
	CHECK_OK(submit_wait(x, &out, NULL));
	CHECK_OK(submit_wait(x, &in, NULL));
	/* a real short read: the slot file cut under the tier (a 'temp'
	 * tier's files have no name while it is open: through its fd) */
	{
		uint64_t slot = kvt_layout_region_bytes(kvt_tier_layout(r->ssd)) /
				N, off;

		CHECK_OK(kvt_tier_ssd_loc(r->ssd, 0, &fd, &off));
		snprintf(path, sizeof(path), "%s/s/kvtier-ssd-000.kvt", r->dir);
		CHECK(access(path, F_OK) != 0);
		CHECK(ftruncate(fd, (off_t)(4096 + 5 * slot + slot / 2)) == 0);
		CHECK_ERR(submit_wait(x, &in, &st), -EIO);
		CHECK(strstr(kvt_errdetail(), "short ssd read") != NULL);
		CHECK(st.bytes_done < st.bytes);
	}
	fprintf(stderr, "%s: faults surfaced as job errors\n", mode);
}

static void cancel_paused(kvt_xfer *x, struct rig *r)
{
	kvt_xfer_desc out = { .src = r->mem, .dst = r->ssd, .src_slots = r->ss,
			      .dst_slots = r->ds, .npages = N };
	kvt_xfer_job *j;

	kvt_xfer_pause(x, 1);
	CHECK_OK(kvt_xfer_submit(x, &out, &j));
	CHECK_ERR(kvt_xfer_wait(j, 1000000), -ETIMEDOUT);
	CHECK_OK(kvt_xfer_cancel(j));
	CHECK_ERR(kvt_xfer_wait(j, -1), -ECANCELED);
	kvt_xfer_job_free(j);
	kvt_xfer_pause(x, 0);
}

int main(void)
{
	kvt_xfer_config cfgs[] = {
		{ .ssd_io = KVT_XFER_URING, .uring_depth = 4 },
		{ .ssd_io = KVT_XFER_PREAD },
	};
	int64_t live = kvt_alloc_live();

	for (int m = 0; m < 2; m++) {
		const char *mode = m ? "pread" : "io_uring";
		kvt_xfer_info info;
		struct rig r = { 0 }, b = { 0 }, h = { 0 };
		kvt_xfer *x;
		int err = kvt_xfer_create(&x, &cfgs[m]);

		if (err == KVT_ENODEV && !m) {
			fprintf(stderr, "io_uring unavailable here: %s\n",
				kvt_errdetail());
			continue;
		}
		CHECK_OK(err);
		if (err)
			continue;
		kvt_xfer_info_get(x, &info);
		CHECK_EQ(info.ssd_io, m ? KVT_XFER_PREAD : KVT_XFER_URING);
		CHECK_EQ(info.ssd_io_note[0] != '\0', m);
		if (m) { /* io_uring cannot be forced on a pread engine */
			struct rig t = { 0 };
			if (!rig_open(&t, "llama-3.1-8b", 16, "ssd-force", "dram")) {
				kvt_xfer_desc d = { .src = t.mem, .dst = t.ssd,
						    .src_slots = t.ss,
						    .dst_slots = t.ds, .npages = N,
						    .method = KVT_XFER_URING };
				kvt_xfer_job *j;
				CHECK_ERR(kvt_xfer_submit(x, &d, &j), KVT_ENODEV);
			}
			rig_close(&t);
		}
		/* direct: 16 KiB pages into dram slots */
		if (!rig_open(&r, "llama-3.1-8b", 1, "ssd-direct", "dram")) {
			round_trip(x, &r);
			faults(x, &r, mode);
		}
		/* bounce: 140,544-byte MLA pages, and layer-first memory */
		if (!rig_open(&b, "deepseek-v3", 2, "ssd-bounce", "dram")) {
			round_trip(x, &b);
			faults(x, &b, mode);
		}
		if (!rig_open(&h, "qwen2.5-7b", 16, "ssd-hostdev", "hostdev")) {
			round_trip(x, &h);
			cancel_paused(x, &h);
		}
		rig_close(&r);
		rig_close(&b);
		rig_close(&h);
		kvt_xfer_destroy(x);
	}
	CHECK_EQ(kvt_alloc_live(), live);
	TEST_DONE();
}
