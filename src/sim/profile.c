/*
 * profile.c — hardware profiles: parse "key = value  # source" files into
 * a kvt_hw, find the built-in ones, and derive the scheduler's cost model.
 *
 * One table (KEYS below) lists every key: its type, where it goes, whether
 * it is required, and its range. Values are numbers ("989e12", "0.6"),
 * names, or, for copy curves, comma-separated CHUNK:GBPS points with
 * CHUNK in bytes and an optional K/M/G suffix (powers of 1024):
 *
 *     copy.batch = 4K:4, 16K:7, 64K:38, 1M:54   # SPEC.md ...
 *
 * A profile is read whole or not at all; errors name the file, the line and
 * the key. Unknown and repeated keys are errors (a typo must not silently
 * fall back to a default).
 */
#include "core/core.h"
#include "kvt_build.h"

#include <kvtier/sim.h>

#include <cjson/cJSON.h>

#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

enum ktype { K_STR, K_U32, K_DBL, K_CURVE, K_CALL };

static const struct key {
	const char *name;
	enum ktype type;
	size_t off;        /* in kvt_hw (K_CURVE/K_CALL: the method) */
	int required;
	double lo, hi;     /* numbers: allowed range */
} keys[] = {
#define F(f) offsetof(kvt_hw, f)
	{ "name", K_STR, F(name), 1, 0, 0 },
	{ "gpu.name", K_STR, F(gpu_name), 1, 0, 0 },
	{ "gpus", K_U32, F(gpus), 1, 1, 1024 },
	{ "gpu.flops", K_DBL, F(gpu_flops), 1, 1e9, 1e18 },
	{ "gpu.gemm_eff", K_DBL, F(gemm_eff), 1, 0.01, 1 },
	{ "gpu.attn_eff", K_DBL, F(attn_eff), 1, 0.01, 1 },
	{ "gpu.hbm_bytes", K_DBL, F(hbm_bytes), 1, 1e9, 1e14 },
	{ "gpu.hbm_gbps", K_DBL, F(hbm_gbps), 1, 1, 1e6 },
	{ "gpu.hbm_eff", K_DBL, F(hbm_eff), 1, 0.01, 1 },
	{ "gpu.mem_util", K_DBL, F(mem_util), 1, 0.05, 1 },
	{ "gpu.reserve_bytes", K_DBL, F(reserve_bytes), 1, 0, 1e14 },
	{ "engine.step_us", K_DBL, F(step_us), 1, 0, 1e6 },
	{ "engine.step_mem_frac", K_DBL, F(step_mem_frac), 0, 0, 1 },
	{ "engine.host_us", K_DBL, F(host_us), 0, 0, 1e6 },
	{ "engine.host_prefill_us", K_DBL, F(host_prefill_us), 0, 0, 1e6 },
	{ "tp.ar_gbps", K_DBL, F(ar_gbps), 1, 0.001, 1e6 },
	{ "tp.ar_us", K_DBL, F(ar_us), 1, 0, 1e6 },
	{ "link.gbps", K_DBL, F(link_gbps), 1, 0.001, 1e5 },
	{ "link.raw_gbps", K_DBL, F(link_raw_gbps), 1, 0.001, 1e5 },
	{ "link.latency_ns", K_DBL, F(link_latency_ns), 1, 0, 1e7 },
	{ "link.gpus_per_uplink", K_U32, F(gpus_per_uplink), 1, 0, 1024 },
	{ "link.uplink_gbps", K_DBL, F(uplink_gbps), 0, 0.001, 1e5 },
	{ "copy.contig", K_CURVE, KVT_COPY_CONTIG, 1, 0, 0 },
	{ "copy.contig_call_us", K_CALL, KVT_COPY_CONTIG, 1, 0, 1e6 },
	{ "copy.memcpy", K_CURVE, KVT_COPY_MEMCPY, 0, 0, 0 },
	{ "copy.memcpy_call_us", K_CALL, KVT_COPY_MEMCPY, 0, 0, 1e6 },
	{ "copy.batch", K_CURVE, KVT_COPY_BATCH, 0, 0, 0 },
	{ "copy.batch_call_us", K_CALL, KVT_COPY_BATCH, 0, 0, 1e6 },
	{ "copy.gather", K_CURVE, KVT_COPY_GATHER, 0, 0, 0 },
	{ "copy.gather_call_us", K_CALL, KVT_COPY_GATHER, 0, 0, 1e6 },
	{ "copy.object", K_CURVE, KVT_COPY_OBJECT, 0, 0, 0 },
	{ "copy.object_call_us", K_CALL, KVT_COPY_OBJECT, 0, 0, 1e6 },
	{ "host.sockets", K_U32, F(sockets), 1, 1, 64 },
	{ "host.dram_gbps", K_DBL, F(dram_gbps), 1, 0.001, 1e6 },
	{ "host.dram_eff", K_DBL, F(dram_eff), 1, 0.01, 1 },
	{ "host.dram_latency_ns", K_DBL, F(dram_latency_ns), 1, 1, 1e6 },
	{ "host.dram_bytes", K_DBL, F(dram_bytes), 1, 0, 1e16 },
	{ "host.dma_window", K_DBL, F(dma_window), 1, 0.01, 1000 },
	{ "host.stress_gbps", K_DBL, F(stress_gbps), 1, 0.001, 1e4 },
	{ "host.copy_gbps", K_DBL, F(copy_gbps), 0, 0, 1e5 },
	{ "fabric.bytes", K_DBL, F(fabric_bytes), 0, 0, 1e16 },
	{ "fabric.link_gbps", K_DBL, F(fabric_link_gbps), 0, 0.001, 1e5 },
	{ "fabric.device_gbps", K_DBL, F(fabric_device_gbps), 0, 0.001, 1e5 },
	{ "ssd.bytes", K_DBL, F(ssd_bytes), 0, 0, 1e17 },
	{ "ssd.read_gbps", K_DBL, F(ssd_read_gbps), 0, 0.001, 1e5 },
	{ "ssd.write_gbps", K_DBL, F(ssd_write_gbps), 0, 0.001, 1e5 },
#undef F
};
#define NKEYS KVT_ARRAY_SIZE(keys)
_Static_assert(KVT_ARRAY_SIZE(keys) <= 64, "kvt_hw.assumed has 64 bits");

static const char *const builtins[] = { "testbed-a", "testbed-b", "gh200",
					 "h100" };

const char *kvt_hw_builtin_name(size_t i)
{
	return i < KVT_ARRAY_SIZE(builtins) ? builtins[i] : NULL;
}

/* Copy-curve bounds: chunks of 1 B..1 TiB, rates of 0.001..1e5 GB/s (the
 * range link.gbps allows). */
#define CHUNK_MAX 1099511627776.0
#define GBPS_MIN 0.001
#define GBPS_MAX 1e5

/* "64K" -> 65536; 0 or -1. */
static int parse_bytes(const char *s, double *out)
{
	char *end;
	double v = strtod(s, &end);

	switch (toupper((unsigned char)*end)) {
	case 'K': v *= 1024, end++; break;
	case 'M': v *= 1024 * 1024, end++; break;
	case 'G': v *= 1024.0 * 1024 * 1024, end++; break;
	default: break;
	}
	if (end == s || *end || !(v >= 1 && v <= CHUNK_MAX))
		return -1;
	*out = v;
	return 0;
}

static int parse_curve(char *v, kvt_copy_curve *k, const char *where)
{
	char *tok, *save = NULL;
	uint32_t n = 0;

	for (tok = strtok_r(v, ",", &save); tok;
	     tok = strtok_r(NULL, ",", &save)) {
		char *colon, *end, *a = tok;
		double bytes, gbps;

		while (isspace((unsigned char)*a))
			a++;
		colon = strchr(a, ':');
		if (!colon)
			return kvti_fail(KVT_ECONFIG, "%s: curve point '%s' is "
					 "not CHUNK:GBPS", where, a);
		*colon = '\0';
		gbps = strtod(colon + 1, &end);
		while (isspace((unsigned char)*end))
			end++;
		if (parse_bytes(a, &bytes) || *end ||
		    !(gbps >= GBPS_MIN && gbps <= GBPS_MAX))
			return kvti_fail(KVT_ECONFIG, "%s: bad curve point "
					 "'%s:%s' (chunk 1..1T bytes, rate "
					 "%g..%g GB/s)", where, a, colon + 1,
					 GBPS_MIN, GBPS_MAX);
		if (n == KVT_CURVE_MAX)
			return kvti_fail(KVT_ECONFIG, "%s: more than %d curve "
					 "points", where, KVT_CURVE_MAX);
		if (n && bytes <= k->chunk_bytes[n - 1])
			return kvti_fail(KVT_ECONFIG, "%s: chunk sizes must "
					 "increase", where);
		k->chunk_bytes[n] = bytes;
		k->gbps[n] = gbps;
		n++;
	}
	if (!n)
		return kvti_fail(KVT_ECONFIG, "%s: empty curve", where);
	k->n = n;
	return 0;
}

static int set_key(kvt_hw *hw, const struct key *k, char *v,
		   const char *where)
{
	char *end;
	double d;

	switch (k->type) {
	case K_STR:
		if (!*v || kvti_strlcpy((char *)hw + k->off, v, KVT_NAME_MAX))
			return kvti_fail(KVT_ECONFIG, "%s: empty or too long",
					 where);
		return 0;
	case K_CURVE:
		return parse_curve(v, &hw->copy[k->off], where);
	default:
		break;
	}
	errno = 0;
	d = strtod(v, &end);
	if (end == v || *end || errno)
		return kvti_fail(KVT_ECONFIG, "%s: '%s' is not a number", where,
				 v);
	if (!(d >= k->lo && d <= k->hi)) /* NaN fails too */
		return kvti_fail(KVT_ECONFIG, "%s: %g is outside %g..%g", where,
				 d, k->lo, k->hi);
	if (k->type == K_U32) {
		if (d != (double)(uint32_t)d)
			return kvti_fail(KVT_ECONFIG, "%s: %g is not an "
					 "integer", where, d);
		*(uint32_t *)((char *)hw + k->off) = (uint32_t)d;
	} else if (k->type == K_CALL) {
		hw->copy[k->off].call_us = d;
	} else {
		*(double *)((char *)hw + k->off) = d;
	}
	return 0;
}

/* Cross-field rules a table cannot say. */
static int check_hw(const kvt_hw *hw, const char *label)
{
	if (hw->gpus_per_uplink && !(hw->uplink_gbps > 0))
		return kvti_fail(KVT_ECONFIG, "%s: link.gpus_per_uplink needs "
				 "link.uplink_gbps", label);
	if (hw->gpus % hw->sockets)
		return kvti_fail(KVT_ECONFIG, "%s: %u gpus do not split over "
				 "%u sockets", label, hw->gpus, hw->sockets);
	if (hw->fabric_bytes > 0 &&
	    !(hw->fabric_link_gbps > 0 && hw->fabric_device_gbps > 0))
		return kvti_fail(KVT_ECONFIG, "%s: fabric.bytes needs "
				 "fabric.link_gbps and fabric.device_gbps",
				 label);
	if (hw->ssd_bytes > 0 && !(hw->ssd_read_gbps > 0 &&
				   hw->ssd_write_gbps > 0))
		return kvti_fail(KVT_ECONFIG, "%s: ssd.bytes needs "
				 "ssd.read_gbps and ssd.write_gbps", label);
	for (int m = 0; m < KVT_COPY_COUNT; m++)
		if (hw->copy[m].call_us > 0 && !hw->copy[m].n)
			return kvti_fail(KVT_ECONFIG, "%s: copy.%s_call_us "
					 "without copy.%s", label,
					 kvt_copy_method_name(m),
					 kvt_copy_method_name(m));
	return 0;
}

/* A source comment that starts with "assumed" marks an assumption. */
static int comment_assumed(const char *c)
{
	while (isspace((unsigned char)*c))
		c++;
	return !strncasecmp(c, "assumed", 7);
}

int kvt_hw_parse(kvt_hw *out, const char *text, const char *label)
{
	char seen[NKEYS] = { 0 }, line[1024], where[320];
	const char *p = text;
	kvt_hw hw;
	int lineno = 0, err, assumed;

	kvti_errclear();
	if (!out || !text)
		return kvti_fail(-EINVAL, "kvt_hw_parse: NULL argument");
	label = label ? label : "profile";
	memset(&hw, 0, sizeof(hw));
	while (*p) {
		const char *nl = strchr(p, '\n');
		size_t len = nl ? (size_t)(nl - p) : strlen(p);
		char *s, *eq, *hash, *key, *val;
		size_t i;

		lineno++;
		if (len >= sizeof(line))
			return kvti_fail(KVT_ECONFIG, "%s:%d: line too long",
					 label, lineno);
		memcpy(line, p, len);
		line[len] = '\0';
		p += len + (nl ? 1 : 0);
		assumed = 0;
		if ((hash = strchr(line, '#'))) {
			assumed = comment_assumed(hash + 1);
			*hash = '\0';
		}
		s = kvti_trim(line);
		if (!*s)
			continue;
		if (!(eq = strchr(s, '=')))
			return kvti_fail(KVT_ECONFIG, "%s:%d: expected 'key = "
					 "value'", label, lineno);
		*eq = '\0';
		key = kvti_trim(s);
		val = kvti_trim(eq + 1);
		for (i = 0; i < NKEYS; i++)
			if (!strcmp(keys[i].name, key))
				break;
		if (i == NKEYS) {
			char q[64];

			return kvti_fail(KVT_ECONFIG, "%s:%d: unknown key '%s'",
					 label, lineno, kvti_printable(q,
					 sizeof(q), key, SIZE_MAX));
		}
		snprintf(where, sizeof(where), "%s:%d: %s", label, lineno, key);
		if (seen[i]++)
			return kvti_fail(KVT_ECONFIG, "%s: given twice", where);
		if ((err = set_key(&hw, &keys[i], val, where)))
			return err;
		if (assumed)
			hw.assumed |= 1ull << i;
	}
	for (size_t i = 0; i < NKEYS; i++)
		if (keys[i].required && !seen[i])
			return kvti_fail(KVT_ECONFIG, "%s: missing key '%s'",
					 label, keys[i].name);
	if ((err = check_hw(&hw, label)))
		return err;
	*out = hw;
	return 0;
}

static int is_path(const char *name)
{
	size_t n = strlen(name);

	return strchr(name, '/') || (n > 5 && !strcmp(name + n - 5, ".prof"));
}

int kvt_hw_load(kvt_hw *hw, const char *name)
{
	const char *env = getenv("KVT_PROFILE_DIR");
	const char *dirs[3] = { env, KVT_SOURCE_DIR "/profiles",
				KVT_BUILD_DATADIR "/profiles" };
	char path[4096 + 64], *text = NULL;
	int err = -ENOENT;

	kvti_errclear();
	if (!hw || !name || !*name)
		return kvti_fail(-EINVAL, "kvt_hw_load: no profile name");
	if (is_path(name)) {
		if ((err = kvti_read_file(name, 1 << 20, &text, NULL)))
			return kvti_fail(err, "profile '%s': %s", name,
					 kvti_file_strerror(err));
		err = kvt_hw_parse(hw, text, name);
		kvt_free(text);
		return err;
	}
	for (size_t i = 0; i < KVT_ARRAY_SIZE(dirs); i++) {
		if (!dirs[i] || !*dirs[i])
			continue;
		snprintf(path, sizeof(path), "%s/%s.prof", dirs[i], name);
		err = kvti_read_file(path, 1 << 20, &text, NULL);
		if (err == -ENOENT)
			continue;
		if (err)
			return kvti_fail(err, "profile '%s': %s", path,
					 kvt_strerror(err));
		err = kvt_hw_parse(hw, text, path);
		kvt_free(text);
		return err;
	}
	return kvti_fail(KVT_ENOTFOUND, "unknown hardware profile '%s' "
			 "(built in: testbed-a, testbed-b, gh200, h100; looked in "
			 "%s%s%s/profiles and %s/profiles; or give a path to "
			 "a .prof file)", name, env ? env : "",
			 env ? ", " : "", KVT_SOURCE_DIR, KVT_BUILD_DATADIR);
}

int kvt_hw_cost(const kvt_hw *hw, const kvt_geom *g, kvt_cost *c)
{
	kvt_cost t;
	int err;

	kvti_errclear();
	if (g->tp_size > hw->gpus)
		return kvti_fail(KVT_ECONFIG, "TP %u needs more GPUs than %s "
				 "has (%u)", g->tp_size, hw->name, hw->gpus);
	memset(&t, 0, sizeof(t));
	t.gpu_flops = hw->gpu_flops;
	t.gemm_eff = hw->gemm_eff;
	t.attn_eff = hw->attn_eff;
	t.hbm_gbps = hw->hbm_gbps;
	t.hbm_eff = hw->hbm_eff;
	t.step_us = hw->step_us;
	t.ar_gbps = hw->ar_gbps;
	t.ar_us = hw->ar_us;
	t.link_gbps = hw->link_gbps;
	memcpy(t.copy, hw->copy, sizeof(t.copy));
	if ((err = kvt_cost_set_model(&t, g)))
		return err;
	if ((err = kvt_cost_check(&t)))
		return err;
	*c = t;
	return 0;
}

/* ---- measured copy rates (kvtier bench xfer --json) ------------------- */

/* Insert one (chunk, gbps) point into @k, keeping chunk sizes increasing
 * (a repeated size keeps the higher rate). */
static void curve_put(kvt_copy_curve *k, double chunk, double gbps)
{
	uint32_t i;

	for (i = 0; i < k->n && k->chunk_bytes[i] < chunk; i++)
		;
	if (i < k->n && k->chunk_bytes[i] == chunk) {
		k->gbps[i] = KVT_MAX(k->gbps[i], gbps);
		return;
	}
	if (k->n == KVT_CURVE_MAX)
		return;
	memmove(&k->chunk_bytes[i + 1], &k->chunk_bytes[i],
		(k->n - i) * sizeof(double));
	memmove(&k->gbps[i + 1], &k->gbps[i], (k->n - i) * sizeof(double));
	k->chunk_bytes[i] = chunk;
	k->gbps[i] = gbps;
	k->n++;
}

int kvt_hw_apply_xfer(kvt_hw *out, const char *json, const char *label)
{
	static const struct {
		const char *name;
		kvt_copy_method m;
	} map[] = {
		{ "cuda-chunk", KVT_COPY_MEMCPY },
		{ "cuda-batch", KVT_COPY_BATCH },
		{ "cuda-kernel", KVT_COPY_GATHER },
	};
	cJSON *root;
	const cJSON *res, *x, *model, *arr;
	kvt_copy_curve fresh[KVT_COPY_COUNT];
	double limit = 0;
	int used = 0, err = 0;
	kvt_hw hw;
	kvt_geom g;

	kvti_errclear();
	label = label ? label : "xfer json";
	if (!out || !json)
		return kvti_fail(-EINVAL, "kvt_hw_apply_xfer: NULL argument");
	if (!(root = cJSON_Parse(json)))
		return kvti_fail(KVT_ECONFIG, "%s: not JSON", label);
	model = cJSON_GetObjectItemCaseSensitive(root, "model");
	err = kvt_geom_preset(&g, cJSON_IsString(model) ? model->valuestring :
				  "llama-3.1-8b", 16, 1, 0);
	res = cJSON_GetObjectItemCaseSensitive(root, "results");
	if (!err && !cJSON_IsArray(res))
		err = kvti_fail(KVT_ECONFIG, "%s: no \"results\" array", label);
	memset(fresh, 0, sizeof(fresh));
	arr = err ? (const cJSON *)NULL : res;
	cJSON_ArrayForEach(x, arr) {
		const cJSON *m = cJSON_GetObjectItemCaseSensitive(x, "method");
		const cJSON *d = cJSON_GetObjectItemCaseSensitive(x, "direction");
		const cJSON *p = cJSON_GetObjectItemCaseSensitive(x, "page_tokens");
		const cJSON *r = cJSON_GetObjectItemCaseSensitive(x, "gbps");
		const cJSON *l = cJSON_GetObjectItemCaseSensitive(x, "limit_gbps");

		if (!cJSON_IsString(m) || !cJSON_IsString(d) ||
		    strcmp(d->valuestring, "load"))
			continue;
		for (size_t i = 0; i < KVT_ARRAY_SIZE(map); i++) {
			if (strcmp(m->valuestring, map[i].name))
				continue;
			/* a point we would use must make sense: no silent skip */
			if (!cJSON_IsNumber(p) || !(p->valuedouble >= 1 &&
			    p->valuedouble <= (1u << 20)) ||
			    p->valuedouble != (double)(uint32_t)p->valuedouble ||
			    !cJSON_IsNumber(r) || !(r->valuedouble >= GBPS_MIN &&
			    r->valuedouble <= GBPS_MAX) ||
			    (l && !cJSON_IsNull(l) && !(cJSON_IsNumber(l) &&
				    l->valuedouble >= 0 &&
				    l->valuedouble <= GBPS_MAX))) {
				err = kvti_fail(KVT_ECONFIG, "%s: %s load point "
						"%d: page_tokens must be an "
						"integer in 1..1048576, gbps "
						"and limit_gbps in %g..%g",
						label, map[i].name, used + 1,
						GBPS_MIN, GBPS_MAX);
				break;
			}
			g.page_tokens = (uint32_t)p->valuedouble;
			curve_put(&fresh[map[i].m],
				  (double)kvt_geom_chunk_bytes(&g),
				  r->valuedouble);
			if (cJSON_IsNumber(l))
				limit = KVT_MAX(limit, l->valuedouble);
			used++;
		}
		if (err)
			break;
	}
	cJSON_Delete(root);
	if (err)
		return err;
	if (!used)
		return kvti_fail(KVT_ECONFIG, "%s: no CUDA load results "
				 "(cuda-chunk, cuda-batch, cuda-kernel): was it "
				 "measured on a machine with a GPU?", label);
	hw = *out;
	for (int m = 0; m < KVT_COPY_COUNT; m++)
		if (fresh[m].n) {
			hw.copy[m] = fresh[m]; /* measured: call cost included */
			hw.copy[m].call_us = m == KVT_COPY_MEMCPY ? 0 :
					     out->copy[m].call_us;
		}
	if (limit > 0) {
		hw.link_gbps = limit;
		hw.copy[KVT_COPY_CONTIG].n = 1;
		hw.copy[KVT_COPY_CONTIG].chunk_bytes[0] = 64.0 * 1024 * 1024;
		hw.copy[KVT_COPY_CONTIG].gbps[0] = limit;
	}
	*out = hw;
	return 0;
}

/* ---- keys by name: overrides (--set) and perturbations (--explain) ---- */

const char *kvt_hw_key_name(size_t i)
{
	return i < NKEYS ? keys[i].name : NULL;
}

int kvt_hw_key_assumed(const kvt_hw *hw, size_t i)
{
	return i < NKEYS && (hw->assumed >> i & 1);
}

static int key_index(const char *name)
{
	for (size_t i = 0; name && i < NKEYS; i++)
		if (!strcmp(keys[i].name, name))
			return (int)i;
	return -1;
}

int kvt_hw_set(kvt_hw *out, const char *key, const char *value)
{
	char where[160], val[512];
	kvt_hw hw;
	int i, err;

	kvti_errclear();
	if (!out || !key || !value)
		return kvti_fail(-EINVAL, "kvt_hw_set: NULL argument");
	if ((i = key_index(key)) < 0)
		return kvti_fail(KVT_ECONFIG, "unknown profile key '%s' "
				 "(docs/FORMATS.md lists them)", key);
	if (kvti_strlcpy(val, value, sizeof(val)))
		return kvti_fail(KVT_ECONFIG, "%s: value too long", key);
	snprintf(where, sizeof(where), "%s (override)", key);
	hw = *out;
	if (keys[i].type == K_CURVE)
		memset(&hw.copy[keys[i].off].chunk_bytes, 0,
		       sizeof(hw.copy[0].chunk_bytes));
	if ((err = set_key(&hw, &keys[i], kvti_trim(val), where)) ||
	    (err = check_hw(&hw, where)))
		return err;
	hw.assumed &= ~(1ull << i); /* the caller's value, not the file's */
	*out = hw;
	return 0;
}

int kvt_hw_key_scale(kvt_hw *out, size_t i, double f, double *from,
		     double *to)
{
	const struct key *k;
	kvt_hw hw;
	double v;

	if (i >= NKEYS || !(f > 0))
		return -EINVAL;
	k = &keys[i];
	hw = *out;
	switch (k->type) {
	case K_DBL:
		v = *(double *)((char *)&hw + k->off);
		if (v == 0)
			return -EINVAL; /* a zero (off) stays off */
		*from = v;
		*to = KVT_MIN(KVT_MAX(v * f, k->lo), k->hi);
		if (*to == v)
			return -EINVAL;
		*(double *)((char *)&hw + k->off) = *to;
		break;
	case K_CALL:
		if (!hw.copy[k->off].n || hw.copy[k->off].call_us == 0)
			return -EINVAL;
		*from = hw.copy[k->off].call_us;
		*to = hw.copy[k->off].call_us *= f;
		break;
	case K_CURVE: /* the whole curve up or down, rates as a factor */
		if (!hw.copy[k->off].n)
			return -EINVAL;
		*from = 1;
		*to = f;
		for (uint32_t j = 0; j < hw.copy[k->off].n; j++)
			hw.copy[k->off].gbps[j] *= f;
		break;
	default:
		return -EINVAL; /* names and counts are not perturbed */
	}
	if (check_hw(&hw, "perturbation"))
		return -EINVAL;
	*out = hw;
	return 0;
}
