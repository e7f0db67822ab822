/*
 * test_cache_crash_daemon — issue 11's test at the daemon: kill -9 the
 * daemon in the middle of a store burst, restart it; every page it serves
 * verifies (the bytes that land in the client's memory are the bytes
 * stored); pages whose commit had not finished are absent, not corrupt.
 *
 *   round: daemon child ([dram +] ssd:DIR,persist) <- client child storing
 *          bursts (4 stores always in flight) of random sessions' pages
 *          SIGKILL the daemon 20..150 ms after its first four stores
 *          finished (the client then fails
 *          its calls and is killed too)
 *          restart the daemon (it rebuilds the ssd tier's index)
 *          connect, look up and load every session; every page served
 *          holds its bytes; none is served the client never began to
 *          store; SIGTERM: the daemon drains and exits 0
 *
 * The cache-level version, with more rounds, is test_cache_crash.c.
 * Rounds: 6 (KVT_CRASH_ROUNDS), about 2 s here; KVT_CRASH_SEED=N repeats
 * a printed seed.
 */
#include "server_util.h"

#include <sys/mman.h>
#include <time.h>

#define NSESS 32
#define MAXPG 12
#define PIPE 4
#define NB (PIPE * MAXPG + MAXPG)

struct shared {
	volatile uint32_t began[NSESS];
	volatile uint32_t inflight;
	volatile uint64_t stores;
};

static char sock[108];
static const char *model;

/* The client child: store until the daemon is gone (then exit). */
static void storer(struct shared *sh, uint64_t seed)
{
	kvt_page_key keys[PIPE][MAXPG];
	kvt_client_job *jobs[PIPE] = { NULL };
	uint32_t tok[MAXPG * SRV_P];
	kvt_client *cl = NULL;
	srv_mem sm;

	if (srv_connect(&cl, sock, model, 1, 1, 0) || srv_mem_alloc(cl, &sm, NB))
		_exit(2);
	for (int n = 0;; n = (n + 1) % PIPE) {
		uint32_t s = (uint32_t)(test_rand(&seed) % NSESS);
		uint32_t np = 1 + (uint32_t)(test_rand(&seed) % MAXPG);
		uint32_t blk[MAXPG];

		if (jobs[n]) {
			if (srv_job_end(jobs[n], NULL) == 0)
				sh->stores++;
			jobs[n] = NULL;
			sh->inflight--;
		}
		srv_tokens(s, tok, np * SRV_P);
		if (kvt_client_hash_tokens(cl, tok, np * SRV_P, keys[n]))
			_exit(0); /* the daemon is gone */
		for (uint32_t i = 0; i < np; i++) {
			blk[i] = (uint32_t)n * MAXPG + i;
			srv_fill(&sm, blk[i], keys[n][i]);
		}
		if (np > sh->began[s])
			sh->began[s] = np;
		if (kvt_client_store(cl, sm.m, keys[n], np, 0, blk, &jobs[n])) {
			jobs[n] = NULL;
			continue;
		}
		sh->inflight++;
	}
}

/* After the restart: every session's pages served hold their bytes. */
static uint64_t check_served(const uint32_t *ever)
{
	uint32_t tok[MAXPG * SRV_P], blk[MAXPG];
	kvt_page_key keys[MAXPG];
	kvt_client *cl = NULL;
	kvt_client_job *j;
	uint64_t served = 0;
	srv_mem sm;

	CHECK_OK(srv_connect(&cl, sock, model, 1, 1, 0));
	if (!cl)
		return 0;
	CHECK_OK(srv_mem_alloc(cl, &sm, NB));
	for (uint32_t s = 0; s < NSESS; s++) {
		kvt_cache_lookup_result r;
		long nf = -1;

		srv_tokens(s, tok, MAXPG * SRV_P);
		CHECK_OK(kvt_client_hash_tokens(cl, tok, MAXPG * SRV_P, keys));
		CHECK_OK(kvt_client_lookup(cl, keys, MAXPG, 0, &r));
		if (r.pages > ever[s]) {
			fprintf(stderr, "session %u: %llu pages served, the client "
				"never began more than %u\n", s,
				(unsigned long long)r.pages, ever[s]);
			kvt_test_failures++;
		}
		if (!r.pages)
			continue;
		for (uint32_t i = 0; i < r.pages; i++) {
			blk[i] = i;
			srv_zero(&sm, i);
		}
		CHECK_OK(kvt_client_load(cl, sm.m, keys, r.pages, 0, blk, &j));
		if (kvt_test_failures)
			break;
		CHECK_OK(srv_job_end(j, &nf));
		CHECK_EQ(nf, 0);
		for (uint32_t i = 0; i < r.pages; i++)
			if (!srv_holds(&sm, blk[i], keys[i])) {
				fprintf(stderr, "session %u page %u: wrong bytes "
					"after the restart\n", s, i);
				kvt_test_failures++;
			}
		served += r.pages;
	}
	kvt_client_close(cl);
	return served;
}

int main(void)
{
	const char *env = getenv("KVT_CRASH_ROUNDS");
	int rounds = env ? atoi(env) : 6, with_pages = 0, mid_burst = 0;
	const char *seed_env = getenv("KVT_CRASH_SEED"); /* to reproduce */
	uint64_t seed = seed_env ? strtoull(seed_env, NULL, 10) :
				   0x9e3779b97f4a7c15ull ^ (uint64_t)time(NULL);
	uint64_t served_total = 0, stores_total = 0;
	uint32_t ever[NSESS] = { 0 };
	char tiers[700], ssd_only[700], tenants[64];
	kvtd_config cfg = { 0 };
	struct shared *sh;

	snprintf(sock, sizeof(sock), "/tmp/kvtd-crash-%d.sock", (int)getpid());
	model = srv_model();
	CHECK(model != NULL);
	if (!model)
		TEST_DONE();
	/* dram 8 pages, ssd 256 of the 384 the sessions have; odd rounds
	 * the ssd tier alone (stores commit into it) */
	snprintf(ssd_only, sizeof(ssd_only), "ssd:%s/ssd,2M,persist",
		 test_dir("cache_crash_daemon"));
	snprintf(tiers, sizeof(tiers), "dram:64K %s", ssd_only);
	snprintf(tenants, sizeof(tenants), "crash:1,uid=%u",
		 (unsigned)geteuid());
	cfg.socket = sock;
	cfg.model = model;
	cfg.page_tokens = SRV_P;
	cfg.tp = 1;
	cfg.tenants = tenants;
	cfg.tiers = tiers;
	sh = mmap(NULL, sizeof(*sh), PROT_READ | PROT_WRITE,
		  MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	if (sh == MAP_FAILED)
		SKIP("no shared mapping");
	fprintf(stderr, "seed %llu, %d rounds\n", (unsigned long long)seed,
		rounds);
	alarm((unsigned)rounds * 20 + 30);
	for (int round = 0; round < rounds && !kvt_test_failures; round++) {
		uint64_t delay = 20 + test_rand(&seed) % 131;
		struct timespec ts = { 0, (long)delay * 1000000 };
		uint64_t served;
		pid_t d, c;
		int st;

		memset((void *)sh, 0, sizeof(*sh));
		cfg.tiers = round % 2 ? ssd_only : tiers;
		d = srv_start(&cfg);
		CHECK(d > 0);
		if (d <= 0)
			break;
		fflush(NULL);
		c = fork();
		if (c == 0) {
			alarm(0);
			storer(sh, seed + (uint64_t)round * 104729);
		}
		/* a loaded machine: let a few stores finish first (5 s at
		 * most), so the restart has pages to serve */
		for (int i = 0; i < 5000 && sh->stores < 4; i++)
			usleep(1000);
		nanosleep(&ts, NULL);
		kill(d, SIGKILL);
		CHECK(waitpid(d, &st, 0) == d && WIFSIGNALED(st));
		kill(c, SIGKILL);
		waitpid(c, NULL, 0);
		for (uint32_t s = 0; s < NSESS; s++)
			if (sh->began[s] > ever[s])
				ever[s] = sh->began[s];
		stores_total += sh->stores;
		mid_burst += sh->inflight > 0;

		d = srv_start(&cfg); /* the restart: rebuilds from the records */
		CHECK(d > 0);
		if (d <= 0)
			break;
		served = check_served(ever);
		served_total += served;
		with_pages += served > 0;
		CHECK_EQ(srv_stop(d), 0);
		fprintf(stderr, "round %d: daemon killed after %llu ms, %llu "
			"stores done, %u in flight; after the restart %llu pages "
			"served, all verified\n", round, (unsigned long long)delay,
			(unsigned long long)sh->stores, sh->inflight,
			(unsigned long long)served);
	}
	fprintf(stderr, "%d rounds: %d killed with stores in flight, %llu "
		"stores, %d restarts with pages, %llu pages served after "
		"restarts\n", rounds, mid_burst,
		(unsigned long long)stores_total, with_pages,
		(unsigned long long)served_total);
	/* the test tested something: kills in bursts, restarts with pages */
	CHECK(mid_burst >= rounds / 2);
	CHECK(with_pages >= rounds / 2);
	unlink(model);
	unlink(sock);
	munmap(sh, sizeof(*sh));
	TEST_DONE();
}
