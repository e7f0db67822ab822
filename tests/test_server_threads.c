/*
 * test_server_threads — the daemon and its clients under one roof, for the
 * thread sanitizer (CI runs *threads* tests under TSan): the daemon serves
 * from a thread of this process, and client threads hammer it at once —
 * each with its own connection storing, looking up, loading and checking
 * its pages, plus two threads sharing one client (its requests serialize,
 * its waits do not), while another thread connects and disconnects with
 * jobs in flight and reads the daemon's statistics. Then SIGTERM-style
 * stop and drain.
 */
#include "server_util.h"

#include <pthread.h>

#define NTHR 3
#define NP 6
#define ROUNDS 12

static char sock[108];
static const char *model;
static kvtd *daemon_h;

static void *daemon_main(void *arg)
{
	(void)arg;
	kvtd_run(daemon_h);
	return NULL;
}

struct worker {
	kvt_client *cl;   /* shared, or NULL: own connection */
	srv_mem *sm;      /* with a shared client */
	uint32_t id, first_block;
	int failures;
};

static int round_trip(kvt_client *cl, srv_mem *sm, uint32_t id, uint32_t r,
		      uint32_t b0)
{
	uint32_t tok[NP * SRV_P], blk[NP], blk2[NP];
	kvt_page_key keys[NP];
	kvt_cache_lookup_result lr;
	kvt_client_job *j;
	int bad = 0;

	srv_tokens(id * 1000 + r, tok, NP * SRV_P);
	if (kvt_client_hash_tokens(cl, tok, NP * SRV_P, keys))
		return 1;
	for (uint32_t i = 0; i < NP; i++) {
		blk[i] = b0 + i;
		blk2[i] = b0 + NP + i;
		srv_fill(sm, blk[i], keys[i]);
		srv_zero(sm, blk2[i]);
	}
	if (kvt_client_store(cl, sm->m, keys, NP, 0, blk, &j) ||
	    srv_job_end(j, NULL))
		return 1;
	if (kvt_client_lookup(cl, keys, NP, 0, &lr))
		return 1;
	/* a small dram tier: the pages may have been evicted meanwhile; a
	 * page that is loaded must be the right one */
	if (kvt_client_load(cl, sm->m, keys, NP, 0, blk2, &j))
		return 1;
	for (uint32_t l = 0; l < SRV_L; l++) {
		int e = kvt_client_job_wait_layer(j, l, 10ll * 1000000000);

		if (e && e != KVT_ENOTFOUND && e != KVT_EBUSY)
			bad++;
	}
	{
		uint32_t failed[NP];
		int e = kvt_client_job_wait(j, -1);
		long nf = kvt_client_job_failed(j, failed, NP);

		if (e && e != KVT_ENOTFOUND && e != KVT_EBUSY)
			bad++;
		for (uint32_t i = 0; i < NP; i++) {
			int f = 0;

			for (long k = 0; k < nf; k++)
				f |= failed[k] == blk2[i];
			if (!f && !srv_holds(sm, blk2[i], keys[i]))
				bad++;
		}
	}
	kvt_client_job_free(j);
	return bad;
}

static void *worker_main(void *arg)
{
	struct worker *w = arg;
	kvt_client *cl = w->cl;
	srv_mem own, *sm = w->sm;

	if (!cl) {
		if (srv_connect(&cl, sock, model, 0, 1, 0) ||
		    srv_mem_alloc(cl, &own, 4 * NP)) {
			w->failures++;
			kvt_client_close(cl);
			return NULL;
		}
		sm = &own;
	}
	for (uint32_t r = 0; r < ROUNDS; r++)
		w->failures += round_trip(cl, sm, w->id, r, w->first_block);
	if (!w->cl)
		kvt_client_close(cl);
	return NULL;
}

/* Connects, starts loads, leaves without waiting; reads statistics. */
static void *leaver_main(void *arg)
{
	int *failures = arg;

	for (int r = 0; r < 6; r++) {
		kvt_client *cl = NULL;
		kvt_client_job *j[4];
		kvt_page_key k[NP];
		uint32_t blk[NP];
		srv_mem sm;
		char *js = NULL;

		if (srv_connect(&cl, sock, model, 0, 1, 0) ||
		    srv_mem_alloc(cl, &sm, NP)) {
			(*failures)++;
			kvt_client_close(cl);
			continue;
		}
		for (uint32_t i = 0; i < NP; i++) {
			k[i] = (kvt_page_key){ i + 1, 77 };
			blk[i] = i;
		}
		for (int i = 0; i < 4; i++)
			if (kvt_client_load(cl, sm.m, k, NP, 0, blk, &j[i]))
				(*failures)++;
		if (kvt_client_stats(cl, &js))
			(*failures)++;
		free(js);
		kvt_client_close(cl); /* jobs and memory dropped by close */
	}
	return NULL;
}

int main(void)
{
	kvtd_config cfg = { 0 };
	pthread_t dt, th[NTHR + 3];
	struct worker w[NTHR + 2];
	kvt_client *shared = NULL;
	srv_mem ssm;
	int leaver_fail = 0;

	snprintf(sock, sizeof(sock), "/tmp/kvtd-thr-%d.sock", (int)getpid());
	model = srv_model();
	cfg.socket = sock;
	cfg.tiers = "dram:1M";
	cfg.model = model;
	cfg.page_tokens = SRV_P;
	CHECK_OK(kvtd_open(&daemon_h, &cfg));
	if (!daemon_h)
		TEST_DONE();
	pthread_create(&dt, NULL, daemon_main, NULL);
	memset(w, 0, sizeof(w));
	CHECK_OK(srv_connect(&shared, sock, model, 0, 1, 0));
	CHECK_OK(srv_mem_alloc(shared, &ssm, 4 * NP));
	for (int i = 0; i < NTHR + 2; i++) {
		w[i].id = (uint32_t)i + 1;
		if (i >= NTHR) { /* two threads on one client */
			w[i].cl = shared;
			w[i].sm = &ssm;
			w[i].first_block = (uint32_t)(i - NTHR) * 2 * NP;
		}
		pthread_create(&th[i], NULL, worker_main, &w[i]);
	}
	pthread_create(&th[NTHR + 2], NULL, leaver_main, &leaver_fail);
	for (int i = 0; i < NTHR + 3; i++)
		pthread_join(th[i], NULL);
	for (int i = 0; i < NTHR + 2; i++)
		CHECK_EQ(w[i].failures, 0);
	CHECK_EQ(leaver_fail, 0);
	kvt_client_close(shared);
	kvtd_stop(daemon_h);
	pthread_join(dt, NULL);
	{
		kvt_cache_check chk;

		CHECK_OK(kvt_cache_verify(kvtd_cache(daemon_h), &chk));
		CHECK_EQ(chk.bad, 0);
	}
	kvtd_close(daemon_h);
	unlink(model);
	TEST_DONE();
}
