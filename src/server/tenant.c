/*
 * tenant.c — the daemon's tenant table: who may act as which tenant, and
 * what each is in the cache.
 *
 *   --tenants "alice:1,uid=1001;bob:2,gid=2000,quota=dram:8G"
 *        |  kvti_tenants_parse()        d->ten[]: name, id, salt, the
 *        v                              uids and gids allowed, quotas
 *   d->ten[i] x TP rank r  --> the cache's tenant 1 + i * tp + r
 *                              (kvti_itenant(); salt ^ XXH3(r)),
 *                              its quota share (kvti_tenants_open())
 *
 * A peer (SO_PEERCRED at accept) may act as a tenant when its uid or gid
 * is on the tenant's list; root may act as any (kvti_tenant_resolve(), at
 * HELLO). The table is written once, at open, and only read after, by
 * every connection thread without a lock (a tenant's @evicted and @mt are
 * the metrics collect hook's; daemon_impl.h).
 */
#include "server/daemon_impl.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <xxhash.h>

static int parse_id(const char *s, const char *what, uint64_t max,
		    uint64_t *out)
{
	char *end;
	unsigned long long v;

	errno = 0;
	v = strtoull(s, &end, 0);
	if (errno || end == s || *end || v > max || s[0] == '-')
		return kvti_fail(KVT_ECONFIG, "daemon: tenants: bad %s '%s'",
				 what, s);
	*out = v;
	return 0;
}

/* "quota=TIER:SIZE" of a tenant entry. */
static int parse_quota(struct tenant *t, const char *v)
{
	const char *colon = strchr(v, ':');
	uint64_t bytes;
	int k;

	for (k = 0; colon && k < KVT_TIER_COUNT; k++) {
		const char *n = kvt_tier_kind_name((kvt_tier_kind)k);

		if (strlen(n) == (size_t)(colon - v) &&
		    !strncmp(n, v, (size_t)(colon - v)))
			break;
	}
	if (!colon || k == KVT_TIER_COUNT || k == KVT_TIER_HBM ||
	    kvt_size_parse(colon + 1, &bytes) || !bytes)
		return kvti_fail(KVT_ECONFIG, "daemon: tenant %s: quota '%s' "
				 "is not TIER:SIZE (fabric, dram or ssd; e.g. "
				 "dram:8G)", t->name, v);
	t->quota[k] = bytes;
	return 0;
}

/* "NAME:ID[,uid=U][,gid=G][,salt=S][,quota=TIER:SIZE][,clients=N]
 * [,mem=SIZE]" entries joined by ';'. A tenant without mem= may register
 * as much as the machine's memory. */
int kvti_tenants_parse(kvtd *d, const char *spec)
{
	char buf[4096], *save = NULL;
	int err = 0;

	if (!spec || !*spec) {
		struct tenant *t = &d->ten[d->nten++];

		snprintf(t->name, sizeof(t->name), "default");
		t->id = 0;
		t->uid[t->nuid++] = geteuid();
		t->salt = XXH3_64bits(t->name, strlen(t->name));
		return 0;
	}
	if (strlen(spec) >= sizeof(buf))
		return kvti_fail(KVT_ECONFIG, "daemon: tenants: spec too long");
	strcpy(buf, spec);
	for (char *e = strtok_r(buf, ";", &save); e && !err;
	     e = strtok_r(NULL, ";", &save)) {
		char *s2 = NULL, *colon = strchr(e, ':'), *f;
		struct tenant *t;
		int salted = 0;
		uint64_t v = 0;

		if (d->nten == MAX_TENANTS)
			return kvti_fail(KVT_ECONFIG, "daemon: more than %d "
					 "tenants", MAX_TENANTS);
		if (!colon || colon == e ||
		    (size_t)(colon - e) > KVTD_METRICS_NAME_MAX)
			return kvti_fail(KVT_ECONFIG, "daemon: tenants: '%s' is "
					 "not NAME:ID[,uid=U][,gid=G][,salt=S]",
					 e);
		t = &d->ten[d->nten];
		memset(t, 0, sizeof(*t));
		memcpy(t->name, e, (size_t)(colon - e));
		for (const char *p = t->name; *p; p++)
			if (*p <= ' ' || *p == '"' || *p == '\\' || *p > '~')
				return kvti_fail(KVT_ECONFIG, "daemon: tenant "
						 "name '%s': printable, no "
						 "spaces or quotes", t->name);
		f = strtok_r(colon + 1, ",", &s2);
		if (!f || (err = parse_id(f, "tenant id", UINT32_MAX, &v)))
			return err ? err : kvti_fail(KVT_ECONFIG, "daemon: "
						     "tenant %s has no id",
						     t->name);
		t->id = (uint32_t)v;
		for (f = strtok_r(NULL, ",", &s2); f && !err;
		     f = strtok_r(NULL, ",", &s2)) {
			if (!strncmp(f, "uid=", 4) && t->nuid < MAX_IDS) {
				err = parse_id(f + 4, "uid", UINT32_MAX - 1, &v);
				t->uid[t->nuid++] = (uid_t)v;
			} else if (!strncmp(f, "gid=", 4) && t->ngid < MAX_IDS) {
				err = parse_id(f + 4, "gid", UINT32_MAX - 1, &v);
				t->gid[t->ngid++] = (gid_t)v;
			} else if (!strcmp(f, "admin")) {
				t->admin = 1;
			} else if (!strncmp(f, "mem=", 4)) {
				if (kvt_size_parse(f + 4, &t->mem_max) ||
				    !t->mem_max)
					err = kvti_fail(KVT_ECONFIG, "daemon: "
							"tenant %s: mem= takes a "
							"size (e.g. 64G)",
							t->name);
			} else if (!strncmp(f, "clients=", 8)) {
				err = parse_id(f + 8, "clients", 65535, &v);
				t->max_clients = (uint32_t)v;
			} else if (!strncmp(f, "quota=", 6)) {
				err = parse_quota(t, f + 6);
			} else if (!strncmp(f, "rkey=", 5) && !t->rkey[0]) {
				if (!f[5] || strlen(f + 5) >= sizeof(t->rkey))
					err = kvti_fail(KVT_ECONFIG, "daemon: "
							"tenant %s: rkey= takes a "
							"key file's path (< %zu "
							"bytes)", t->name,
							sizeof(t->rkey));
				else
					kvti_strlcpy(t->rkey, f + 5,
						     sizeof(t->rkey));
			} else if (!strncmp(f, "salt=", 5)) {
				err = parse_id(f + 5, "salt", UINT64_MAX, &v);
				t->salt = v;
				salted = 1;
			} else {
				err = kvti_fail(KVT_ECONFIG, "daemon: tenant %s: "
						"unknown or repeated field '%s' "
						"(uid=, gid=, salt=, quota=, "
						"clients=, mem=, rkey=, admin; at "
						"most %d ids)", t->name, f,
						MAX_IDS);
			}
		}
		if (err)
			return err;
		if (!salted)
			t->salt = XXH3_64bits(t->name, strlen(t->name));
		for (int i = 0; i < d->nten; i++)
			if (d->ten[i].id == t->id ||
			    !strcmp(d->ten[i].name, t->name))
				return kvti_fail(KVT_ECONFIG, "daemon: tenant "
						 "%s:%u given twice", t->name,
						 t->id);
		d->nten++;
	}
	if (!d->nten)
		return kvti_fail(KVT_ECONFIG, "daemon: tenants: none given");
	return 0;
}

/* The peer's uid is on the list, or its primary gid or one of its
 * supplementary groups (as the kernel gave them at connect). */
static int tenant_allows(const struct tenant *t, const struct conn *c)
{
	if (c->cred.uid == 0)
		return 1;
	for (int i = 0; i < t->nuid; i++)
		if (t->uid[i] == c->cred.uid)
			return 1;
	for (int i = 0; i < t->ngid; i++) {
		if (t->gid[i] == c->cred.gid)
			return 1;
		for (int k = 0; k < c->ngroups; k++)
			if (t->gid[i] == c->groups[k])
				return 1;
	}
	return 0;
}

void kvti_peer_groups(struct conn *c)
{
	socklen_t len = sizeof(c->groups);

	c->ngroups = 0;
	/* more groups than MAX_GROUPS: ERANGE, and only the primary counts */
	if (!getsockopt(c->fd, SOL_SOCKET, SO_PEERGROUPS, c->groups, &len))
		c->ngroups = (int)(len / sizeof(gid_t));
}

int kvti_tenant_resolve(kvtd *d, const struct conn *c, int monitor,
			uint32_t id, int *out)
{
	const struct ucred *cr = &c->cred;
	int ti = -1;

	for (int i = 0; i < d->nten && ti < 0; i++)
		if (monitor ? tenant_allows(&d->ten[i], c) :
			      d->ten[i].id == id)
			ti = i;
	if (ti < 0 && monitor)
		return kvti_fail(-EACCES, "no tenant allows uid %u gid %u",
				 (unsigned)cr->uid, (unsigned)cr->gid);
	/* an unknown id and one not open to the peer look the same */
	if (ti < 0 || !tenant_allows(&d->ten[ti], c))
		return kvti_fail(-EACCES, "tenant %u is not open to uid %u gid "
				 "%u (or does not exist)", id,
				 (unsigned)cr->uid, (unsigned)cr->gid);
	*out = ti;
	return 0;
}

int kvti_tenants_open(kvtd *d)
{
	uint64_t phys = (uint64_t)sysconf(_SC_PHYS_PAGES) *
			(uint64_t)sysconf(_SC_PAGESIZE);
	int err = 0;

	for (int i = 0; i < d->nten; i++) {
		struct tenant *t = &d->ten[i];

		if (!t->mem_max) /* no engine shares more than the machine has */
			t->mem_max = phys;

		for (uint32_t r = 0; r < d->g->tp_size && !err; r++)
			err = kvt_cache_tenant_add(d->c, kvti_itenant(d, i, r),
						   t->salt ^ XXH3_64bits(&r,
						   sizeof(r)));
		/* rkey=: its remote values under a MAC key of its own */
		for (uint32_t r = 0; t->rkey[0] && r < d->g->tp_size && !err;
		     r++) {
			char why[256];

			err = kvt_cache_remote_tenant_key(d->c,
					kvti_itenant(d, i, r), t->rkey);
			if (!err)
				continue;
			kvti_strlcpy(why, err == KVT_ENOTFOUND ? "needs --remote" :
				     kvt_errdetail(), sizeof(why));
			err = kvti_fail(err == KVT_ENOTFOUND ? KVT_ECONFIG : err,
					"daemon: tenant %s: rkey=: %s", t->name,
					why);
		}
		/* a tenant's quota is split over its TP ranks (each its own
		 * tenant of the cache) */
		for (int k = 0; k < KVT_TIER_COUNT && !err; k++) {
			uint64_t pb = kvt_geom_page_bytes(d->g), tp = d->g->tp_size;
			uint64_t pages = (t->quota[k] / pb + tp - 1) / tp;

			if (!t->quota[k])
				continue;
			if (!kvt_cache_tier(d->c, (kvt_tier_kind)k)) {
				err = kvti_fail(KVT_ECONFIG, "daemon: tenant %s: "
						"a quota for the %s tier, which "
						"is not in --tiers", t->name,
						kvt_tier_kind_name(
							(kvt_tier_kind)k));
				break;
			}
			for (uint32_t r = 0; r < tp && !err; r++)
				err = kvt_cache_tenant_quota(d->c,
						kvti_itenant(d, i, r),
						(kvt_tier_kind)k,
						pages ? pages : 1);
		}
		if (!err)
			err = kvtd_metrics_tenant(d->m, t->id, t->name, &t->mt);
		if (err)
			return err;
	}
	return 0;
}

/* ---- admission -------------------------------------------------------- */

static int allowed_anywhere(const kvtd *d, const struct conn *c)
{
	for (int i = 0; i < d->nten; i++)
		if (tenant_allows(&d->ten[i], c))
			return 1;
	return 0;
}

/* A non-root uid's share of max_clients. */
static uint32_t uid_cap(const kvtd *d)
{
	uint32_t n = d->cfg.max_clients * UID_SHARE_NUM / UID_SHARE_DEN;

	return n ? n : 1;
}

int kvti_admit_accept(kvtd *d, const struct conn *c)
{
	uint32_t mine = 0, waiting = 0;

	if ((uint32_t)d->nconns >= d->cfg.max_clients)
		return kvti_fail(KVT_EBUSY, "%u clients already (max_clients)",
				 d->cfg.max_clients);
	/* a peer no tenant allows holds nothing, not even for hello_ms */
	if (!allowed_anywhere(d, c))
		return kvti_fail(-EACCES, "no tenant allows uid %u gid %u",
				 (unsigned)c->cred.uid, (unsigned)c->cred.gid);
	for (const struct conn *o = d->conns; o; o = o->next)
		if (o->cred.uid == c->cred.uid) {
			mine++;
			waiting += !o->hello;
		}
	if (waiting >= MAX_PREHELLO_PER_UID)
		return kvti_fail(KVT_EBUSY, "uid %u has %u connections that "
				 "have not said HELLO", (unsigned)c->cred.uid,
				 waiting);
	if (c->cred.uid != 0 && mine >= uid_cap(d))
		return kvti_fail(KVT_EBUSY, "uid %u holds %u connections, its "
				 "most (%u of max_clients %u)",
				 (unsigned)c->cred.uid, mine, uid_cap(d),
				 d->cfg.max_clients);
	return 0;
}

int kvti_admit_hello(kvtd *d, struct conn *c, int ti, int monitor)
{
	struct tenant *t = &d->ten[ti];
	uint32_t mon = 0, mon_uid = 0, of_t = 0;
	int err = 0;

	pthread_mutex_lock(&d->mu);
	for (const struct conn *o = d->conns; o; o = o->next) {
		if (o == c || !o->hello)
			continue;
		if (o->monitor) {
			mon++;
			mon_uid += o->cred.uid == c->cred.uid;
		}
		of_t += o->t == t;
	}
	if (monitor && (mon >= MAX_MONITORS ||
			(c->cred.uid != 0 && mon_uid >= MAX_MONITORS_PER_UID)))
		err = kvti_fail(KVT_EBUSY, "%u monitoring connections already "
				"(%u of uid %u; at most %d, %d a uid)", mon,
				mon_uid, (unsigned)c->cred.uid, MAX_MONITORS,
				MAX_MONITORS_PER_UID);
	else if (t->max_clients && of_t >= t->max_clients)
		err = kvti_fail(KVT_EBUSY, "tenant %s has %u connections, its "
				"most (clients=%u)", t->name, of_t,
				t->max_clients);
	if (!err) {
		c->monitor = monitor;
		c->t = t;
		c->hello = 1;
	}
	pthread_mutex_unlock(&d->mu);
	return err;
}

void kvti_refused_log(kvtd *d, const struct conn *c, const char *why)
{
	uint64_t now = kvt_now_ns(), skipped = 0;
	int log = 0;

	pthread_mutex_lock(&d->mu);
	if (now - d->refused_ns >= 1000000000ull) {
		log = 1;
		skipped = d->refused;
		d->refused = 0;
		d->refused_ns = now;
	} else {
		d->refused++;
	}
	pthread_mutex_unlock(&d->mu);
	if (log)
		kvti_warn("daemon: refused pid %d uid %u: %s (%llu more "
			  "refusals not logged in the last second)",
			  (int)c->cred.pid, (unsigned)c->cred.uid, why,
			  (unsigned long long)skipped);
}
