/*
 * test_xfer_threads — many threads on one engine (run under TSan in CI):
 * four submitters, each owning its own slot range on every tier (dram,
 * fabric, hostdev in both layouts, ssd), move random page lists between
 * random tiers with random flags (checksums out and back, cancel right
 * after submit, completion by wait, poll or callback), while another
 * thread pauses and resumes the engine and a stressor copies in the
 * background. Each submitter keeps a model — the XXH3 of the page every
 * slot should hold — updated on success (and re-read after a cancel,
 * whose destination is undefined), and checks it against the tiers.
 */
#include "xfer_util.h"

#include <pthread.h>
#include <stdatomic.h>
#include <unistd.h>

enum { THREADS = 4, PER = 12, SLOTS = THREADS * PER, NT = 5, ROUNDS = 200 };

static kvt_tier *tiers[NT];
static kvt_xfer *x;
static atomic_int stop_chaos;

struct sub {
	int id;
	uint64_t seed;
	uint64_t model[NT][PER];
	int jobs, cancelled, failed;
	pthread_t th;
};

struct cb {
	atomic_int fired;
	int err;
};

static void on_done(kvt_xfer_job *j, int err, void *arg)
{
	struct cb *c = arg;

	c->err = err;
	atomic_store(&c->fired, 1);
}

static void model_read(struct sub *s, int t)
{
	for (int i = 0; i < PER; i++)
		s->model[t][i] = page_xxh3(tiers[t], (uint32_t)(s->id * PER + i));
}

static int wait_any(struct sub *s, kvt_xfer_job *j, struct cb *c, int how)
{
	int err;

	switch (how) {
	case 0:
		return kvt_xfer_wait(j, -1);
	case 1:
		while ((err = kvt_xfer_poll(j)) == -EINPROGRESS)
			usleep(50);
		return err;
	default:
		err = kvt_xfer_wait(j, -1); /* the callback has run by now */
		CHECK(atomic_load(&c->fired));
		CHECK_EQ(c->err, err);
		return err;
	}
}

static void *submitter(void *arg)
{
	struct sub *s = arg;
	uint32_t ss[PER], ds[PER];
	uint64_t sums[PER];

	for (int t = 0; t < NT; t++)
		model_read(s, t);
	for (int r = 0; r < ROUNDS; r++) {
		int a = (int)(test_rand(&s->seed) % NT), b, how, cancel;
		size_t n = test_rand(&s->seed) % (PER + 1);
		struct cb c = { 0 };
		kvt_xfer_job *j;
		kvt_xfer_desc d;
		int err;

		do
			b = (int)(test_rand(&s->seed) % NT);
		while (b == a);
		if (a == 4 && b == 4)
			continue;
		pick_slots(&s->seed, ss, n, PER, 0);
		pick_slots(&s->seed, ds, n, PER, (int)(r % 3));
		for (size_t i = 0; i < n; i++)
			ss[i] += s->id * PER, ds[i] += s->id * PER;
		how = (int)(test_rand(&s->seed) % 3);
		cancel = test_rand(&s->seed) % 6 == 0;
		d = (kvt_xfer_desc){ .src = tiers[a], .dst = tiers[b],
				     .src_slots = ss, .dst_slots = ds,
				     .npages = n, .flags = KVT_XFER_SUM,
				     .sums = sums,
				     .done = how == 2 ? on_done : NULL,
				     .arg = &c };
		CHECK_OK(kvt_xfer_submit(x, &d, &j));
		if (kvt_test_failures)
			break;
		if (cancel)
			kvt_xfer_cancel(j);
		err = wait_any(s, j, &c, how);
		kvt_xfer_job_free(j);
		s->jobs++;
		if (err == -ECANCELED) {
			s->cancelled++;
			model_read(s, b);
			continue;
		}
		CHECK_OK(err);
		for (size_t i = 0; i < n; i++) {
			uint64_t want = s->model[a][ss[i] - s->id * PER];
			CHECK(sums[i] == want);
			s->model[b][ds[i] - s->id * PER] = want;
		}
		/* and back with VERIFY, half the time */
		if (n && r % 2) {
			d = (kvt_xfer_desc){ .src = tiers[b], .dst = tiers[a],
					     .src_slots = ds, .dst_slots = ss,
					     .npages = n,
					     .flags = KVT_XFER_VERIFY,
					     .sums = sums };
			CHECK_OK(run_job(x, &d));
		}
	}
	for (int t = 0; t < NT; t++)
		for (int i = 0; i < PER; i++)
			if (page_xxh3(tiers[t], (uint32_t)(s->id * PER + i)) !=
			    s->model[t][i]) {
				fprintf(stderr, "thread %d: tier %d slot %d holds "
					"the wrong page\n", s->id, t,
					s->id * PER + i);
				s->failed++;
			}
	return NULL;
}

static void *chaos(void *arg)
{
	while (!atomic_load(&stop_chaos)) {
		kvt_xfer_pause(x, 1);
		usleep(300);
		kvt_xfer_pause(x, 0);
		usleep(2000);
	}
	return NULL;
}

int main(void)
{
	kvt_xfer_config cfg = { .cpu_threads = 3, .task_bytes = 16384,
				.uring_depth = 8 };
	const char *specs[NT] = { "dram", "fabric:memfd", "hostdev",
				  "hostdev,layout=sglang", "ssd" };
	struct sub subs[THREADS];
	kvt_stress_stat st;
	kvt_stress *stress;
	pthread_t ch;
	kvt_geom g;
	int total = 0, cancelled = 0;

	CHECK_OK(kvt_geom_preset(&g, "llama-3.1-8b", 4, 8, 2));
	for (int t = 0; t < NT; t++) {
		char spec[400];
		uint64_t bytes = SLOTS * kvt_geom_page_bytes(&g);
		const char *comma = strchr(specs[t], ',');

		if (t == 4)
			snprintf(spec, sizeof(spec), "ssd:%s/s,%llu,temp",
				 test_dir("xfer-threads"),
				 (unsigned long long)bytes);
		else if (comma)
			snprintf(spec, sizeof(spec), "%.*s:%llu%s",
				 (int)(comma - specs[t]), specs[t],
				 (unsigned long long)bytes, comma);
		else if (!strcmp(specs[t], "fabric:memfd"))
			snprintf(spec, sizeof(spec), "fabric:memfd,%llu",
				 (unsigned long long)bytes);
		else
			snprintf(spec, sizeof(spec), "%s:%llu", specs[t],
				 (unsigned long long)bytes);
		if (!(tiers[t] = tier_open(spec, &g)))
			TEST_DONE();
		tier_fill(tiers[t], 100 + t);
	}
	CHECK_OK(kvt_xfer_create(&x, &cfg));
	CHECK_OK(kvt_stress_start(&stress, 1, 2 << 20, 0));
	pthread_create(&ch, NULL, chaos, NULL);
	for (int i = 0; i < THREADS; i++) {
		subs[i] = (struct sub){ .id = i, .seed = 1000 + i };
		pthread_create(&subs[i].th, NULL, submitter, &subs[i]);
	}
	for (int i = 0; i < THREADS; i++) {
		pthread_join(subs[i].th, NULL);
		total += subs[i].jobs;
		cancelled += subs[i].cancelled;
		CHECK_EQ(subs[i].failed, 0);
	}
	atomic_store(&stop_chaos, 1);
	pthread_join(ch, NULL);
	kvt_stress_sample(stress, &st);
	CHECK(st.bytes > 0);
	kvt_stress_stop(stress, &st);
	CHECK_EQ(st.running, 0);
	kvt_xfer_destroy(x);
	for (int t = 0; t < NT; t++)
		kvt_tier_close(tiers[t]);
	fprintf(stderr, "%d jobs from %d threads (%d cancelled), models agree\n",
		total, THREADS, cancelled);
	CHECK(total >= THREADS * ROUNDS * 9 / 10);
	TEST_DONE();
}
