/*
 * trace.c — Mooncake-format request traces (format: include/kvtier/trace.h).
 *
 * The file is read whole, then parsed line by line with cJSON; requests
 * go into one array and all their hash ids into another, so a request's
 * hash_ids point into the second (fixed once parsing is over). Any bad
 * line fails the whole trace with "<name>:<line>: <what>".
 */
#include "core/core.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <math.h>
#include <string.h>

#define TRACE_MAX_BYTES (1ull << 30)
#define ID_MAX 9007199254740992.0 /* 2^53: exact in a double */

struct kvt_trace {
	kvt_trace_req *req;
	size_t n, cap;
	uint64_t *ids;
	size_t nids, capids;
	uint64_t unique;
};

/* A number field that must be a whole number in [0, max]. */
static int get_uint(const cJSON *o, const char *key, double max, double *v,
		    const char **why)
{
	const cJSON *f = cJSON_GetObjectItemCaseSensitive(o, key);

	if (!f) {
		*why = "missing";
		return -1;
	}
	if (!cJSON_IsNumber(f)) {
		*why = "not a number";
		return -1;
	}
	*v = f->valuedouble;
	if (!isfinite(*v) || *v < 0 || *v > max) {
		*why = "out of range";
		return -1;
	}
	if (max != INFINITY && *v != floor(*v)) {
		*why = "not a whole number";
		return -1;
	}
	return 0;
}

static int parse_line(kvt_trace *t, const char *s, size_t len,
		      const char *name, uint32_t line)
{
	const char *end = NULL, *why = NULL, *field = NULL;
	cJSON *o = cJSON_ParseWithLengthOpts(s, len, &end, 0);
	const cJSON *ids, *id;
	kvt_trace_req *r;
	double v;
	int err = KVT_ECONFIG, k;

	if (!o) {
		if (!end || end < s || end > s + len)
			return kvti_fail(KVT_ECONFIG, "%s:%u: not JSON", name,
					 line);
		return kvti_fail(KVT_ECONFIG, "%s:%u: not JSON (at column %zu)",
				 name, line, (size_t)(end - s) + 1);
	}
	if (!cJSON_IsObject(o)) {
		kvti_fail(err, "%s:%u: not a JSON object", name, line);
		goto out;
	}
	/* one object per line: anything after it but blanks fails the line */
	for (const char *q = end; q && q < s + len; q++)
		if (!strchr(" \t\r", *q)) {
			kvti_fail(err, "%s:%u: data after the JSON object (at "
				  "column %zu)", name, line,
				  (size_t)(q - s) + 1);
			goto out;
		}
	if ((err = kvti_grow((void **)&t->req, &t->cap, t->n + 1, sizeof(*r),
			     256)))
		goto out;
	err = KVT_ECONFIG;
	r = &t->req[t->n];
	memset(r, 0, sizeof(*r));
	r->line = line;
	if (get_uint(o, field = "timestamp", INFINITY, &v, &why))
		goto bad;
	if (v * 1e6 >= 1.8e19) {
		why = "out of range";
		goto bad;
	}
	r->time_ns = (uint64_t)llround(v * 1e6);
	if (get_uint(o, field = "input_length", UINT32_MAX, &v, &why))
		goto bad;
	r->input_length = (uint32_t)v;
	if (get_uint(o, field = "output_length", UINT32_MAX, &v, &why))
		goto bad;
	r->output_length = (uint32_t)v;
	field = "hash_ids";
	ids = cJSON_GetObjectItemCaseSensitive(o, field);
	if (!ids || !cJSON_IsArray(ids)) {
		why = ids ? "not an array" : "missing";
		goto bad;
	}
	k = cJSON_GetArraySize(ids);
	if ((err = kvti_grow((void **)&t->ids, &t->capids, t->nids + (size_t)k,
			     sizeof(*t->ids), 256)))
		goto out;
	err = KVT_ECONFIG;
	r->nhash = (uint32_t)k;
	r->hash_ids = (const uint64_t *)(uintptr_t)t->nids; /* fixed later */
	k = 0;
	cJSON_ArrayForEach(id, ids) {
		double d = cJSON_IsNumber(id) ? id->valuedouble : -1;
		if (!cJSON_IsNumber(id) || d < 0 || d >= ID_MAX ||
		    d != floor(d)) {
			if (cJSON_IsNumber(id))
				kvti_fail(err, "%s:%u: 'hash_ids' holds %g "
					  "(item %d), not an id (a whole "
					  "number in 0..2^53)", name, line, d,
					  k);
			else
				kvti_fail(err, "%s:%u: 'hash_ids' item %d is "
					  "not a number", name, line, k);
			goto out;
		}
		t->ids[t->nids + (size_t)k++] = (uint64_t)d;
	}
	t->nids += (size_t)k;
	t->n++;
	err = 0;
	goto out;
bad:
	kvti_fail(err, "%s:%u: '%s' %s", name, line, field, why);
out:
	cJSON_Delete(o);
	return err;
}

static int count_unique(kvt_trace *t)
{
	size_t cap = 64, m;
	uint64_t *set;

	while (cap < t->nids * 2)
		cap *= 2;
	set = kvt_calloc(cap, sizeof(*set));
	if (!set)
		return -ENOMEM;
	m = cap - 1;
	for (size_t i = 0; i < t->nids; i++) {
		uint64_t v = t->ids[i] + 1, h = v * 0x9e3779b97f4a7c15ull;
		size_t s = (size_t)(h >> 17) & m;
		while (set[s] && set[s] != v)
			s = (s + 1) & m;
		if (!set[s]) {
			set[s] = v;
			t->unique++;
		}
	}
	kvt_free(set);
	return 0;
}

int kvt_trace_parse(kvt_trace **out, const char *text, size_t len,
		    const char *name)
{
	kvt_trace *t;
	const char *p = text, *e = text + len;
	uint32_t line = 0;
	int err = 0;

	kvti_errclear();
	if (!name)
		name = "trace";
	if (!text && len)
		return kvti_fail(-EINVAL, "%s: no text", name);
	t = kvt_calloc(1, sizeof(*t));
	if (!t)
		return -ENOMEM;
	while (p < e && !err) {
		const char *nl = memchr(p, '\n', (size_t)(e - p)), *q;
		size_t n = nl ? (size_t)(nl - p) : (size_t)(e - p);

		line++;
		for (q = p; q < p + n && strchr(" \t\r", *q); q++)
			;
		if (q < p + n)
			err = parse_line(t, p, n, name, line);
		p += n + 1;
	}
	if (!err && !t->n)
		err = kvti_fail(KVT_ECONFIG, "%s: no request in the trace",
				name);
	/* every request's hash_ids points into t->ids, even when all are
	 * empty (no NULL + 0) */
	if (!err && !t->ids)
		err = kvti_grow((void **)&t->ids, &t->capids, 1,
				sizeof(*t->ids), 1);
	if (!err)
		err = count_unique(t);
	if (err) {
		kvt_trace_close(t);
		return err;
	}
	for (size_t i = 0; i < t->n; i++)
		t->req[i].hash_ids = t->ids + (uintptr_t)t->req[i].hash_ids;
	*out = t;
	return 0;
}

int kvt_trace_open(kvt_trace **out, const char *path)
{
	char *buf;
	size_t len;
	int err;

	kvti_errclear();
	err = kvti_read_file(path, TRACE_MAX_BYTES, &buf, &len);
	if (err)
		return kvti_fail(err, "trace %s: %s", path,
				 err == -EFBIG ? "larger than 1 GiB" :
				 kvti_file_strerror(err));
	err = kvt_trace_parse(out, buf, len, path);
	kvt_free(buf);
	return err;
}

void kvt_trace_close(kvt_trace *t)
{
	if (!t)
		return;
	kvt_free(t->req);
	kvt_free(t->ids);
	kvt_free(t);
}

size_t kvt_trace_count(const kvt_trace *t)
{
	return t->n;
}

const kvt_trace_req *kvt_trace_get(const kvt_trace *t, size_t i)
{
	return i < t->n ? &t->req[i] : NULL;
}

uint64_t kvt_trace_blocks(const kvt_trace *t)
{
	return t->nids;
}

uint64_t kvt_trace_unique_blocks(const kvt_trace *t)
{
	return t->unique;
}
