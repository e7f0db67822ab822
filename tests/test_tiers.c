/*
 * test_tiers — every tier backend this machine can build: write pages,
 * read them back, reopen what persists, refuse what is impossible.
 */
#include "harness.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

static int open_spec(kvt_tier **t, const char *spec, const kvt_geom *g)
{
	kvt_tier_spec s[1];
	size_t n;
	int err = kvt_tier_spec_parse(spec, s, 1, &n);

	return err ? err : kvt_tier_open(t, s, g);
}

static void fill(unsigned char *p, size_t n, uint64_t seed)
{
	for (size_t i = 0; i < n; i++)
		p[i] = (unsigned char)(test_rand(&seed) >> 56);
}

/* Write distinct pages to a few slots, read them all back. */
static void round_trip(kvt_tier *t, uint64_t seed)
{
	kvt_tier_desc d;
	uint64_t page;
	unsigned char *w, *r;
	uint32_t slots[3];

	kvt_tier_info(t, &d);
	page = d.page_bytes;
	slots[0] = 0;
	slots[1] = (uint32_t)(d.nslots / 2);
	slots[2] = (uint32_t)(d.nslots - 1);
	w = malloc(page * 3 + 1);
	r = malloc(page + 1);
	for (int i = 0; i < 3; i++) {
		fill(w + i * page, page, seed + i);
		CHECK_OK(kvt_tier_write(t, slots[i], w + i * page));
	}
	for (int i = 0; i < 3; i++) {
		memset(r, 0, page);
		CHECK_OK(kvt_tier_read(t, slots[i], r));
		if (memcmp(r, w + i * page, page)) {
			fprintf(stderr, "%s: slot %u read back differs\n", d.name,
				slots[i]);
			CHECK(0);
		}
		/* unaligned buffers work too */
		CHECK_OK(kvt_tier_read(t, slots[i], r + 1));
		CHECK(!memcmp(r + 1, w + i * page, page));
	}
	CHECK_ERR(kvt_tier_read(t, (uint32_t)d.nslots, r), -ERANGE);
	CHECK_ERR(kvt_tier_write(t, (uint32_t)d.nslots, r), -ERANGE);
	free(w);
	free(r);
}

static void test_memory_tiers(const kvt_geom *g, const char *dir)
{
	char spec[512];
	kvt_tier *t;
	kvt_tier_desc d;

	CHECK_OK(open_spec(&t, "dram:64M", g));
	kvt_tier_info(t, &d);
	CHECK(!d.emulated && !strcmp(d.name, "dram"));
	CHECK_EQ(d.nslots, (64u << 20) / kvt_geom_page_bytes(g));
	CHECK_EQ(kvt_pool_slots(kvt_tier_pool(t)), d.nslots);
	CHECK(kvt_tier_slot_ptr(t, 0) != NULL);
	CHECK(kvt_tier_slot_ptr(t, (uint32_t)d.nslots) == NULL);
	round_trip(t, 1);
	kvt_tier_close(t);

	CHECK_OK(open_spec(&t, "dram:64M,mlock,populate,thp", g));
	kvt_tier_info(t, &d);
	CHECK(d.locked);
	round_trip(t, 2);
	kvt_tier_close(t);

	CHECK_OK(open_spec(&t, "fabric:memfd,32M", g));
	kvt_tier_info(t, &d);
	CHECK(d.emulated && d.backing == KVT_BACK_MEMFD);
	round_trip(t, 3);
	kvt_tier_close(t);

	/* file-backed fabric: the file persists unless temp */
	snprintf(spec, sizeof(spec), "fabric:file=%s/fab,32M", dir);
	CHECK_OK(open_spec(&t, spec, g));
	kvt_tier_info(t, &d);
	CHECK(d.emulated && strstr(d.note, "file"));
	round_trip(t, 4);
	kvt_tier_close(t);
	CHECK_EQ(test_count_entries(dir), 1);
	snprintf(spec, sizeof(spec), "fabric:file=%s/fab,32M,temp", dir);
	CHECK_OK(open_spec(&t, spec, g));
	kvt_tier_close(t);
	CHECK_EQ(test_count_entries(dir), 0);
	/* a directory is not a file */
	snprintf(spec, sizeof(spec), "fabric:file=%s,32M", dir);
	CHECK_ERR(open_spec(&t, spec, g), KVT_ESPEC);

	/* hostdev in both GPU layouts: pages land where the layout says */
	for (int lay = 0; lay < 2; lay++) {
		const kvt_layout *l;
		unsigned char *page = malloc(kvt_geom_page_bytes(g));
		unsigned char *back = malloc(kvt_geom_page_bytes(g));
		kvt_layout pf;
		void *pb[1] = { page };
		uint64_t from = 0, to = 3;

		CHECK_OK(open_spec(&t, lay ? "hostdev:32M,layout=sglang" :
					     "hostdev:32M,populate,mlock", g));
		kvt_tier_info(t, &d);
		CHECK(d.layer_first && d.emulated);
		l = kvt_tier_layout(t);
		CHECK_EQ(l->kind, lay ? KVT_LAYOUT_SGLANG : KVT_LAYOUT_VLLM);
		CHECK(kvt_tier_slot_ptr(t, 0) == NULL);
		round_trip(t, 5 + lay);
		/* kvt_tier_write scatters exactly as the reference does */
		fill(page, kvt_geom_page_bytes(g), 77);
		CHECK_OK(kvt_tier_write(t, 3, page));
		CHECK_OK(kvt_layout_init(&pf, KVT_LAYOUT_PAGE_FIRST, g, 1));
		memset(back, 0, kvt_geom_page_bytes(g));
		pb[0] = back;
		CHECK_OK(kvt_layout_convert_ref(l, kvt_tier_bufs(t), &to, &pf, pb,
						&from, 1));
		CHECK(!memcmp(page, back, kvt_geom_page_bytes(g)));
		kvt_tier_close(t);
		free(page);
		free(back);
	}
}

static void test_ssd(const kvt_geom *g, const char *dir)
{
	char spec[512], sub[400];
	kvt_tier *t;
	kvt_tier_desc d;
	unsigned char *w, *r;
	uint64_t page = kvt_geom_page_bytes(g);
	int fd;
	uint64_t off;

	snprintf(sub, sizeof(sub), "%s/ssd", dir);
	snprintf(spec, sizeof(spec), "ssd:%s,16M,files=3", sub);
	CHECK_OK(open_spec(&t, spec, g));
	kvt_tier_info(t, &d);
	CHECK_EQ(d.slot_bytes % 4096, 0);
	CHECK(d.slot_bytes >= page);
	CHECK_EQ(test_count_entries(sub), 3);
	CHECK(kvt_tier_slot_ptr(t, 0) == NULL);
	CHECK_OK(kvt_tier_ssd_loc(t, 4, &fd, &off));
	CHECK(fd >= 0 && off % 4096 == 0);
	CHECK_ERR(kvt_tier_ssd_loc(t, (uint32_t)d.nslots, &fd, &off), -EINVAL);
	round_trip(t, 9);
	w = malloc(page);
	r = malloc(page);
	fill(w, page, 42);
	CHECK_OK(kvt_tier_write(t, 5, w));
	kvt_tier_close(t);

	/* reopen: same set, data still there */
	CHECK_OK(open_spec(&t, spec, g));
	CHECK_OK(kvt_tier_read(t, 5, r));
	CHECK(!memcmp(w, r, page));
	kvt_tier_close(t);

	/* Regression (issue 10): a set truncated to its 4 KiB header was
	 * reused without a length check */
	snprintf(sub, sizeof(sub), "%s/ssd/kvtier-ssd-001.kvt", dir);
	CHECK_EQ(truncate(sub, 4096), 0);
	CHECK_ERR(open_spec(&t, spec, g), KVT_ECORRUPT);
	CHECK(strstr(kvt_errdetail(), "kvtier-ssd-001.kvt is 4.00 KiB, "
		     "shorter than"));
	CHECK(strstr(kvt_errdetail(), "fresh"));
	CHECK_EQ(truncate(sub, (off_t)(4096 + 2 * d.slot_bytes)), 0);
	CHECK_ERR(open_spec(&t, spec, g), KVT_ECORRUPT);
	snprintf(sub, sizeof(sub), "%s/ssd", dir);
	/* Regression (issue 10): a mismatched header printed its geometry
	 * name raw (binary bytes on the terminal) */
	{
		char p[512], junk[64];
		int hf;

		snprintf(p, sizeof(p), "%s/kvtier-ssd-000.kvt", sub);
		for (int i = 0; i < 64; i++)
			junk[i] = (char)(0x80 + i * 7 % 0x7f);
		junk[0] = 'a';
		junk[1] = '\033';
		hf = open(p, O_WRONLY);
		CHECK(hf >= 0);
		CHECK_EQ(pwrite(hf, junk, 64, 48), 64); /* geometry name */
		CHECK_EQ(pwrite(hf, junk, 8, 24), 8);   /* slot bytes */
		close(hf);
		CHECK_ERR(open_spec(&t, spec, g), KVT_ECORRUPT);
		CHECK(strstr(kvt_errdetail(), "geometry 'a??????"));
		for (const char *c = kvt_errdetail(); *c; c++)
			CHECK(*c >= 0x20 && *c < 0x7f);
	}

	/* another geometry or size is refused, nothing touched */
	snprintf(spec, sizeof(spec), "ssd:%s,32M,files=3", sub);
	CHECK_ERR(open_spec(&t, spec, g), KVT_ECORRUPT);
	CHECK(strstr(kvt_errdetail(), "fresh"));
	CHECK_EQ(test_count_entries(sub), 3);
	/* fresh replaces it; temp removes the names at once (a killed
	 * process leaves no data), and the tier still reads and writes */
	snprintf(spec, sizeof(spec), "ssd:%s,32M,files=3,fresh,temp", sub);
	CHECK_OK(open_spec(&t, spec, g));
	CHECK_EQ(test_count_entries(sub), 0);
	CHECK_OK(kvt_tier_read(t, 5, r));
	round_trip(t, 6);
	kvt_tier_close(t);
	CHECK(access(sub, F_OK) != 0 || test_count_entries(sub) == 0);

	/* a foreign file in the way is refused and left alone */
	{
		FILE *f;
		char p[512];
		snprintf(p, sizeof(p), "%s/kvtier-ssd-000.kvt", sub);
		mkdir(sub, 0700);
		f = fopen(p, "w");
		fputs("not kvtier", f);
		fclose(f);
		snprintf(spec, sizeof(spec), "ssd:%s,16M", sub);
		CHECK_ERR(open_spec(&t, spec, g), KVT_ECORRUPT);
		CHECK_EQ(test_count_entries(sub), 1);
		unlink(p);
	}
	/* more than the disk holds: no files left behind */
	snprintf(spec, sizeof(spec), "ssd:%s/big,100T", dir);
	CHECK_ERR(open_spec(&t, spec, g), -ENOSPC);
	CHECK(strstr(kvt_errdetail(), "free"));
	CHECK(access(spec + 4, F_OK) != 0); /* directory removed */
	/* a file where the directory should be */
	snprintf(spec, sizeof(spec), "ssd:%s/fab2,16M", dir);
	{
		char p[512];
		FILE *f;
		snprintf(p, sizeof(p), "%s/fab2", dir);
		f = fopen(p, "w");
		fclose(f);
		CHECK_ERR(open_spec(&t, spec, g), KVT_ESPEC);
		unlink(p);
	}
	free(w);
	free(r);
}

static void test_impossible(const kvt_geom *g)
{
	kvt_tier *t;
	kvt_machine m;

	kvt_probe(&m);
	CHECK_ERR(open_spec(&t, "dram:1K", g), KVT_ESPEC);
	CHECK(strstr(kvt_errdetail(), "holds no page"));
	CHECK_ERR(open_spec(&t, "dram:64T", g), KVT_ESPEC);
	CHECK(strstr(kvt_errdetail(), "memory"));
	CHECK_ERR(open_spec(&t, "fabric:/dev/dax9.9", g), -ENOENT);
	CHECK_ERR(open_spec(&t, "fabric:/dev/daxnull", g), -ENOENT);
	CHECK_ERR(open_spec(&t, "remote:redis://127.0.0.1:1", g), KVT_ENOTBUILT);
	CHECK_ERR(open_spec(&t, "dram:64M,numa=63", g), KVT_ENODEV);
	if (m.nnodes && m.nodes[0].cpus) {
		char spec[64];
		kvt_tier_desc d;

		snprintf(spec, sizeof(spec), "fabric:numa=%d,32M", m.nodes[0].id);
		CHECK_ERR(open_spec(&t, spec, g), KVT_ESPEC);
		CHECK(strstr(kvt_errdetail(), "allow-cpus"));
		snprintf(spec, sizeof(spec), "fabric:numa=%d,32M,allow-cpus",
			 m.nodes[0].id);
		CHECK_OK(open_spec(&t, spec, g));
		kvt_tier_info(t, &d);
		CHECK(d.emulated && d.numa_node == m.nodes[0].id);
		round_trip(t, 11);
		kvt_tier_close(t);
		snprintf(spec, sizeof(spec), "dram:32M,numa=%d", m.nodes[0].id);
		CHECK_OK(open_spec(&t, spec, g));
		kvt_tier_close(t);
	}
	if (m.hugepages_free == 0)
		CHECK_ERR(open_spec(&t, "dram:64M,hugepages", g), KVT_ESPEC);
	if (!m.cuda_built) {
		CHECK_ERR(open_spec(&t, "hbm:64M", g), KVT_ENOTBUILT);
		CHECK_ERR(open_spec(&t, "dram:64M,pin", g), KVT_ENOTBUILT);
	} else if (!m.ngpus) {
		CHECK_ERR(open_spec(&t, "hbm:64M", g), KVT_ENODEV);
		CHECK_ERR(open_spec(&t, "dram:64M,pin", g), KVT_ENODEV);
	}
}

int main(void)
{
	const char *dir;
	int64_t live = kvt_alloc_live();
	kvt_geom g;

	/* 1 MiB pages */
	CHECK_OK(kvt_geom_preset(&g, "llama-3.1-8b", 8, 1, 0));
	dir = test_dir("tiers-llama");
	test_memory_tiers(&g, dir);
	test_ssd(&g, dir);
	test_impossible(&g);
	/* a page that is not a multiple of 4 KiB: MLA, one token, TP 2 */
	CHECK_OK(kvt_geom_preset(&g, "deepseek-v3", 1, 2, 1));
	CHECK(kvt_geom_page_bytes(&g) % 4096 != 0);
	dir = test_dir("tiers-mla");
	test_memory_tiers(&g, dir);
	test_ssd(&g, dir);
	CHECK_EQ(kvt_alloc_live(), live);
	TEST_DONE();
}
