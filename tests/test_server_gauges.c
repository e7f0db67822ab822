/*
 * test_server_gauges — the daemon's jobs_in_flight, leases and
 * pinned_pages gauges are true at every render (issue 21, finding 10:
 * they were sampled by the lease reaper every 50 ms, so a 1,024-page
 * store still running read 0 while a lookup showed its pages in flight).
 * A store of 1,024 pages, then STATS at once: whenever the job is still
 * running after STATS returned, STATS must have counted it; once every
 * job is done, all three read 0.
 */
#include "server_util.h"

#define NP 1024

static char sock[108];
static const char *model;

int main(void)
{
	kvtd_config cfg = { 0 };
	kvt_page_key keys[NP];
	uint32_t blocks[NP];
	kvt_client *cl = NULL;
	int seen = 0, tries = 0;
	srv_mem sm;
	pid_t d;

	snprintf(sock, sizeof(sock), "/tmp/kvtd-gauge-%d.sock", (int)getpid());
	model = srv_model();
	cfg.socket = sock;
	cfg.tiers = "dram:64M";
	cfg.model = model;
	cfg.page_tokens = SRV_P;
	d = srv_start(&cfg);
	CHECK(d > 0);
	if (d <= 0)
		return 1;
	CHECK_OK(srv_connect(&cl, sock, model, 0, 1, 0));
	if (!cl || srv_mem_alloc(cl, &sm, NP))
		return 1;
	for (int i = 0; i < NP; i++)
		blocks[i] = (uint32_t)i;
	for (; tries < 20 && seen < 3; tries++) {
		kvt_client_job *j = NULL;
		double jobs, pinned;

		for (int i = 0; i < NP; i++)
			keys[i] = (kvt_page_key){ (uint64_t)tries + 1,
						  (uint64_t)i + 1 };
		CHECK_OK(kvt_client_store(cl, sm.m, keys, NP, 0, blocks, &j));
		if (!j)
			break;
		jobs = srv_gauge(cl, "jobs_in_flight");
		pinned = srv_gauge(cl, "pinned_pages");
		if (kvt_client_job_poll(j) == -EINPROGRESS) {
			/* running through the whole render: it was counted */
			seen++;
			if (jobs < 1 || pinned < NP) {
				fprintf(stderr, "a store of %d pages running: "
					"jobs_in_flight %.0f, pinned_pages "
					"%.0f\n", NP, jobs, pinned);
				kvt_test_failures++;
			}
		}
		CHECK_EQ(srv_job_end(j, NULL), 0);
	}
	fprintf(stderr, "%d of %d stores still running after STATS\n", seen,
		tries);
	CHECK_EQ(srv_gauge(cl, "jobs_in_flight"), 0);
	CHECK_EQ(srv_gauge(cl, "leases"), 0);
	CHECK_EQ(srv_gauge(cl, "pinned_pages"), 0);
	kvt_client_close(cl);
	CHECK_EQ(srv_stop(d), 0);
	unlink(model);
	if (!seen && !kvt_test_failures)
		SKIP("no store was still running after STATS (too fast here)");
	TEST_DONE();
}
