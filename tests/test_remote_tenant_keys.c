/*
 * test_remote_tenant_keys — per-tenant MAC keys for remote values (issue
 * 21, finding 6's "a key per namespace, and per tenant where tenants must
 * not share"). With one key per namespace every node that holds it can
 * write any tenant's pages: a node serving only tenant A could forge
 * tenant B's. A real redis-server on loopback (skipped without one):
 *
 *   node X serves A (its own key file a.key); node Y serves B (b.key) and
 *   C, who shares with A (a.key too); both hold the namespace's key=.
 *
 *   - the control, as it was: X writes B's page names under the
 *     namespace's key and Y, reading them as the namespace, serves every
 *     one (the hole);
 *   - X's values (A's key) read by Y as C: all served (sharing kept);
 *     as B: none served, each a bad value;
 *   - X forges B's pages (its own key, and the namespace's): Y as B
 *     serves none; B's true values replayed under other names or read by
 *     X as B (X has no b.key): none served; Y as B reads its own;
 *   - a node without key= that has a tenant key writes and reads that
 *     tenant's values authenticated;
 *   - the daemon's rkey= (kvtd_open): a bad key file or no --remote is
 *     KVT_ECONFIG; a good one opens;
 *   - end to end, three daemons: X stores a prompt as tenant "a"
 *     (rkey=a.key), it is written through; Y (a with a.key) finds it,
 *     prefetches and loads it byte for byte; Z (a with b.key: a node that
 *     does not hold a's key, with a's salt) never gets it verified: its
 *     load fails every block.
 */
#include "server_util.h"
#include "remote_util.h"
#include "remote/remote_impl.h"

#include <fcntl.h>
#include <sys/stat.h>

#define N 12
#define TA 1u
#define TB 2u
#define TC 3u

static kvt_geom g;
static int port;
static uint64_t pb;

/* Read @keys as @tenant (ANY: the namespace) into @bufs: how many came
 * back as the true pages of @keys (rt_fill), *@other how many came back
 * as anything else (served but not those bytes: a forgery served). */
static int read_as(kvt_remote *r, uint32_t tenant, const kvt_page_key *keys,
		   uint8_t **bufs, int *other)
{
	uint8_t ok[N], *want = malloc(pb);
	int right = 0;

	*other = 0;
	CHECK(kvt_remote_get_as(r, tenant, keys, N, (void *const *)bufs, ok,
				NULL) >= 0);
	for (int i = 0; i < N; i++) {
		if (!ok[i])
			continue;
		rt_fill(want, pb, &keys[i]);
		if (memcmp(bufs[i], want, pb))
			(*other)++;
		else
			right++;
	}
	free(want);
	return right;
}

static uint64_t bad_values(kvt_remote *r)
{
	kvt_remote_stat st;

	CHECK_OK(kvt_remote_stat_get(r, &st));
	return st.bad_values;
}

/* Copy the value of @from to the name of @to, behind the library. */
static void replay(kvt_remote *r, const kvt_page_key *from,
		   const kvt_page_key *to)
{
	char a[KVTI_RKEY_MAX], b[KVTI_RKEY_MAX];
	redisReply *rep;

	kvt_remote_key_name(r, from, a, sizeof(a));
	kvt_remote_key_name(r, to, b, sizeof(b));
	rep = rt_cmd(port, "GET", a);
	CHECK(rep && rep->type == REDIS_REPLY_STRING);
	if (rep && rep->type == REDIS_REPLY_STRING) {
		const char *av[3] = { "SET", b, rep->str };
		size_t al[3] = { 3, strlen(b), rep->len };

		CHECK(rt_reply_is(rt_cmdv(port, 3, av, al), "OK"));
	}
	if (rep)
		freeReplyObject(rep);
}

static void daemon_config(const char *dir, const char *nskey,
			  const char *akey, const char *openkey)
{
	char sock[600], tiers[64], remote[700], tenants[900];
	const char *model = srv_model();
	kvtd_config cfg = { 0 };
	kvtd *d = NULL;

	snprintf(sock, sizeof(sock), "%s/d.sock", dir);
	snprintf(tiers, sizeof(tiers), "dram:8M");
	snprintf(remote, sizeof(remote), "remote:redis://127.0.0.1:%d,key=%s",
		 port, nskey);
	cfg.socket = sock;
	cfg.tiers = tiers;
	cfg.model = model;
	cfg.page_tokens = SRV_P;
	cfg.tenants = tenants;
	/* rkey= without a remote tier */
	snprintf(tenants, sizeof(tenants), "a:1,uid=0,rkey=%s", akey);
	CHECK_ERR(kvtd_open(&d, &cfg), KVT_ECONFIG);
	CHECK(strstr(kvt_errdetail(), "needs --remote") != NULL);
	cfg.remote = remote;
	/* a key file others can read */
	snprintf(tenants, sizeof(tenants), "a:1,uid=0,rkey=%s", openkey);
	CHECK_ERR(kvtd_open(&d, &cfg), KVT_ECONFIG);
	CHECK(strstr(kvt_errdetail(), "tenant a") != NULL);
	snprintf(tenants, sizeof(tenants), "a:1,uid=0,rkey=");
	CHECK_ERR(kvtd_open(&d, &cfg), KVT_ECONFIG);
	snprintf(tenants, sizeof(tenants), "a:1,uid=0,rkey=%s;b:2,uid=0",
		 akey);
	CHECK_OK(kvtd_open(&d, &cfg));
	kvtd_close(d);
	unlink(model);
}

#define NP 8
#define NB 16

/* Node X stores; Y (same rkey) gets the pages; Z (another rkey) none. */
static void daemons(const char *nsk, const char *ak, const char *bk)
{
	const char *model = srv_model();
	char remote[800], sock[3][108], ten[3][700];
	const char *rk[3] = { ak, ak, bk };
	kvt_client *cl[3] = { 0 };
	kvtd_config cfg = { 0 };
	kvt_cache_lookup_result r;
	kvt_page_key keys[NP];
	uint32_t tok[NP * SRV_P], blk[NP];
	srv_mem sm[3];
	pid_t pid[3] = { -1, -1, -1 };
	kvt_client_job *j;
	long nf;

	snprintf(remote, sizeof(remote), "remote:redis://127.0.0.1:%d,key=%s",
		 port, nsk);
	cfg.tiers = "dram:2M";
	cfg.model = model;
	cfg.page_tokens = SRV_P;
	cfg.remote = remote;
	for (int i = 0; i < 3; i++) {
		snprintf(sock[i], sizeof(sock[i]), "/tmp/kvtd-tk%d-%d.sock", i,
			 (int)getpid());
		snprintf(ten[i], sizeof(ten[i]), "a:1,uid=0,rkey=%s", rk[i]);
		cfg.socket = sock[i];
		cfg.tenants = ten[i];
		pid[i] = srv_start(&cfg);
		CHECK(pid[i] > 0);
		if (pid[i] <= 0)
			goto out;
		CHECK_OK(srv_connect(&cl[i], sock[i], model, 1, 1, 0));
		if (!cl[i])
			goto out;
		CHECK_OK(srv_mem_alloc(cl[i], &sm[i], NB));
	}
	srv_tokens(7, tok, NP * SRV_P);
	CHECK_OK(kvt_client_hash_tokens(cl[0], tok, NP * SRV_P, keys));
	for (uint32_t i = 0; i < NP; i++) {
		blk[i] = i;
		srv_fill(&sm[0], i, keys[i]);
	}
	CHECK_OK(kvt_client_store(cl[0], sm[0].m, keys, NP, 0, blk, &j));
	CHECK_OK(srv_job_end(j, NULL));
	/* Y: found remotely and prefetched into its dram (up to 10 s) */
	memset(&r, 0, sizeof(r));
	for (int i = 0; i < 200 && r.pages < NP; i++) {
		CHECK_OK(kvt_client_lookup(cl[1], keys, NP, 0, &r));
		if (r.pages < NP)
			rt_sleep_ms(50);
	}
	CHECK_EQ(r.pages, NP);
	for (uint32_t i = 0; i < NP; i++) {
		blk[i] = NB - 1 - i;
		srv_zero(&sm[1], blk[i]);
	}
	CHECK_OK(kvt_client_load(cl[1], sm[1].m, keys, NP, 0, blk, &j));
	nf = -1;
	CHECK_OK(srv_job_end(j, &nf));
	CHECK_EQ(nf, 0);
	for (uint32_t i = 0; i < NP; i++)
		CHECK(srv_holds(&sm[1], blk[i], keys[i]));
	/* Z: sees the values exist, never verifies one (1 s of lookups,
	 * each may start a prefetch) */
	for (int i = 0; i < 20; i++) {
		CHECK_OK(kvt_client_lookup(cl[2], keys, NP, 0, &r));
		CHECK_EQ(r.pages, 0);
		rt_sleep_ms(50);
	}
	for (uint32_t i = 0; i < NP; i++) {
		blk[i] = i;
		srv_zero(&sm[2], i);
	}
	CHECK_OK(kvt_client_load(cl[2], sm[2].m, keys, NP, 0, blk, &j));
	nf = -1;
	CHECK_ERR(srv_job_end(j, &nf), KVT_ENOTFOUND);  /* every block */
	CHECK_EQ(nf, NP);
out:
	for (int i = 0; i < 3; i++) {
		kvt_client_close(cl[i]);
		if (pid[i] > 0)
			CHECK_EQ(srv_stop(pid[i]), 0);
	}
	unlink(model);
}

int main(void)
{
	char nsk[600], ak[600], bk[600], openk[600];
	kvt_page_key ka[N], kb[N], kc[N];
	uint8_t *bufs[N], *pages[N], *forged[N];
	kvt_remote *x, *y, *plain;
	struct rt_server srv;
	const char *dir;
	uint64_t bad0;
	int right, other;

	rt_need_redis();
	rt_geom(&g, "tenants");
	pb = kvt_geom_page_bytes(&g);
	dir = test_dir("remote_tenant_keys");
	port = rt_free_port(0);
	if (rt_start(&srv, dir, port, NULL))
		SKIP("redis-server would not start here");
	snprintf(nsk, sizeof(nsk), "%s/ns.key", dir);
	snprintf(ak, sizeof(ak), "%s/a.key", dir);
	snprintf(bk, sizeof(bk), "%s/b.key", dir);
	snprintf(openk, sizeof(openk), "%s/open.key", dir);
	rt_write_key(nsk, "the namespace's secret, thirty-two bytes and more",
		     0600);
	rt_write_key(ak, "tenant a's own secret, thirty-two bytes and more",
		     0600);
	rt_write_key(bk, "tenant b's own secret, thirty-two bytes and more",
		     0600);
	rt_write_key(openk, "a secret anyone may read, thirty-two bytes long",
		     0644);
	rt_keys(ka, N, 1);
	rt_keys(kb, N, 2);
	rt_keys(kc, N, 3);
	for (int i = 0; i < N; i++) {
		bufs[i] = malloc(pb);
		pages[i] = malloc(pb);
		forged[i] = malloc(pb);
		memset(forged[i], 0x3c ^ i, pb);
	}
	x = rt_open(port, nsk, &g);
	y = rt_open(port, nsk, &g);
	CHECK_OK(kvt_remote_tenant_key(x, TA, ak));
	CHECK_OK(kvt_remote_tenant_key(y, TB, bk));
	CHECK_OK(kvt_remote_tenant_key(y, TC, ak));
	CHECK_ERR(kvt_remote_tenant_key(y, KVT_REMOTE_ANY_TENANT, bk), -EINVAL);
	CHECK_ERR(kvt_remote_tenant_key(y, TB, openk), KVT_ECONFIG);

	/* the control: one key per namespace lets node X forge B's pages */
	CHECK_EQ(kvt_remote_set(x, kb, N, (const void *const *)forged, NULL,
				NULL), N);
	right = read_as(y, KVT_REMOTE_ANY_TENANT, kb, bufs, &other);
	CHECK_EQ(right, 0);
	CHECK_EQ(other, N); /* served as verified: what tenant keys stop */
	/* ... and B, with its own key, takes none of them */
	bad0 = bad_values(y);
	CHECK_EQ(read_as(y, TB, kb, bufs, &other), 0);
	CHECK_EQ(other, 0);
	CHECK_EQ(bad_values(y) - bad0, N);

	/* A's values: C (who shares a.key) gets them all, B none */
	for (int i = 0; i < N; i++)
		rt_fill(pages[i], pb, &ka[i]);
	CHECK_EQ(kvt_remote_set_as(x, TA, ka, N, (const void *const *)pages,
				   NULL, NULL), N);
	CHECK_EQ(read_as(y, TC, ka, bufs, &other), N);
	CHECK_EQ(other, 0);
	bad0 = bad_values(y);
	CHECK_EQ(read_as(y, TB, ka, bufs, &other), 0);
	CHECK_EQ(other, 0);
	CHECK_EQ(read_as(y, KVT_REMOTE_ANY_TENANT, ka, bufs, &other), 0);
	CHECK_EQ(other, 0);
	CHECK_EQ(bad_values(y) - bad0, 2 * N);

	/* X forges B's pages under A's key: refused */
	CHECK_EQ(kvt_remote_set_as(x, TA, kb, N, (const void *const *)forged,
				   NULL, NULL), N);
	bad0 = bad_values(y);
	CHECK_EQ(read_as(y, TB, kb, bufs, &other), 0);
	CHECK_EQ(other, 0);
	CHECK_EQ(bad_values(y) - bad0, N);

	/* B's true values: B reads them; replayed under other names, or read
	 * by X (no b.key: it tries the namespace's key), none */
	for (int i = 0; i < N; i++)
		rt_fill(pages[i], pb, &kb[i]);
	CHECK_EQ(kvt_remote_set_as(y, TB, kb, N, (const void *const *)pages,
				   NULL, NULL), N);
	CHECK_EQ(read_as(y, TB, kb, bufs, &other), N);
	CHECK_EQ(other, 0);
	bad0 = bad_values(x);
	CHECK_EQ(read_as(x, TB, kb, bufs, &other), 0);
	CHECK_EQ(other, 0);
	CHECK_EQ(bad_values(x) - bad0, N);
	for (int i = 0; i < N; i++)
		replay(y, &kb[i], &kc[i]);   /* B's value under C's names */
	bad0 = bad_values(y);
	CHECK_EQ(read_as(y, TB, kc, bufs, &other), 0);
	CHECK_EQ(read_as(y, TC, kc, bufs, &other), 0);
	CHECK_EQ(other, 0);
	CHECK_EQ(bad_values(y) - bad0, 2 * N);

	/* no key= at all, a tenant key: that tenant's values are MAC'd */
	plain = rt_open(port, NULL, &g);
	CHECK_OK(kvt_remote_tenant_key(plain, TA, ak));
	for (int i = 0; i < N; i++)
		rt_fill(pages[i], pb, &kc[i]);
	CHECK_EQ(kvt_remote_set_as(plain, TA, kc, N,
				   (const void *const *)pages, NULL, NULL), N);
	CHECK_EQ(read_as(y, TC, kc, bufs, &other), N);
	CHECK_EQ(read_as(plain, TA, kc, bufs, &other), N);
	CHECK_EQ(read_as(plain, KVT_REMOTE_ANY_TENANT, kc, bufs, &other), 0);
	CHECK_EQ(other, 0);

	daemon_config(dir, nsk, ak, openk);
	daemons(nsk, ak, bk);

	kvt_remote_close(x);
	kvt_remote_close(y);
	kvt_remote_close(plain);
	for (int i = 0; i < N; i++) {
		free(bufs[i]);
		free(pages[i]);
		free(forged[i]);
	}
	rt_stop(&srv, SIGTERM);
	TEST_DONE();
}
