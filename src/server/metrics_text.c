/*
 * metrics_text.c — the metrics snapshot as Prometheus text exposition
 * 0.0.4 (GET /metrics, served by http.c through kvtd_metrics_render_cb()).
 *
 *   kvti_metrics_snap_take() (holds m->mu) --> struct snap --> families:
 *   node (info, start time, gauges), tiers, cache totals, data path
 *   (metrics_dpath.c), per-tenant counters, latency histograms --> one
 *   kvt_malloc'ed buffer (struct sb: grows, remembers its first error)
 *
 * Invariants: every family has its HELP and TYPE once, then its samples;
 * every label value goes through sb_label() (\\, \" and \n escaped: tenant
 * names are the only outside bytes in a label); histogram buckets are
 * cumulative, +Inf last, and _count equals it.
 *
 * Locking: none here; the snapshot is taken under m->mu and formatted
 * after the mutex is dropped.
 */
#include "server/metrics_impl.h"

#include "core/core.h"

#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

/* The node gauges' family names and help (metrics_json.c has their keys). */
static const char *const gauge_names[KVTD_G_COUNT] = {
	"kvtier_clients", "kvtier_leases", "kvtier_pinned_pages",
	"kvtier_jobs_in_flight", "kvtier_registered_memory_bytes",
};
static const char *const gauge_help[KVTD_G_COUNT] = {
	"Clients connected to the daemon.",
	"Leases (pins) held by clients now.",
	"Pages under a lease now.",
	"Loads and stores submitted and not done.",
	"Engine memory registered by clients, bytes.",
};

struct sb {
	char *p;
	size_t len, cap;
	int err;
};

static void sb_printf(struct sb *b, const char *fmt, ...)
	__attribute__((format(printf, 2, 3)));
static void sb_printf(struct sb *b, const char *fmt, ...)
{
	va_list ap;
	int n;

	if (b->err)
		return;
	for (;;) {
		size_t room = b->cap - b->len;

		va_start(ap, fmt);
		n = vsnprintf(b->p ? b->p + b->len : NULL, room, fmt, ap);
		va_end(ap);
		if (n < 0) {
			b->err = -EINVAL;
			return;
		}
		if ((size_t)n < room) {
			b->len += (size_t)n;
			return;
		}
		if (kvti_grow((void **)&b->p, &b->cap, b->len + (size_t)n + 1,
			      1, 16384)) {
			b->err = -ENOMEM;
			return;
		}
	}
}

static void sb_put(struct sb *b, const char *s, size_t n)
{
	if (b->err)
		return;
	if (b->cap - b->len <= n &&
	    kvti_grow((void **)&b->p, &b->cap, b->len + n + 1, 1, 16384)) {
		b->err = -ENOMEM;
		return;
	}
	memcpy(b->p + b->len, s, n);
	b->len += n;
	b->p[b->len] = 0;
}

/* A label value, escaped as the format wants: \\, \" and \n. */
static void sb_label(struct sb *b, const char *v)
{
	for (;;) {
		size_t n = strcspn(v, "\\\"\n");

		sb_put(b, v, n);
		v += n;
		if (!*v)
			return;
		sb_put(b, *v == '\n' ? "\\n" : *v == '"' ? "\\\"" : "\\\\", 2);
		v++;
	}
}

static void sb_str(struct sb *b, const char *s)
{
	sb_put(b, s, strlen(s));
}

/* " <v>\n" */
static void sb_value(struct sb *b, uint64_t v)
{
	char d[24], *p = d + sizeof(d);

	*--p = '\n';
	do
		*--p = (char)('0' + v % 10);
	while ((v /= 10));
	*--p = ' ';
	sb_put(b, p, (size_t)(d + sizeof(d) - p));
}

static void family(struct sb *b, const char *name, const char *type,
		   const char *help)
{
	sb_printf(b, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

/* name{tenant="..."[,<more>]} value — @more is "" or 'k="v"' pairs. */
static void sample_t(struct sb *b, const char *name,
		     const struct snap_tenant *t, const char *more, uint64_t v)
{
	sb_str(b, name);
	sb_put(b, "{tenant=\"", 9);
	sb_label(b, t->name);
	sb_put(b, "\"", 1);
	if (*more) {
		sb_put(b, ",", 1);
		sb_str(b, more);
	}
	sb_put(b, "}", 1);
	sb_value(b, v);
}

/* Which label values a family shows (see label_family()). */
enum { SEL_TIERS, SEL_PAGES, SEL_ALL, SEL_SEEN };

/*
 * A per-tenant family with one more label, @key="names[k]" for k < @n, of
 * the uint64_t array at @off in struct snap_tenant. @sel picks the k:
 * SEL_TIERS the snapshot's tier set, SEL_PAGES the tiers where the daemon
 * set the tenant's pages, SEL_ALL every k, SEL_SEEN the nonzero ones.
 * @names NULL: tier names.
 */
static void label_family(struct sb *b, const struct snap *s, const char *name,
			 const char *type, const char *help, const char *key,
			 const char *const *names, int n, size_t off, int sel)
{
	char lab[64];

	family(b, name, type, help);
	for (int i = 0; i < s->nt; i++) {
		const struct snap_tenant *t = &s->t[i];
		const uint64_t *v = (const uint64_t *)((const char *)t + off);
		uint64_t nz = 0;

		for (int k = 0; k < n; k++)
			nz |= v[k];
		if (!kvti_metrics_shown(t, nz | (sel == SEL_PAGES)))
			continue;
		for (int k = 0; k < n; k++) {
			if ((sel == SEL_TIERS && !(s->tiers & (1u << k))) ||
			    (sel == SEL_PAGES && !(t->pages_set & (1u << k))) ||
			    (sel == SEL_SEEN && !v[k]))
				continue;
			snprintf(lab, sizeof(lab), "%s=\"%s\"", key,
				 names ? names[k] : kvti_metrics_tier_name(k));
			sample_t(b, name, t, lab, v[k]);
		}
	}
}

static void tier_family(struct sb *b, const struct snap *s, const char *name,
			const char *help, size_t off)
{
	label_family(b, s, name, "counter", help, "tier", NULL, NTU, off,
		     SEL_TIERS);
}

static void text_node(struct sb *b, const struct snap *s)
{
	family(b, "kvtier_info", "gauge",
	       "The kvtier daemon's version (always 1).");
	sb_printf(b, "kvtier_info{version=\"");
	sb_label(b, kvt_version());
	sb_printf(b, "\"} 1\n");
	family(b, "kvtier_start_time_seconds", "gauge",
	       "When the metrics registry was made, Unix time in seconds.");
	sb_printf(b, "kvtier_start_time_seconds %.3f\n", s->start);
	for (int g = 0; g < KVTD_G_COUNT; g++) {
		family(b, gauge_names[g], "gauge", gauge_help[g]);
		sb_printf(b, "%s %" PRIu64 "\n", gauge_names[g], s->gauge[g]);
	}
}

static void text_tiers(struct sb *b, const struct snap *s)
{
	static const struct {
		const char *name, *type, *help;
		size_t off;
	} f[] = {
		{ "kvtier_tier_capacity_bytes", "gauge",
		  "Page data a tier can hold, bytes.",
		  offsetof(struct snap_tier, cap_bytes) },
		{ "kvtier_tier_used_bytes", "gauge",
		  "Page data a tier holds now, bytes.",
		  offsetof(struct snap_tier, used_bytes) },
		{ "kvtier_tier_capacity_pages", "gauge",
		  "Page slots in a tier.",
		  offsetof(struct snap_tier, cap_pages) },
		{ "kvtier_tier_used_pages", "gauge",
		  "Page slots in use in a tier.",
		  offsetof(struct snap_tier, used_pages) },
		{ "kvtier_tier_alloc_failures_total", "counter",
		  "Slot allocations a full tier refused.",
		  offsetof(struct snap_tier, full) },
	};

	if (!s->have_cache)
		return;
	for (size_t i = 0; i < KVT_ARRAY_SIZE(f); i++) {
		family(b, f[i].name, f[i].type, f[i].help);
		for (int k = 0; k < NT; k++) {
			const struct snap_tier *t = &s->tier[k];

			if (!t->present)
				continue;
			sb_printf(b, "%s{tier=\"%s\"} %" PRIu64 "\n", f[i].name,
				  kvt_tier_kind_name((kvt_tier_kind)k),
				  *(const uint64_t *)((const char *)t +
						      f[i].off));
		}
	}
}

/* The rows of table @tab over @base (a struct the table describes). */
static void text_ctrs(struct sb *b, const struct kvti_metrics_cache_ctr *tab,
		      size_t n, const void *base)
{
	for (size_t i = 0; i < n; i++) {
		const struct kvti_metrics_cache_ctr *r = &tab[i];

		if (r->help)
			family(b, r->family, "counter", r->help);
		sb_str(b, r->family);
		if (r->op)
			sb_printf(b, "{op=\"%s\"}", r->op);
		if (r->seconds)
			sb_printf(b, " %.9f\n", kvti_metrics_cache_val(base, r));
		else
			sb_value(b, *(const uint64_t *)((const char *)base +
							r->off));
	}
}

static void text_cache(struct sb *b, const struct snap *s)
{
	if (!s->have_cache)
		return;
	text_ctrs(b, kvti_metrics_cache_ctrs, kvti_metrics_ncache_ctrs, &s->cs);
	if (s->have_remote)
		text_ctrs(b, kvti_metrics_remote_ctrs,
			  kvti_metrics_nremote_ctrs, &s->rs);
}

static void text_tenants(struct sb *b, const struct snap *s)
{
	char lab[96];

	tier_family(b, s, "kvtier_hits_total",
		    "Pages a lookup found, by the tier holding them.",
		    offsetof(struct snap_tenant, hits));
	family(b, "kvtier_misses_total", "counter",
	       "Pages a lookup asked for that no tier holds.");
	for (int i = 0; i < s->nt; i++)
		if (kvti_metrics_shown(&s->t[i], s->t[i].misses))
			sample_t(b, "kvtier_misses_total", &s->t[i], "",
				 s->t[i].misses);
	family(b, "kvtier_fingerprint_conflicts_total", "counter",
	       "Engines of a tenant that published page-hash fingerprints "
	       "differing from one already published: their pages never "
	       "match.");
	for (int i = 0; i < s->nt; i++)
		if (kvti_metrics_shown(&s->t[i], s->t[i].fpconf))
			sample_t(b, "kvtier_fingerprint_conflicts_total",
				 &s->t[i], "", s->t[i].fpconf);
	tier_family(b, s, "kvtier_read_failures_total",
		    "Pages a tier held but a load could not read (not misses).",
		    offsetof(struct snap_tenant, read_fail));
	tier_family(b, s, "kvtier_evictions_total",
		    "Pages that left a tier to make room.",
		    offsetof(struct snap_tenant, evict));
	tier_family(b, s, "kvtier_demotions_total",
		    "Pages moved out of a tier into a slower one.",
		    offsetof(struct snap_tenant, demote));
	tier_family(b, s, "kvtier_checksum_failures_total",
		    "Page copies that failed their checksum and were dropped.",
		    offsetof(struct snap_tenant, csum));
	family(b, "kvtier_transfer_bytes_total", "counter",
	       "Bytes moved, by link: from and to are tiers or the engine.");
	for (int i = 0; i < s->nt; i++)
		for (int f = 0; f < KVTD_END_COUNT; f++)
			for (int to = 0; to < KVTD_END_COUNT; to++) {
				if (!s->t[i].bytes[f][to])
					continue;
				snprintf(lab, sizeof(lab),
					 "from=\"%s\",to=\"%s\"",
					 kvtd_end_name((enum kvtd_end)f),
					 kvtd_end_name((enum kvtd_end)to));
				sample_t(b, "kvtier_transfer_bytes_total",
					 &s->t[i], lab, s->t[i].bytes[f][to]);
			}
	label_family(b, s, "kvtier_lease_expiries_total", "counter",
		     "Leases that ended without a release: deadline or "
		     "disconnect.", "reason", kvti_metrics_lease_names,
		     KVTD_LEASE_END_COUNT, offsetof(struct snap_tenant, lease),
		     SEL_ALL);
	label_family(b, s, "kvtier_protocol_errors_total", "counter",
		     "Messages refused, by reason.", "reason",
		     kvti_metrics_perr_names, KVTD_PERR_COUNT,
		     offsetof(struct snap_tenant, perr), SEL_SEEN);
	label_family(b, s, "kvtier_tenant_used_pages", "gauge",
		     "Pages a tenant holds in a tier.", "tier", NULL, NT,
		     offsetof(struct snap_tenant, used), SEL_PAGES);
	label_family(b, s, "kvtier_tenant_quota_pages", "gauge",
		     "A tenant's page quota in a tier (0: none).", "tier", NULL,
		     NT, offsetof(struct snap_tenant, quota), SEL_PAGES);
}

static void text_hists(struct sb *b, const struct snap *s)
{
	static const char *const help[KVTD_OP_COUNT] = {
		"LOOKUP latency (request to reply), seconds.",
		"LOAD latency (request to all layers in place), seconds.",
		"STORE latency (request to committed), seconds.",
	};
	char name[64], les[NB][24];

	for (int k = 0; k < NB; k++)
		if (k < KVTD_HIST_BOUNDS)
			snprintf(les[k], sizeof(les[k]), "le=\"%.6g\"",
				 kvtd_hist_bound(k));
		else
			snprintf(les[k], sizeof(les[k]), "le=\"+Inf\"");
	for (int o = 0; o < KVTD_OP_COUNT; o++) {
		snprintf(name, sizeof(name), "kvtier_%s_duration_seconds",
			 kvti_metrics_op_names[o]);
		family(b, name, "histogram", help[o]);
		for (int i = 0; i < s->nt; i++) {
			const struct snap_tenant *t = &s->t[i];

			if (!kvti_metrics_shown(t, t->cum[o][NB - 1]))
				continue;
			snprintf(name, sizeof(name),
				 "kvtier_%s_duration_seconds_bucket",
				 kvti_metrics_op_names[o]);
			for (int k = 0; k < NB; k++)
				sample_t(b, name, t, les[k], t->cum[o][k]);
			sb_printf(b, "kvtier_%s_duration_seconds_sum{tenant=\"",
				  kvti_metrics_op_names[o]);
			sb_label(b, t->name);
			sb_printf(b, "\"} %.9f\n", (double)t->sum_ns[o] / 1e9);
			snprintf(name, sizeof(name),
				 "kvtier_%s_duration_seconds_count",
				 kvti_metrics_op_names[o]);
			sample_t(b, name, t, "", t->cum[o][NB - 1]);
		}
	}
}

int kvtd_metrics_render_text(kvtd_metrics *m, char **out, size_t *len)
{
	struct sb b = { 0 };
	struct snap s;
	int err;

	*out = NULL;
	if ((err = kvti_metrics_snap_take(m, &s)))
		goto out;
	text_node(&b, &s);
	text_tiers(&b, &s);
	text_cache(&b, &s);
	{
		char *dp = NULL;

		if ((err = kvtd_dpath_text(&s.dp, &dp)))
			goto out;
		if (dp)
			sb_str(&b, dp);
		kvt_free(dp);
	}
	text_tenants(&b, &s);
	text_hists(&b, &s);
	err = b.err;
out:
	kvt_free(s.t);
	if (err) {
		kvt_free(b.p);
		return err;
	}
	*out = b.p;
	if (len)
		*len = b.len;
	return 0;
}


int kvtd_metrics_render_cb(void *arg, char **body, size_t *len)
{
	return kvtd_metrics_render_text(arg, body, len);
}
