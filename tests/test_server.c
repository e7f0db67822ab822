/*
 * test_server — the node daemon with real processes: a daemon child, and
 * client children that are two TP ranks of one engine and a second engine.
 * Each stores pages out of its registered memory and loads them back into
 * other blocks; the bytes that land are the bytes stored (checked byte by
 * byte), ranks and tenants never see each other's pages, a second engine
 * of the same tenant reuses the first's. A client killed with SIGKILL while
 * it holds jobs leaves no lease, registered memory or connection behind.
 * A uid not on a tenant's allow-list is refused; a geometry that differs
 * from the namespace's is refused. SIGTERM drains the daemon; exit 0.
 *
 * Bad input on the wire is in test_server_proto.c.
 */
#include "server_util.h"

#include <cjson/cJSON.h>
#include <sys/mman.h>

#define NB 32   /* blocks per client */
#define NP 8    /* pages per session */

static char sock[108];
static const char *model;

/* A client process: store session @s's pages, look them up, load them
 * into other blocks, check the bytes. Exit status: failures. */
static int engine(uint32_t tenant, uint32_t tp, uint32_t rank, uint32_t s,
		  int expect_hit)
{
	uint32_t tok[NP * SRV_P], blk[NP], blk2[NP];
	kvt_page_key keys[NP];
	kvt_cache_lookup_result r;
	kvt_client_job *j;
	kvt_client *cl = NULL;
	srv_mem sm;
	long nf = -1;

	kvt_test_failures = 0; /* this process's own count (a child) */
	CHECK_OK(srv_connect(&cl, sock, model, tenant, tp, rank));
	if (!cl)
		return 1;
	CHECK_OK(srv_mem_alloc(cl, &sm, NB));
	srv_tokens(s, tok, NP * SRV_P);
	CHECK_OK(kvt_client_hash_tokens(cl, tok, NP * SRV_P, keys));
	CHECK_OK(kvt_client_lookup(cl, keys, NP, 0, &r));
	if (expect_hit) {
		CHECK_EQ(r.pages, NP);
	} else {
		CHECK_EQ(r.pages, 0);
		for (uint32_t i = 0; i < NP; i++) {
			blk[i] = i;
			srv_fill(&sm, i, keys[i]);
		}
		CHECK_OK(kvt_client_store(cl, sm.m, keys, NP, 0, blk, &j));
		if (kvt_test_failures)
			return 1;
		CHECK_OK(srv_job_end(j, &nf));
		CHECK_EQ(nf, 0);
		CHECK_OK(kvt_client_lookup(cl, keys, NP, 0, &r));
		CHECK_EQ(r.pages, NP);
	}
	/* load into other blocks, layer by layer */
	for (uint32_t i = 0; i < NP; i++) {
		blk2[i] = NB - 1 - i;
		srv_zero(&sm, blk2[i]);
	}
	{
		uint64_t t0 = kvt_now_ns(), prev = 0;

		CHECK_OK(kvt_client_load(cl, sm.m, keys, NP, 0, blk2, &j));
		if (kvt_test_failures)
			return 1;
		for (uint32_t l = 0; l < SRV_L; l++) {
			uint64_t at;

			CHECK_OK(kvt_client_job_wait_layer(j, l,
							   10ll * 1000000000));
			/* the daemon's stamp: when it reported the layer
			 * ready, on this clock, never before the load began */
			at = kvt_client_job_layer_ns(j, l);
			CHECK(at >= t0 && at <= kvt_now_ns());
			CHECK(at >= prev);
			prev = at;
		}
		CHECK_EQ(kvt_client_job_layer_ns(j, SRV_L), 0);
	}
	CHECK_OK(kvt_client_job_wait(j, -1));
	{
		kvt_cache_job_stat st;

		kvt_client_job_stat_get(j, &st);
		CHECK_EQ(st.pages, NP);
		CHECK_EQ(st.copied, NP);
		CHECK_EQ(st.failed, 0);
	}
	CHECK_OK(srv_job_end(j, &nf));
	CHECK_EQ(nf, 0);
	for (uint32_t i = 0; i < NP; i++)
		CHECK(srv_holds(&sm, blk2[i], keys[i]));
	/* where the pages are, run by run, and the daemon's measured rates */
	{
		static kvt_xfer_rate rt[KVT_TIER_COUNT][KVT_TIER_COUNT];
		kvt_cache_run runs[KVT_CACHE_MAX_RUNS];
		size_t nr = 0;
		uint64_t sum = 0, loads = 0;

		CHECK_OK(kvt_client_lookup_runs(cl, keys, NP, 0, &r, runs,
						KVT_CACHE_MAX_RUNS, &nr));
		CHECK_EQ(r.pages, NP);
		CHECK(nr >= 1);
		for (size_t i = 0; i < nr; i++)
			sum += runs[i].pages;
		CHECK_EQ(sum, NP);
		CHECK_ERR(kvt_client_lookup_runs(cl, keys, NP, 0, &r, NULL, 1,
						 &nr), -EINVAL);
		CHECK_ERR(kvt_client_lookup(cl, keys, NP, 1u << 16, &r),
			  -EINVAL);
		CHECK_OK(kvt_client_rates(cl, rt));
		for (int t = KVT_TIER_FABRIC; t < KVT_TIER_REMOTE; t++)
			loads += rt[t][KVT_TIER_HBM].jobs;
		CHECK(loads >= 1);
	}
	/* a load with a page nobody stored: that block fails, alone */
	{
		kvt_page_key k2[NP + 1];
		uint32_t b3[NP + 1], failed[4];

		memcpy(k2, keys, sizeof(keys));
		k2[NP] = (kvt_page_key){ 0x1234, 0x5678 + s };
		for (uint32_t i = 0; i <= NP; i++)
			b3[i] = i;
		CHECK_OK(kvt_client_load(cl, sm.m, k2, NP + 1, NP - 1, b3, &j));
		if (kvt_test_failures)
			return 1;
		CHECK_ERR(kvt_client_job_wait(j, -1), KVT_ENOTFOUND);
		CHECK_EQ(kvt_client_job_failed(j, failed, 4), 1);
		CHECK_EQ(failed[0], 1);
		{ /* why, through the wire (RELEASE's busy, absent) */
			kvt_cache_job_stat st;

			kvt_client_job_stat_get(j, &st);
			CHECK_EQ(st.failed, 1);
			CHECK_EQ(st.absent, 1);
			CHECK_EQ(st.busy, 0);
		}
		kvt_client_job_free(j);
	}
	kvt_client_close(cl);
	return kvt_test_failures;
}

static pid_t spawn(uint32_t tenant, uint32_t tp, uint32_t rank, uint32_t s,
		   int hit)
{
	pid_t p = fork();

	if (p == 0)
		_exit(engine(tenant, tp, rank, s, hit) ? 1 : 0);
	return p;
}

static int reap(pid_t p)
{
	int st = 0;

	if (waitpid(p, &st, 0) != p)
		return -1;
	return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

/* A gauge from the daemon's STATS JSON (-1 if absent). */
static void test_ranks_and_engines(void)
{
	kvtd_config cfg = { 0 };
	char tenants[256];
	pid_t d, a, b;
	kvt_client *cl = NULL;

	snprintf(tenants, sizeof(tenants), "alpha:1,uid=%u;beta:2,uid=%u",
		 (unsigned)geteuid(), (unsigned)geteuid());
	cfg.socket = sock;
	cfg.model = model;
	cfg.page_tokens = SRV_P;
	cfg.tp = 2;
	cfg.tenants = tenants;
	cfg.tiers = "dram:4M";
	cfg.socket_mode = 0666; /* the allow-list, not the mode, refuses */
	d = srv_start(&cfg);
	CHECK(d > 0);
	if (d <= 0)
		return;
	/* two TP ranks of one engine, at once: each stores its shard */
	a = spawn(1, 2, 0, 7, 0);
	b = spawn(1, 2, 1, 7, 0);
	CHECK_EQ(reap(a), 0);
	CHECK_EQ(reap(b), 0);
	/* a second engine of the same tenant, rank 0: hits rank 0's pages */
	a = spawn(1, 2, 0, 7, 1);
	CHECK_EQ(reap(a), 0);
	/* another tenant, same tokens: no hit; it stores its own */
	a = spawn(2, 2, 0, 7, 0);
	CHECK_EQ(reap(a), 0);

	/* geometry that differs from the namespace's: refused */
	CHECK_ERR(srv_connect(&cl, sock, model, 1, 1, 0), KVT_EGEOM);
	/* an unknown tenant is refused as one not open to us: no one
	 * learns which ids exist */
	CHECK_ERR(srv_connect(&cl, sock, model, 9, 2, 0), -EACCES);
	{
		kvt_client_config c = KVT_CLIENT_CONFIG_INIT;

		c.socket = sock;
		c.model = model;
		c.page_tokens = SRV_P;
		c.tp_size = 2;
		c.tenant = 1;
		c.ns = "other";
		CHECK_ERR(kvt_client_connect(&cl, &c), KVT_ENOTFOUND);
	}

	/* kill -9 a client that holds jobs and memory */
	CHECK_OK(srv_connect(&cl, sock, model, 1, 2, 0));
	if (cl) {
		int pfd[2];

		/* the refused connections above end asynchronously */
		for (int i = 0; i < 200 && srv_gauge(cl, "clients") != 1; i++)
			usleep(10000);
		CHECK_EQ(srv_gauge(cl, "clients"), 1);
		CHECK(pipe(pfd) == 0);
		a = fork();
		if (a == 0) {
			kvt_client *c2 = NULL;
			uint32_t tok[NP * SRV_P], blk[NP];
			kvt_page_key keys[NP];
			kvt_client_job *j[64];
			srv_mem sm;

			if (srv_connect(&c2, sock, model, 1, 2, 0) ||
			    srv_mem_alloc(c2, &sm, NB))
				_exit(1);
			srv_tokens(7, tok, NP * SRV_P);
			kvt_client_hash_tokens(c2, tok, NP * SRV_P, keys);
			for (uint32_t i = 0; i < NP; i++)
				blk[i] = i;
			for (int k = 0; k < 64; k++)
				kvt_client_load(c2, sm.m, keys, NP, 0, blk,
						&j[k]);
			if (write(pfd[1], "x", 1) != 1)
				_exit(1);
			pause();
			_exit(0);
		}
		{
			char x;
			CHECK(read(pfd[0], &x, 1) == 1);
		}
		CHECK_EQ(srv_gauge(cl, "clients"), 2);
		CHECK(srv_gauge(cl, "registered_memory_bytes") > 0);
		kill(a, SIGKILL);
		CHECK_EQ(reap(a), 128 + SIGKILL);
		/* within a second: its connection, jobs, memory are gone */
		for (int i = 0; i < 100 && srv_gauge(cl, "clients") != 1; i++)
			usleep(10000);
		CHECK_EQ(srv_gauge(cl, "clients"), 1);
		CHECK_EQ(srv_gauge(cl, "registered_memory_bytes"), 0);
		for (int i = 0; i < 100 && srv_gauge(cl, "jobs_in_flight") != 0; i++)
			usleep(10000);
		CHECK_EQ(srv_gauge(cl, "jobs_in_flight"), 0);
		close(pfd[0]);
		close(pfd[1]);
		kvt_client_close(cl);
	}

	/* a uid not on the allow-list */
	a = fork();
	if (a == 0) {
		kvt_client *c2 = NULL;
		int err;

		if (geteuid() == 0 && (setgid(65534) || setuid(65534)))
			_exit(2);
		err = srv_connect(&c2, sock, model, 1, 2, 0);
		_exit(err == -EACCES ? 0 : 1);
	}
	{
		int st = reap(a);
		CHECK(st == 0 || st == 2);
	}
	CHECK_EQ(srv_stop(d), 0);
}

/* tenants[name].tiers[tier][field] from the daemon's STATS, or -1. */
static double tenant_num(kvt_client *cl, const char *name, const char *tier,
			 const char *field)
{
	char *js = NULL;
	double v = -1;
	cJSON *root, *t;

	if (kvt_client_stats(cl, &js))
		return -1;
	root = cJSON_Parse(js);
	cJSON_ArrayForEach(t, cJSON_GetObjectItem(root, "tenants")) {
		cJSON *n = cJSON_GetObjectItem(t, "name"), *x;

		if (!cJSON_IsString(n) || strcmp(n->valuestring, name))
			continue;
		x = cJSON_GetObjectItem(cJSON_GetObjectItem(cJSON_GetObjectItem(
			t, "tiers"), tier), field);
		if (cJSON_IsNumber(x))
			v = x->valuedouble;
	}
	cJSON_Delete(root);
	free(js);
	return v;
}

/* Tenant quotas through the daemon: alpha at its dram quota pushes its own
 * pages down to ssd; beta's stay in dram. */
static void test_quota(void)
{
	kvtd_config cfg = { 0 };
	char tenants[256], tiers[600];
	const char *dir = test_dir("server-quota");
	uint64_t page = (uint64_t)SRV_L * 2 * SRV_P * 2 * 64 * 2;
	kvt_page_key ka[6][NP], kb[NP];
	kvt_cache_lookup_result r;
	kvt_client *a = NULL, *b = NULL;
	srv_mem ma, mb;
	uint32_t blk[NP];
	pid_t d;

	snprintf(tenants, sizeof(tenants), "alpha:1,uid=%u,quota=dram:%llu;"
		 "beta:2,uid=%u", (unsigned)geteuid(),
		 (unsigned long long)(2 * NP * page), (unsigned)geteuid());
	snprintf(tiers, sizeof(tiers), "dram:%llu,ssd:%s,8M",
		 (unsigned long long)(6 * NP * page), dir);
	cfg.socket = sock;
	cfg.tiers = tiers;
	cfg.model = model;
	cfg.page_tokens = SRV_P;
	cfg.tenants = tenants;
	d = srv_start(&cfg);
	CHECK(d > 0);
	if (d <= 0)
		return;
	CHECK_OK(srv_connect(&a, sock, model, 1, 1, 0));
	CHECK_OK(srv_connect(&b, sock, model, 2, 1, 0));
	if (!a || !b)
		goto out;
	CHECK_OK(srv_mem_alloc(a, &ma, NB));
	CHECK_OK(srv_mem_alloc(b, &mb, NB));
	for (uint32_t i = 0; i < NP; i++)
		blk[i] = i;
	/* beta: one session, in dram */
	{
		uint32_t tok[NP * SRV_P];
		kvt_client_job *j;

		srv_tokens(500, tok, NP * SRV_P);
		CHECK_OK(kvt_client_hash_tokens(b, tok, NP * SRV_P, kb));
		for (uint32_t i = 0; i < NP; i++)
			srv_fill(&mb, i, kb[i]);
		CHECK_OK(kvt_client_store(b, mb.m, kb, NP, 0, blk, &j));
		CHECK_OK(srv_job_end(j, NULL));
	}
	/* alpha: six sessions, three times its quota */
	for (uint32_t s = 0; s < 6; s++) {
		uint32_t tok[NP * SRV_P];
		kvt_client_job *j;

		srv_tokens(600 + s, tok, NP * SRV_P);
		CHECK_OK(kvt_client_hash_tokens(a, tok, NP * SRV_P, ka[s]));
		for (uint32_t i = 0; i < NP; i++)
			srv_fill(&ma, i, ka[s][i]);
		CHECK_OK(kvt_client_store(a, ma.m, ka[s], NP, 0, blk, &j));
		CHECK_OK(srv_job_end(j, NULL));
	}
	CHECK_OK(kvt_client_quiesce(a));
	/* beta untouched in dram; alpha's oldest in ssd, at most its quota
	 * in dram */
	CHECK_OK(kvt_client_lookup(b, kb, NP, 0, &r));
	CHECK_EQ(r.tier_pages[KVT_TIER_DRAM], NP);
	{
		uint64_t in_dram = 0;

		for (uint32_t s = 0; s < 6; s++) {
			CHECK_OK(kvt_client_lookup(a, ka[s], NP, 0, &r));
			CHECK_EQ(r.pages, NP);
			in_dram += r.tier_pages[KVT_TIER_DRAM];
		}
		CHECK(in_dram <= 2 * NP);
		CHECK_OK(kvt_client_lookup(a, ka[0], NP, 0, &r));
		CHECK_EQ(r.tier_pages[KVT_TIER_SSD], NP);
		/* the metrics say whose pages left dram */
		CHECK(tenant_num(a, "alpha", "dram", "evictions") >= 4 * NP);
		CHECK_EQ(tenant_num(a, "beta", "dram", "evictions"), 0);
	}
	/* and alpha's pages come back right from ssd */
	{
		kvt_client_job *j;
		uint32_t b2[NP];
		long nf;

		for (uint32_t i = 0; i < NP; i++) {
			b2[i] = NB - 1 - i;
			srv_zero(&ma, b2[i]);
		}
		CHECK_OK(kvt_client_load(a, ma.m, ka[0], NP, 0, b2, &j));
		CHECK_OK(srv_job_end(j, &nf));
		CHECK_EQ(nf, 0);
		for (uint32_t i = 0; i < NP; i++)
			CHECK(srv_holds(&ma, b2[i], ka[0][i]));
	}
out:
	kvt_client_close(a);
	kvt_client_close(b);
	CHECK_EQ(srv_stop(d), 0);
}

int main(void)
{
	snprintf(sock, sizeof(sock), "/tmp/kvtd-test-%d.sock", (int)getpid());
	model = srv_model();
	CHECK(model != NULL);
	if (!model)
		TEST_DONE();
	test_ranks_and_engines();
	test_quota();
	unlink(model);
	TEST_DONE();
}
