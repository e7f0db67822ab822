/*
 * test_client_close_threads — closing a client while other threads wait on
 * its jobs (issue 21, finding 7: kvt_client_close() freed the jobs under
 * a kvt_client_job_wait() in another thread: a use-after-free, segfaults
 * and a hang in 30 runs). 30 rounds each of:
 *
 *   - kvt_client_shutdown() racing the waits, then join, then close;
 *   - kvt_client_close() while the waits are inside the library (it waits
 *     for them to return before it frees).
 *
 * Every wait returns (done, or -ECONNRESET: every block failed), nothing
 * is touched after it was freed (ASan), no data race (TSan).
 */
#include "server_util.h"

#include <pthread.h>
#include <stdatomic.h>

enum { N = 64, WAITERS = 3 };

static char sock[108];
static const char *model;
static pid_t dpid;

static void *resume_soon(void *arg)
{
	(void)arg;
	usleep(30000);
	kill(dpid, SIGCONT);
	return NULL;
}

struct waiter {
	kvt_client_job *j;
	_Atomic int in;
	int result;
};

static void *wait_job(void *arg)
{
	struct waiter *w = arg;

	atomic_store(&w->in, 1);
	w->result = kvt_client_job_wait(w->j, -1);
	return NULL;
}

static void round_trip(int direct_close)
{
	struct waiter w[WAITERS];
	pthread_t th[WAITERS];
	kvt_page_key keys[N];
	uint32_t blocks[N];
	kvt_client *cl = NULL;
	kvt_client_job *st = NULL;
	pthread_t rs;
	srv_mem sm;
	int stst;

	CHECK_OK(srv_connect(&cl, sock, model, 0, 1, 0));
	if (!cl)
		return;
	CHECK_OK(srv_mem_alloc(cl, &sm, (uint64_t)N * (WAITERS + 1)));
	for (int i = 0; i < N; i++) {
		keys[i] = (kvt_page_key){ 7, (uint64_t)i + 1 };
		blocks[i] = (uint32_t)i;
	}
	CHECK_OK(kvt_client_store(cl, sm.m, keys, N, 0, blocks, &st));
	if (st)
		CHECK_EQ(srv_job_end(st, NULL), 0);
	for (int i = 0; i < WAITERS; i++) {
		uint32_t into[N]; /* each its own blocks: no two copies race */

		w[i].j = NULL;
		atomic_store(&w[i].in, 0);
		for (int b = 0; b < N; b++)
			into[b] = (uint32_t)(N * (i + 1) + b);
		CHECK_OK(kvt_client_load(cl, sm.m, keys, N, 0, into, &w[i].j));
		pthread_create(&th[i], NULL, wait_job, &w[i]);
	}
	/* the daemon stopped, the loads cannot end: the waits are inside the
	 * library when the close comes; it resumes 30 ms in */
	kill(dpid, SIGSTOP);
	waitpid(dpid, &stst, WUNTRACED);
	for (int i = 0; i < WAITERS; i++)
		while (!atomic_load(&w[i].in))
			usleep(100);
	pthread_create(&rs, NULL, resume_soon, NULL);
	if (direct_close) {
		usleep(2000); /* the waiters are inside the library */
		kvt_client_close(cl);
	} else {
		kvt_client_shutdown(cl);
	}
	for (int i = 0; i < WAITERS; i++) {
		pthread_join(th[i], NULL);
		/* done (all loaded), or ended (cancelled) with the
		 * connection */
		if (w[i].result != 0 && w[i].result != -ECONNRESET &&
		    w[i].result != -ECANCELED) {
			fprintf(stderr, "wait: %s\n", kvt_strerror(w[i].result));
			kvt_test_failures++;
		}
	}
	pthread_join(rs, NULL);
	if (!direct_close)
		kvt_client_close(cl);
}

int main(void)
{
	kvtd_config cfg = { 0 };
	pid_t d;

	snprintf(sock, sizeof(sock), "/tmp/kvtd-cct-%d.sock", (int)getpid());

	model = srv_model();
	cfg.socket = sock;
	cfg.tiers = "dram:8M";
	cfg.model = model;
	cfg.page_tokens = SRV_P;
	d = dpid = srv_start(&cfg);
	CHECK(d > 0);
	if (d > 0) {
		for (int r = 0; r < 30; r++) {
			round_trip(0);
			round_trip(1);
		}
		CHECK_EQ(srv_stop(d), 0);
	}
	unlink(model);
	TEST_DONE();
}
