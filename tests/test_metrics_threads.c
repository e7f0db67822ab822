/*
 * test_metrics_threads.c — the metrics registry under concurrency (run
 * under TSan in CI): updater threads count into shared tenant blocks and
 * the node block while a thread registers more tenants, a renderer checks
 * every text and JSON snapshot (well-formed, counters never go back), and
 * a client scrapes GET /metrics. At the end every counter holds exactly
 * what the threads added.
 */
#include "harness.h"
#include "metrics_util.h"
#include "server/metrics.h"
#include "core/core.h"

#include <cjson/cJSON.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>

#define UPDATERS 4
#define ITERS 45000 /* a multiple of 9: see the histogram check */
#define REG 40 /* tenants the registrar adds while updates run */

static kvtd_metrics *m;
static kvtd_mtenant *ta, *tb;
static atomic_int running;
static atomic_int renders, scrapes, render_fail, scrape_fail;
static atomic_int updating, overlapped; /* updaters running; renders and
					   scrapes that ran while they did */
static unsigned port;

static void *updater(void *arg)
{
	uintptr_t id = (uintptr_t)arg;
	uint64_t seed = 0x9e3779b97f4a7c15ull * (id + 1);

	/* start once a render (and a scrape) went through, so they overlap */
	while (!atomic_load(&renders) || (port && !atomic_load(&scrapes)))
		sched_yield();
	for (int i = 0; i < ITERS; i++) {
		kvtd_mtenant *t = (i % 3 == 0) ? ta : (i % 3 == 1) ? tb : NULL;
		uint64_t r = test_rand(&seed);

		kvtd_metrics_hit(m, t, KVT_TIER_DRAM, 2);
		kvtd_metrics_miss(m, t, 1);
		kvtd_metrics_read_failure(m, t, KVT_TIER_SSD, 1);
		kvtd_metrics_bytes(m, t, KVTD_END_DRAM, KVTD_END_ENGINE, 4096);
		kvtd_metrics_eviction(m, t, KVT_TIER_DRAM, 1);
		kvtd_metrics_demotion(m, t, KVT_TIER_DRAM, 1);
		kvtd_metrics_lease_expiry(m, t, KVTD_LEASE_DEADLINE, 1);
		kvtd_metrics_checksum_failure(m, t, KVT_TIER_SSD, 1);
		kvtd_metrics_protocol_error(m, t, KVTD_PERR_TRUNCATED);
		/* 1 us .. ~1 s, spread over the buckets */
		kvtd_metrics_observe(m, t, (enum kvtd_op)(i / 3 % KVTD_OP_COUNT),
				     1000 + (r >> 34));
		if (i % 1024 == 0)
			kvtd_metrics_gauge_set(m, KVTD_G_CLIENTS, (uint64_t)i);
		if (i % 4096 == 0)
			kvtd_metrics_tenant_pages(m, t, KVT_TIER_DRAM,
						  (uint64_t)i, 1000000);
	}
	return NULL;
}

static void *registrar(void *arg)
{
	char name[32];

	for (int i = 0; i < REG; i++) {
		kvtd_mtenant *t, *again;

		snprintf(name, sizeof(name), "late-%d", i);
		CHECK_OK(kvtd_metrics_tenant(m, 1000 + (uint32_t)i, name, &t));
		CHECK_OK(kvtd_metrics_tenant(m, 1000 + (uint32_t)i, name,
					     &again));
		CHECK(t == again);
		kvtd_metrics_hit(m, t, KVT_TIER_FABRIC, 1);
	}
	return NULL;
}

static void *renderer(void *arg)
{
	double last_hits = 0, last_count = 0;
	char why[256];

	while (atomic_load(&running)) {
		char *text = NULL, *json = NULL;
		double v;
		cJSON *root;

		if (kvtd_metrics_render_text(m, &text, NULL) ||
		    expo_check(text, why, sizeof(why)) < 0) {
			fprintf(stderr, "render: %s\n", text ? why : "failed");
			atomic_fetch_add(&render_fail, 1);
			kvt_free(text);
			break;
		}
		/* absent (NAN) until a tier counted something: read as 0 */
		v = expo_value(text, "kvtier_hits_total{tenant=\"a\",tier=\"dram\"}");
		v = isnan(v) ? 0 : v;
		if (!(v >= last_hits))
			atomic_fetch_add(&render_fail, 1);
		last_hits = v;
		v = expo_value(text, "kvtier_load_duration_seconds_count{tenant=\"b\"}");
		if (!(v >= last_count))
			atomic_fetch_add(&render_fail, 1);
		last_count = v;
		kvt_free(text);
		if (kvtd_metrics_render_json(m, &json, NULL)) {
			atomic_fetch_add(&render_fail, 1);
			break;
		}
		root = cJSON_Parse(json);
		if (!root)
			atomic_fetch_add(&render_fail, 1);
		cJSON_Delete(root);
		kvt_free(json);
		atomic_fetch_add(&renders, 1);
		if (atomic_load(&updating))
			atomic_fetch_add(&overlapped, 1);
	}
	return NULL;
}

static void *scraper(void *arg)
{
	char why[256];

	while (atomic_load(&running)) {
		char *resp = NULL;
		int st = http_request(port, "GET", "/metrics", &resp);

		if (st != 200 || expo_check(http_body(resp), why,
					    sizeof(why)) < 0) {
			fprintf(stderr, "scrape: %d %s\n", st, why);
			atomic_fetch_add(&scrape_fail, 1);
			free(resp);
			break;
		}
		free(resp);
		atomic_fetch_add(&scrapes, 1);
		if (atomic_load(&updating))
			atomic_fetch_add(&overlapped, 1);
	}
	return NULL;
}

int main(void)
{
	pthread_t up[UPDATERS], reg, ren, scr;
	kvtd_http *h = NULL;
	const uint64_t per = (uint64_t)UPDATERS * ITERS / 3; /* each block */
	char *text;
	int err;

	CHECK_OK(kvtd_metrics_create(&m));
	CHECK_OK(kvtd_metrics_tenant(m, 1, "a", &ta));
	CHECK_OK(kvtd_metrics_tenant(m, 2, "b", &tb));
	err = kvtd_http_start(&h, "127.0.0.1:0", kvtd_metrics_render_cb, m);
	if (err && err != KVT_ENOTBUILT)
		CHECK_OK(err);
	port = kvtd_http_port(h);

	atomic_store(&running, 1);
	pthread_create(&ren, NULL, renderer, NULL);
	if (h)
		pthread_create(&scr, NULL, scraper, NULL);
	pthread_create(&reg, NULL, registrar, NULL);
	atomic_store(&updating, 1);
	for (uintptr_t i = 0; i < UPDATERS; i++)
		pthread_create(&up[i], NULL, updater, (void *)i);
	for (int i = 0; i < UPDATERS; i++)
		pthread_join(up[i], NULL);
	atomic_store(&updating, 0);
	pthread_join(reg, NULL);
	/* at least one render and scrape overlapped the updates or ran after */
	while (atomic_load(&renders) < 2 ||
	       (h && atomic_load(&scrapes) < 2 && !atomic_load(&scrape_fail)))
		usleep(1000);
	atomic_store(&running, 0);
	pthread_join(ren, NULL);
	if (h)
		pthread_join(scr, NULL);
	kvtd_http_stop(h);
	CHECK_EQ(atomic_load(&render_fail), 0);
	CHECK_EQ(atomic_load(&scrape_fail), 0);
	fprintf(stderr, "%d renders, %d scrapes, %d of them during updates\n",
		atomic_load(&renders), atomic_load(&scrapes),
		atomic_load(&overlapped));
	CHECK(atomic_load(&overlapped) >= 1);

	CHECK_OK(kvtd_metrics_render_text(m, &text, NULL));
	{
		static const char *const who[] = { "a", "b", "" };
		char s[160];

		/* each series as a format taking the tenant, and how many
		 * times @per it must hold */
		static const struct {
			const char *fmt;
			uint64_t times;
		} want[] = {
			{ "kvtier_hits_total{tenant=\"%s\",tier=\"dram\"}", 2 },
			{ "kvtier_misses_total{tenant=\"%s\"}", 1 },
			{ "kvtier_read_failures_total{tenant=\"%s\",tier=\"ssd\"}", 1 },
			{ "kvtier_transfer_bytes_total{tenant=\"%s\",from=\"dram\",to=\"engine\"}", 4096 },
			{ "kvtier_evictions_total{tenant=\"%s\",tier=\"dram\"}", 1 },
			{ "kvtier_demotions_total{tenant=\"%s\",tier=\"dram\"}", 1 },
			{ "kvtier_lease_expiries_total{tenant=\"%s\",reason=\"deadline\"}", 1 },
			{ "kvtier_checksum_failures_total{tenant=\"%s\",tier=\"ssd\"}", 1 },
			{ "kvtier_protocol_errors_total{tenant=\"%s\",reason=\"truncated\"}", 1 },
		};

		for (int i = 0; i < 3; i++)
			for (size_t w = 0; w < sizeof(want) / sizeof(want[0]); w++) {
				snprintf(s, sizeof(s), want[w].fmt, who[i]);
				if (expo_value(text, s) != (double)(want[w].times * per)) {
					fprintf(stderr, "%s = %g, want %llu\n", s,
						expo_value(text, s),
						(unsigned long long)(want[w].times * per));
					CHECK(0);
				}
			}
		/* histogram counts: ops cycle lookup, load, store with i / 3, the
		 * blocks cycle a, b, node: every (block, op) pair gets 1/9 */
		for (int i = 0; i < 3; i++)
			for (int o = 0; o < KVTD_OP_COUNT; o++) {
				snprintf(s, sizeof(s), "kvtier_%s_duration_seconds_count{tenant=\"%s\"}",
					 kvtd_op_name((enum kvtd_op)o), who[i]);
				CHECK(expo_value(text, s) ==
				      (double)UPDATERS * ITERS / 9);
			}
		for (int i = 0; i < REG; i++) {
			snprintf(s, sizeof(s), "kvtier_hits_total{tenant=\"late-%d\",tier=\"fabric\"}", i);
			CHECK(expo_value(text, s) == 1);
		}
	}
	kvt_free(text);
	kvtd_metrics_destroy(m);
	TEST_DONE();
}
