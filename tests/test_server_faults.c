/*
 * test_server_faults — the daemon's ssd tier misbehaving under its clients:
 *
 *   - an ssd tier larger than its file system's free space: the daemon
 *     refuses to start, saying so (-ENOSPC), and leaves nothing behind;
 *   - pages pushed down to ssd, then the slot file overwritten behind the
 *     daemon's back: loads of those pages fail (their blocks on the failed
 *     list, KVT_ECORRUPT), no block a load reports good differs from what
 *     was stored, the daemon counts checksum failures and keeps serving;
 *   - the slot file cut short (an I/O error on every read past the cut):
 *     loads fail the same way, stores of new pages still work (they land
 *     in dram), the daemon does not crash.
 */
#include "server_util.h"

#include <cjson/cJSON.h>
#include <fcntl.h>

#define NB 64
#define NP 4    /* pages per session */
#define NS 6    /* sessions */

static char sock[108];
static const char *model;

/* Store @n pages of session @s; their keys in @keys. */
static void store_session(kvt_client *cl, srv_mem *sm, uint32_t s,
			  kvt_page_key *keys, size_t n)
{
	uint32_t tok[NP * SRV_P], blk[NP];
	kvt_client_job *j;

	srv_tokens(s, tok, n * SRV_P);
	CHECK_OK(kvt_client_hash_tokens(cl, tok, n * SRV_P, keys));
	for (uint32_t i = 0; i < n; i++) {
		blk[i] = i;
		srv_fill(sm, i, keys[i]);
	}
	int err = kvt_client_store(cl, sm->m, keys, n, 0, blk, &j);

	CHECK_OK(err);
	if (!err)
		CHECK_OK(srv_job_end(j, NULL));
}

/* Load @n pages into blocks NP.. and check: every block is either on the
 * failed list or holds its page. Returns the failed count. */
static long load_check(kvt_client *cl, srv_mem *sm, const kvt_page_key *keys,
		       size_t n, int *result)
{
	uint32_t blk[NP], failed[NP];
	kvt_client_job *j;
	long nf;

	for (uint32_t i = 0; i < n; i++) {
		blk[i] = NP + i;
		srv_zero(sm, blk[i]);
	}
	int err = kvt_client_load(cl, sm->m, keys, n, 0, blk, &j);

	CHECK_OK(err);
	if (err)
		return -1;
	*result = kvt_client_job_wait(j, 30ll * 1000000000);
	nf = kvt_client_job_failed(j, failed, NP);
	for (uint32_t i = 0; i < n; i++) {
		int f = 0;

		for (long k = 0; k < nf; k++)
			f |= failed[k] == blk[i];
		if (!f && !srv_holds(sm, blk[i], keys[i])) {
			fprintf(stderr, "block %u reported loaded, wrong bytes\n",
				blk[i]);
			kvt_test_failures++;
		}
	}
	kvt_client_job_free(j);
	return nf;
}

/* A tenant counter of tier @tier in STATS (the first tenant), or -1. */
static double tenant_tier_num(kvt_client *cl, const char *tier,
			      const char *name)
{
	char *js = NULL;
	double v = -1;
	cJSON *root, *t, *x;

	if (kvt_client_stats(cl, &js))
		return -1;
	root = cJSON_Parse(js);
	t = cJSON_GetArrayItem(cJSON_GetObjectItem(root, "tenants"), 0);
	x = cJSON_GetObjectItem(cJSON_GetObjectItem(cJSON_GetObjectItem(t,
				"tiers"), tier), name);
	if (cJSON_IsNumber(x))
		v = x->valuedouble;
	cJSON_Delete(root);
	free(js);
	return v;
}

static double cache_num(kvt_client *cl, const char *name)
{
	char *js = NULL;
	double v = -1;
	cJSON *root, *x;

	if (kvt_client_stats(cl, &js))
		return -1;
	root = cJSON_Parse(js);
	x = cJSON_GetObjectItem(cJSON_GetObjectItem(root, "cache"), name);
	if (cJSON_IsNumber(x))
		v = x->valuedouble;
	cJSON_Delete(root);
	free(js);
	return v;
}

int main(void)
{
	kvtd_config cfg = { 0 };
	char tiers[700], ssd[600], path[700];
	const char *dir = test_dir("server-faults");
	kvt_page_key keys[NS][NP], k2[NS][NP];
	kvt_cache_lookup_result lr;
	kvt_client *cl = NULL;
	srv_mem sm;
	kvtd *d = NULL;
	pid_t pid;
	int res = 0, fd;
	long nf;

	snprintf(sock, sizeof(sock), "/tmp/kvtd-faults-%d.sock", (int)getpid());
	model = srv_model();
	cfg.socket = sock;
	cfg.model = model;
	cfg.page_tokens = SRV_P;

	/* a tier the disk cannot hold */
	snprintf(ssd, sizeof(ssd), "%s/huge", dir);
	snprintf(tiers, sizeof(tiers), "dram:1M,ssd:%s,30T", ssd);
	cfg.tiers = tiers;
	CHECK_ERR(kvtd_open(&d, &cfg), -ENOSPC);
	CHECK(strstr(kvt_errdetail(), "free") != NULL);
	CHECK(access(ssd, F_OK) != 0);
	CHECK(access(sock, F_OK) != 0);

	/* dram for 2 sessions: the others go to ssd */
	snprintf(ssd, sizeof(ssd), "%s/ssd", dir);
	snprintf(tiers, sizeof(tiers), "dram:%u,ssd:%s,4M",
		 2 * NP * SRV_L * 2 * SRV_P * 2 * 64 * 2, ssd);
	pid = srv_start(&cfg);
	CHECK(pid > 0);
	if (pid <= 0)
		TEST_DONE();
	CHECK_OK(srv_connect(&cl, sock, model, 0, 1, 0));
	if (!cl)
		TEST_DONE();
	CHECK_OK(srv_mem_alloc(cl, &sm, NB));
	for (uint32_t s = 0; s < NS; s++)
		store_session(cl, &sm, s + 1, keys[s], NP);
	CHECK_OK(kvt_client_quiesce(cl));
	CHECK_OK(kvt_client_lookup(cl, keys[0], NP, 0, &lr));
	CHECK_EQ(lr.pages, NP);
	CHECK_EQ(lr.tier_pages[KVT_TIER_SSD], NP);
	for (uint32_t s = 0; s < NS; s++) {
		nf = load_check(cl, &sm, keys[s], NP, &res);
		CHECK_EQ(nf, 0);
		CHECK_EQ(res, 0);
	}

	/* overwrite the slot file past its header */
	snprintf(path, sizeof(path), "%s/kvtier-ssd-000.kvt", ssd);
	fd = open(path, O_WRONLY);
	CHECK(fd >= 0);
	if (fd >= 0) {
		static char junk[1 << 16];

		memset(junk, 0x5a, sizeof(junk));
		for (off_t o = 4096; o < (4 << 20); o += sizeof(junk))
			CHECK(pwrite(fd, junk, sizeof(junk), o) ==
			      (ssize_t)sizeof(junk));
		fsync(fd);
		close(fd);
	}
	nf = load_check(cl, &sm, keys[0], NP, &res);
	CHECK(nf > 0);
	CHECK_EQ(res, KVT_ECORRUPT);
	CHECK(cache_num(cl, "checksum_failures") > 0);
	CHECK(tenant_tier_num(cl, "ssd", "read_failures") > 0);
	CHECK(tenant_tier_num(cl, "ssd", "checksum_failures") > 0);
	/* corrupt pages are dropped, never served: asked again, they are
	 * absent from the index (the leading run ends at the first) */
	CHECK_OK(kvt_client_lookup(cl, keys[0], NP, 0, &lr));
	CHECK(lr.pages < NP);

	/* cut the file: reads past the end fail */
	for (uint32_t s = 0; s < NS; s++)
		store_session(cl, &sm, 100 + s, k2[s], NP);
	CHECK_OK(kvt_client_quiesce(cl));
	CHECK_OK(kvt_client_lookup(cl, k2[0], NP, 0, &lr));
	CHECK_EQ(lr.tier_pages[KVT_TIER_SSD], NP);
	CHECK(truncate(path, 8192) == 0);
	nf = load_check(cl, &sm, k2[0], NP, &res);
	CHECK(nf > 0);
	CHECK(res != 0);
	/* the daemon still serves: a new store and its load from dram */
	store_session(cl, &sm, 999, keys[0], NP);
	nf = load_check(cl, &sm, keys[0], NP, &res);
	CHECK_EQ(nf, 0);
	CHECK_EQ(res, 0);
	kvt_client_close(cl);
	CHECK_EQ(srv_stop(pid), 0);
	unlink(model);
	TEST_DONE();
}
