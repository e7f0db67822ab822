/*
 * test_server_lease — a job's lease ends at its deadline: with a 10 ms
 * lease (the reaper wakes at the earliest lease's end, not on a 50 ms
 * tick), a load big enough to outlive it (512 MiB of Llama-3.1-8B pages;
 * it took 29-33 ms on a quiet 2-core VM, so a 40 ms lease was outrun)
 * is cancelled by the daemon, not by the client. The client sees -ECANCELED, the blocks not loaded on the failed
 * list and every other block right; the daemon counts the expiry
 * (kvtier_lease_expiries_total{reason="deadline"}) and its pins are gone
 * (the same pages can be stored over and loaded again afterwards).
 */
#include "server_util.h"

#include <cjson/cJSON.h>

#define NPG 128      /* 4 MiB pages: 512 MiB */
#define STEP 1       /* pages per store job: short enough to beat the lease
			(one caught by it is stored again) */

static char sock[108];

static void fill(const kvt_geom *g, void *const *base, uint64_t bs,
		 uint64_t ks, uint32_t b, kvt_page_key key)
{
	uint64_t chunk = kvt_geom_chunk_bytes(g);

	for (uint32_t l = 0; l < g->layers; l++)
		for (uint32_t k = 0; k < 2; k++) {
			uint64_t *p = (uint64_t *)((uint8_t *)base[l] + b * bs +
						   k * ks);
			uint64_t v = key.lo ^ (key.hi << 1) ^ ((uint64_t)l << 40) ^
				     ((uint64_t)k << 56);

			for (uint64_t i = 0; i < chunk / 8; i++)
				p[i] = v + i;
		}
}

static int holds(const kvt_geom *g, void *const *base, uint64_t bs,
		 uint64_t ks, uint32_t b, kvt_page_key key)
{
	uint64_t chunk = kvt_geom_chunk_bytes(g);

	for (uint32_t l = 0; l < g->layers; l++)
		for (uint32_t k = 0; k < 2; k++) {
			const uint64_t *p = (const uint64_t *)((uint8_t *)base[l] +
							       b * bs + k * ks);
			uint64_t v = key.lo ^ (key.hi << 1) ^ ((uint64_t)l << 40) ^
				     ((uint64_t)k << 56);

			for (uint64_t i = 0; i < chunk / 8; i += 997)
				if (p[i] != v + i)
					return 0;
		}
	return 1;
}

static double deadline_expiries(kvt_client *cl)
{
	char *js = NULL;
	double v = -1;
	cJSON *root, *t;

	if (kvt_client_stats(cl, &js))
		return -1;
	root = cJSON_Parse(js);
	cJSON_ArrayForEach(t, cJSON_GetObjectItem(root, "tenants")) {
		cJSON *x = cJSON_GetObjectItem(cJSON_GetObjectItem(t,
					"lease_expiries"), "deadline");
		if (cJSON_IsNumber(x))
			v = (v < 0 ? 0 : v) + x->valuedouble;
	}
	cJSON_Delete(root);
	free(js);
	return v;
}

int main(void)
{
	kvtd_config cfg = { 0 };
	kvt_client_config cc = KVT_CLIENT_CONFIG_INIT;
	kvt_client *cl = NULL;
	kvt_client_mem *m = NULL;
	kvt_page_key keys[NPG];
	uint32_t blk[NPG], failed[NPG];
	void *base[128];
	uint64_t bs, ks;
	const kvt_geom *g;
	int cancelled = 0;
	pid_t pid;

	snprintf(sock, sizeof(sock), "/tmp/kvtd-lease-%d.sock", (int)getpid());
	cfg.socket = sock;
	cfg.tiers = "dram:600M";
	cfg.model = "llama-3.1-8b";
	cfg.page_tokens = 32;
	cfg.lease_ms = 10;
	pid = srv_start(&cfg);
	CHECK(pid > 0);
	if (pid <= 0)
		TEST_DONE();
	cc.socket = sock;
	cc.model = "llama-3.1-8b";
	cc.page_tokens = 32;
	CHECK_OK(kvt_client_connect(&cl, &cc));
	if (!cl)
		TEST_DONE();
	g = kvt_client_geom(cl);
	CHECK_OK(kvt_client_mem_alloc(cl, NPG, base, &bs, &ks, NULL, &m));
	if (kvt_test_failures)
		TEST_DONE();
	for (uint32_t i = 0; i < NPG; i++) {
		keys[i] = (kvt_page_key){ 0x1000 + i, 0xabc };
		blk[i] = i;
		fill(g, base, bs, ks, i, keys[i]);
	}
	/* store in short jobs; one the lease caught is simply stored again */
	for (uint32_t i = 0; i < NPG; i += STEP) {
		int err = -1;

		for (int tries = 0; tries < 50 && err; tries++) {
			kvt_client_job *j;

			err = kvt_client_store(cl, m, keys, i + STEP, i, blk + i,
					       &j);
			if (!err)
				err = srv_job_end(j, NULL);
			if (err && err != -ECANCELED)
				break;
		}
		CHECK_OK(err);
		if (err)
			break;
	}
	/* a load of all of it outlives a 10 ms lease */
	for (int round = 0; round < 5 && !cancelled && !kvt_test_failures;
	     round++) {
		kvt_client_job *j;
		long nf;
		int err;

		for (uint32_t i = 0; i < NPG; i++)
			memset((uint8_t *)base[0] + i * bs, 0, 64);
		CHECK_OK(kvt_client_load(cl, m, keys, NPG, 0, blk, &j));
		if (kvt_test_failures)
			break;
		err = kvt_client_job_wait(j, 60ll * 1000000000);
		nf = kvt_client_job_failed(j, failed, NPG);
		kvt_client_job_free(j);
		if (err == 0)
			continue; /* outran the check: try again */
		CHECK_EQ(err, -ECANCELED);
		CHECK(nf > 0);
		for (uint32_t i = 0; i < NPG; i++) {
			int f = 0;

			for (long k = 0; k < nf; k++)
				f |= failed[k] == blk[i];
			if (!f)
				CHECK(holds(g, base, bs, ks, i, keys[i]));
		}
		cancelled = 1;
	}
	CHECK(cancelled);
	CHECK(deadline_expiries(cl) >= 1);
	kvt_client_close(cl);
	CHECK_EQ(srv_stop(pid), 0);
	TEST_DONE();
}
