/*
 * test_metrics.c — the daemon's metrics registry and endpoint
 * (src/server/metrics.h): counters land in the right series, histogram
 * buckets are cumulative with le inclusive, the text exposition passes a
 * strict line checker and says what the JSON says, tenant names are
 * escaped, tier gauges come from a real cache, allocation failures leave
 * nothing behind, and GET /metrics answers on a loopback port (404, 405,
 * 500, bad and busy addresses refused, no descriptor left after stop).
 */
#include "harness.h"
#include "metrics_util.h"
#include "server/metrics.h"
#include "core/core.h"

#include <kvtier/cache.h>
#include <cjson/cJSON.h>

#include "kvt_build.h"

static char why[256];

/* Render, check the exposition, return it (free()d by the caller with
 * kvt_free). */
static char *render_checked(kvtd_metrics *m)
{
	char *text = NULL;
	size_t len = 0;

	CHECK_OK(kvtd_metrics_render_text(m, &text, &len));
	if (!text)
		return NULL;
	CHECK_EQ(len, strlen(text));
	if (expo_check(text, why, sizeof(why)) < 0) {
		fprintf(stderr, "exposition rejected: %s\n%s", why, text);
		CHECK(0);
	}
	return text;
}

static double val(const char *text, const char *series)
{
	double v = expo_value(text, series);

	if (isnan(v))
		fprintf(stderr, "no sample %s\n", series);
	return v;
}

/* ---- the checker itself rejects what it should ---------------------------- */

static void test_checker(void)
{
	static const char *bad[] = {
		"kvtier_x_total 1\n", /* no HELP/TYPE */
		"# HELP kvtier_x_total h\n# TYPE kvtier_x_total counter\n"
		"kvtier_x_total{a=\"b} 1\n",
		"# HELP kvtier_x h\n# TYPE kvtier_x counter\nkvtier_x 1\n",
		"# HELP kvtier_x_total h\n# TYPE kvtier_x_total gauge\n"
		"kvtier_x_total 1\n",
		"# HELP kvtier_x_total h\n# TYPE kvtier_x_total counter\n"
		"kvtier_x_total{a=\"\\t\"} 1\n",
		"# HELP kvtier_x_total h\n# TYPE kvtier_x_total counter\n"
		"kvtier_x_total 1\nkvtier_x_total 2\n",
		"# HELP kvtier_x_total h\n# TYPE kvtier_x_total counter\n"
		"kvtier_x_total one\n",
		"# HELP kvtier_h_seconds h\n# TYPE kvtier_h_seconds histogram\n"
		"kvtier_h_seconds_bucket{le=\"1\"} 2\n"
		"kvtier_h_seconds_bucket{le=\"+Inf\"} 1\n"
		"kvtier_h_seconds_count 1\n",
		"# HELP kvtier_h_seconds h\n# TYPE kvtier_h_seconds histogram\n"
		"kvtier_h_seconds_bucket{le=\"1\"} 1\n"
		"kvtier_h_seconds_bucket{le=\"+Inf\"} 2\n"
		"kvtier_h_seconds_count 3\n",
		"# HELP kvtier_x_total h\n# TYPE kvtier_x_total counter\n"
		"kvtier_x_total{__a=\"1\"} 1\n",
		"# HELP kvtier_x_total h\n# TYPE kvtier_x_total counter\n"
		"kvtier_x_total 1", /* no final newline */
	};
	const char *good =
		"# HELP kvtier_x_total h \\\\ x\n# TYPE kvtier_x_total counter\n"
		"kvtier_x_total{a=\"q\\\"\\\\\\n\",b=\"\"} 1\n"
		"# HELP kvtier_h_seconds h\n# TYPE kvtier_h_seconds histogram\n"
		"kvtier_h_seconds_bucket{le=\"1e-06\"} 1\n"
		"kvtier_h_seconds_bucket{le=\"+Inf\"} 2\n"
		"kvtier_h_seconds_sum 0.5\nkvtier_h_seconds_count 2\n";

	CHECK_EQ(expo_check(good, why, sizeof(why)), 5);
	for (size_t i = 0; i < KVT_ARRAY_SIZE(bad); i++)
		if (expo_check(bad[i], why, sizeof(why)) >= 0) {
			fprintf(stderr, "checker accepted bad[%zu]\n", i);
			CHECK(0);
		}
}

/* ---- tenants ---------------------------------------------------------------- */

static void test_tenants(void)
{
	kvtd_metrics *m;
	kvtd_mtenant *a, *b, *x;
	char name[80];

	CHECK_OK(kvtd_metrics_create(&m));
	CHECK_OK(kvtd_metrics_tenant(m, 7, "alice", &a));
	CHECK_OK(kvtd_metrics_tenant(m, 7, "alice", &b));
	CHECK(a && a == b);
	CHECK_ERR(kvtd_metrics_tenant(m, 7, "bob", &x), KVT_EBUSY);
	CHECK(x == NULL);
	CHECK_ERR(kvtd_metrics_tenant(m, 8, "alice", &x), KVT_EBUSY);
	CHECK_OK(kvtd_metrics_tenant(m, 0, "zero", &x)); /* the daemon's 0 */
	CHECK(x && x != kvtd_metrics_node(m));
	CHECK_ERR(kvtd_metrics_tenant(m, 9, "", &x), -EINVAL);
	CHECK_ERR(kvtd_metrics_tenant(m, 9, "a\nb", &x), -EINVAL);
	memset(name, 'n', sizeof(name));
	name[KVTD_METRICS_NAME_MAX + 1] = 0;
	CHECK_ERR(kvtd_metrics_tenant(m, 9, name, &x), -EINVAL);
	name[KVTD_METRICS_NAME_MAX] = 0;
	CHECK_OK(kvtd_metrics_tenant(m, 9, name, &x));
	for (uint32_t id = 100; id < 100 + KVTD_METRICS_MAX_TENANTS - 3; id++) {
		snprintf(name, sizeof(name), "t%u", id);
		CHECK_OK(kvtd_metrics_tenant(m, id, name, &x));
	}
	CHECK_ERR(kvtd_metrics_tenant(m, 5000, "one-too-many", &x), KVT_EFULL);
	CHECK(kvtd_metrics_node(m) != NULL);
	{
		char *t = render_checked(m);
		kvt_free(t);
	}
	kvtd_metrics_destroy(m);
	kvtd_metrics_destroy(NULL);
}

/* ---- counters, escaping, text vs JSON ---------------------------------------- */

static void test_counters(void)
{
	kvtd_metrics *m;
	kvtd_mtenant *a, *w;
	char *text, *json;
	size_t jl;
	cJSON *root, *ten, *t;

	CHECK_OK(kvtd_metrics_create(&m));
	CHECK_OK(kvtd_metrics_tenant(m, 1, "alice", &a));
	CHECK_OK(kvtd_metrics_tenant(m, 2, "we\"ird\\na me", &w));

	/* a fresh registry: registered tenants show zeros, the node nothing */
	text = render_checked(m);
	CHECK(val(text, "kvtier_misses_total{tenant=\"alice\"}") == 0);
	CHECK(val(text, "kvtier_misses_total{tenant=\"we\\\"ird\\\\na me\"}") == 0);
	CHECK(isnan(expo_value(text, "kvtier_misses_total{tenant=\"\"}")));
	CHECK(val(text, "kvtier_clients") == 0);
	kvt_free(text);

	kvtd_metrics_hit(m, a, KVT_TIER_DRAM, 10);
	kvtd_metrics_hit(m, a, KVT_TIER_DRAM, 5);
	kvtd_metrics_hit(m, a, KVT_TIER_SSD, 3);
	kvtd_metrics_miss(m, a, 4);
	kvtd_metrics_read_failure(m, a, KVT_TIER_SSD, 2);
	kvtd_metrics_bytes(m, a, KVTD_END_DRAM, KVTD_END_ENGINE, 4096);
	kvtd_metrics_bytes(m, a, KVTD_END_ENGINE, KVTD_END_DRAM, 8192);
	kvtd_metrics_eviction(m, a, KVT_TIER_DRAM, 6);
	kvtd_metrics_demotion(m, NULL, KVT_TIER_DRAM, 9);
	kvtd_metrics_bytes(m, NULL, KVTD_END_DRAM, KVTD_END_SSD, 1 << 20);
	kvtd_metrics_lease_expiry(m, w, KVTD_LEASE_DISCONNECT, 2);
	kvtd_metrics_checksum_failure(m, w, KVT_TIER_SSD, 1);
	kvtd_metrics_protocol_error(m, NULL, KVTD_PERR_TRUNCATED);
	kvtd_metrics_protocol_error(m, NULL, KVTD_PERR_TRUNCATED);
	kvtd_metrics_protocol_error(m, w, KVTD_PERR_NOT_OWNER);
	kvtd_metrics_gauge_set(m, KVTD_G_CLIENTS, 3);
	kvtd_metrics_gauge_set(m, KVTD_G_REGISTERED_BYTES, 1ull << 33);
	kvtd_metrics_tenant_pages(m, a, KVT_TIER_DRAM, 12, 100);
	/* a tier not known: tier="unknown" */
	kvtd_metrics_read_failure(m, w, KVT_TIER_COUNT, 5);
	/* out of range: counted nowhere, no crash */
	kvtd_metrics_hit(m, a, (kvt_tier_kind)(KVT_TIER_COUNT + 1), 1000);
	kvtd_metrics_hit(m, a, (kvt_tier_kind)-1, 1000);
	kvtd_metrics_bytes(m, a, KVTD_END_COUNT, KVTD_END_DRAM, 1000);
	kvtd_metrics_protocol_error(m, a, KVTD_PERR_COUNT);
	kvtd_metrics_lease_expiry(m, a, KVTD_LEASE_END_COUNT, 1000);
	kvtd_metrics_observe(m, a, KVTD_OP_COUNT, 1000);
	kvtd_metrics_gauge_set(m, KVTD_G_COUNT, 1000);
	kvtd_metrics_tenant_pages(m, a, KVT_TIER_COUNT, 1, 1);

	text = render_checked(m);
	CHECK(val(text, "kvtier_hits_total{tenant=\"alice\",tier=\"dram\"}") == 15);
	CHECK(val(text, "kvtier_hits_total{tenant=\"alice\",tier=\"ssd\"}") == 3);
	/* every tier that counted anything gets series for every tenant */
	CHECK(val(text, "kvtier_hits_total{tenant=\"we\\\"ird\\\\na me\",tier=\"ssd\"}") == 0);
	CHECK(isnan(expo_value(text, "kvtier_hits_total{tenant=\"alice\",tier=\"fabric\"}")));
	CHECK(val(text, "kvtier_read_failures_total{tenant=\"we\\\"ird\\\\na me\",tier=\"unknown\"}") == 5);
	CHECK(val(text, "kvtier_hits_total{tenant=\"alice\",tier=\"unknown\"}") == 0);
	CHECK(val(text, "kvtier_misses_total{tenant=\"alice\"}") == 4);
	CHECK(val(text, "kvtier_read_failures_total{tenant=\"alice\",tier=\"ssd\"}") == 2);
	CHECK(val(text, "kvtier_transfer_bytes_total{tenant=\"alice\",from=\"dram\",to=\"engine\"}") == 4096);
	CHECK(val(text, "kvtier_transfer_bytes_total{tenant=\"alice\",from=\"engine\",to=\"dram\"}") == 8192);
	CHECK(val(text, "kvtier_transfer_bytes_total{tenant=\"\",from=\"dram\",to=\"ssd\"}") == 1 << 20);
	CHECK(val(text, "kvtier_evictions_total{tenant=\"alice\",tier=\"dram\"}") == 6);
	CHECK(val(text, "kvtier_demotions_total{tenant=\"\",tier=\"dram\"}") == 9);
	CHECK(val(text, "kvtier_lease_expiries_total{tenant=\"we\\\"ird\\\\na me\",reason=\"disconnect\"}") == 2);
	CHECK(val(text, "kvtier_lease_expiries_total{tenant=\"alice\",reason=\"deadline\"}") == 0);
	CHECK(val(text, "kvtier_checksum_failures_total{tenant=\"we\\\"ird\\\\na me\",tier=\"ssd\"}") == 1);
	CHECK(val(text, "kvtier_protocol_errors_total{tenant=\"\",reason=\"truncated\"}") == 2);
	CHECK(val(text, "kvtier_protocol_errors_total{tenant=\"we\\\"ird\\\\na me\",reason=\"not_owner\"}") == 1);
	CHECK(val(text, "kvtier_clients") == 3);
	CHECK(val(text, "kvtier_registered_memory_bytes") == (double)(1ull << 33));
	CHECK(val(text, "kvtier_tenant_used_pages{tenant=\"alice\",tier=\"dram\"}") == 12);
	CHECK(val(text, "kvtier_tenant_quota_pages{tenant=\"alice\",tier=\"dram\"}") == 100);
	CHECK(isnan(expo_value(text, "kvtier_tenant_used_pages{tenant=\"alice\",tier=\"ssd\"}")));
	CHECK(strstr(text, "kvtier_info{version=\"") != NULL);
	/* nothing out of range counted */
	CHECK(isnan(expo_value(text, "kvtier_protocol_errors_total{tenant=\"alice\",reason=\"other\"}")));
	CHECK(val(text, "kvtier_lease_expiries_total{tenant=\"alice\",reason=\"disconnect\"}") == 0);
	CHECK(val(text, "kvtier_load_duration_seconds_count{tenant=\"alice\"}") == 0);
	/* no cache given: no tier gauges */
	CHECK(strstr(text, "kvtier_tier_capacity_bytes") == NULL);

	/* the JSON says the same */
	CHECK_OK(kvtd_metrics_render_json(m, &json, &jl));
	CHECK_EQ(jl, strlen(json));
	root = cJSON_Parse(json);
	CHECK(root != NULL);
	CHECK_EQ(cJSON_GetObjectItem(root, "format")->valuedouble,
		 KVTD_METRICS_JSON_VERSION);
	CHECK(cJSON_IsNull(cJSON_GetObjectItem(root, "cache")));
	CHECK_EQ(cJSON_GetArraySize(cJSON_GetObjectItem(root, "buckets")),
		 KVTD_HIST_BOUNDS);
	CHECK_EQ(cJSON_GetObjectItem(cJSON_GetObjectItem(root, "gauges"),
				     "clients")->valuedouble, 3);
	ten = cJSON_GetObjectItem(root, "tenants");
	CHECK_EQ(cJSON_GetArraySize(ten), 3); /* node (it counted), alice, w */
	t = cJSON_GetArrayItem(ten, 1);
	CHECK(!strcmp(cJSON_GetObjectItem(t, "name")->valuestring, "alice"));
	CHECK_EQ(cJSON_GetObjectItem(t, "id")->valuedouble, 1);
	CHECK_EQ(cJSON_GetObjectItem(t, "misses")->valuedouble, 4);
	{
		cJSON *d = cJSON_GetObjectItem(cJSON_GetObjectItem(t, "tiers"),
					       "dram");
		cJSON *s = cJSON_GetObjectItem(cJSON_GetObjectItem(t, "tiers"),
					       "ssd");
		cJSON *tb = cJSON_GetObjectItem(t, "transfer_bytes");

		CHECK_EQ(cJSON_GetObjectItem(d, "hits")->valuedouble, 15);
		CHECK_EQ(cJSON_GetObjectItem(d, "evictions")->valuedouble, 6);
		CHECK_EQ(cJSON_GetObjectItem(d, "used_pages")->valuedouble, 12);
		CHECK_EQ(cJSON_GetObjectItem(d, "quota_pages")->valuedouble, 100);
		CHECK_EQ(cJSON_GetObjectItem(s, "read_failures")->valuedouble, 2);
		CHECK(cJSON_GetObjectItem(s, "used_pages") == NULL);
		CHECK_EQ(cJSON_GetObjectItem(cJSON_GetObjectItem(
			cJSON_GetObjectItem(t, "tiers"), "unknown"),
			"hits")->valuedouble, 0);
		CHECK_EQ(cJSON_GetArraySize(tb), 2);
	}
	t = cJSON_GetArrayItem(ten, 2);
	CHECK(!strcmp(cJSON_GetObjectItem(t, "name")->valuestring,
		      "we\"ird\\na me"));
	CHECK_EQ(cJSON_GetObjectItem(cJSON_GetObjectItem(t, "protocol_errors"),
				     "not_owner")->valuedouble, 1);
	t = cJSON_GetArrayItem(ten, 0);
	CHECK(cJSON_IsNull(cJSON_GetObjectItem(t, "id")));
	CHECK(!strcmp(cJSON_GetObjectItem(t, "name")->valuestring, ""));
	CHECK_EQ(cJSON_GetObjectItem(cJSON_GetObjectItem(t, "protocol_errors"),
				     "truncated")->valuedouble, 2);
	cJSON_Delete(root);
	kvt_free(json);
	kvt_free(text);
	kvtd_metrics_destroy(m);
}

/* ---- histograms ------------------------------------------------------------ */

static void test_histogram(void)
{
	/* observations (ns) and the bucket (index of its le) each lands in */
	static const struct {
		uint64_t ns;
		int bucket; /* KVTD_HIST_BOUNDS: +Inf */
	} obs[] = {
		{ 0, 0 },           { 999, 0 },          { 1000, 0 },
		{ 1001, 1 },        { 2000, 1 },         { 2001, 2 },
		{ 24000, 5 },       { 50000, 5 },        { 1000000, 9 },
		{ 9999999999ull, 21 }, { 10000000000ull, 21 },
		{ 10000000001ull, KVTD_HIST_BOUNDS }, { UINT64_MAX / 4, KVTD_HIST_BOUNDS },
	};
	uint64_t per[KVTD_HIST_BOUNDS + 1] = { 0 }, sum = 0, cum = 0;
	kvtd_metrics *m;
	kvtd_mtenant *a;
	char series[160], *text, *json;
	cJSON *root, *lat, *c;

	/* the bounds: 1-2-5 from 1 us to 10 s, increasing */
	CHECK(kvtd_hist_bound(0) == 1e-6);
	CHECK(kvtd_hist_bound(KVTD_HIST_BOUNDS - 1) == 10.0);
	CHECK(kvtd_hist_bound(KVTD_HIST_BOUNDS) == 0);
	for (int i = 1; i < KVTD_HIST_BOUNDS; i++)
		CHECK(kvtd_hist_bound(i) > kvtd_hist_bound(i - 1));

	CHECK_OK(kvtd_metrics_create(&m));
	CHECK_OK(kvtd_metrics_tenant(m, 3, "carol", &a));
	for (size_t i = 0; i < KVT_ARRAY_SIZE(obs); i++) {
		kvtd_metrics_observe(m, a, KVTD_OP_LOAD, obs[i].ns);
		per[obs[i].bucket]++;
		sum += obs[i].ns;
	}
	kvtd_metrics_observe(m, a, KVTD_OP_LOOKUP, 20000);
	text = render_checked(m);
	for (int k = 0; k <= KVTD_HIST_BOUNDS; k++) {
		char le[32];

		cum += per[k];
		if (k < KVTD_HIST_BOUNDS)
			snprintf(le, sizeof(le), "%.6g", kvtd_hist_bound(k));
		else
			snprintf(le, sizeof(le), "+Inf");
		snprintf(series, sizeof(series),
			 "kvtier_load_duration_seconds_bucket{tenant=\"carol\","
			 "le=\"%s\"}", le);
		if (val(text, series) != (double)cum) {
			fprintf(stderr, "bucket %s: %g, want %llu\n", le,
				val(text, series), (unsigned long long)cum);
			CHECK(0);
		}
	}
	CHECK(val(text, "kvtier_load_duration_seconds_bucket{tenant=\"carol\",le=\"1e-06\"}") == 3);
	CHECK(val(text, "kvtier_load_duration_seconds_count{tenant=\"carol\"}") ==
	      KVT_ARRAY_SIZE(obs));
	CHECK(fabs(val(text, "kvtier_load_duration_seconds_sum{tenant=\"carol\"}") -
		   (double)sum / 1e9) < 1e-3);
	CHECK(val(text, "kvtier_lookup_duration_seconds_bucket{tenant=\"carol\",le=\"1e-05\"}") == 0);
	CHECK(val(text, "kvtier_lookup_duration_seconds_bucket{tenant=\"carol\",le=\"2e-05\"}") == 1);
	CHECK(val(text, "kvtier_store_duration_seconds_count{tenant=\"carol\"}") == 0);
	CHECK(strstr(text, "# TYPE kvtier_load_duration_seconds histogram\n"));

	CHECK_OK(kvtd_metrics_render_json(m, &json, NULL));
	root = cJSON_Parse(json);
	lat = cJSON_GetObjectItem(cJSON_GetObjectItem(
		cJSON_GetArrayItem(cJSON_GetObjectItem(root, "tenants"), 0),
		"latency"), "load");
	CHECK_EQ(cJSON_GetObjectItem(lat, "count")->valuedouble,
		 KVT_ARRAY_SIZE(obs));
	c = cJSON_GetObjectItem(lat, "cumulative");
	CHECK_EQ(cJSON_GetArraySize(c), KVTD_HIST_BOUNDS + 1);
	CHECK_EQ(cJSON_GetArrayItem(c, 0)->valuedouble, 3);
	CHECK_EQ(cJSON_GetArrayItem(c, KVTD_HIST_BOUNDS)->valuedouble,
		 KVT_ARRAY_SIZE(obs));
	cJSON_Delete(root);
	kvt_free(json);
	kvt_free(text);
	kvtd_metrics_destroy(m);
}

static void test_sample_current(kvtd_metrics *m);

/* ---- tier gauges from a real cache, the collect hook ------------------------ */

static int collected;

static void collect(kvtd_metrics *m, void *arg)
{
	collected++;
	kvtd_metrics_gauge_set(m, KVTD_G_LEASES, (uint64_t)collected);
	kvtd_metrics_demotion(m, arg, KVT_TIER_DRAM, 1);
}

static void test_cache_gauges(void)
{
	kvt_cache_config cfg = KVT_CACHE_CONFIG_INIT;
	char spec[700], *text, *json;
	kvtd_metrics *m;
	kvt_cache *c;
	kvt_geom g;
	cJSON *root, *tiers;
	char json_cfg[256];
	uint64_t pb;

	snprintf(json_cfg, sizeof(json_cfg), "{\"num_hidden_layers\":4,"
		 "\"num_attention_heads\":2,\"hidden_size\":128,"
		 "\"num_key_value_heads\":2,\"torch_dtype\":\"bfloat16\"}");
	CHECK_OK(kvt_geom_from_json(&g, json_cfg, "small", 4, 1, 0));
	pb = kvt_geom_page_bytes(&g);
	snprintf(spec, sizeof(spec), "dram:%llu ssd:%s,%llu,temp,fresh",
		 (unsigned long long)(pb * 32), test_dir("metrics-cache"),
		 (unsigned long long)(pb * 64));
	cfg.tiers = spec;
	cfg.geom = &g;
	if (kvt_cache_open(&c, &cfg)) {
		fprintf(stderr, "cache open: %s\n", kvt_errdetail());
		CHECK(0);
		return;
	}
	CHECK_OK(kvtd_metrics_create(&m));
	kvtd_metrics_set_cache(m, c);
	kvtd_metrics_set_collect(m, collect, NULL);
	text = render_checked(m);
	CHECK_EQ(collected, 1);
	CHECK(val(text, "kvtier_leases") == 1);
	CHECK(val(text, "kvtier_demotions_total{tenant=\"\",tier=\"dram\"}") == 1);
	CHECK(val(text, "kvtier_tier_capacity_pages{tier=\"dram\"}") == 32);
	CHECK(val(text, "kvtier_tier_capacity_bytes{tier=\"dram\"}") ==
	      (double)(32 * pb));
	CHECK(val(text, "kvtier_tier_used_pages{tier=\"dram\"}") == 0);
	CHECK(val(text, "kvtier_tier_capacity_pages{tier=\"ssd\"}") >= 64);
	CHECK(isnan(expo_value(text, "kvtier_tier_capacity_pages{tier=\"hbm\"}")));
	CHECK(val(text, "kvtier_cache_pages_total{op=\"load\"}") == 0);
	CHECK(val(text, "kvtier_cache_checksum_failures_total") == 0);
	/* tiers of the cache get per-tier series wherever a tenant shows */
	CHECK(val(text, "kvtier_demotions_total{tenant=\"\",tier=\"ssd\"}") == 0);
	CHECK(isnan(expo_value(text, "kvtier_hits_total{tenant=\"\",tier=\"ssd\"}")));
	CHECK(isnan(expo_value(text, "kvtier_lookup_duration_seconds_count{tenant=\"\"}")));
	kvt_free(text);

	CHECK_OK(kvtd_metrics_render_json(m, &json, NULL));
	CHECK_EQ(collected, 2);
	root = cJSON_Parse(json);
	tiers = cJSON_GetObjectItem(root, "tiers");
	CHECK_EQ(cJSON_GetArraySize(tiers), 2);
	CHECK(!strcmp(cJSON_GetObjectItem(cJSON_GetArrayItem(tiers, 0),
					  "tier")->valuestring, "dram"));
	CHECK_EQ(cJSON_GetObjectItem(cJSON_GetArrayItem(tiers, 0),
				     "capacity_pages")->valuedouble, 32);
	CHECK(cJSON_IsObject(cJSON_GetObjectItem(root, "cache")));
	CHECK_EQ(cJSON_GetObjectItem(cJSON_GetObjectItem(root, "gauges"),
				     "leases")->valuedouble, 2);
	cJSON_Delete(root);
	kvt_free(json);
	test_sample_current(m);
	kvtd_metrics_destroy(m);
	kvt_cache_close(c);
}

/* Every "parent.key" in @o (array elements take the array's name) into
 * @keys ('\n'-separated). */
static void key_paths(const cJSON *o, const char *parent, char *keys,
		      size_t len)
{
	const cJSON *c;
	char path[128];

	cJSON_ArrayForEach(c, o) {
		const char *name = cJSON_IsArray(o) ? parent : c->string;

		snprintf(path, sizeof(path), "\n%s.%s\n", parent, name);
		if (!cJSON_IsArray(o) && !strstr(keys, path))
			snprintf(keys + strlen(keys), len - strlen(keys), "%s",
				 path + 1);
		if (cJSON_IsObject(c) || cJSON_IsArray(c))
			key_paths(c, name, keys, len);
	}
}

/*
 * tests/metrics_sample.json feeds test_cli_stat (kvtier stat's formatter);
 * it was made by kvtd_metrics_render_json(). Whatever the renderer writes
 * now must still be in it, so the formatter is tested on what the daemon
 * sends (regenerate it when the format grows).
 */
static void test_sample_current(kvtd_metrics *m)
{
	static char fresh_keys[16384] = "\n", sample_keys[16384] = "\n";
	kvtd_mtenant *t;
	char *json, *sample, *p, *nl;
	cJSON *fresh, *fix;

	CHECK_OK(kvtd_metrics_tenant(m, 1, "alice", &t));
	kvtd_metrics_tenant_pages(m, t, KVT_TIER_DRAM, 1, 2);
	kvtd_metrics_bytes(m, t, KVTD_END_DRAM, KVTD_END_ENGINE, 1);
	kvtd_metrics_protocol_error(m, t, KVTD_PERR_TRUNCATED);
	kvtd_metrics_observe(m, t, KVTD_OP_LOAD, 1);
	CHECK_OK(kvtd_metrics_render_json(m, &json, NULL));
	CHECK_OK(kvti_read_file(KVT_SOURCE_DIR "/tests/metrics_sample.json",
				1 << 20, &sample, NULL));
	fresh = cJSON_Parse(json);
	fix = cJSON_Parse(sample);
	CHECK(fresh && fix);
	CHECK_EQ(cJSON_GetObjectItem(fix, "format")->valuedouble,
		 KVTD_METRICS_JSON_VERSION);
	key_paths(fresh, "", fresh_keys, sizeof(fresh_keys));
	key_paths(fix, "", sample_keys, sizeof(sample_keys));
	for (p = fresh_keys + 1; (nl = strchr(p, '\n')); p = nl + 1) {
		char k[128];

		snprintf(k, sizeof(k), "\n%.*s\n", (int)(nl - p + 0), p);
		if (!strstr(sample_keys, k)) {
			fprintf(stderr, "metrics_sample.json lacks %.*s: "
				"regenerate it\n", (int)(nl - p), p);
			CHECK(0);
		}
	}
	CHECK(strstr(fresh_keys, "\ntenants.latency\n") != NULL);
	CHECK(strstr(fresh_keys, "\ncache.evicted_pages\n") != NULL);
	cJSON_Delete(fresh);
	cJSON_Delete(fix);
	kvt_free(sample);
	kvt_free(json);
}

/* ---- allocation failures ---------------------------------------------------- */

enum { MAKE, TEXT, JSON };

/* Fail the 1st, 2nd, ... allocation of a call (@what: MAKE a registry
 * into *@m, render @m as TEXT or JSON into *@out) until it succeeds: each
 * failure must be -ENOMEM and leave the result NULL. Returns how many
 * allocations the call makes, 0 if it never succeeded. */
static int fail_each(int what, kvtd_metrics **m, char **out)
{
	for (int n = 1; n < 100; n++) {
		int err;

		kvt_alloc_fail_at((uint64_t)n);
		err = what == MAKE ? kvtd_metrics_create(m) :
		      what == TEXT ? kvtd_metrics_render_text(*m, out, NULL) :
				     kvtd_metrics_render_json(*m, out, NULL);
		kvt_alloc_fail_at(0);
		if (!err)
			return n - 1;
		CHECK_ERR(err, -ENOMEM);
		CHECK(what == MAKE ? *m == NULL : *out == NULL);
	}
	return 0;
}

static void test_alloc_failures(void)
{
	kvtd_metrics *m;
	kvtd_mtenant *a;
	int64_t live = kvt_alloc_live();
	char *out;

	CHECK(fail_each(MAKE, &m, NULL) >= 1);
	CHECK_OK(kvtd_metrics_tenant(m, 1, "a", &a));
	kvtd_metrics_hit(m, a, KVT_TIER_DRAM, 1);
	kvt_alloc_fail_at(1);
	CHECK_ERR(kvtd_metrics_tenant(m, 2, "b", &a), -ENOMEM);
	kvt_alloc_fail_at(0);
	CHECK(fail_each(TEXT, &m, &out) >= 1);
	kvt_free(out);
	CHECK(fail_each(JSON, &m, &out) >= 1);
	kvt_free(out);
	kvtd_metrics_destroy(m);
	CHECK_EQ(kvt_alloc_live(), live);
}

/* ---- the HTTP endpoint ------------------------------------------------------- */

static int render_fails(void *arg, char **body, size_t *len)
{
	return -ENOMEM;
}

static void test_addr(void)
{
	static const char *bad[] = {
		"", "127.0.0.1", "127.0.0.1:", ":9464", "1.2.3:80",
		"127.0.0.1:65536", "127.0.0.1:-1", "127.0.0.1:+1",
		"127.0.0.1:80x", "host.example:80", "::1:80", "[::1]80",
		"[::1", "[nothost]:80", "999.0.0.1:80", "x", "-5",
		"127.0.0.1:99999999999999999999999",
	};
	struct sockaddr_in6 ss;
	unsigned len;
	kvtd_http *h;

	for (size_t i = 0; i < KVT_ARRAY_SIZE(bad); i++) {
		int err = kvtd_http_parse_addr(bad[i], (struct sockaddr *)&ss,
					       &len);

		if (err != KVT_ECONFIG)
			fprintf(stderr, "address '%s' -> %d\n", bad[i], err);
		CHECK_EQ(err, KVT_ECONFIG);
		CHECK(strstr(kvt_errdetail(), "metrics address") != NULL);
		CHECK_ERR(kvtd_http_start(&h, bad[i], kvtd_metrics_render_cb,
					  NULL), KVT_ECONFIG);
		CHECK(h == NULL);
	}
	CHECK_OK(kvtd_http_parse_addr(KVTD_METRICS_ADDR_DEFAULT,
				      (struct sockaddr *)&ss, &len));
	CHECK_EQ(len, sizeof(struct sockaddr_in));
	CHECK_EQ(((struct sockaddr_in *)&ss)->sin_port, htons(9464));
	CHECK_OK(kvtd_http_parse_addr("9464", (struct sockaddr *)&ss, &len));
	CHECK_EQ(((struct sockaddr_in *)&ss)->sin_addr.s_addr,
		 htonl(INADDR_LOOPBACK));
	CHECK_OK(kvtd_http_parse_addr("localhost:0", (struct sockaddr *)&ss,
				      &len));
	CHECK_OK(kvtd_http_parse_addr("[::1]:9464", (struct sockaddr *)&ss,
				      &len));
	CHECK_EQ(len, sizeof(struct sockaddr_in6));
	CHECK_EQ(ss.sin6_family, AF_INET6);
	CHECK_OK(kvtd_http_parse_addr("0.0.0.0:1", (struct sockaddr *)&ss,
				      &len));
}

static void test_http(void)
{
	kvtd_metrics *m;
	kvtd_mtenant *a;
	kvtd_http *h, *h2;
	char *resp, addr[64];
	unsigned port;
	int fds, st;

	CHECK_OK(kvtd_metrics_create(&m));
	CHECK_OK(kvtd_metrics_tenant(m, 1, "alice", &a));
	kvtd_metrics_hit(m, a, KVT_TIER_DRAM, 42);
	fds = test_count_entries("/proc/self/fd");
	st = kvtd_http_start(&h, "127.0.0.1:0", kvtd_metrics_render_cb, m);
	if (st == KVT_ENOTBUILT) {
		kvtd_metrics_destroy(m);
		SKIP("built without libmicrohttpd");
	}
	CHECK_OK(st);
	if (st) {
		kvtd_metrics_destroy(m);
		return;
	}
	CHECK(kvtd_http_port(h) > 0);

	st = http_request(kvtd_http_port(h), "GET", "/metrics", &resp);
	CHECK_EQ(st, 200);
	CHECK(resp && strstr(resp, "text/plain; version=0.0.4"));
	if (resp) {
		const char *body = http_body(resp);

		CHECK(expo_check(body, why, sizeof(why)) > 0);
		CHECK(val(body, "kvtier_hits_total{tenant=\"alice\",tier=\"dram\"}") == 42);
	}
	free(resp);
	st = http_request(kvtd_http_port(h), "HEAD", "/metrics", &resp);
	CHECK_EQ(st, 200);
	CHECK(resp && !*http_body(resp));
	free(resp);
	st = http_request(kvtd_http_port(h), "GET", "/", &resp);
	CHECK_EQ(st, 404);
	free(resp);
	st = http_request(kvtd_http_port(h), "GET", "/metrics/x", &resp);
	CHECK_EQ(st, 404);
	free(resp);
	st = http_request(kvtd_http_port(h), "POST", "/metrics", &resp);
	CHECK_EQ(st, 405);
	CHECK(resp && strstr(resp, "Allow: GET, HEAD"));
	free(resp);
	st = http_request(kvtd_http_port(h), "DELETE", "/nothing", &resp);
	CHECK_EQ(st, 405);
	free(resp);

	/* the same port again: refused with the bind error */
	port = kvtd_http_port(h);
	snprintf(addr, sizeof(addr), "127.0.0.1:%u", port);
	CHECK_ERR(kvtd_http_start(&h2, addr, kvtd_metrics_render_cb, m),
		  -EADDRINUSE);
	CHECK(h2 == NULL);
	kvtd_http_stop(h);
	kvtd_http_stop(NULL);
	CHECK_EQ(test_count_entries("/proc/self/fd"), fds);
	/* nothing listens there any more */
	CHECK_EQ(http_request(port, "GET", "/metrics", &resp), -1);
	free(resp);

	/* IPv6 loopback, where the machine has it */
	st = kvtd_http_start(&h, "[::1]:0", kvtd_metrics_render_cb, m);
	if (st == -EADDRNOTAVAIL || st == -EAFNOSUPPORT) {
		fprintf(stderr, "no IPv6 loopback here: %s\n", kvt_errdetail());
	} else {
		CHECK_OK(st);
		CHECK(kvtd_http_port(h) > 0);
		kvtd_http_stop(h);
	}

	/* a render that fails answers 500 */
	CHECK_OK(kvtd_http_start(&h, "localhost:0", render_fails, NULL));
	st = http_request(kvtd_http_port(h), "GET", "/metrics", &resp);
	CHECK_EQ(st, 500);
	free(resp);
	kvtd_http_stop(h);
	kvtd_metrics_destroy(m);
}

int main(void)
{
	test_checker();
	test_tenants();
	test_counters();
	test_histogram();
	test_cache_gauges();
	test_alloc_failures();
	test_addr();
	test_http();
	TEST_DONE();
}
