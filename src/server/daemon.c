/*
 * daemon.c — kvtierd: one process per node owns the fabric, dram and ssd
 * tiers (one kvt_cache) and serves every engine process over a Unix socket
 * (proto.h). Page data never crosses the socket: a client's KV memory is a
 * memfd it passes once (REGISTER), mapped here and attached to the cache
 * (kvt_cache_attach()), so the transfer engine copies between the tiers
 * and the client's blocks directly.
 *
 * THREADS
 *
 *   main      kvtd_run(): accept, check the peer's credentials, start a
 *             connection thread (at most max_clients).
 *   conn      one per client: blocking reads, one request, one reply. A
 *             connection owns its jobs, memories and job-slot page; it is
 *             the only thread that frees them (RELEASE, disconnect).
 *   reaper    every 50 ms: cancels jobs past their lease (d->mu, then
 *             each conn->mu).
 *   cache     the cache's own threads run the copies and call on_progress()
 *             which writes the job's slot, wakes futex waiters, and signals
 *             the client's eventfd when a job is done.
 *
 * LOCKS: d->mu (the connection list, counts) before conn->mu (the job
 * table); neither is held across a cache call that waits.
 *
 * TENANTS AND RANKS: each (tenant, TP rank) is its own tenant of the cache
 * (index id 1 + tenant# * tp + rank, with the tenant's salt mixed with the
 * rank): pages of different tenants or ranks never match, while one cache
 * and one set of tiers serves them all.
 *
 * A DEAD CLIENT: its socket reads end, the connection thread cancels and
 * frees its jobs (leases dropped; a store not committed is never served),
 * detaches and unmaps its memory, closes its fds. kill -9 of a client is
 * the same path.
 */
#include "server/server.h"
#include <kvtier/client.h>
#include "server/io.h"
#include "server/metrics.h"
#include "server/proto.h"
#include "core/core.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <linux/futex.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <unistd.h>
#include <xxhash.h>

#define MAX_JOBS 1024
#define MAX_MEMS 8
#define MAX_TENANTS 64
#define MAX_IDS 16

struct tenant {
	char name[KVTD_METRICS_NAME_MAX + 1];
	uint32_t id;
	uint64_t salt;
	uid_t uid[MAX_IDS];
	gid_t gid[MAX_IDS];
	int nuid, ngid;
	uint64_t quota[KVT_TIER_COUNT]; /* bytes per owned tier; 0: none */
	uint64_t evicted[KVT_TIER_COUNT]; /* collect(): evictions seen */
	kvtd_mtenant *mt;
};

struct conn;

struct job {
	struct conn *c;
	kvt_cache_job *cj;
	uint64_t pages;      /* the prefix it pins */
	uint32_t slot;
	int store;
	uint64_t t0, deadline;
	int expired;
};

struct cmem {
	uint32_t id;          /* 0: unused */
	kvt_cache_mem *m;
	void *map;
	size_t len;
};

struct conn {
	kvtd *d;
	int fd;
	struct ucred cred;
	int hello;
	int monitor;                 /* HELLO without geometry: STATS only */
	struct tenant *t;
	uint32_t rank, itenant, id;
	int slot_fd, efd;
	uint8_t *slots;
	pthread_mutex_t mu;          /* jobs[] */
	struct job *jobs[MAX_JOBS];
	int njobs;
	struct cmem mems[MAX_MEMS];
	uint32_t next_mem;
	kvt_cache_fetch *fetch;      /* a remote prefetch this client's lookup
					started, ended by its next LOAD */
	kvtd_buf in, out;
	struct conn *next;           /* d->mu */
};

struct kvtd {
	kvtd_config cfg;
	kvt_cache *c;
	const kvt_geom *g;
	char ns[KVTD_NS_MAX + 1];
	struct tenant ten[MAX_TENANTS];
	int nten;
	int lfd, stopfd;
	char path[sizeof(((struct sockaddr_un *)0)->sun_path)];
	kvtd_metrics *m;
	kvtd_http *http;

	pthread_mutex_t mu;
	pthread_cond_t cv;
	struct conn *conns;
	int nconns;
	int stopping;
	pthread_t reaper;
	int have_reaper;
	uint64_t registered; /* bytes */
	uint32_t next_id;
};

kvt_cache *kvtd_cache(kvtd *d)
{
	return d->c;
}

/* ---- configuration ------------------------------------------------------ */

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

/* "NAME:ID[,uid=U][,gid=G][,salt=S][,quota=TIER:SIZE]" entries joined by
 * ';'. */
static int tenants_parse(kvtd *d, const char *spec)
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
			} else if (!strncmp(f, "quota=", 6)) {
				err = parse_quota(t, f + 6);
			} else if (!strncmp(f, "salt=", 5)) {
				err = parse_id(f + 5, "salt", UINT64_MAX, &v);
				t->salt = v;
				salted = 1;
			} else {
				err = kvti_fail(KVT_ECONFIG, "daemon: tenant %s: "
						"unknown or repeated field '%s' "
						"(uid=, gid=, salt=, quota=; at "
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

static int tenant_allows(const struct tenant *t, const struct ucred *cr)
{
	if (cr->uid == 0)
		return 1;
	for (int i = 0; i < t->nuid; i++)
		if (t->uid[i] == cr->uid)
			return 1;
	for (int i = 0; i < t->ngid; i++)
		if (t->gid[i] == cr->gid)
			return 1;
	return 0;
}

static uint32_t itenant(const kvtd *d, int ti, uint32_t rank)
{
	return 1 + (uint32_t)ti * d->g->tp_size + rank;
}

/* ---- jobs ----------------------------------------------------------------- */

static _Atomic uint32_t *slot_word(struct conn *c, uint32_t s)
{
	return (_Atomic uint32_t *)(c->slots + (size_t)s * KVTD_SLOT_BYTES);
}

static void slot_put(struct conn *c, uint32_t s, int off, int32_t v)
{
	uint8_t *p = c->slots + (size_t)s * KVTD_SLOT_BYTES + off;
	__atomic_store_n((int32_t *)p, v, __ATOMIC_RELAXED);
}

static void futex_wake(_Atomic uint32_t *w)
{
	syscall(SYS_futex, w, FUTEX_WAKE, INT_MAX, NULL, NULL, 0);
}

/* The cache's threads, under the cache job's lock: publish progress. */
static void on_progress(void *arg, const kvt_cache_progress *p)
{
	struct job *j = arg;
	struct conn *c = j->c;
	uint32_t w = KVT_MIN(p->layers, KVTD_SLOT_LAYERS);

	if (p->failed) {
		slot_put(c, j->slot, 8, p->failed);
		w |= KVTD_SLOT_FAILED;
	}
	if (p->done) {
		slot_put(c, j->slot, 4, p->result);
		w |= KVTD_SLOT_DONE;
		kvtd_metrics_observe(c->d->m, c->t->mt, j->store ?
				     KVTD_OP_STORE : KVTD_OP_LOAD,
				     kvt_now_ns() - j->t0);
	}
	atomic_store_explicit(slot_word(c, j->slot), w, memory_order_release);
	futex_wake(slot_word(c, j->slot));
	if (p->done) {
		uint64_t one = 1;
		if (write(c->efd, &one, sizeof(one)) < 0) {
			/* the counter cannot overflow in practice */
		}
	}
}

/* conn->mu not held; the conn thread only. */
static void job_free(struct conn *c, uint32_t s)
{
	struct job *j;

	pthread_mutex_lock(&c->mu);
	j = c->jobs[s];
	c->jobs[s] = NULL;
	if (j)
		c->njobs--;
	pthread_mutex_unlock(&c->mu);
	if (!j)
		return;
	if (kvt_cache_job_poll(j->cj) == -EINPROGRESS)
		kvtd_metrics_lease_expiry(c->d->m, c->t->mt,
					  KVTD_LEASE_DISCONNECT, 1);
	kvt_cache_job_free(j->cj); /* cancels and waits if still running */
	kvt_free(j);
}

static void *reaper_main(void *arg)
{
	kvtd *d = arg;

	pthread_mutex_lock(&d->mu);
	while (!d->stopping) {
		struct timespec ts;
		uint64_t now = kvt_now_ns(), jobs = 0, pinned = 0;

		for (struct conn *c = d->conns; c; c = c->next) {
			pthread_mutex_lock(&c->mu);
			for (int s = 0; s < MAX_JOBS; s++) {
				struct job *j = c->jobs[s];

				if (!j)
					continue;
				if (kvt_cache_job_poll(j->cj) != -EINPROGRESS)
					continue;
				jobs++;
				pinned += j->pages;
				if (j->expired || now < j->deadline)
					continue;
				j->expired = 1;
				kvt_cache_job_cancel(j->cj);
				kvtd_metrics_lease_expiry(d->m, c->t->mt,
							  KVTD_LEASE_DEADLINE,
							  1);
				/* counted; one line per job only at info
				 * (a slow disk must not flood the log) */
				kvti_info("daemon: client pid %d: job in slot %d "
					  "ran past its lease (%u ms): "
					  "cancelled", (int)c->cred.pid, s,
					  d->cfg.lease_ms);
			}
			pthread_mutex_unlock(&c->mu);
		}
		/* every job in flight holds one lease over its prefix */
		kvtd_metrics_gauge_set(d->m, KVTD_G_JOBS, jobs);
		kvtd_metrics_gauge_set(d->m, KVTD_G_LEASES, jobs);
		kvtd_metrics_gauge_set(d->m, KVTD_G_PINNED_PAGES, pinned);
		kvti_deadline(&ts, 50 * 1000 * 1000);
		pthread_cond_timedwait(&d->cv, &d->mu, &ts);
	}
	pthread_mutex_unlock(&d->mu);
	return NULL;
}

/* ---- replies -------------------------------------------------------------- */

static void reply_begin(struct conn *c, const kvtd_hdr *h, int status)
{
	const char *det = status ? kvt_errdetail() : "";
	size_t n = KVT_MIN(strlen(det), (size_t)255);

	kvtd_begin(&c->out, (uint16_t)(h->op | KVTD_REPLY), h->seq);
	kvtd_put_u32(&c->out, (uint32_t)status);
	kvtd_put_u16(&c->out, (uint16_t)n);
	kvtd_put_bytes(&c->out, det, n);
}

static int reply_send(struct conn *c, const int *fds, int nfds)
{
	int err = kvtd_end(&c->out);

	if (err)
		return err;
	return kvtd_send(c->fd, c->out.p, c->out.len, fds, nfds);
}

static int reply_status(struct conn *c, const kvtd_hdr *h, int status)
{
	reply_begin(c, h, status);
	return reply_send(c, NULL, 0);
}

/* ---- requests ------------------------------------------------------------- */

static int perr(struct conn *c, enum kvtd_proto_err why, int err)
{
	kvtd_metrics_protocol_error(c->d->m, c->t ? c->t->mt : NULL, why);
	return err;
}

static int do_hello(struct conn *c, const kvtd_req *q)
{
	kvtd *d = c->d;
	const kvt_geom *g = d->g;
	int ti = -1, monitor;

	if (c->hello)
		return perr(c, KVTD_PERR_ORDER, kvti_fail(KVT_EPROTO,
			    "HELLO twice"));
	/* every geometry field 0: a monitor (kvtier stat), STATS only */
	monitor = !q->u.hello.layers && !q->u.hello.kv_heads_total &&
		  !q->u.hello.kv_heads && !q->u.hello.head_dim &&
		  !q->u.hello.dtype_bytes && !q->u.hello.page_tokens &&
		  !q->u.hello.tp_size && !q->u.hello.tp_rank &&
		  !q->u.hello.mla;
	if (strcmp(q->u.hello.ns, d->ns))
		return perr(c, KVTD_PERR_GEOMETRY, kvti_fail(KVT_ENOTFOUND,
			    "namespace '%s' is not served here (this daemon "
			    "serves '%s')", q->u.hello.ns, d->ns));
	for (int i = 0; i < d->nten && ti < 0; i++)
		if (monitor ? tenant_allows(&d->ten[i], &c->cred) :
			      d->ten[i].id == q->u.hello.tenant)
			ti = i;
	if (ti < 0 && monitor)
		return perr(c, KVTD_PERR_AUTH, kvti_fail(-EACCES,
			    "no tenant allows uid %u gid %u",
			    (unsigned)c->cred.uid, (unsigned)c->cred.gid));
	if (ti < 0)
		return perr(c, KVTD_PERR_AUTH, kvti_fail(KVT_ENOTFOUND,
			    "no tenant %u here", q->u.hello.tenant));
	if (!tenant_allows(&d->ten[ti], &c->cred))
		return perr(c, KVTD_PERR_AUTH, kvti_fail(-EACCES,
			    "tenant %s does not allow uid %u gid %u",
			    d->ten[ti].name, (unsigned)c->cred.uid,
			    (unsigned)c->cred.gid));
	if (!monitor &&
	    (q->u.hello.layers != g->layers ||
	     q->u.hello.kv_heads_total != g->kv_heads_total ||
	     q->u.hello.kv_heads != g->kv_heads ||
	     q->u.hello.head_dim != g->head_dim ||
	     q->u.hello.dtype_bytes != g->dtype_bytes ||
	     q->u.hello.page_tokens != g->page_tokens ||
	     q->u.hello.tp_size != g->tp_size || q->u.hello.mla != g->mla ||
	     q->u.hello.tp_rank >= g->tp_size))
		return perr(c, KVTD_PERR_GEOMETRY, kvti_fail(KVT_EGEOM,
			    "geometry L%u H%u/%u D%u s%u P%u tp%u/%u mla%u "
			    "differs from namespace %s: L%u H%u/%u D%u s%u "
			    "P%u tp%u mla%u", q->u.hello.layers,
			    q->u.hello.kv_heads, q->u.hello.kv_heads_total,
			    q->u.hello.head_dim, q->u.hello.dtype_bytes,
			    q->u.hello.page_tokens, q->u.hello.tp_rank,
			    q->u.hello.tp_size, q->u.hello.mla, d->ns,
			    g->layers, g->kv_heads, g->kv_heads_total,
			    g->head_dim, g->dtype_bytes, g->page_tokens,
			    g->tp_size, g->mla));
	c->monitor = monitor;
	c->t = &d->ten[ti];
	c->rank = q->u.hello.tp_rank;
	c->itenant = itenant(d, ti, c->rank);
	return 0;
}

/* The HELLO reply: the job-slot page and the done eventfd. */
static int hello_reply(struct conn *c, const kvtd_hdr *h)
{
	size_t len = (size_t)MAX_JOBS * KVTD_SLOT_BYTES;
	char path[64];
	int fds[2], ro = -1, err;

	c->slot_fd = memfd_create("kvtierd-slots", MFD_CLOEXEC);
	if (c->slot_fd < 0 || ftruncate(c->slot_fd, (off_t)len))
		return kvti_fail(-errno, "HELLO: job slots: %s",
				 strerror(errno));
	c->slots = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED,
			c->slot_fd, 0);
	if (c->slots == MAP_FAILED) {
		c->slots = NULL;
		return kvti_fail(-errno, "HELLO: job slots: %s",
				 strerror(errno));
	}
	c->efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
	if (c->efd < 0)
		return kvti_fail(-errno, "HELLO: eventfd: %s", strerror(errno));
	/* the client gets a read-only descriptor of the slots */
	snprintf(path, sizeof(path), "/proc/self/fd/%d", c->slot_fd);
	ro = open(path, O_RDONLY | O_CLOEXEC);
	reply_begin(c, h, 0);
	kvtd_put_u32(&c->out, c->id);
	kvtd_put_u32(&c->out, MAX_JOBS);
	kvtd_put_u32(&c->out, KVTD_SLOT_BYTES);
	kvtd_put_u32(&c->out, c->d->cfg.lease_ms);
	kvtd_put_u64(&c->out, kvt_geom_page_bytes(c->d->g));
	fds[0] = ro >= 0 ? ro : c->slot_fd;
	fds[1] = c->efd;
	err = reply_send(c, fds, 2);
	if (ro >= 0)
		close(ro);
	if (!err)
		c->hello = 1;
	return err;
}

static int do_register(struct conn *c, const kvtd_req *q, int fd,
		       uint32_t *id)
{
	const kvt_geom *g = c->d->g;
	uint64_t hs = q->u.reg.head_stride;
	uint32_t L = q->u.reg.nlayers;
	void *base[KVTD_MAX_LAYERS];
	struct cmem *cm = NULL;
	kvt_layout lay;
	struct stat st;
	int seals, err;

	if (q->u.reg.device >= 0)
		return kvti_fail(KVT_ENOTBUILT, "REGISTER: GPU memory (CUDA "
				 "IPC handles) is not implemented yet; register "
				 "host memory");
	for (int i = 0; i < MAX_MEMS; i++)
		if (!c->mems[i].id) {
			cm = &c->mems[i];
			break;
		}
	if (!cm)
		return kvti_fail(KVT_EFULL, "REGISTER: %d memories already",
				 MAX_MEMS);
	if (fstat(fd, &st))
		return kvti_fail(-errno, "REGISTER: fstat: %s", strerror(errno));
	seals = fcntl(fd, F_GET_SEALS);
	if (!S_ISREG(st.st_mode) || seals < 0 || !(seals & F_SEAL_SHRINK))
		return kvti_fail(-EINVAL, "REGISTER: the fd must be a memfd "
				 "sealed with F_SEAL_SHRINK (it could shrink "
				 "under the daemon)");
	if (L != g->layers)
		return kvti_fail(KVT_EGEOM, "REGISTER: %u layers, the namespace "
				 "has %u", L, g->layers);
	if (!q->u.reg.nblocks || q->u.reg.nblocks > KVT_POOL_MAX_SLOTS)
		return kvti_fail(-EINVAL, "REGISTER: %llu blocks",
				 (unsigned long long)q->u.reg.nblocks);
	if (!hs) /* REGISTER: packed rows */
		hs = (uint64_t)g->head_dim * g->dtype_bytes;
	/* the layout's own checks (rows, overlaps, overflow), and its span:
	 * from a layer's base to the end of its last row */
	if ((err = kvt_layout_init_rows(&lay, g, q->u.reg.nblocks,
					q->u.reg.block_stride,
					q->u.reg.kv_stride,
					q->u.reg.token_stride, hs)))
		return err;
	for (uint32_t l = 0; l < L; l++) {
		uint64_t off = kvtd_u64_at(q->u.reg.layer_off, l), end;

		if (off > UINT64_MAX / 4 || lay.buf_bytes > UINT64_MAX / 4)
			return kvti_fail(-EINVAL, "REGISTER: layer %u: strides "
					 "out of range", l);
		end = off + lay.buf_bytes;
		if (end > (uint64_t)st.st_size)
			return kvti_fail(-EINVAL, "REGISTER: layer %u ends at "
					 "byte %llu, the memfd has %lld", l,
					 (unsigned long long)end,
					 (long long)st.st_size);
	}
	cm->len = (size_t)st.st_size;
	cm->map = mmap(NULL, cm->len, PROT_READ | PROT_WRITE, MAP_SHARED, fd,
		       0);
	if (cm->map == MAP_FAILED) {
		cm->map = NULL;
		return kvti_fail(-errno, "REGISTER: mmap: %s", strerror(errno));
	}
	for (uint32_t l = 0; l < L; l++)
		base[l] = (uint8_t *)cm->map + kvtd_u64_at(q->u.reg.layer_off, l);
	err = kvt_cache_attach_rows(c->d->c, base, L, q->u.reg.nblocks,
				    q->u.reg.block_stride, q->u.reg.kv_stride,
				    q->u.reg.token_stride, hs, -1, &cm->m);
	if (err) {
		munmap(cm->map, cm->len);
		cm->map = NULL;
		return err;
	}
	cm->id = ++c->next_mem;
	*id = cm->id;
	pthread_mutex_lock(&c->d->mu);
	c->d->registered += cm->len;
	kvtd_metrics_gauge_set(c->d->m, KVTD_G_REGISTERED_BYTES,
			       c->d->registered);
	pthread_mutex_unlock(&c->d->mu);
	return 0;
}

static void mem_drop(struct conn *c, struct cmem *cm)
{
	kvt_cache_detach(cm->m);
	munmap(cm->map, cm->len);
	pthread_mutex_lock(&c->d->mu);
	c->d->registered -= cm->len;
	kvtd_metrics_gauge_set(c->d->m, KVTD_G_REGISTERED_BYTES,
			       c->d->registered);
	pthread_mutex_unlock(&c->d->mu);
	memset(cm, 0, sizeof(*cm));
}

static struct cmem *mem_find(struct conn *c, uint32_t id)
{
	for (int i = 0; i < MAX_MEMS; i++)
		if (id && c->mems[i].id == id)
			return &c->mems[i];
	return NULL;
}

static kvt_page_key *keys_copy(const uint8_t *p, uint32_t n)
{
	kvt_page_key *k = kvt_malloc((n ? n : 1) * sizeof(*k));

	if (k)
		for (uint32_t i = 0; i < n; i++)
			k[i] = kvtd_key_at(p, i);
	return k;
}

/* The fastest owned tier (where stores and prefetches land). */
static int top_tier(kvtd *d)
{
	for (int k = KVT_TIER_FABRIC; k < KVT_TIER_REMOTE; k++)
		if (kvt_cache_tier(d->c, (kvt_tier_kind)k))
			return k;
	return KVT_TIER_DRAM;
}

/* End this client's prefetch: @cut 1 keeps what arrived and stops. */
static void fetch_end(struct conn *c, int cut)
{
	uint64_t pages = 0;

	if (!c->fetch)
		return;
	kvt_cache_prefetch_end(c->fetch, cut, &pages);
	c->fetch = NULL;
	if (pages) /* remote -> the top owned tier */
		kvtd_metrics_bytes(c->d->m, c->t->mt, KVTD_END_REMOTE,
				   (enum kvtd_end)top_tier(c->d), pages *
				   kvt_geom_page_bytes(c->d->g));
}

static void fetch_start(struct conn *c, const kvt_page_key *keys,
			size_t nkeys, size_t first)
{
	fetch_end(c, 1); /* one at a time per client */
	if (kvt_cache_prefetch_start(c->d->c, c->itenant, keys, nkeys, first,
				     &c->fetch))
		c->fetch = NULL; /* a miss: the engine computes them */
}

/* LOAD / STORE (each: LOAD_EACH / STORE_EACH, KVT_CACHE_IO_EACH) */
static int do_job(struct conn *c, const kvtd_req *q, int store, int each)
{
	kvtd *d = c->d;
	uint32_t s = q->u.job.slot, n = q->u.job.nkeys - q->u.job.first;
	kvt_cache_io io = KVT_CACHE_IO_INIT;
	struct cmem *cm = mem_find(c, q->u.job.mem_id);
	kvt_page_key *keys = NULL;
	uint32_t *blocks = NULL;
	struct job *j = NULL;
	int err;

	if (!cm)
		return perr(c, KVTD_PERR_NOT_OWNER, kvti_fail(KVT_ENOTFOUND,
			    "%s: no memory %u registered by this client",
			    store ? "STORE" : "LOAD", q->u.job.mem_id));
	if (s >= MAX_JOBS)
		return perr(c, KVTD_PERR_NOT_OWNER, kvti_fail(-EINVAL,
			    "%s: job slot %u (0..%u)", store ? "STORE" :
			    "LOAD", s, MAX_JOBS - 1));
	if (c->jobs[s])
		return perr(c, KVTD_PERR_ORDER, kvti_fail(KVT_EBUSY,
			    "%s: job slot %u is in use (RELEASE it first)",
			    store ? "STORE" : "LOAD", s));
	/* the request is scheduled: whatever the prefetch brought is used */
	fetch_end(c, 1);
	keys = keys_copy(q->u.job.keys, q->u.job.nkeys);
	blocks = kvt_malloc((n ? n : 1) * sizeof(*blocks));
	j = kvt_calloc(1, sizeof(*j));
	if (!keys || !blocks || !j) {
		err = -ENOMEM;
		goto out;
	}
	for (uint32_t i = 0; i < n; i++)
		blocks[i] = kvtd_u32_at(q->u.job.blocks, i);
	j->c = c;
	j->slot = s;
	j->pages = q->u.job.nkeys;
	j->store = store;
	j->t0 = kvt_now_ns();
	j->deadline = j->t0 + (uint64_t)d->cfg.lease_ms * 1000000ull;
	/* a fresh slot: generation up, nothing ready */
	slot_put(c, s, 12, (int32_t)(kvtd_u32_at(c->slots, s * 4 + 3) + 1));
	slot_put(c, s, 4, 0);
	slot_put(c, s, 8, 0);
	atomic_store_explicit(slot_word(c, s), 0, memory_order_release);
	io.mem = cm->m;
	io.progress = on_progress;
	io.arg = j;
	io.flags = each ? KVT_CACHE_IO_EACH : 0;
	err = store ? kvt_cache_store_ex(d->c, c->itenant, keys,
					 q->u.job.nkeys, q->u.job.first,
					 blocks, &io, &j->cj)
		    : kvt_cache_load_ex(d->c, c->itenant, keys, q->u.job.nkeys,
					q->u.job.first, blocks, &io, &j->cj);
	if (!err) { /* the reaper sees it from now on */
		pthread_mutex_lock(&c->mu);
		c->jobs[s] = j;
		c->njobs++;
		pthread_mutex_unlock(&c->mu);
		j = NULL;
	}
out:
	kvt_free(keys);
	kvt_free(blocks);
	kvt_free(j);
	return err;
}

static int do_release(struct conn *c, const kvtd_hdr *h, uint32_t s)
{
	kvt_cache_job_stat st;
	struct job *j = s < MAX_JOBS ? c->jobs[s] : NULL;
	uint32_t *failed = NULL;
	long nf;
	int res;

	if (!j)
		return reply_status(c, h, perr(c, KVTD_PERR_NOT_OWNER,
				    kvti_fail(KVT_ENOTFOUND, "RELEASE: no job "
					      "in slot %u", s)));
	res = kvt_cache_job_poll(j->cj);
	if (res == -EINPROGRESS)
		return reply_status(c, h, kvti_fail(KVT_EBUSY, "RELEASE: job "
				    "in slot %u is not done (CANCEL it, wait, "
				    "then RELEASE)", s));
	kvt_cache_job_stat_get(j->cj, &st);
	nf = kvt_cache_job_failed(j->cj, NULL, 0);
	if (nf > 0 && !(failed = kvt_malloc((size_t)nf * sizeof(*failed))))
		return reply_status(c, h, -ENOMEM);
	if (nf > 0)
		kvt_cache_job_failed(j->cj, failed, (size_t)nf);
	/* metrics: what the load read, what it could not */
	if (!j->store) {
		for (int t = 0; t < KVT_TIER_COUNT; t++)
			if (st.from[t])
				kvtd_metrics_bytes(c->d->m, c->t->mt,
						   (enum kvtd_end)t,
						   KVTD_END_ENGINE,
						   st.from[t] *
						   kvt_geom_page_bytes(c->d->g));
		/* copies there but not readable right, by tier (absent or
		 * busy blocks were misses, counted at lookup) */
		uint64_t rf[KVT_TIER_COUNT];

		if (st.failed && !kvt_cache_job_read_failures(j->cj, rf))
			for (int t = 0; t < KVT_TIER_COUNT; t++) {
				if (!rf[t])
					continue;
				kvtd_metrics_read_failure(c->d->m, c->t->mt,
							  (kvt_tier_kind)t,
							  rf[t]);
				if (res == KVT_ECORRUPT)
					kvtd_metrics_checksum_failure(c->d->m,
						c->t->mt, (kvt_tier_kind)t,
						rf[t]);
			}
	} else if (st.bytes) {
		kvtd_metrics_bytes(c->d->m, c->t->mt, KVTD_END_ENGINE,
				   (enum kvtd_end)top_tier(c->d), st.bytes);
	}
	reply_begin(c, h, 0);
	kvtd_put_u32(&c->out, (uint32_t)res);
	kvtd_put_u64(&c->out, st.pages);
	kvtd_put_u64(&c->out, st.copied);
	kvtd_put_u64(&c->out, st.skipped);
	kvtd_put_u64(&c->out, st.failed);
	kvtd_put_u64(&c->out, st.verified);
	kvtd_put_u64(&c->out, st.bytes);
	kvtd_put_u32(&c->out, KVT_TIER_COUNT);
	for (int t = 0; t < KVT_TIER_COUNT; t++)
		kvtd_put_u64(&c->out, st.from[t]);
	kvtd_put_f64(&c->out, st.wait_s);
	kvtd_put_f64(&c->out, st.layer0_s);
	kvtd_put_f64(&c->out, st.total_s);
	kvtd_put_u32(&c->out, (uint32_t)(nf > 0 ? nf : 0));
	for (long i = 0; i < nf; i++)
		kvtd_put_u32(&c->out, failed[i]);
	kvt_free(failed);
	job_free(c, s);
	return reply_send(c, NULL, 0);
}

/* One request. A nonzero return closes the connection. */
static int serve_one(struct conn *c, const kvtd_hdr *h, int fd)
{
	kvtd *d = c->d;
	kvtd_req q;
	uint64_t t0 = kvt_now_ns();
	int err;

	kvti_errclear();
	err = kvtd_req_decode(c->in.p, c->in.len, &q);
	if (err)
		return perr(c, KVTD_PERR_MALFORMED, reply_status(c, h, err));
	if (q.h.op != KVTD_MSG_HELLO && !c->hello)
		return reply_status(c, h, perr(c, KVTD_PERR_ORDER,
				    kvti_fail(KVT_EPROTO, "%s before HELLO",
					      kvtd_msg_name(q.h.op))));
	if (c->monitor && q.h.op != KVTD_MSG_STATS)
		return reply_status(c, h, perr(c, KVTD_PERR_ORDER,
				    kvti_fail(KVT_EPROTO, "%s on a monitoring "
					      "connection (HELLO without "
					      "geometry: STATS only)",
					      kvtd_msg_name(q.h.op))));
	switch (q.h.op) {
	case KVTD_MSG_HELLO:
		if ((err = do_hello(c, &q)))
			return reply_status(c, h, err);
		if ((err = hello_reply(c, h)))
			return err;
		kvti_info("daemon: client pid %d uid %u: tenant %s rank %u",
			  (int)c->cred.pid, (unsigned)c->cred.uid, c->t->name,
			  c->rank);
		return 0;
	case KVTD_MSG_REGISTER:
	case KVTD_MSG_REGISTER_ROWS: {
		uint32_t id = 0;

		if (fd < 0)
			return reply_status(c, h, perr(c, KVTD_PERR_MALFORMED,
					    kvti_fail(KVT_EPROTO, "REGISTER "
						      "without a memfd")));
		err = do_register(c, &q, fd, &id);
		if (err)
			return reply_status(c, h, err);
		reply_begin(c, h, 0);
		kvtd_put_u32(&c->out, id);
		return reply_send(c, NULL, 0);
	}
	case KVTD_MSG_UNREGISTER: {
		struct cmem *cm = mem_find(c, q.u.id);

		if (!cm)
			return reply_status(c, h, perr(c, KVTD_PERR_NOT_OWNER,
					    kvti_fail(KVT_ENOTFOUND,
						      "UNREGISTER: no memory "
						      "%u", q.u.id)));
		mem_drop(c, cm);
		return reply_status(c, h, 0);
	}
	case KVTD_MSG_HASH: {
		uint32_t n = q.u.hash.ntokens, *tok;
		size_t nk = n / d->g->page_tokens;
		kvt_page_key *keys;

		tok = kvt_malloc((n ? n : 1) * sizeof(*tok));
		keys = kvt_malloc((nk ? nk : 1) * sizeof(*keys));
		if (!tok || !keys) {
			kvt_free(tok);
			kvt_free(keys);
			return reply_status(c, h, -ENOMEM);
		}
		for (uint32_t i = 0; i < n; i++)
			tok[i] = kvtd_u32_at(q.u.hash.tokens, i);
		err = kvt_cache_hash_tokens(d->c, c->itenant, tok, n, keys);
		reply_begin(c, h, err);
		if (!err) {
			kvtd_put_u32(&c->out, (uint32_t)nk);
			kvtd_put_keys(&c->out, keys, nk);
		}
		kvt_free(tok);
		kvt_free(keys);
		return reply_send(c, NULL, 0);
	}
	case KVTD_MSG_LOOKUP: {
		kvt_page_key *keys = keys_copy(q.u.lookup.keys,
					       q.u.lookup.nkeys);
		kvt_cache_lookup_result r;

		if (!keys)
			return reply_status(c, h, -ENOMEM);
		err = kvt_cache_lookup(d->c, c->itenant, keys,
				       q.u.lookup.nkeys,
				       q.u.lookup.flags & (KVT_LOOKUP_TOUCH |
							   KVT_LOOKUP_EACH), &r);
		/* a remote run after the local one: bring it in while the
		 * request waits to be scheduled (its LOAD cuts it off) */
		if (!err && r.tier_pages[KVT_TIER_REMOTE] && !r.inflight)
			fetch_start(c, keys, r.pages +
				    r.tier_pages[KVT_TIER_REMOTE], r.pages);
		kvt_free(keys);
		reply_begin(c, h, err);
		if (!err) {
			kvtd_put_u64(&c->out, r.pages);
			kvtd_put_u32(&c->out, KVT_TIER_COUNT);
			for (int t = 0; t < KVT_TIER_COUNT; t++) {
				kvtd_put_u64(&c->out, r.tier_pages[t]);
				if (r.tier_pages[t])
					kvtd_metrics_hit(d->m, c->t->mt,
							 (kvt_tier_kind)t,
							 r.tier_pages[t]);
			}
			kvtd_put_u64(&c->out, r.inflight);
			if (q.u.lookup.nkeys > r.pages)
				kvtd_metrics_miss(d->m, c->t->mt,
						  q.u.lookup.nkeys - r.pages);
		}
		err = reply_send(c, NULL, 0);
		kvtd_metrics_observe(d->m, c->t->mt, KVTD_OP_LOOKUP,
				     kvt_now_ns() - t0);
		return err;
	}
	case KVTD_MSG_LOAD:
	case KVTD_MSG_STORE:
	case KVTD_MSG_LOAD_EACH:
	case KVTD_MSG_STORE_EACH:
		return reply_status(c, h, do_job(c, &q,
			q.h.op == KVTD_MSG_STORE || q.h.op == KVTD_MSG_STORE_EACH,
			q.h.op >= KVTD_MSG_LOAD_EACH));
	case KVTD_MSG_CANCEL: {
		struct job *j = q.u.id < MAX_JOBS ? c->jobs[q.u.id] : NULL;

		if (!j)
			return reply_status(c, h, perr(c, KVTD_PERR_NOT_OWNER,
					    kvti_fail(KVT_ENOTFOUND, "CANCEL: no "
						      "job in slot %u",
						      q.u.id)));
		err = kvt_cache_job_cancel(j->cj);
		return reply_status(c, h, err == -EALREADY ? 0 : err);
	}
	case KVTD_MSG_RELEASE:
		return do_release(c, h, q.u.id);
	case KVTD_MSG_QUIESCE:
		kvt_cache_quiesce(d->c);
		return reply_status(c, h, 0);
	case KVTD_MSG_STATS: {
		char *json = NULL;
		size_t len = 0;

		err = kvtd_metrics_render_json(d->m, &json, &len);
		reply_begin(c, h, err);
		if (!err) {
			kvtd_put_u32(&c->out, (uint32_t)len);
			kvtd_put_bytes(&c->out, json, len);
		}
		kvt_free(json);
		return reply_send(c, NULL, 0);
	}
	}
	return reply_status(c, h, kvti_fail(KVT_EPROTO, "op %u", q.h.op));
}

static void conn_free(struct conn *c)
{
	kvtd *d = c->d;

	pthread_mutex_lock(&d->mu);
	for (struct conn **p = &d->conns; *p; p = &(*p)->next)
		if (*p == c) {
			*p = c->next;
			break;
		}
	pthread_mutex_unlock(&d->mu);
	fetch_end(c, 1);
	for (uint32_t s = 0; s < MAX_JOBS; s++)
		job_free(c, s);
	for (int i = 0; i < MAX_MEMS; i++)
		if (c->mems[i].id)
			mem_drop(c, &c->mems[i]);
	if (c->slots)
		munmap(c->slots, (size_t)MAX_JOBS * KVTD_SLOT_BYTES);
	if (c->slot_fd >= 0)
		close(c->slot_fd);
	if (c->efd >= 0)
		close(c->efd);
	close(c->fd);
	kvtd_buf_free(&c->in);
	kvtd_buf_free(&c->out);
	pthread_mutex_destroy(&c->mu);
	kvt_free(c);
	pthread_mutex_lock(&d->mu);
	d->nconns--;
	kvtd_metrics_gauge_set(d->m, KVTD_G_CLIENTS, (uint64_t)d->nconns);
	pthread_cond_broadcast(&d->cv);
	pthread_mutex_unlock(&d->mu);
}

static enum kvtd_proto_err hdr_reason(void)
{
	const char *d = kvt_errdetail();

	if (strstr(d, "version"))
		return KVTD_PERR_VERSION;
	if (strstr(d, "unknown op"))
		return KVTD_PERR_UNKNOWN_OP;
	if (strstr(d, "limit"))
		return KVTD_PERR_OVERSIZED;
	return KVTD_PERR_MALFORMED;
}

static void *conn_main(void *arg)
{
	struct conn *c = arg;
	kvtd *d = c->d;

	kvtd_set_timeout(c->fd, d->cfg.hello_ms);
	for (;;) {
		int fds[KVTD_MAX_FDS], nfds = 0, err;
		kvtd_hdr h;

		kvti_errclear();
		err = kvtd_recv(c->fd, &c->in, &h, fds, &nfds, 0);
		if (err == 1)
			break; /* the client closed */
		if (err == KVT_EPROTO) {
			/* no way to find the next message: answer, close */
			perr(c, hdr_reason(), 0);
			h.op = 0; /* op 0: the header was not understood */
			reply_status(c, &h, err);
			for (int i = 0; i < nfds; i++)
				close(fds[i]);
			break;
		}
		if (err) {
			perr(c, err == -ETIMEDOUT && !c->hello ?
			     KVTD_PERR_IDLE : KVTD_PERR_TRUNCATED, 0);
			if (err == -ETIMEDOUT && !c->hello)
				kvti_info("daemon: client pid %d sent no HELLO "
					  "in %u ms: closed", (int)c->cred.pid,
					  d->cfg.hello_ms);
			for (int i = 0; i < nfds; i++)
				close(fds[i]);
			break;
		}
		if (nfds < 0 || nfds != kvtd_msg_fds(h.op)) {
			for (int i = 0; i < nfds; i++)
				close(fds[i]);
			perr(c, KVTD_PERR_MALFORMED, 0);
			err = reply_status(c, &h, kvti_fail(KVT_EPROTO,
					   "%s with %d descriptors (takes %d)",
					   kvtd_msg_name(h.op), nfds,
					   kvtd_msg_fds(h.op)));
			if (err)
				break;
			continue;
		}
		err = serve_one(c, &h, nfds ? fds[0] : -1);
		for (int i = 0; i < nfds; i++)
			close(fds[i]);
		if (err)
			break;
		if (c->hello)
			kvtd_set_timeout(c->fd, 0); /* engines may idle */
	}
	conn_free(c);
	return NULL;
}

/* ---- open, run, close -------------------------------------------------------- */

/* Before each metrics render: what each tenant holds per tier (all its
 * ranks), and its quota there. */
static void collect(kvtd_metrics *m, void *arg)
{
	kvtd *d = arg;

	for (int i = 0; i < d->nten; i++) {
		uint64_t used[KVT_TIER_COUNT] = { 0 }, quota[KVT_TIER_COUNT] = { 0 };
		uint64_t ev[KVT_TIER_COUNT] = { 0 };
		struct tenant *t = &d->ten[i];

		for (uint32_t r = 0; r < d->g->tp_size; r++) {
			kvt_tenant_usage u;

			if (kvt_cache_tenant_usage(d->c, itenant(d, i, r), &u))
				continue;
			for (int k = 0; k < KVT_TIER_COUNT; k++) {
				used[k] += u.pages[k];
				quota[k] += u.quota[k];
				ev[k] += u.evicted[k];
			}
		}
		for (int k = 0; k < KVT_TIER_COUNT; k++) {
			if (!kvt_cache_tier(d->c, (kvt_tier_kind)k))
				continue;
			kvtd_metrics_tenant_pages(m, t->mt, (kvt_tier_kind)k,
						  used[k], quota[k]);
			/* counters only grow: add what left since last time */
			if (ev[k] > t->evicted[k])
				kvtd_metrics_eviction(m, t->mt, (kvt_tier_kind)k,
						      ev[k] - t->evicted[k]);
			t->evicted[k] = KVT_MAX(t->evicted[k], ev[k]);
		}
	}
}

static int listen_on(kvtd *d, const char *path)
{
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	int fd, err;

	if (strlen(path) >= sizeof(sa.sun_path))
		return kvti_fail(KVT_ECONFIG, "daemon: socket path '%s' too long "
				 "(%zu bytes max)", path, sizeof(sa.sun_path) - 1);
	strcpy(sa.sun_path, path);
	fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return kvti_fail(-errno, "daemon: socket: %s", strerror(errno));
	/* a live daemon answers on it: do not steal its socket */
	if (!connect(fd, (struct sockaddr *)&sa, sizeof(sa))) {
		close(fd);
		return kvti_fail(-EADDRINUSE, "daemon: a daemon is already "
				 "serving %s", path);
	}
	close(fd);
	unlink(path);
	fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return kvti_fail(-errno, "daemon: socket: %s", strerror(errno));
	if (bind(fd, (struct sockaddr *)&sa, sizeof(sa)) ||
	    chmod(path, d->cfg.socket_mode) || listen(fd, 64)) {
		err = -errno;
		close(fd);
		return kvti_fail(err, "daemon: %s: %s", path, strerror(-err));
	}
	d->lfd = fd;
	snprintf(d->path, sizeof(d->path), "%s", path);
	return 0;
}

int kvtd_open(kvtd **out, const kvtd_config *cfg)
{
	kvt_cache_config cc = KVT_CACHE_CONFIG_INIT;
	kvt_geom kvg;
	kvtd *d;
	int err;

	kvti_errclear();
	if (!out || !cfg)
		return kvti_fail(-EINVAL, "daemon: no config");
	if (!(d = kvt_calloc(1, sizeof(*d))))
		return -ENOMEM;
	d->cfg = *cfg;
	d->lfd = d->stopfd = -1;
	if (!d->cfg.socket || !*d->cfg.socket)
		d->cfg.socket = KVT_CLIENT_SOCKET;
	if (!d->cfg.socket_mode)
		d->cfg.socket_mode = 0660;
	if (!d->cfg.lease_ms)
		d->cfg.lease_ms = 30000;
	if (!d->cfg.hello_ms)
		d->cfg.hello_ms = 5000;
	if (!d->cfg.max_clients)
		d->cfg.max_clients = 64;
	snprintf(d->ns, sizeof(d->ns), "%s",
		 cfg->ns && *cfg->ns ? cfg->ns : "default");
	if (cfg->ns && strlen(cfg->ns) > KVTD_NS_MAX) {
		kvt_free(d);
		return kvti_fail(KVT_ECONFIG, "daemon: namespace longer than %d",
				 KVTD_NS_MAX);
	}
	pthread_mutex_init(&d->mu, NULL);
	kvti_cond_init_mono(&d->cv);
	if ((err = tenants_parse(d, cfg->tenants)))
		goto fail;
	cc.tiers = cfg->tiers;
	cc.model = cfg->model;
	cc.page_tokens = cfg->page_tokens;
	cc.tp_size = cfg->tp;
	if (cfg->kv_dtype && *cfg->kv_dtype &&
	    !kvti_streq_ci(cfg->kv_dtype, "auto")) {
		/* the model's geometry with the KV cache's element size */
		uint32_t P = cfg->page_tokens ? cfg->page_tokens : 16;
		uint32_t tp = cfg->tp ? cfg->tp : 1;
		const char *m = cfg->model && *cfg->model ? cfg->model :
				"llama-3.1-8b";

		if (strchr(m, '/') && access(m, R_OK) == 0)
			err = kvt_geom_from_config(&kvg, m, P, tp, 0);
		else
			err = kvt_geom_preset(&kvg, m, P, tp, 0);
		if (!err)
			err = kvt_geom_dtype_bytes(cfg->kv_dtype,
						   &kvg.dtype_bytes);
		if (err)
			goto fail;
		cc.geom = &kvg;
	}
	cc.flags = cfg->cache_flags;
	cc.write = cfg->write;
	cc.remote = cfg->remote && *cfg->remote ? cfg->remote : NULL;
	cc.evict = cfg->evict;
	cc.xfer_threads = cfg->xfer_threads;
	if ((err = kvt_cache_open(&d->c, &cc)))
		goto fail;
	d->g = kvt_cache_geom(d->c);
	if ((err = kvtd_metrics_create(&d->m)))
		goto fail;
	kvtd_metrics_set_cache(d->m, d->c);
	kvtd_metrics_set_collect(d->m, collect, d);
	for (int i = 0; i < d->nten; i++) {
		struct tenant *t = &d->ten[i];

		for (uint32_t r = 0; r < d->g->tp_size && !err; r++)
			err = kvt_cache_tenant_add(d->c, itenant(d, i, r),
						   t->salt ^ XXH3_64bits(&r,
						   sizeof(r)));
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
						itenant(d, i, r),
						(kvt_tier_kind)k,
						pages ? pages : 1);
		}
		if (!err)
			err = kvtd_metrics_tenant(d->m, t->id, t->name, &t->mt);
		if (err)
			goto fail;
	}
	d->stopfd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
	if (d->stopfd < 0) {
		err = kvti_fail(-errno, "daemon: eventfd: %s", strerror(errno));
		goto fail;
	}
	if ((err = listen_on(d, d->cfg.socket)))
		goto fail;
	if (cfg->metrics && *cfg->metrics &&
	    (err = kvtd_http_start(&d->http, cfg->metrics,
				   kvtd_metrics_render_cb, d->m)))
		goto fail;
	if ((err = -pthread_create(&d->reaper, NULL, reaper_main, d))) {
		kvti_fail(err, "daemon: thread: %s", strerror(-err));
		goto fail;
	}
	d->have_reaper = 1;
	*out = d;
	return 0;
fail:
	kvtd_close(d);
	return err;
}

void kvtd_stop(kvtd *d)
{
	uint64_t one = 1;

	if (write(d->stopfd, &one, sizeof(one)) < 0) {
		/* already signalled */
	}
}

int kvtd_run(kvtd *d)
{
	struct pollfd p[2] = { { .fd = d->lfd, .events = POLLIN },
			       { .fd = d->stopfd, .events = POLLIN } };

	for (;;) {
		struct conn *c;
		socklen_t cl = sizeof(struct ucred);
		int fd, err;

		if (poll(p, 2, -1) < 0) {
			if (errno == EINTR)
				continue;
			return kvti_fail(-errno, "daemon: poll: %s",
					 strerror(errno));
		}
		if (p[1].revents)
			return 0;
		fd = accept4(d->lfd, NULL, NULL, SOCK_CLOEXEC);
		if (fd < 0) {
			if (errno == EINTR || errno == ECONNABORTED ||
			    errno == EAGAIN)
				continue;
			kvti_warn("daemon: accept: %s", strerror(errno));
			if (errno == EMFILE || errno == ENFILE)
				usleep(100000); /* let clients leave */
			continue;
		}
		c = kvt_calloc(1, sizeof(*c));
		if (!c) {
			close(fd);
			continue;
		}
		c->d = d;
		c->fd = fd;
		c->slot_fd = c->efd = -1;
		pthread_mutex_init(&c->mu, NULL);
		if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &c->cred, &cl)) {
			kvt_free(c);
			close(fd);
			continue;
		}
		pthread_mutex_lock(&d->mu);
		if ((uint32_t)d->nconns >= d->cfg.max_clients) {
			pthread_mutex_unlock(&d->mu);
			kvti_warn("daemon: %u clients already: refused pid %d",
				  d->cfg.max_clients, (int)c->cred.pid);
			kvtd_metrics_protocol_error(d->m, NULL,
						    KVTD_PERR_OTHER);
			pthread_mutex_destroy(&c->mu);
			kvt_free(c);
			close(fd);
			continue;
		}
		c->next = d->conns;
		c->id = ++d->next_id;
		d->conns = c;
		d->nconns++;
		kvtd_metrics_gauge_set(d->m, KVTD_G_CLIENTS,
				       (uint64_t)d->nconns);
		pthread_mutex_unlock(&d->mu);
		{
			pthread_attr_t a;
			pthread_t th;

			pthread_attr_init(&a);
			pthread_attr_setdetachstate(&a,
						    PTHREAD_CREATE_DETACHED);
			err = pthread_create(&th, &a, conn_main, c);
			pthread_attr_destroy(&a);
		}
		if (err) {
			kvti_warn("daemon: thread: %s", strerror(err));
			c->hello = 0;
			conn_free(c);
		}
	}
}

void kvtd_close(kvtd *d)
{
	if (!d)
		return;
	if (d->lfd >= 0) {
		close(d->lfd);
		unlink(d->path);
		d->lfd = -1;
	}
	/* drain: jobs in flight finish (a lease at most), then every client
	 * is disconnected; its thread frees what it holds */
	pthread_mutex_lock(&d->mu);
	for (struct conn *c = d->conns; c; c = c->next) {
		pthread_mutex_lock(&c->mu);
		for (int s = 0; s < MAX_JOBS; s++)
			if (c->jobs[s])
				kvt_cache_job_wait(c->jobs[s]->cj,
						   (int64_t)d->cfg.lease_ms *
						   1000000);
		pthread_mutex_unlock(&c->mu);
		shutdown(c->fd, SHUT_RDWR);
	}
	while (d->nconns)
		pthread_cond_wait(&d->cv, &d->mu);
	d->stopping = 1;
	pthread_cond_broadcast(&d->cv);
	pthread_mutex_unlock(&d->mu);
	if (d->have_reaper)
		pthread_join(d->reaper, NULL);
	kvtd_http_stop(d->http);
	kvt_cache_close(d->c);
	kvtd_metrics_destroy(d->m);
	if (d->stopfd >= 0)
		close(d->stopfd);
	pthread_mutex_destroy(&d->mu);
	pthread_cond_destroy(&d->cv);
	kvt_free(d);
}
