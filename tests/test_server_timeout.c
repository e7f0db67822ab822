/*
 * test_server_timeout — a daemon that stops answering for a while (SIGSTOP
 * here; a stuck disk or a hung Redis alike) and a client whose requests
 * time out (issue 21, finding 5):
 *
 *   - a LOOKUP times out: -ETIMEDOUT, and the connection is dropped; once
 *     the daemon runs again every later request fails with -ECONNRESET
 *     (it used to answer KVT_EPROTO forever, "reply LOOKUP #17 to LOAD
 *     #18": one timeout desynced the client for good), and a new client
 *     is served;
 *   - a LOAD times out (its fate unknown: the daemon may have started
 *     it): the call returns only once the daemon has let go of this
 *     client's memory — at that moment the daemon maps none of it any
 *     more (its /proc/PID/maps);
 *   - the daemon stays stopped: the LOAD returns -ETIMEDOUT after lease_ms
 *     + timeout_ms all the same, saying the memory may still be written;
 *   - a job started before the stop, waited on in another thread: its
 *     wait ends (every block failed) once the daemon let go, not before.
 */
#include "server_util.h"

#include <pthread.h>

static char sock[108];
static const char *model;
static pid_t dpid;

/* Mappings of client KV memory (memfd "kvtier-kv") in the daemon. */
static int daemon_kv_maps(void)
{
	char path[64], line[512];
	FILE *f;
	int n = 0;

	snprintf(path, sizeof(path), "/proc/%d/maps", (int)dpid);
	if (!(f = fopen(path, "r")))
		return -1;
	while (fgets(line, sizeof(line), f))
		n += strstr(line, "memfd:kvtier-kv") != NULL;
	fclose(f);
	return n;
}

/* SIGSTOP the daemon and wait until it is stopped. */
static void stop_daemon(void)
{
	int st;

	kill(dpid, SIGSTOP);
	CHECK(waitpid(dpid, &st, WUNTRACED) == dpid && WIFSTOPPED(st));
}

static kvt_client *connect_fast(void)
{
	kvt_client_config c = KVT_CLIENT_CONFIG_INIT;
	kvt_client *cl = NULL;

	c.socket = sock;
	c.model = model;
	c.page_tokens = SRV_P;
	c.timeout_ms = 300;
	CHECK_OK(kvt_client_connect(&cl, &c));
	return cl;
}

static void *resume_later(void *arg)
{
	usleep((useconds_t)(uintptr_t)arg * 1000);
	kill(dpid, SIGCONT);
	return NULL;
}

static void test_lookup_timeout(void)
{
	kvt_client *cl = connect_fast(), *c2;
	kvt_cache_lookup_result r;
	kvt_page_key k = { 1, 2 };

	if (!cl)
		return;
	CHECK_OK(kvt_client_lookup(cl, &k, 1, 0, &r));
	stop_daemon();
	CHECK_ERR(kvt_client_lookup(cl, &k, 1, 0, &r), -ETIMEDOUT);
	kill(dpid, SIGCONT);
	usleep(200000); /* the late reply is there now */
	for (int i = 0; i < 3; i++) {
		int err = kvt_client_lookup(cl, &k, 1, 0, &r);

		if (err != -ECONNRESET) {
			fprintf(stderr, "after a timeout: %s (%s), want "
				"ECONNRESET\n", kvt_strerror(err),
				kvt_errdetail());
			kvt_test_failures++;
		}
	}
	kvt_client_close(cl);
	c2 = connect_fast();
	if (c2)
		CHECK_OK(kvt_client_lookup(c2, &k, 1, 0, &r));
	kvt_client_close(c2);
}

/* A LOAD that times out while the daemon is stopped; the daemon resumes
 * after @resume_ms (0: not at all, until the test does). */
static void test_load_timeout(unsigned resume_ms)
{
	kvt_client *cl = connect_fast();
	kvt_client_job *j = NULL;
	kvt_page_key k = { 5, 6 };
	uint32_t blk = 0;
	uint64_t t0, ms;
	pthread_t th;
	srv_mem sm;
	int err;

	if (!cl)
		return;
	CHECK_OK(srv_mem_alloc(cl, &sm, 4));
	CHECK(daemon_kv_maps() >= 1);
	stop_daemon();
	if (resume_ms)
		pthread_create(&th, NULL, resume_later,
			       (void *)(uintptr_t)resume_ms);
	t0 = kvt_now_ns();
	err = kvt_client_load(cl, sm.m, &k, 1, 0, &blk, &j);
	ms = (kvt_now_ns() - t0) / 1000000;
	CHECK_EQ(err, -ETIMEDOUT);
	fprintf(stderr, "LOAD timed out after %llu ms (daemon resumed at %u "
		"ms): %s\n", (unsigned long long)ms, resume_ms,
		kvt_errdetail());
	if (resume_ms) {
		/* returned: the daemon holds nothing of ours */
		int n = daemon_kv_maps();

		if (n != 0) {
			fprintf(stderr, "the LOAD returned while the daemon "
				"still mapped %d client memories\n", n);
			kvt_test_failures++;
		}
		CHECK(strstr(kvt_errdetail(), "let go") != NULL);
		pthread_join(th, NULL);
	} else {
		CHECK(strstr(kvt_errdetail(), "may still be written") != NULL);
		kill(dpid, SIGCONT);
	}
	CHECK_ERR(kvt_client_lookup(cl, &k, 1, 0, &(kvt_cache_lookup_result){ 0 }),
		  -ECONNRESET);
	kvt_client_close(cl);
}

struct waiter {
	kvt_client_job *j;
	int result;
	uint64_t done_ns;
};

static void *wait_job(void *arg)
{
	struct waiter *w = arg;

	w->result = kvt_client_job_wait(w->j, -1);
	w->done_ns = kvt_now_ns();
	return NULL;
}

/* A store of many pages running when a request times out: its wait in
 * another thread ends once the daemon let go (every block failed or the
 * store done), never with the daemon still at it. */
static void test_wait_across_timeout(void)
{
	enum { N = 64 };
	kvt_client *cl = connect_fast();
	kvt_page_key keys[N];
	uint32_t blocks[N];
	struct waiter w = { 0 };
	kvt_cache_lookup_result r;
	pthread_t th;
	srv_mem sm;

	if (!cl)
		return;
	CHECK_OK(srv_mem_alloc(cl, &sm, N));
	for (int i = 0; i < N; i++) {
		keys[i] = (kvt_page_key){ 100 + (uint64_t)i, 7 };
		blocks[i] = (uint32_t)i;
		srv_fill(&sm, (uint64_t)i, keys[i]);
	}
	CHECK_OK(kvt_client_store(cl, sm.m, keys, N, 0, blocks, &w.j));
	if (!w.j) {
		kvt_client_close(cl);
		return;
	}
	pthread_create(&th, NULL, wait_job, &w);
	stop_daemon();
	CHECK_ERR(kvt_client_lookup(cl, keys, 1, 0, &r), -ETIMEDOUT);
	kill(dpid, SIGCONT);
	pthread_join(th, NULL);
	CHECK(w.result == 0 || w.result == -ECONNRESET ||
	      w.result == -ECANCELED);
	/* ended with the connection: the daemon had let go of it; done or
	 * cancelled before that: the memory goes with the teardown */
	if (w.result == -ECONNRESET)
		CHECK_EQ(daemon_kv_maps(), 0);
	for (int i = 0; i < 300 && daemon_kv_maps() > 0; i++)
		usleep(10000);
	CHECK_EQ(daemon_kv_maps(), 0);
	kvt_client_job_free(w.j);
	kvt_client_close(cl);
}

int main(void)
{
	kvtd_config cfg = { 0 };

	snprintf(sock, sizeof(sock), "/tmp/kvtd-tmo-%d.sock", (int)getpid());
	model = srv_model();
	cfg.socket = sock;
	cfg.tiers = "dram:8M";
	cfg.model = model;
	cfg.page_tokens = SRV_P;
	cfg.lease_ms = 1500;
	dpid = srv_start(&cfg);
	CHECK(dpid > 0);
	if (dpid > 0) {
		test_lookup_timeout();
		test_load_timeout(700);
		test_load_timeout(0);
		test_wait_across_timeout();
		CHECK_EQ(srv_stop(dpid), 0);
	}
	unlink(model);
	TEST_DONE();
}
