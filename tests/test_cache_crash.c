/*
 * test_cache_crash — kill -9 in the middle of a store burst, restart:
 * every page the restarted cache serves verifies; pages whose commit had
 * not finished are absent, not corrupt.
 *
 *   parent                               child (fork)
 *   ------                               ------------
 *   fork ------------------------------> open [dram +] ssd:DIR,persist
 *                                        (rebuild), register memory
 *   sleep 5..150 ms                      a burst that never ends: 4
 *                                        stores of random sessions'
 *                                        prefixes always in flight;
 *                                        background demotion runs
 *                                        dram -> ssd -> gone all along
 *   SIGKILL ---------------------------> (dies wherever it is)
 *   open a cache over the same dir (rebuild)
 *   kvt_cache_verify(): every restored page's bytes match its sums
 *   lookup + load of every session: each page served has the bytes the
 *   child stored (derived from its key); no page is present that the
 *   child never began to store
 *   close (clean), next round: the child restarts from what is there
 *
 * The child tells the parent through a shared mapping what it began and
 * what it finished (and whether stores were in flight when it died), so
 * the test can say that the kills did land in bursts. Rounds: 12 by
 * default (KVT_CRASH_ROUNDS), about 3 s here; the seed is printed and
 * KVT_CRASH_SEED=N runs it again.
 */
#include "cache_util.h"

#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>

#define P 4
#define NB 128          /* engine blocks */
#define NSESS 48        /* sessions (prompts) */
#define MAXPG 16        /* pages per session at most */
#define BURST 4         /* stores in flight at once */

struct shared {
	volatile uint32_t ready;            /* child: open done */
	volatile uint32_t open_err;         /* child: open failed (code) */
	volatile uint32_t inflight;         /* child: stores submitted, not
					       yet waited for */
	volatile uint32_t began[NSESS];     /* pages whose store began */
	volatile uint32_t done[NSESS];      /* pages a store finished with */
	volatile uint64_t stores, pages;    /* child: stores finished */
};

static kvt_geom geom;
static char spec[1024], spec_ssd[1024];

static int open_cache(kvt_cache **c, const char *tiers, unsigned flags)
{
	kvt_cache_config cfg = KVT_CACHE_CONFIG_INIT;

	cfg.tiers = tiers;
	cfg.geom = &geom;
	cfg.flags = flags;
	return kvt_cache_open(c, &cfg);
}

/* The child: store bursts until killed. Never returns. */
static void child(struct shared *sh, const char *tiers, uint64_t seed)
{
	kvt_page_key keys[BURST][MAXPG];
	kvt_cache_job *jobs[BURST] = { NULL };
	uint32_t sess[BURST], len[BURST];
	kvt_cache *c;
	eng e;
	int err;

	if ((err = open_cache(&c, tiers, 0))) {
		sh->open_err = (uint32_t)-err;
		_exit(2);
	}
	if (eng_init(&e, &geom, NB, ENG_KV_OUTER, 64, -1) ||
	    eng_register(c, &e)) {
		sh->open_err = 1;
		_exit(2);
	}
	sh->ready = 1;
	/* a pipeline: BURST stores always in flight, each with its own
	 * blocks; a slot's next store is filled once its last one is done */
	for (int n = 0;; n = (n + 1) % BURST) {
		uint32_t s = (uint32_t)(test_rand(&seed) % NSESS);
		uint32_t np = 1 + (uint32_t)(test_rand(&seed) % MAXPG);
		uint32_t blocks[MAXPG];

		if (jobs[n]) {
			if (kvt_cache_job_wait(jobs[n], -1) == 0) {
				if (len[n] > sh->done[sess[n]])
					sh->done[sess[n]] = len[n];
				sh->stores++;
				sh->pages += len[n];
			}
			kvt_cache_job_free(jobs[n]);
			jobs[n] = NULL;
			sh->inflight--;
		}
		if (session_keys(c, 0, s, np, keys[n]))
			continue;
		for (uint32_t i = 0; i < np; i++)
			blocks[i] = (uint32_t)n * MAXPG + i;
		eng_fill(&e, keys[n], np, 0, blocks);
		if (np > sh->began[s])
			sh->began[s] = np; /* before the store: its lock orders it */
		if (kvt_cache_store(c, 0, keys[n], np, 0, blocks, &jobs[n])) {
			jobs[n] = NULL;
			continue;
		}
		sess[n] = s;
		len[n] = np;
		sh->inflight++;
	}
}

/* The parent's check after a kill: returns the pages served. */
static uint64_t check_restart(const struct shared *sh, uint32_t *ever,
			      kvt_cache_restore *rs)
{
	kvt_page_key k[MAXPG];
	uint32_t d[MAXPG];
	kvt_cache_check chk;
	kvt_cache *c;
	uint64_t served = 0;
	eng e;
	int err;

	if ((err = open_cache(&c, spec_ssd, KVT_CACHE_NO_BACKGROUND))) {
		fprintf(stderr, "reopen: %s (%s)\n", kvt_strerror(err),
			kvt_errdetail());
		kvt_test_failures++;
		return 0;
	}
	CHECK_OK(eng_init(&e, &geom, NB, ENG_BLOCK_OUTER, 64, -1));
	CHECK_OK(eng_register(c, &e));
	CHECK_OK(kvt_cache_restore_info(c, rs));
	/* every restored page's bytes match its recorded sums */
	CHECK_OK(kvt_cache_verify(c, &chk));
	CHECK_EQ(chk.bad, 0);
	CHECK_EQ(chk.checked, rs->restored);
	CHECK_OK(kvt_index_check(kvt_cache_index(c)));
	for (uint32_t s = 0; s < NSESS; s++) {
		kvt_cache_lookup_result r;
		long nf = -1;

		CHECK_OK(session_keys(c, 0, s, MAXPG, k));
		CHECK_OK(kvt_cache_lookup(c, 0, k, MAXPG, 0, &r));
		if (r.pages > ever[s]) {
			fprintf(stderr, "session %u: %llu pages present, the "
				"child never began more than %u\n", s,
				(unsigned long long)r.pages, ever[s]);
			kvt_test_failures++;
		}
		CHECK_EQ(r.inflight, 0);
		if (!r.pages)
			continue;
		for (uint32_t i = 0; i < r.pages; i++) {
			d[i] = i;
			eng_poison(&e, i);
		}
		CHECK_OK(cache_load_wait(c, 0, k, r.pages, 0, d, NULL, &nf,
					 NULL));
		CHECK_EQ(nf, 0);
		for (uint32_t i = 0; i < r.pages; i++)
			if (!eng_block_is(&e, d[i], k[i])) {
				fprintf(stderr, "session %u page %u: wrong "
					"bytes served after the restart\n", s, i);
				kvt_test_failures++;
			}
		served += r.pages;
	}
	{
		kvt_cache_stat st;

		kvt_cache_stat_get(c, &st);
		CHECK_EQ(st.corrupt, 0);
		CHECK_EQ(st.load_pages, served);
	}
	(void)sh;
	kvt_cache_close(c);
	eng_free(&e);
	return served;
}

int main(void)
{
	const char *dir = test_dir("cache_crash");
	const char *env = getenv("KVT_CRASH_ROUNDS");
	int rounds = env ? atoi(env) : 12, mid_burst = 0, restarted = 0;
	uint32_t ever[NSESS] = { 0 };
	const char *seed_env = getenv("KVT_CRASH_SEED"); /* to reproduce */
	uint64_t seed = seed_env ? strtoull(seed_env, NULL, 10) :
				   0x243f6a8885a308d3ull ^ (uint64_t)time(NULL);
	uint64_t total_served = 0, total_stores = 0, bad_records = 0;
	struct shared *sh;

	small_geom(&geom, 4, P); /* 8 KiB pages */
	/* dram 64 pages, ssd 256 of the 768 the sessions have: pages churn
	 * through both. Odd rounds run the child on the ssd tier alone
	 * (stores commit into ssd), even ones with dram in front (pages
	 * reach ssd by background demotion). */
	snprintf(spec_ssd, sizeof(spec_ssd), "ssd:%s/ssd,2M,persist", dir);
	snprintf(spec, sizeof(spec), "dram:512K %s", spec_ssd);
	test_watchdog(rounds * 10 + 30);
	fprintf(stderr, "seed %llu, %d rounds\n", (unsigned long long)seed,
		rounds);
	sh = mmap(NULL, sizeof(*sh), PROT_READ | PROT_WRITE,
		  MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	if (sh == MAP_FAILED)
		SKIP("no shared mapping");
	for (int round = 0; round < rounds; round++) {
		uint64_t delay = 5 + test_rand(&seed) % 146; /* ms */
		struct timespec ts = { (time_t)(delay / 1000),
				       (long)(delay % 1000) * 1000000 };
		kvt_cache_restore rs;
		int status;
		pid_t pid;

		test_phase = "child";
		memset((void *)sh, 0, sizeof(*sh));
		fflush(NULL);
		pid = fork();
		if (pid < 0)
			SKIP("fork failed");
		if (pid == 0) {
			alarm(0);
			child(sh, round % 2 ? spec_ssd : spec,
			      seed + (uint64_t)round * 7919);
		}
		/* let it open (rebuild) first, most rounds: a kill during the
		 * open's rebuild is a crash too (every fourth round) */
		for (int i = 0; round % 4 && !sh->ready && !sh->open_err &&
				i < 5000; i++)
			usleep(1000);
		nanosleep(&ts, NULL);
		kill(pid, SIGKILL);
		CHECK(waitpid(pid, &status, 0) == pid);
		if (!WIFSIGNALED(status) || WTERMSIG(status) != SIGKILL) {
			fprintf(stderr, "round %d: child ended by itself "
				"(status 0x%x, open error %u)\n", round, status,
				sh->open_err);
			kvt_test_failures++;
			break;
		}
		for (uint32_t s = 0; s < NSESS; s++)
			if (sh->began[s] > ever[s])
				ever[s] = sh->began[s];
		mid_burst += sh->inflight > 0;
		total_stores += sh->stores;

		test_phase = "restart";
		total_served += check_restart(sh, ever, &rs);
		restarted += rs.restored > 0;
		bad_records += rs.bad_records;
		fprintf(stderr, "round %2d: killed after %3llu ms, %llu stores "
			"done, %u in flight; restart: %llu records, %llu "
			"restored, %llu orphans, %llu bad, rebuild %.2f ms\n",
			round, (unsigned long long)delay,
			(unsigned long long)sh->stores, sh->inflight,
			(unsigned long long)rs.records,
			(unsigned long long)rs.restored,
			(unsigned long long)rs.orphans,
			(unsigned long long)rs.bad_records, rs.rebuild_s * 1e3);
	}
	fprintf(stderr, "%d rounds: %d killed mid-burst, %d restarts with "
		"pages, %llu stores, %llu pages served after restarts, %llu "
		"torn records dropped\n", rounds, mid_burst, restarted,
		(unsigned long long)total_stores,
		(unsigned long long)total_served,
		(unsigned long long)bad_records);
	/* the test tested something: kills landed in bursts, restarts had
	 * pages to serve */
	CHECK(mid_burst >= rounds / 2);
	CHECK(restarted >= rounds / 3);
	CHECK(total_served > 0);
	munmap(sh, sizeof(*sh));
	TEST_DONE();
}
