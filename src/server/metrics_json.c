/*
 * metrics_json.c — the metrics snapshot as JSON: the STATS reply's
 * document (`kvtier stat`; format KVTD_METRICS_JSON_VERSION, keys in
 * docs/METRICS.md), all tenants' or one tenant's own.
 *
 *   kvti_metrics_snap_take() (holds m->mu) --> struct snap --> cJSON tree
 *   (format, version, times, gauges, tiers, cache, datapath and devices
 *   from metrics_dpath.c, bucket bounds, tenants) --> printed, copied into
 *   a kvt_malloc'ed buffer
 *
 * Invariants: the same snapshot the text rendering formats, so the same
 * numbers under other names; a failed cJSON allocation anywhere fails the
 * whole render (-ENOMEM), never a document missing a key.
 *
 * Locking: none here; the snapshot is taken under m->mu and formatted
 * after the mutex is dropped.
 */
#include "server/metrics_impl.h"

#include "core/core.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <string.h>

/* The node gauges' keys (metrics_text.c has their family names). */
static const char *const gauge_json[KVTD_G_COUNT] = {
	"clients", "leases", "pinned_pages", "jobs_in_flight",
	"registered_memory_bytes",
};

/* ---- JSON ---------------------------------------------------------------- */

/* cJSON allocates with malloc and reports failure as NULL: every add below
 * is checked once at the end through the tree's completeness (a failed
 * add leaves the tree smaller, so failures are tracked in @ok). */
struct jb {
	int ok;
};

static cJSON *jnum(struct jb *j, cJSON *o, const char *k, double v)
{
	cJSON *n = cJSON_AddNumberToObject(o, k, v);

	if (!n)
		j->ok = 0;
	return n;
}

static cJSON *jobj(struct jb *j, cJSON *o, const char *k)
{
	cJSON *n = o ? cJSON_AddObjectToObject(o, k) : NULL;

	if (!n)
		j->ok = 0;
	return n;
}

static cJSON *jarr(struct jb *j, cJSON *o, const char *k)
{
	cJSON *n = o ? cJSON_AddArrayToObject(o, k) : NULL;

	if (!n)
		j->ok = 0;
	return n;
}

static cJSON *jitem(struct jb *j, cJSON *arr, cJSON *it)
{
	if (!it || !arr || !cJSON_AddItemToArray(arr, it)) {
		cJSON_Delete(it);
		j->ok = 0;
		return NULL;
	}
	return it;
}

static void json_tenant(struct jb *j, cJSON *arr, const struct snap *s,
			const struct snap_tenant *t)
{
	cJSON *o = jitem(j, arr, cJSON_CreateObject()), *x, *y;

	if (!o)
		return;
	if (t->node ? !cJSON_AddNullToObject(o, "id") :
		      !cJSON_AddNumberToObject(o, "id", t->id))
		j->ok = 0;
	if (!cJSON_AddStringToObject(o, "name", t->name))
		j->ok = 0;
	jnum(j, o, "misses", (double)t->misses);
	jnum(j, o, "fingerprint_conflicts", (double)t->fpconf);
	x = jobj(j, o, "tiers");
	for (int k = 0; x && k < NTU; k++) {
		if (!(s->tiers & (1u << k)))
			continue;
		y = jobj(j, x, kvti_metrics_tier_name(k));
		if (!y)
			break;
		jnum(j, y, "hits", (double)t->hits[k]);
		jnum(j, y, "read_failures", (double)t->read_fail[k]);
		jnum(j, y, "evictions", (double)t->evict[k]);
		jnum(j, y, "demotions", (double)t->demote[k]);
		jnum(j, y, "checksum_failures", (double)t->csum[k]);
		if (t->pages_set & (1u << k)) {
			jnum(j, y, "used_pages", (double)t->used[k]);
			jnum(j, y, "quota_pages", (double)t->quota[k]);
		}
	}
	x = jarr(j, o, "transfer_bytes");
	for (int f = 0; x && f < KVTD_END_COUNT; f++)
		for (int to = 0; to < KVTD_END_COUNT; to++) {
			if (!t->bytes[f][to])
				continue;
			y = jitem(j, x, cJSON_CreateObject());
			if (!y)
				break;
			if (!cJSON_AddStringToObject(
				    y, "from", kvtd_end_name((enum kvtd_end)f)) ||
			    !cJSON_AddStringToObject(
				    y, "to", kvtd_end_name((enum kvtd_end)to)))
				j->ok = 0;
			jnum(j, y, "bytes", (double)t->bytes[f][to]);
		}
	x = jobj(j, o, "lease_expiries");
	for (int r = 0; x && r < KVTD_LEASE_END_COUNT; r++)
		jnum(j, x, kvti_metrics_lease_names[r], (double)t->lease[r]);
	x = jobj(j, o, "protocol_errors");
	for (int r = 0; x && r < KVTD_PERR_COUNT; r++)
		if (t->perr[r])
			jnum(j, x, kvti_metrics_perr_names[r],
			     (double)t->perr[r]);
	x = jobj(j, o, "latency");
	for (int op = 0; x && op < KVTD_OP_COUNT; op++) {
		cJSON *h = jobj(j, x, kvti_metrics_op_names[op]), *c;

		if (!h)
			break;
		jnum(j, h, "count", (double)t->cum[op][NB - 1]);
		jnum(j, h, "sum_seconds", (double)t->sum_ns[op] / 1e9);
		c = jarr(j, h, "cumulative");
		for (int k = 0; c && k < NB; k++)
			jitem(j, c, cJSON_CreateNumber((double)t->cum[op][k]));
	}
}

static cJSON *json_build(const struct snap *s, const kvtd_mtenant *only)
{
	struct jb j = { 1 };
	cJSON *root = cJSON_CreateObject(), *x, *y;

	if (!root)
		return NULL;
	jnum(&j, root, "format", KVTD_METRICS_JSON_VERSION);
	if (!cJSON_AddStringToObject(root, "version", kvt_version()))
		j.ok = 0;
	jnum(&j, root, "time", s->now);
	jnum(&j, root, "start_time", s->start);
	x = jobj(&j, root, "gauges");
	for (int g = 0; x && g < KVTD_G_COUNT; g++)
		jnum(&j, x, gauge_json[g], (double)s->gauge[g]);
	x = jarr(&j, root, "tiers");
	for (int k = 0; x && k < NT; k++) {
		const struct snap_tier *t = &s->tier[k];

		if (!t->present)
			continue;
		y = jitem(&j, x, cJSON_CreateObject());
		if (!y)
			break;
		if (!cJSON_AddStringToObject(y, "tier",
					     kvt_tier_kind_name((kvt_tier_kind)k)))
			j.ok = 0;
		jnum(&j, y, "capacity_bytes", (double)t->cap_bytes);
		jnum(&j, y, "used_bytes", (double)t->used_bytes);
		jnum(&j, y, "capacity_pages", (double)t->cap_pages);
		jnum(&j, y, "used_pages", (double)t->used_pages);
		jnum(&j, y, "alloc_failures", (double)t->full);
	}
	if (s->have_cache) {
		x = jobj(&j, root, "cache");
		for (size_t i = 0; x && i < kvti_metrics_ncache_ctrs; i++) {
			const struct kvti_metrics_cache_ctr *r =
				&kvti_metrics_cache_ctrs[i];

			jnum(&j, x, r->json, kvti_metrics_cache_val(&s->cs, r));
		}
	} else if (!cJSON_AddNullToObject(root, "cache")) {
		j.ok = 0;
	}
	if (s->have_remote) {
		x = jobj(&j, root, "remote");
		for (size_t i = 0; x && i < kvti_metrics_nremote_ctrs; i++) {
			const struct kvti_metrics_cache_ctr *r =
				&kvti_metrics_remote_ctrs[i];

			jnum(&j, x, r->json, kvti_metrics_cache_val(&s->rs, r));
		}
	} else if (!cJSON_AddNullToObject(root, "remote")) {
		j.ok = 0;
	}
	if (kvtd_dpath_json(&s->dp, root))
		j.ok = 0;
	x = jarr(&j, root, "buckets");
	for (int k = 0; x && k < KVTD_HIST_BOUNDS; k++)
		jitem(&j, x, cJSON_CreateNumber(kvtd_hist_bound(k)));
	x = jarr(&j, root, "tenants");
	for (int i = 0; x && i < s->nt; i++)
		if (only ? !s->t[i].node && s->t[i].id == only->id :
			   kvti_metrics_shown(&s->t[i], s->t[i].any))
			json_tenant(&j, x, s, &s->t[i]);
	if (!j.ok) {
		cJSON_Delete(root);
		return NULL;
	}
	return root;
}

int kvtd_metrics_render_json(kvtd_metrics *m, char **out, size_t *len)
{
	return kvtd_metrics_render_json_for(m, NULL, out, len);
}

int kvtd_metrics_render_json_for(kvtd_metrics *m, const kvtd_mtenant *only,
				 char **out, size_t *len)
{
	struct snap s;
	cJSON *root = NULL;
	char *txt = NULL;
	size_t n;
	int err;

	*out = NULL;
	if ((err = kvti_metrics_snap_take(m, &s)))
		goto out;
	err = -ENOMEM;
	root = json_build(&s, only);
	if (!root)
		goto out;
	txt = cJSON_PrintUnformatted(root);
	if (!txt)
		goto out;
	n = strlen(txt);
	*out = kvt_malloc(n + 1);
	if (!*out)
		goto out;
	memcpy(*out, txt, n + 1);
	if (len)
		*len = n;
	err = 0;
out:
	cJSON_free(txt);
	cJSON_Delete(root);
	kvt_free(s.t);
	return err;
}

