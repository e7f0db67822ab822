/*
 * cache_remote.c — the node cache's remote tier (include/kvtier/cache.h,
 * "The remote tier"): write-through after stores, remote runs in lookups,
 * prefetch into the top tier. Only the cache's public calls, its
 * extension hooks (cache_ext.h: told of committed stores, asked after
 * lookups) and kvtier/remote.h are used; the bytes go through two staging
 * areas that the cache sees as attached host memory in page-first order
 * (a block is a page: base[l] = buf + l*kv*chunk, block stride = page
 * bytes), which is also the remote tier's value layout, so no conversion
 * is needed. Stores out of the staging areas are not written through
 * (kvti_cache_ext_quiet(): their pages came from the remote tier).
 *
 *   store job done --stored hook--> queue (keys) --writer thread-->
 *       EXISTS; load_ex(top tier -> wstage); kvt_remote_set(absent pages)
 *
 *   prefetch: kvt_remote_get(-> pstage); store_ex(pstage -> top tier)
 *
 *   lookup: answered from what is known (the presence table), never from
 *       the network; keys not known go to the prober thread:
 *       lookup --(unknown keys)--> probe queue --prober--> EXISTS
 *          ^                                                 |
 *          +------------- presence table <-------------------+
 *       (also fed by the writer's EXISTS and SETs and by prefetches)
 *
 * A hung or slow Redis therefore costs lookups nothing: they report what
 * is known (a remote run a probe found within PRESENT_NS, or that this
 * node wrote), and a prefix asked about for the first time reports no
 * remote run until its probe answers (the next lookup sees it). A cut-off
 * prefetch (kvt_cache_prefetch_end(cut 1)) does not wait for a batch stuck
 * on the network either: the thread finishes (and frees its handle) on
 * its own.
 *
 * Three connections: the writer's own (cr->rw), the prober's (cr->rq) and
 * the prefetches' (cr->r), so none waits behind another's batch.
 *
 * Locks: cr->mu guards the queues, the presence table and the counters;
 * it is a leaf (taken inside the stored hook, under a job's lock, and in
 * the lookup hook; never held across a cache or network call). cr->pmu
 * serializes prefetches (one staging area).
 */
#include "cache/cache_ext.h"

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <string.h>

#define STAGE_BYTES (64ull << 20) /* per staging area */
#define STAGE_MAX 64              /* pages per staging area */
#define QUEUE_MAX (1u << 16)      /* pages waiting for write-through */
#define FETCH_BATCH_BYTES (16ull << 20) /* asynchronous prefetch batch */
#define KNOWN_SLOTS (1u << 16)    /* presence table entries (2 MiB) */
#define PRESENT_NS (60ull * 1000000000) /* a page seen there is trusted */
#define ABSENT_NS (1ull * 1000000000)   /* a page not there, re-asked */
#define PROBING_NS (30ull * 1000000000) /* a probe not back: ask again */
#define PROBE_MAX 256             /* keys one probe asks about */
#define PROBE_QUEUE 64            /* probes waiting, more are dropped */

enum { K_NONE, K_PRESENT, K_ABSENT, K_PROBING };

/* What this node knows of one page in the remote tier. */
struct known {
	kvt_page_key key;
	uint64_t until;               /* kvt_now_ns() the state holds to */
	uint8_t state;                /* K_* */
};

struct probe {
	struct probe *next;
	size_t n;
	kvt_page_key keys[];
};

struct wentry {
	struct wentry *next;
	uint32_t tenant;
	size_t nkeys, first;
	kvt_page_key keys[];
};

struct cremote {
	kvt_cache *c;
	kvt_remote *r;                /* lookups and prefetches */
	kvt_remote *rw;               /* the writer's own: a lookup never
					 waits behind a write batch */
	kvt_remote *rq;               /* the prober's own */
	uint64_t page;
	uint32_t slots;               /* pages per staging area */
	uint8_t *wbuf, *pbuf;
	kvt_cache_mem *wmem, *pmem;
	uint32_t *blocks;             /* 0..slots-1 */
	uint8_t *ok, *wok;            /* per staged page: prefetch, writer */
	pthread_mutex_t pmu;

	pthread_mutex_t mu;
	pthread_cond_t cv, idle;
	struct wentry *head, *tail;   /* mu */
	uint64_t pending;             /* mu: pages queued or being written */
	int fetches;                  /* mu: asynchronous prefetches running */
	atomic_int closing;           /* prefetches stop between batches */
	int stop, have_thread, have_prober;
	pthread_t th, prober;
	struct known *known;          /* mu: KNOWN_SLOTS, direct-mapped */
	struct probe *phead, *ptail;  /* mu: probes to send */
	uint32_t nprobes;             /* mu: queued */
	pthread_cond_t pcv;           /* a probe queued, or stop */
	kvt_cache_remote_stat st;     /* mu (remote: filled on read) */
};

static void remote_stored(void *arg, uint32_t tenant, const kvt_page_key *keys,
			  size_t nkeys, size_t first);
static void remote_lookup(void *arg, const kvt_page_key *keys, size_t nkeys,
			  kvt_cache_lookup_result *r);
static void remote_stop(void *arg);
static void remote_free(void *arg);

/* What the cache calls (cache_ext.h). */
static const struct kvti_cache_ext remote_ext = {
	.stored = remote_stored,
	.lookup = remote_lookup,
	.stop = remote_stop,
	.free = remote_free,
};

/* ---- what is known of the remote tier ----------------------------------- */

static struct known *known_at(struct cremote *cr, const kvt_page_key *k)
{
	uint64_t h = (k->lo ^ (k->hi * 0x9E3779B97F4A7C15ull)) >> 7;

	return &cr->known[h & (KNOWN_SLOTS - 1)];
}

/* cr->mu held: the state of page @k now (K_NONE when not known or
 * expired). */
static int known_get(struct cremote *cr, const kvt_page_key *k, uint64_t now)
{
	struct known *e = known_at(cr, k);

	if (e->state == K_NONE || e->key.lo != k->lo || e->key.hi != k->hi ||
	    now >= e->until)
		return K_NONE;
	return e->state;
}

/* cr->mu held: record page @k as @state (K_PRESENT ... ) from now. */
static void known_put(struct cremote *cr, const kvt_page_key *k, int state,
		      uint64_t now)
{
	struct known *e = known_at(cr, k);

	e->key = *k;
	e->state = (uint8_t)state;
	e->until = now + (state == K_PRESENT ? PRESENT_NS :
			  state == K_ABSENT ? ABSENT_NS : PROBING_NS);
}

/* Record what a call learnt: @ok[i] 1 for keys[i] there, else absent. */
static void known_learn(struct cremote *cr, const kvt_page_key *keys,
			size_t n, const uint8_t *ok)
{
	uint64_t now = kvt_now_ns();

	pthread_mutex_lock(&cr->mu);
	for (size_t i = 0; i < n; i++)
		known_put(cr, &keys[i], ok[i] ? K_PRESENT : K_ABSENT, now);
	pthread_mutex_unlock(&cr->mu);
}

static void *prober_main(void *arg)
{
	struct cremote *cr = arg;
	uint8_t *present = kvt_malloc(PROBE_MAX);

	pthread_mutex_lock(&cr->mu);
	for (;;) {
		struct probe *p;
		size_t lead = 0;

		while (!cr->phead && !cr->stop)
			pthread_cond_wait(&cr->pcv, &cr->mu);
		if (cr->stop)
			break;
		p = cr->phead;
		cr->phead = p->next;
		if (!cr->phead)
			cr->ptail = NULL;
		cr->nprobes--;
		pthread_mutex_unlock(&cr->mu);
		/* off every lookup's path: this may take the remote timeout */
		if (present && !kvt_remote_exists(cr->rq, p->keys, p->n, &lead,
						  present))
			known_learn(cr, p->keys, p->n, present);
		pthread_mutex_lock(&cr->mu);
		cr->st.probe_pages += p->n;
		kvt_free(p);
	}
	pthread_mutex_unlock(&cr->mu);
	kvt_free(present);
	return NULL;
}

/* cr->mu held: ask the prober about keys[0..n) (those not being probed
 * already), unless too many probes wait (then a later lookup asks). */
static void probe_queue(struct cremote *cr, const kvt_page_key *keys,
			size_t n, uint64_t now)
{
	struct probe *p;
	size_t m = 0;

	n = KVT_MIN(n, (size_t)PROBE_MAX);
	if (!cr->have_prober || cr->stop)
		return;
	if (cr->nprobes >= PROBE_QUEUE) {
		cr->st.probe_dropped += n;
		return;
	}
	if (!(p = kvt_malloc(sizeof(*p) + n * sizeof(*keys))))
		return;
	for (size_t i = 0; i < n; i++) {
		if (known_get(cr, &keys[i], now) == K_PROBING)
			continue;
		known_put(cr, &keys[i], K_PROBING, now);
		p->keys[m++] = keys[i];
	}
	if (!m) {
		kvt_free(p);
		return;
	}
	p->n = m;
	p->next = NULL;
	if (cr->ptail)
		cr->ptail->next = p;
	else
		cr->phead = p;
	cr->ptail = p;
	cr->nprobes++;
	pthread_cond_signal(&cr->pcv);
}

/* ---- staging areas -------------------------------------------------------- */

static int stage_attach(struct cremote *cr, uint8_t **buf,
			kvt_cache_mem **mem)
{
	const kvt_geom *g = kvt_cache_geom(cr->c);
	uint64_t chunk = kvt_geom_chunk_bytes(g);
	void **base;
	int err;

	if (!(*buf = kvti_aligned_alloc(4096, cr->slots * cr->page)))
		return -ENOMEM;
	if (!(base = kvt_malloc(g->layers * sizeof(void *))))
		return -ENOMEM;
	for (uint32_t l = 0; l < g->layers; l++)
		base[l] = *buf + (uint64_t)l * kvt_geom_kv(g) * chunk;
	err = kvt_cache_attach(cr->c, base, g->layers, cr->slots, cr->page,
			       chunk, (uint64_t)g->kv_heads * g->head_dim *
			       g->dtype_bytes, -1, mem);
	kvt_free(base);
	if (!err) /* what it stores came from the remote tier */
		kvti_cache_ext_quiet(*mem);
	return err;
}

/* ---- write-through ------------------------------------------------------- */

/* Write pages first..nkeys-1 of one committed store, a staging area at a
 * time. */
static void write_entry(struct cremote *cr, const struct wentry *e)
{
	uint64_t written = 0, present = 0, dropped = 0, failed = 0;
	kvt_cache_io io = KVT_CACHE_IO_INIT;
	const void **bufs = NULL;
	kvt_page_key *ks = NULL;
	uint32_t *bad = NULL;

	io.mem = cr->wmem;
	bufs = kvt_malloc(cr->slots * sizeof(*bufs));
	ks = kvt_malloc(cr->slots * sizeof(*ks));
	bad = kvt_malloc(cr->slots * sizeof(*bad));
	for (size_t s = e->first; s < e->nkeys;) {
		size_t cnt = KVT_MIN((size_t)cr->slots, e->nkeys - s), lead, m = 0;
		kvt_cache_job *j = NULL;
		long nbad = 0;
		int got;

		if (!bufs || !ks || !bad) {
			dropped += e->nkeys - s;
			break;
		}
		if (!kvt_remote_exists(cr->rw, e->keys + s, cnt, &lead,
				       cr->wok))
			known_learn(cr, e->keys + s, cnt, cr->wok);
		for (size_t i = 0; i < cnt; i++)
			present += cr->wok[i];
		if (lead == cnt) {
			s += cnt;
			continue;
		}
		if (kvt_cache_load_ex(cr->c, e->tenant, e->keys, s + cnt, s,
				      cr->blocks, &io, &j)) {
			dropped += cnt;
			s += cnt;
			continue;
		}
		kvt_cache_job_wait(j, -1);
		nbad = kvt_cache_job_failed(j, bad, cr->slots);
		kvt_cache_job_free(j);
		for (size_t i = 0; i < cnt; i++) {
			int gone = 0;

			for (long b = 0; b < nbad && b < (long)cr->slots; b++)
				gone |= bad[b] == i;
			if (cr->wok[i])
				continue;
			if (gone) {
				dropped++;
				continue;
			}
			ks[m] = e->keys[s + i];
			bufs[m++] = cr->wbuf + i * cr->page;
		}
		got = m ? kvt_remote_set_as(cr->rw, e->tenant, ks, m, bufs,
					    NULL, cr->wok) : 0;
		if (got > 0) { /* what it took is there now */
			uint64_t now = kvt_now_ns();

			pthread_mutex_lock(&cr->mu);
			for (size_t i = 0; i < m; i++)
				if (cr->wok[i])
					known_put(cr, &ks[i], K_PRESENT, now);
			pthread_mutex_unlock(&cr->mu);
		}
		written += got > 0 ? (uint64_t)got : 0;
		failed += m - (got > 0 ? (uint64_t)got : 0);
		s += cnt;
	}
	kvt_free(bufs);
	kvt_free(ks);
	kvt_free(bad);
	pthread_mutex_lock(&cr->mu);
	cr->st.written += written;
	cr->st.present += present;
	cr->st.dropped += dropped;
	cr->st.failed += failed;
	pthread_mutex_unlock(&cr->mu);
}

static void *writer_main(void *arg)
{
	struct cremote *cr = arg;

	pthread_mutex_lock(&cr->mu);
	for (;;) {
		struct wentry *e;

		while (!cr->head && !cr->stop)
			pthread_cond_wait(&cr->cv, &cr->mu);
		if (cr->stop)
			break;
		e = cr->head;
		cr->head = e->next;
		if (!cr->head)
			cr->tail = NULL;
		pthread_mutex_unlock(&cr->mu);
		write_entry(cr, e);
		pthread_mutex_lock(&cr->mu);
		cr->pending -= e->nkeys - e->first;
		kvt_free(e);
		pthread_cond_broadcast(&cr->idle);
	}
	pthread_mutex_unlock(&cr->mu);
	return NULL;
}

/* The stored hook (cache_ext.h): runs under the store job's lock, record
 * and wake only. */
static void remote_stored(void *arg, uint32_t tenant, const kvt_page_key *keys,
			  size_t nkeys, size_t first)
{
	struct cremote *cr = arg;
	uint64_t n = nkeys - first;
	struct wentry *e = kvt_malloc(sizeof(*e) + nkeys * sizeof(*keys));

	pthread_mutex_lock(&cr->mu);
	if (e && !cr->stop && cr->pending + n <= QUEUE_MAX) {
		e->next = NULL;
		e->tenant = tenant;
		e->nkeys = nkeys;
		e->first = first;
		memcpy(e->keys, keys, nkeys * sizeof(*keys));
		if (cr->tail)
			cr->tail->next = e;
		else
			cr->head = e;
		cr->tail = e;
		cr->pending += n;
		cr->st.queued += n;
		pthread_cond_signal(&cr->cv);
		e = NULL;
	} else {
		cr->st.dropped += n;
	}
	pthread_mutex_unlock(&cr->mu);
	kvt_free(e);
}

int kvt_cache_remote_tenant_key(kvt_cache *c, uint32_t tenant,
				const char *path)
{
	struct cremote *cr = kvti_cache_ext_arg(c, &remote_ext);
	int err;

	if (!cr)
		return kvti_fail(KVT_ENOTFOUND, "cache: no remote tier (a "
				 "tenant key needs one)");
	/* the two handles that move values: prefetches and write-through */
	if ((err = kvt_remote_tenant_key(cr->r, tenant, path)))
		return err;
	return kvt_remote_tenant_key(cr->rw, tenant, path);
}

int kvt_cache_remote_flush(kvt_cache *c, int64_t timeout_ns)
{
	struct cremote *cr = kvti_cache_ext_arg(c, &remote_ext);
	struct timespec ts;
	int err = 0;

	if (!cr)
		return kvti_fail(KVT_ENOTFOUND, "cache: no remote tier");
	if (timeout_ns >= 0)
		kvti_deadline(&ts, timeout_ns);
	pthread_mutex_lock(&cr->mu);
	while (cr->pending && !err)
		err = timeout_ns < 0 ? -pthread_cond_wait(&cr->idle, &cr->mu) :
			-pthread_cond_timedwait(&cr->idle, &cr->mu, &ts);
	pthread_mutex_unlock(&cr->mu);
	return err;
}

/* ---- lookup and prefetch --------------------------------------------------- */

/* The lookup hook (cache_ext.h): no cache lock held. No network call:
 * the remote run is what the presence table knows; the first key it does
 * not know (or knows only as absent, expired) and those after it go to
 * the prober, for the next lookup. */
static void remote_lookup(void *arg, const kvt_page_key *keys, size_t nkeys,
			  kvt_cache_lookup_result *r)
{
	struct cremote *cr = arg;
	uint64_t now = kvt_now_ns();
	size_t lead = 0, i;

	if (r->inflight || r->pages >= nkeys)
		return;
	keys += r->pages;
	nkeys -= r->pages;
	pthread_mutex_lock(&cr->mu);
	while (lead < nkeys && known_get(cr, &keys[lead], now) == K_PRESENT)
		lead++;
	i = lead;
	if (i < nkeys && known_get(cr, &keys[i], now) != K_ABSENT)
		probe_queue(cr, keys + i, nkeys - i, now);
	cr->st.lookups++;
	cr->st.lookup_pages += lead;
	pthread_mutex_unlock(&cr->mu);
	r->tier_pages[KVT_TIER_REMOTE] = lead;
}

/* Bring pages first..nkeys-1 in, @batch pages a time, until one is not
 * there, @cut is set (checked between batches) or the cache closes. */
static int fetch_run(struct cremote *cr, uint32_t tenant,
		     const kvt_page_key *keys, size_t nkeys, size_t first,
		     size_t batch, atomic_int *cut, _Atomic uint64_t *pages)
{
	kvt_cache_io io = KVT_CACHE_IO_INIT;
	void **bufs;
	size_t s = first;
	int err = 0;

	atomic_store(pages, 0);
	if (!(bufs = kvt_malloc(cr->slots * sizeof(*bufs))))
		return -ENOMEM;
	for (uint32_t i = 0; i < cr->slots; i++)
		bufs[i] = cr->pbuf + i * cr->page;
	io.mem = cr->pmem;
	pthread_mutex_lock(&cr->pmu);
	while (s < nkeys && !(cut && atomic_load(cut)) &&
	       !atomic_load(&cr->closing)) {
		size_t cnt = KVT_MIN(batch, nkeys - s), lead = 0;
		kvt_cache_job *j;

		kvt_remote_get_as(cr->r, tenant, keys + s, cnt, bufs, cr->ok,
				  NULL);
		known_learn(cr, keys + s, cnt, cr->ok);
		while (lead < cnt && cr->ok[lead])
			lead++;
		if (!lead)
			break;
		if ((err = kvt_cache_store_ex(cr->c, tenant, keys, s + lead, s,
					      cr->blocks, &io, &j)))
			break;
		err = kvt_cache_job_wait(j, -1);
		kvt_cache_job_free(j);
		if (err)
			break;
		s += lead;
		atomic_fetch_add(pages, lead);
		if (lead < cnt)
			break;
	}
	pthread_mutex_unlock(&cr->pmu);
	pthread_mutex_lock(&cr->mu);
	cr->st.prefetched += atomic_load(pages);
	pthread_mutex_unlock(&cr->mu);
	kvt_free(bufs);
	return err;
}

int kvt_cache_prefetch(kvt_cache *c, uint32_t tenant, const kvt_page_key *keys,
		       size_t nkeys, size_t first, uint64_t *pages)
{
	struct cremote *cr = kvti_cache_ext_arg(c, &remote_ext);

	kvti_errclear();
	if (!c || !pages || (nkeys && !keys) || first > nkeys)
		return kvti_fail(-EINVAL, "cache prefetch: bad arguments");
	if (!cr)
		return kvti_fail(KVT_ENOTFOUND, "cache prefetch: no remote tier");
	{
		_Atomic uint64_t got;
		int err = fetch_run(cr, tenant, keys, nkeys, first, cr->slots,
				    NULL, &got);

		*pages = atomic_load(&got);
		return err;
	}
}

/* ---- asynchronous prefetch ------------------------------------------------ */

struct kvt_cache_fetch {
	struct cremote *cr;
	uint32_t tenant;
	size_t nkeys, first;
	atomic_int cut;
	_Atomic uint64_t pages;
	int err;
	atomic_int done;              /* set under cr->mu, read without it */
	int abandoned;                /* cr->mu */
	pthread_t th;
	kvt_page_key keys[];
};

static void *fetch_main(void *arg)
{
	kvt_cache_fetch *f = arg;
	struct cremote *cr = f->cr;
	/* small batches: a cut-off waits for at most one of them */
	size_t batch = (size_t)KVT_MAX(1, KVT_MIN(cr->slots,
						  FETCH_BATCH_BYTES / cr->page));
	int abandoned;

	f->err = fetch_run(cr, f->tenant, f->keys, f->nkeys, f->first, batch,
			   &f->cut, &f->pages);
	pthread_mutex_lock(&cr->mu);
	atomic_store(&f->done, 1);
	cr->fetches--;
	abandoned = f->abandoned;
	pthread_cond_broadcast(&cr->idle);
	pthread_mutex_unlock(&cr->mu);
	if (abandoned) /* cut off while on the network: no one waits for it */
		kvt_free(f);
	return NULL;
}

int kvt_cache_prefetch_start(kvt_cache *c, uint32_t tenant,
			     const kvt_page_key *keys, size_t nkeys,
			     size_t first, kvt_cache_fetch **out)
{
	struct cremote *cr = kvti_cache_ext_arg(c, &remote_ext);
	kvt_cache_fetch *f;
	int err;

	kvti_errclear();
	if (!c || !out || (nkeys && !keys) || first > nkeys)
		return kvti_fail(-EINVAL, "cache prefetch: bad arguments");
	if (!cr)
		return kvti_fail(KVT_ENOTFOUND, "cache prefetch: no remote tier");
	if (!(f = kvt_calloc(1, sizeof(*f) + nkeys * sizeof(*keys))))
		return -ENOMEM;
	f->cr = cr;
	f->tenant = tenant;
	f->nkeys = nkeys;
	f->first = first;
	memcpy(f->keys, keys, nkeys * sizeof(*keys));
	pthread_mutex_lock(&cr->mu);
	cr->fetches++;
	pthread_mutex_unlock(&cr->mu);
	if ((err = -pthread_create(&f->th, NULL, fetch_main, f))) {
		pthread_mutex_lock(&cr->mu);
		cr->fetches--;
		pthread_mutex_unlock(&cr->mu);
		kvt_free(f);
		return kvti_fail(err, "cache prefetch: starting its thread");
	}
	*out = f;
	return 0;
}

int kvt_cache_prefetch_end(kvt_cache_fetch *f, int cut, uint64_t *pages)
{
	struct cremote *cr;
	int err;

	if (!f)
		return kvti_fail(-EINVAL, "cache prefetch end: no handle");
	cr = f->cr;
	/* done: the thread touches nothing more, and the cache (and cr) may
	 * be closed already (its close waited for this thread) */
	if (cut && !atomic_load(&f->done)) {
		atomic_store(&f->cut, 1);
		pthread_mutex_lock(&cr->mu);
		if (!atomic_load(&f->done)) {
			/* a batch on the network (a slow or hung server): do
			 * not wait for it; what arrived so far is committed,
			 * the thread ends and frees the handle itself */
			f->abandoned = 1;
			pthread_detach(f->th);
			if (pages)
				*pages = atomic_load(&f->pages);
			pthread_mutex_unlock(&cr->mu);
			return 0;
		}
		pthread_mutex_unlock(&cr->mu);
	}
	pthread_join(f->th, NULL);
	if (pages)
		*pages = atomic_load(&f->pages);
	err = f->err;
	kvt_free(f);
	return err;
}

int kvt_cache_remote_stat_get(kvt_cache *c, kvt_cache_remote_stat *st)
{
	struct cremote *cr = kvti_cache_ext_arg(c, &remote_ext);
	kvt_remote_stat w;
	uint64_t *a = (uint64_t *)&st->remote;
	const uint64_t *b = (const uint64_t *)&w;

	if (!cr)
		return kvti_fail(KVT_ENOTFOUND, "cache: no remote tier");
	pthread_mutex_lock(&cr->mu);
	*st = cr->st;
	pthread_mutex_unlock(&cr->mu);
	kvt_remote_stat_get(cr->r, &st->remote);
	kvt_remote_stat_get(cr->rw, &w);
	/* both connections' counters added (every field up to lat_ns_max
	 * is a uint64_t count); the longest call and the nodes are the
	 * larger of the two */
	for (size_t i = 0; i < offsetof(kvt_remote_stat, lat_ns_max) /
				       sizeof(uint64_t); i++)
		a[i] += b[i];
	st->remote.lat_ns_max = KVT_MAX(st->remote.lat_ns_max, w.lat_ns_max);
	st->remote.nodes = KVT_MAX(st->remote.nodes, w.nodes);
	st->remote.nodes_up = KVT_MAX(st->remote.nodes_up, w.nodes_up);
	return 0;
}

/* ---- open and close --------------------------------------------------------- */

int kvti_cache_remote_open(kvt_cache *c, const char *spec)
{
	struct cremote *cr = kvt_calloc(1, sizeof(*cr));
	int err;

	if (!cr)
		return -ENOMEM;
	cr->c = c;
	cr->page = kvt_geom_page_bytes(kvt_cache_geom(c));
	cr->slots = (uint32_t)KVT_MAX(1, KVT_MIN(STAGE_MAX,
						 STAGE_BYTES / cr->page));
	pthread_mutex_init(&cr->mu, NULL);
	pthread_mutex_init(&cr->pmu, NULL);
	kvti_cond_init_mono(&cr->cv);
	kvti_cond_init_mono(&cr->idle);
	kvti_cond_init_mono(&cr->pcv);
	if ((err = kvt_remote_open(&cr->r, spec, kvt_cache_geom(c))) ||
	    (err = kvt_remote_open(&cr->rw, spec, kvt_cache_geom(c))) ||
	    (err = kvt_remote_open(&cr->rq, spec, kvt_cache_geom(c))))
		goto fail;
	err = -ENOMEM;
	if (!(cr->known = kvt_calloc(KNOWN_SLOTS, sizeof(*cr->known))) ||
	    !(cr->blocks = kvt_malloc(cr->slots * sizeof(*cr->blocks))) ||
	    !(cr->ok = kvt_malloc(cr->slots)) || !(cr->wok = kvt_malloc(cr->slots)))
		goto fail;
	for (uint32_t i = 0; i < cr->slots; i++)
		cr->blocks[i] = i;
	if ((err = stage_attach(cr, &cr->wbuf, &cr->wmem)) ||
	    (err = stage_attach(cr, &cr->pbuf, &cr->pmem)))
		goto fail;
	if ((err = -pthread_create(&cr->th, NULL, writer_main, cr))) {
		kvti_fail(err, "cache: starting the remote writer thread");
		goto fail;
	}
	cr->have_thread = 1;
	if ((err = -pthread_create(&cr->prober, NULL, prober_main, cr))) {
		kvti_fail(err, "cache: starting the remote prober thread");
		goto fail;
	}
	cr->have_prober = 1;
	kvti_cache_ext_set(c, &remote_ext, cr);
	return 0;
fail:
	remote_stop(cr);
	kvt_cache_detach(cr->wmem);
	kvt_cache_detach(cr->pmem);
	remote_free(cr);
	return err;
}

static void remote_stop(void *arg)
{
	struct cremote *cr = arg;

	atomic_store(&cr->closing, 1);
	pthread_mutex_lock(&cr->mu);
	cr->stop = 1;
	pthread_cond_broadcast(&cr->cv);
	pthread_cond_broadcast(&cr->pcv);
	while (cr->fetches) /* their handles stay valid until _end() */
		pthread_cond_wait(&cr->idle, &cr->mu);
	pthread_mutex_unlock(&cr->mu);
	if (cr->have_thread)
		pthread_join(cr->th, NULL);
	cr->have_thread = 0;
	if (cr->have_prober)
		pthread_join(cr->prober, NULL);
	cr->have_prober = 0;
	/* what was still queued is dropped */
	pthread_mutex_lock(&cr->mu);
	while (cr->head) {
		struct wentry *e = cr->head;

		cr->head = e->next;
		cr->st.dropped += e->nkeys - e->first;
		cr->pending -= e->nkeys - e->first;
		kvt_free(e);
	}
	cr->tail = NULL;
	while (cr->phead) {
		struct probe *p = cr->phead;

		cr->phead = p->next;
		kvt_free(p);
	}
	cr->ptail = NULL;
	cr->nprobes = 0;
	pthread_cond_broadcast(&cr->idle);
	pthread_mutex_unlock(&cr->mu);
}

static void remote_free(void *arg)
{
	struct cremote *cr = arg;

	kvt_remote_close(cr->r);
	kvt_remote_close(cr->rw);
	kvt_remote_close(cr->rq);
	kvt_free(cr->known);
	kvt_free(cr->wbuf);
	kvt_free(cr->pbuf);
	kvt_free(cr->blocks);
	kvt_free(cr->ok);
	kvt_free(cr->wok);
	pthread_mutex_destroy(&cr->mu);
	pthread_mutex_destroy(&cr->pmu);
	pthread_cond_destroy(&cr->cv);
	pthread_cond_destroy(&cr->idle);
	pthread_cond_destroy(&cr->pcv);
	kvt_free(cr);
}
