/*
 * test_server_remote — two nodes' daemons sharing one Redis (a real
 * redis-server on loopback; skipped without one) as the remote tier below
 * their own tiers: an engine on node A stores a prompt's pages; an engine
 * on node B with the same tokens finds them remotely (LOOKUP's
 * tier_pages[REMOTE]), the daemon prefetches them into B's dram while the
 * request waits, and B's load is byte-identical. Redis killed: both nodes
 * go on serving from their own tiers, lookups report no remote run.
 */
#include "server_util.h"
#include "remote_util.h"

#define NB 32
#define NP 8

static const char *model;

static void store(kvt_client *cl, srv_mem *sm, const kvt_page_key *keys)
{
	uint32_t blk[NP];
	kvt_client_job *j;
	int err;

	for (uint32_t i = 0; i < NP; i++) {
		blk[i] = i;
		srv_fill(sm, i, keys[i]);
	}
	err = kvt_client_store(cl, sm->m, keys, NP, 0, blk, &j);
	CHECK_OK(err);
	if (!err)
		CHECK_OK(srv_job_end(j, NULL));
}

int main(void)
{
	const char *dir = test_dir("server-remote");
	struct rt_server rs = { 0 };
	kvtd_config cfg = { 0 };
	char sa[108], sb[108], remote[128];
	kvt_client *a = NULL, *b = NULL;
	kvt_cache_lookup_result r;
	kvt_page_key keys[NP], k2[NP];
	uint32_t tok[NP * SRV_P];
	srv_mem ma, mb;
	pid_t da, db;
	int port;

	rt_need_redis();
	port = rt_free_port(0);
	if (rt_start(&rs, dir, port, NULL))
		SKIP("redis-server would not start here");
	model = srv_model();
	snprintf(remote, sizeof(remote), "remote:redis://127.0.0.1:%d", port);
	snprintf(sa, sizeof(sa), "/tmp/kvtd-ra-%d.sock", (int)getpid());
	snprintf(sb, sizeof(sb), "/tmp/kvtd-rb-%d.sock", (int)getpid());
	cfg.tiers = "dram:2M";
	cfg.model = model;
	cfg.page_tokens = SRV_P;
	cfg.remote = remote;
	cfg.socket = sa;
	da = srv_start(&cfg);
	cfg.socket = sb;
	db = srv_start(&cfg);
	CHECK(da > 0 && db > 0);
	if (da <= 0 || db <= 0)
		goto out;
	CHECK_OK(srv_connect(&a, sa, model, 0, 1, 0));
	CHECK_OK(srv_connect(&b, sb, model, 0, 1, 0));
	if (!a || !b)
		goto out;
	CHECK_OK(srv_mem_alloc(a, &ma, NB));
	CHECK_OK(srv_mem_alloc(b, &mb, NB));

	/* node A computes and stores the prompt; it goes to Redis too */
	srv_tokens(42, tok, NP * SRV_P);
	CHECK_OK(kvt_client_hash_tokens(a, tok, NP * SRV_P, keys));
	CHECK_OK(kvt_client_hash_tokens(b, tok, NP * SRV_P, k2));
	CHECK(!memcmp(keys, k2, sizeof(keys))); /* same tokens, same keys */
	store(a, &ma, keys);

	/* node B: found remotely, brought in while it waits (up to 10 s for
	 * A's write-through and B's prefetch) */
	memset(&r, 0, sizeof(r));
	for (int i = 0; i < 200; i++) {
		CHECK_OK(kvt_client_lookup(b, keys, NP, 0, &r));
		if (r.pages == NP)
			break;
		rt_sleep_ms(50);
	}
	CHECK_EQ(r.pages, NP);
	CHECK_EQ(r.tier_pages[KVT_TIER_DRAM], NP);
	{
		uint32_t blk[NP];
		kvt_client_job *j;
		long nf = -1;

		for (uint32_t i = 0; i < NP; i++) {
			blk[i] = NB - 1 - i;
			srv_zero(&mb, blk[i]);
		}
		CHECK_OK(kvt_client_load(b, mb.m, keys, NP, 0, blk, &j));
		CHECK_OK(srv_job_end(j, &nf));
		CHECK_EQ(nf, 0);
		for (uint32_t i = 0; i < NP; i++)
			CHECK(srv_holds(&mb, blk[i], keys[i]));
	}
	/* the remote tier in the daemons' metrics: A wrote the prompt
	 * through, B found it there and fetched it, nothing forged */
	CHECK(srv_stat_num(a, "remote", "written") >= NP);
	CHECK(srv_stat_num(a, "remote", "stored") >= NP);
	CHECK(srv_stat_num(b, "remote", "lookup_pages") >= NP);
	CHECK(srv_stat_num(b, "remote", "hits") >= NP);
	CHECK(srv_stat_num(b, "remote", "bytes_read") > 0);
	CHECK_EQ(srv_stat_num(b, "remote", "bad_values"), 0);

	/* Redis gone: both nodes serve from their own tiers */
	rt_stop(&rs, SIGKILL);
	srv_tokens(43, tok, NP * SRV_P);
	CHECK_OK(kvt_client_hash_tokens(a, tok, NP * SRV_P, k2));
	store(a, &ma, k2);
	CHECK_OK(kvt_client_lookup(a, k2, NP, 0, &r));
	CHECK_EQ(r.pages, NP);
	CHECK_OK(kvt_client_lookup(b, k2, NP, 0, &r));
	CHECK_EQ(r.pages, 0);
	CHECK_EQ(r.tier_pages[KVT_TIER_REMOTE], 0);
	CHECK_OK(kvt_client_lookup(b, keys, NP, 0, &r));
	CHECK_EQ(r.pages, NP);
out:
	kvt_client_close(a);
	kvt_client_close(b);
	if (da > 0)
		CHECK_EQ(srv_stop(da), 0);
	if (db > 0)
		CHECK_EQ(srv_stop(db), 0);
	rt_stop(&rs, SIGTERM);
	if (model)
		unlink(model);
	TEST_DONE();
}
