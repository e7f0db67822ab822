/*
 * test_ssd_persist — the restart-safe ssd tier (ssd:DIR,SIZE,persist):
 * pages stored in one cache are found, loaded bit-exact and verified by
 * the next cache over the same directory; pages demoted from dram come
 * back too (and pages whose parents were only in dram are dropped as
 * orphans); a page whose data was changed on disk fails its checksum at
 * the load, is counted and never served, and its record goes; a torn
 * record is dropped with the chain below it; tenants come back with their
 * salt (another salt drops their pages); another geometry or index format
 * version is refused with a clear error and 'fresh' starts over; opening
 * without 'persist' removes the index; a persistent directory has one
 * owner (a second open, persistent or not, is KVT_EBUSY); spec errors;
 * and a failed
 * allocation at every point of a rebuilding open leaves the records
 * whole; a restart says in one log line what it recovered (issue 21,
 * finding 11: nothing was logged), at info, at warning level when it
 * dropped records.
 *
 * The crash test (kill -9 in a store burst) is test_cache_crash.c.
 */
#include "cache_util.h"

#include <fcntl.h>
#include <sys/stat.h>

#define P 4
#define NB 64

static kvt_geom geom;
static char dir[600], spec[1024];

static int open_geom(kvt_cache **c, const char *s, const kvt_geom *g,
		     unsigned flags)
{
	kvt_cache_config cfg = KVT_CACHE_CONFIG_INIT;

	cfg.tiers = s;
	cfg.geom = g;
	cfg.flags = flags | KVT_CACHE_NO_BACKGROUND;
	return kvt_cache_open(c, &cfg);
}

/* A cache over the persistent ssd directory (optionally a dram tier in
 * front, options after the ssd size), with engine memory registered; a
 * failed open ends the test. */
static kvt_cache *reopen(eng *e, const char *dram, const char *opts)
{
	kvt_cache *c = NULL;
	int err;

	snprintf(spec, sizeof(spec), "%s%sssd:%s,1M,persist%s%s",
		 dram ? dram : "", dram ? " " : "", dir, opts ? "," : "",
		 opts ? opts : "");
	if ((err = open_geom(&c, spec, &geom, 0))) {
		/* nothing after this could be checked */
		fprintf(stderr, "open %s: %s (%s)\n", spec, kvt_strerror(err),
			kvt_errdetail());
		exit(1);
	}
	CHECK_OK(eng_register(c, e));
	return c;
}

static kvt_cache_restore restored(kvt_cache *c)
{
	kvt_cache_restore r;

	memset(&r, 0xff, sizeof(r));
	CHECK_OK(kvt_cache_restore_info(c, &r));
	return r;
}

/* Store session @s's first @n pages for @tenant from blocks 0..n-1. */
static void store_session(kvt_cache *c, const eng *e, uint32_t tenant,
			  uint32_t s, size_t n, kvt_page_key *k)
{
	uint32_t b[NB];

	for (size_t i = 0; i < n; i++)
		b[i] = (uint32_t)i;
	CHECK_OK(session_keys(c, tenant, s, n, k));
	eng_fill(e, k, n, 0, b);
	CHECK_OK(cache_store_wait(c, tenant, k, n, 0, b, NULL));
}

/* Load session @s's first @n pages into blocks 32.. and check each one:
 * returns how many leading pages lookup reported and loaded bit-exact. */
static size_t served(kvt_cache *c, eng *e, uint32_t tenant, uint32_t s,
		     size_t n)
{
	kvt_cache_lookup_result r;
	kvt_page_key k[NB];
	uint32_t d[NB];

	CHECK_OK(session_keys(c, tenant, s, n, k));
	CHECK_OK(kvt_cache_lookup(c, tenant, k, n, 0, &r));
	for (size_t i = 0; i < r.pages; i++) {
		d[i] = (uint32_t)(32 + i);
		eng_poison(e, d[i]);
	}
	if (!r.pages)
		return 0;
	CHECK_OK(cache_load_wait(c, tenant, k, r.pages, 0, d, NULL, NULL,
				 NULL));
	for (size_t i = 0; i < r.pages; i++)
		CHECK(eng_block_is(e, d[i], k[i]));
	return r.pages;
}

static void verify_all(kvt_cache *c, uint64_t want)
{
	kvt_cache_check chk;

	CHECK_OK(kvt_cache_verify(c, &chk));
	CHECK_EQ(chk.bad, 0);
	CHECK_EQ(chk.per_tier[KVT_TIER_SSD], want);
	CHECK_OK(kvt_index_check(kvt_cache_index(c)));
}

/* The ssd slot of page @i of session @s (tenant 0). */
static uint32_t ssd_slot(kvt_cache *c, uint32_t s, size_t i)
{
	kvt_page_key k[NB];
	kvt_page_info info[NB];
	kvt_prefix px = { .keys = k, .nkeys = i + 1 };
	size_t found = 0;

	CHECK_OK(session_keys(c, 0, s, i + 1, k));
	CHECK_OK(kvt_index_inspect(kvt_cache_index(c), &px, info, NB, &found));
	CHECK_EQ(found, i + 1);
	return found == i + 1 ? info[i].slot[KVT_TIER_SSD] : 0;
}

/* Overwrite @n bytes at @off of file @name in the ssd directory. */
static void poke(const char *name, uint64_t off, const void *buf, size_t n)
{
	char path[700];
	int fd;

	snprintf(path, sizeof(path), "%s/%s", dir, name);
	fd = open(path, O_RDWR);
	CHECK(fd >= 0);
	if (fd < 0)
		return;
	CHECK(pwrite(fd, buf, n, (off_t)off) == (ssize_t)n);
	close(fd);
}

/* ---- round trips ------------------------------------------------------ */

static void test_round_trip(void)
{
	kvt_page_key k[NB];
	kvt_cache_restore r;
	kvt_cache *c;
	eng e;

	CHECK_OK(eng_init(&e, &geom, NB, ENG_KV_OUTER, 64, -1));
	c = reopen(&e, NULL, "fresh");
	r = restored(c);
	CHECK_EQ(r.records, 0);
	/* three sessions; 2 shares session 1's pages? no: each its own */
	store_session(c, &e, 0, 1, 8, k);
	store_session(c, &e, 0, 2, 5, k);
	store_session(c, &e, 0, 3, 1, k);
	kvt_cache_close(c);

	c = reopen(&e, NULL, NULL);
	r = restored(c);
	CHECK_EQ(r.records, 14);
	CHECK_EQ(r.restored, 14);
	CHECK_EQ(r.bad_records + r.orphans + r.duplicates + r.failed, 0);
	CHECK(r.rebuild_s >= r.scan_s && r.rebuild_s < 5);
	CHECK_EQ(served(c, &e, 0, 1, 8), 8);
	CHECK_EQ(served(c, &e, 0, 2, 5), 5);
	CHECK_EQ(served(c, &e, 0, 3, 1), 1);
	verify_all(c, 14);
	/* a store that extends a restored chain, and a third open */
	store_session(c, &e, 0, 1, 12, k);
	kvt_cache_close(c);
	c = reopen(&e, NULL, NULL);
	CHECK_EQ(restored(c).restored, 18);
	CHECK_EQ(served(c, &e, 0, 1, 12), 12);
	verify_all(c, 18);
	kvt_cache_close(c);
	eng_free(&e);
}

/* dram (8 pages) in front: what was demoted to ssd comes back, pages
 * whose parent was only in dram are orphans. */
static void test_demoted(void)
{
	kvt_page_key k[NB];
	kvt_cache_restore r;
	kvt_index_stat ist;
	kvt_cache *c;
	uint64_t in_ssd, total = 0;
	eng e;

	CHECK_OK(eng_init(&e, &geom, NB, ENG_BLOCK_OUTER, 64, -1));
	c = reopen(&e, "dram:64K", "fresh");
	for (uint32_t s = 10; s < 16; s++)
		store_session(c, &e, 0, s, 6, k);
	kvt_index_stat_get(kvt_cache_index(c), &ist);
	in_ssd = ist.resident[KVT_TIER_SSD];
	CHECK(in_ssd >= 20); /* 36 pages, 8 fit in dram */
	kvt_cache_close(c);

	c = reopen(&e, "dram:64K", NULL);
	r = restored(c);
	CHECK_EQ(r.records, in_ssd);
	CHECK_EQ(r.restored + r.orphans, in_ssd);
	CHECK(r.restored > 0);
	for (uint32_t s = 10; s < 16; s++)
		total += served(c, &e, 0, s, 6);
	CHECK_EQ(total, r.restored);
	verify_all(c, r.restored);
	fprintf(stderr, "demoted: %llu in ssd, %llu restored, %llu orphans\n",
		(unsigned long long)in_ssd, (unsigned long long)r.restored,
		(unsigned long long)r.orphans);
	kvt_cache_close(c);
	eng_free(&e);
}

/* ---- damage ------------------------------------------------------------ */

static void test_tampered_data(void)
{
	kvt_cache_lookup_result lr;
	kvt_cache_stat st;
	kvt_page_key k[NB];
	uint32_t d[4] = { 40, 41, 42, 43 }, failed[4];
	unsigned char junk[64];
	kvt_cache_restore r;
	kvt_cache *c;
	long nf = 0;
	uint32_t slot;
	eng e;

	CHECK_OK(eng_init(&e, &geom, NB, ENG_KV_OUTER, 64, -1));
	c = reopen(&e, NULL, "fresh");
	store_session(c, &e, 0, 20, 4, k);
	slot = ssd_slot(c, 20, 2);
	kvt_cache_close(c);
	/* page 2's layer 1 changes on disk (one file: slot s at 4096 + s *
	 * slot bytes; 8 KiB pages) */
	memset(junk, 0x5a, sizeof(junk));
	poke("kvtier-ssd-000.kvt", 4096 + (uint64_t)slot * 8192 + 2048 + 100,
	     junk, sizeof(junk));

	c = reopen(&e, NULL, NULL);
	CHECK_EQ(restored(c).restored, 4); /* the data is not read at open */
	for (int i = 0; i < 4; i++)
		eng_poison(&e, d[i]);
	CHECK_ERR(cache_load_wait(c, 0, k, 4, 0, d, failed, &nf, NULL),
		  KVT_ECORRUPT);
	CHECK_EQ(nf, 1);
	CHECK_EQ(failed[0], d[2]);
	CHECK(eng_block_is(&e, d[0], k[0]) && eng_block_is(&e, d[3], k[3]));
	kvt_cache_stat_get(c, &st);
	CHECK_EQ(st.corrupt, 1);
	/* never served again */
	CHECK_OK(kvt_cache_lookup(c, 0, k, 4, 0, &lr));
	CHECK_EQ(lr.pages, 2);
	kvt_cache_close(c);
	/* its record went with it: page 3 is an orphan now */
	c = reopen(&e, NULL, NULL);
	r = restored(c);
	CHECK_EQ(r.restored, 2);
	CHECK_EQ(r.orphans, 1);
	CHECK_EQ(served(c, &e, 0, 20, 4), 2);
	verify_all(c, 2);
	kvt_cache_close(c);
	eng_free(&e);
}

static void test_torn_record(void)
{
	kvt_page_key k[NB];
	kvt_cache_restore r;
	kvt_cache *c;
	unsigned char x = 0x77;
	uint32_t slot, rb = (uint32_t)KVT_SSD_REC_BYTES(4);
	eng e;

	CHECK_OK(eng_init(&e, &geom, NB, ENG_KV_OUTER, 64, -1));
	c = reopen(&e, NULL, "fresh");
	store_session(c, &e, 0, 30, 4, k);
	store_session(c, &e, 0, 31, 2, k);
	slot = ssd_slot(c, 30, 1);
	kvt_cache_close(c);
	/* one byte of page 1's key in its record */
	poke("kvtier-ssd-index.kvt", 4096 + (uint64_t)slot * rb + 20, &x, 1);
	c = reopen(&e, NULL, NULL);
	r = restored(c);
	CHECK_EQ(r.bad_records, 1);
	CHECK_EQ(r.records, 5);
	CHECK_EQ(r.orphans, 2);
	CHECK_EQ(r.restored, 3);
	CHECK_EQ(served(c, &e, 0, 30, 4), 1);
	CHECK_EQ(served(c, &e, 0, 31, 2), 2);
	verify_all(c, 3);
	kvt_cache_close(c);
	eng_free(&e);
}

/* reopen() with the log at @level and stderr in @out (@max bytes). */
static kvt_cache *reopen_logged(eng *e, const char *opts, int level,
				char *out, size_t max)
{
	int saved = dup(2), old = kvt_log_get_level();
	FILE *f = tmpfile();
	kvt_cache *c;
	size_t n = 0;

	CHECK(saved >= 0 && f);
	fflush(stderr);
	dup2(fileno(f), 2);
	kvt_log_set_level(level);
	c = reopen(e, NULL, opts);
	kvt_log_set_level(old);
	fflush(stderr);
	dup2(saved, 2);
	close(saved);
	rewind(f);
	n = fread(out, 1, max - 1, f);
	out[n] = 0;
	fclose(f);
	fputs(out, stderr); /* the log, for whoever reads the test's */
	return c;
}

static void test_restart_log(void)
{
	uint32_t slot, rb = (uint32_t)KVT_SSD_REC_BYTES(4);
	unsigned char x = 0x77;
	kvt_page_key k[NB];
	char log[4096];
	kvt_cache *c;
	eng e;

	CHECK_OK(eng_init(&e, &geom, NB, ENG_KV_OUTER, 64, -1));
	c = reopen(&e, NULL, "fresh");
	store_session(c, &e, 0, 40, 4, k);
	store_session(c, &e, 0, 41, 2, k);
	slot = ssd_slot(c, 40, 1);
	kvt_cache_close(c);
	/* a clean restart: info */
	c = reopen_logged(&e, NULL, KVT_LOG_INFO, log, sizeof(log));
	CHECK(strstr(log, "kvtier: info: cache: persistent ssd tier: 6 pages "
		      "restored of 6 records (0 tenants re-created; dropped: "
		      "0 bad, 0 orphans, 0 duplicates, 0 refused) in "));
	kvt_cache_close(c);
	c = reopen_logged(&e, NULL, KVT_LOG_WARN, log, sizeof(log));
	CHECK(!strstr(log, "persistent ssd tier"));
	kvt_cache_close(c);
	/* one torn record (and the two pages after it): a warning */
	poke("kvtier-ssd-index.kvt", 4096 + (uint64_t)slot * rb + 20, &x, 1);
	c = reopen_logged(&e, NULL, KVT_LOG_WARN, log, sizeof(log));
	CHECK(strstr(log, "kvtier: warning: cache: persistent ssd tier: 3 "
		      "pages restored of 5 records (0 tenants re-created; "
		      "dropped: 1 bad, 2 orphans, 0 duplicates, 0 refused) "
		      "in "));
	kvt_cache_close(c);
	eng_free(&e);
}

/* A record of page 1 copied to a free slot (its slot field and checksum
 * made right): the older of the two is dropped. Newer at the copy's slot,
 * whose data is not the page: the load catches it, counts it, serves the
 * page before it only. */
static void test_duplicates(void)
{
	uint32_t rb = (uint32_t)KVT_SSD_REC_BYTES(4), slot, copy = 100;
	unsigned char rec[KVT_SSD_REC_BYTES(4)];
	kvt_page_key k[NB];
	kvt_cache_stat st;
	kvt_cache_restore r;
	char path[700];
	kvt_cache *c;
	eng e;

	CHECK_OK(eng_init(&e, &geom, NB, ENG_KV_OUTER, 64, -1));
	snprintf(path, sizeof(path), "%s/kvtier-ssd-index.kvt", dir);
	for (int newer = 0; newer < 2; newer++) {
		uint64_t gen, check;
		FILE *f;

		c = reopen(&e, NULL, "fresh");
		store_session(c, &e, 0, 70, 3, k);
		slot = ssd_slot(c, 70, 1);
		CHECK(slot != copy);
		kvt_cache_close(c);
		f = fopen(path, "rb");
		CHECK(f && fseek(f, 4096 + (long)slot * rb, SEEK_SET) == 0 &&
		      fread(rec, rb, 1, f) == 1);
		if (f)
			fclose(f);
		memcpy(&gen, rec + 8, 8);
		gen = newer ? gen + 1000 : gen - 1;
		memcpy(rec + 8, &gen, 8);
		memcpy(rec + 72, &copy, 4);
		check = XXH3_64bits(rec, 80 + 8 * 4);
		memcpy(rec + 80 + 8 * 4, &check, 8);
		poke("kvtier-ssd-index.kvt", 4096 + (uint64_t)copy * rb, rec, rb);

		c = reopen(&e, NULL, NULL);
		r = restored(c);
		CHECK_EQ(r.records, 4);
		CHECK_EQ(r.duplicates, 1);
		CHECK_EQ(r.restored, 3);
		CHECK_EQ(ssd_slot(c, 70, 1), newer ? copy : slot);
		if (newer) {
			uint32_t d[3] = { 50, 51, 52 }, failed[3];
			long nf = 0;

			CHECK_ERR(cache_load_wait(c, 0, k, 3, 0, d, failed, &nf,
						  NULL), KVT_ECORRUPT);
			CHECK_EQ(nf, 1);
			CHECK_EQ(failed[0], d[1]);
		}
		CHECK_EQ(served(c, &e, 0, 70, 3), newer ? 1 : 3);
		kvt_cache_stat_get(c, &st);
		CHECK_EQ(st.corrupt, (uint64_t)newer);
		kvt_cache_close(c);
	}
	eng_free(&e);
}

/* ---- tenants -------------------------------------------------------------- */

static void test_tenants(void)
{
	kvt_page_key k[NB], k2[NB];
	kvt_cache *c;
	eng e;

	CHECK_OK(eng_init(&e, &geom, NB, ENG_KV_OUTER, 64, -1));
	c = reopen(&e, NULL, "fresh");
	CHECK_OK(kvt_cache_tenant_add(c, 7, 99));
	store_session(c, &e, 7, 40, 3, k);
	store_session(c, &e, 0, 40, 2, k2);
	kvt_cache_close(c);

	c = reopen(&e, NULL, NULL);
	CHECK_EQ(restored(c).tenants, 1);
	/* the tenant is back before it is added, and adding it keeps it */
	CHECK_EQ(served(c, &e, 7, 40, 3), 3);
	CHECK_OK(kvt_cache_tenant_add(c, 7, 99));
	CHECK_ERR(kvt_cache_tenant_add(c, 7, 99), -EEXIST);
	CHECK_EQ(served(c, &e, 7, 40, 3), 3);
	CHECK_EQ(served(c, &e, 0, 40, 2), 2);
	kvt_cache_close(c);

	/* added with another salt: its old pages go, tenant 0's stay */
	c = reopen(&e, NULL, NULL);
	CHECK_OK(kvt_cache_tenant_add(c, 7, 100));
	CHECK_EQ(served(c, &e, 7, 40, 3), 0);
	CHECK_EQ(served(c, &e, 0, 40, 2), 2);
	verify_all(c, 2);
	kvt_cache_close(c);
	c = reopen(&e, NULL, NULL);
	CHECK_EQ(restored(c).restored, 2);
	kvt_cache_close(c);
	eng_free(&e);
}

/* ---- refusals, options ------------------------------------------------------ */

static void test_refusals(void)
{
	kvt_page_key k[NB];
	kvt_geom g6;
	kvt_cache *c = NULL;
	uint32_t v = 2;
	char s[700], path[700];
	struct stat sb;
	eng e;

	CHECK_OK(eng_init(&e, &geom, NB, ENG_KV_OUTER, 64, -1));
	c = reopen(&e, NULL, "fresh");
	store_session(c, &e, 0, 50, 3, k);
	kvt_cache_close(c);
	snprintf(s, sizeof(s), "ssd:%s,1M,persist", dir);

	/* another geometry (same page bytes, other layer count: 6 layers of
	 * P = 4 is 12 KiB; so the data files are refused first, or the
	 * index: either names the geometry) */
	small_geom(&g6, 6, P);
	CHECK_ERR(open_geom(&c, s, &g6, 0), KVT_ECORRUPT);
	CHECK(strstr(kvt_errdetail(), "fresh") != NULL);
	/* same shape, another model name: the index refuses */
	g6 = geom;
	snprintf(g6.name, sizeof(g6.name), "other-model");
	CHECK_ERR(open_geom(&c, s, &g6, 0), KVT_ECORRUPT);
	CHECK(strstr(kvt_errdetail(), "geometry") != NULL);
	CHECK(strstr(kvt_errdetail(), "other-model") != NULL);
	/* another format version */
	poke("kvtier-ssd-index.kvt", 8, &v, 4);
	CHECK_ERR(open_geom(&c, s, &geom, 0), KVT_ECORRUPT);
	CHECK(strstr(kvt_errdetail(), "version 2") != NULL);
	/* 'fresh' starts over */
	c = reopen(&e, NULL, "fresh");
	CHECK_EQ(restored(c).records, 0);
	CHECK_EQ(served(c, &e, 0, 50, 3), 0);
	store_session(c, &e, 0, 50, 3, k);
	kvt_cache_close(c);
	/* spec and flag errors */
	snprintf(s, sizeof(s), "ssd:%s,1M,persist,temp", dir);
	CHECK_ERR(open_geom(&c, s, &geom, 0), KVT_ESPEC);
	CHECK_ERR(open_geom(&c, "dram:1M,persist", &geom, 0), KVT_ESPEC);
	snprintf(s, sizeof(s), "ssd:%s,1M,persist", dir);
	CHECK_ERR(open_geom(&c, s, &geom, KVT_CACHE_NO_VERIFY), -EINVAL);
	CHECK(strstr(kvt_errdetail(), "checksums") != NULL);
	/* still whole after all that; while it is open, nobody else opens
	 * the directory, persistent or not (which would drop the records) */
	c = reopen(&e, NULL, NULL);
	{
		kvt_cache *c2 = NULL;

		CHECK_ERR(open_geom(&c2, s, &geom, 0), KVT_EBUSY);
		snprintf(path, sizeof(path), "ssd:%s,1M", dir);
		CHECK_ERR(open_geom(&c2, path, &geom, 0), KVT_EBUSY);
		CHECK(strstr(kvt_errdetail(), "persistent") != NULL);
	}
	CHECK_EQ(served(c, &e, 0, 50, 3), 3);
	kvt_cache_close(c);
	/* opened without 'persist': the records go, the next open is empty;
	 * two plain tiers may share a directory (as before) */
	snprintf(s, sizeof(s), "ssd:%s,1M", dir);
	CHECK_OK(open_geom(&c, s, &geom, 0));
	CHECK_ERR(kvt_cache_restore_info(c, &(kvt_cache_restore){ 0 }), -EINVAL);
	{
		kvt_cache *c2 = NULL;

		CHECK_OK(open_geom(&c2, s, &geom, 0));
		kvt_cache_close(c2);
		snprintf(path, sizeof(path), "ssd:%s,1M,persist", dir);
		CHECK_ERR(open_geom(&c2, path, &geom, 0), KVT_EBUSY);
	}
	kvt_cache_close(c);
	snprintf(path, sizeof(path), "%s/kvtier-ssd-index.kvt", dir);
	CHECK(stat(path, &sb) < 0 && errno == ENOENT);
	c = reopen(&e, NULL, NULL);
	CHECK_EQ(restored(c).records, 0);
	CHECK_EQ(served(c, &e, 0, 50, 3), 0);
	kvt_cache_close(c);
	eng_free(&e);
}

/* A failed allocation at every point of a rebuilding open: a clean error,
 * nothing leaked, and the records still whole for the next open. */
static void test_open_faults(void)
{
	kvt_page_key k[NB];
	kvt_cache *c;
	uint64_t before, points;
	int failed = 0;
	eng e;

	CHECK_OK(eng_init(&e, &geom, NB, ENG_KV_OUTER, 64, -1));
	c = reopen(&e, NULL, "fresh");
	store_session(c, &e, 0, 60, 6, k);
	store_session(c, &e, 0, 61, 3, k);
	kvt_cache_close(c);
	snprintf(spec, sizeof(spec), "ssd:%s,1M,persist", dir);
	before = kvt_alloc_count();
	CHECK_OK(open_geom(&c, spec, &geom, 0));
	points = kvt_alloc_count() - before;
	kvt_cache_close(c);
	for (uint64_t n = 1; n <= points; n++) {
		int64_t live = kvt_alloc_live();
		int err;

		kvt_alloc_fail_at(n);
		err = open_geom(&c, spec, &geom, 0);
		kvt_alloc_fail_at(0);
		if (!err) {
			kvt_cache_close(c);
			continue;
		}
		failed++;
		CHECK(err == -ENOMEM || err == -EAGAIN); /* EAGAIN: threads */
		CHECK_EQ(kvt_alloc_live(), live);
	}
	CHECK(failed > 5);
	c = reopen(&e, NULL, NULL);
	CHECK_EQ(restored(c).restored, 9);
	CHECK_EQ(served(c, &e, 0, 60, 6), 6);
	kvt_cache_close(c);
	fprintf(stderr, "open faults: %llu allocations, %d failures injected\n",
		(unsigned long long)points, failed);
	eng_free(&e);
}

int main(void)
{
	int64_t live = kvt_alloc_live();

	snprintf(dir, sizeof(dir), "%s/ssd", test_dir("ssd_persist"));
	small_geom(&geom, 4, P); /* 8 KiB pages, 128 slots in 1M */
	test_watchdog(120);
	test_phase = "round trip";
	test_round_trip();
	test_phase = "demoted";
	test_demoted();
	test_phase = "tampered data";
	test_tampered_data();
	test_phase = "torn record";
	test_torn_record();
	test_phase = "restart log";
	test_restart_log();
	test_phase = "duplicates";
	test_duplicates();
	test_phase = "tenants";
	test_tenants();
	test_phase = "refusals";
	test_refusals();
	test_phase = "open faults";
	test_open_faults();
	CHECK_EQ(kvt_alloc_live(), live);
	TEST_DONE();
}
