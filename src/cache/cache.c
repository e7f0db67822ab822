/*
 * cache.c — the node cache itself (include/kvtier/cache.h is the
 * contract): open and close (owned tiers, index, transfer engine, the
 * worker and background threads, a persistent ssd tier's rebuild, the
 * remote tier), engine memory (register, attach, detach), tenants, lookup,
 * accounting and kvt_cache_verify().
 *
 * The structures, which lock guards which field, the threads and the
 * other files are in cache_impl.h. A lookup takes c->mu for the index and
 * c->smu for the slot states, and asks the remote tier (network) only
 * after dropping both. Close cancels every live job and waits for them
 * before the threads stop; detach does the same for one memory.
 */
#include "cache/cache_impl.h"
#include "xfer/xfer_int.h"
#include "core/cuda.h"
#include "dev/dev.h"
#include "xfer/xxh.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <time.h>
#include <unistd.h>

/* ---- open / close / register ---------------------------------------------- */

static void stop_threads(kvt_cache *c)
{
	/* the room thread first: the stores it still holds submit to the
	 * workers (kvt_cache_close() waited for every job anyway) */
	pthread_mutex_lock(&c->rmu);
	c->rstop = 1;
	pthread_cond_broadcast(&c->rcv);
	pthread_mutex_unlock(&c->rmu);
	if (c->have_room)
		pthread_join(c->room, NULL);
	c->have_room = 0;
	pthread_mutex_lock(&c->wmu);
	c->stopping = 1;
	pthread_cond_broadcast(&c->wcv);
	pthread_cond_broadcast(&c->bgcv);
	pthread_mutex_unlock(&c->wmu);
	if (c->have_bg)
		pthread_join(c->bg, NULL);
	for (int i = 0; i < c->nworkers; i++)
		pthread_join(c->workers[i], NULL);
	c->have_bg = c->nworkers = 0;
}

/* A persistent ssd tier: its records, and the index rebuilt from them
 * (before any thread runs). */
static int persist_open(kvt_cache *c)
{
	kvt_tier *ssd = c->tiers[KVT_TIER_SSD];
	kvt_tier_desc d;
	int err;

	if (!ssd)
		return 0;
	kvt_tier_info(ssd, &d);
	if (!d.persistent)
		return 0;
	if (!c->verify)
		return kvti_fail(-EINVAL, "cache: a persistent ssd tier needs "
				 "checksums (every load of a restored page is "
				 "verified): drop KVT_CACHE_NO_VERIFY or "
				 "'persist'");
	if ((err = kvtp_open(&c->persist, ssd, c->tiers, c->L)))
		return err;
	return kvtp_rebuild(c->persist, c->idx, c->m[KVT_TIER_SSD].sums,
			    c->m[KVT_TIER_SSD].state, ST_OK);
}

/* Forget the records' state; the records stay for the next open. */
static void persist_close(kvt_cache *c)
{
	pthread_mutex_lock(&c->smu);
	kvtp_free(c->persist);
	c->persist = NULL;
	pthread_mutex_unlock(&c->smu);
}

static void cache_free(kvt_cache *c)
{
	stop_threads(c);
	kvt_xfer_destroy(c->x);
	kvti_cache_dev_release(c); /* the lanes are gone, the tiers mapped */
	persist_close(c); /* before the index gives its slots back */
	kvt_index_destroy(c->idx);
	for (int t = 0; t < KVT_TIER_COUNT; t++) {
		kvt_tier_close(c->tiers[t]);
		kvti_cache_meta_free(&c->m[t]);
	}
	kvt_tier_close(c->stage);
	while (c->mems) {
		kvt_cache_mem *m = c->mems;

		c->mems = m->next;
		kvt_tier_close(m->t);
		kvt_free(m);
	}
	kvt_free(c->bad);
	kvt_free(c->cur.mv);
	kvt_free(c->cur.sums);
	pthread_mutex_destroy(&c->mu);
	pthread_mutex_destroy(&c->smu);
	pthread_mutex_destroy(&c->wmu);
	pthread_mutex_destroy(&c->stage_mu);
	pthread_mutex_destroy(&c->rmu);
	pthread_cond_destroy(&c->rcv);
	pthread_cond_destroy(&c->scv);
	pthread_cond_destroy(&c->wcv);
	pthread_cond_destroy(&c->bgcv);
	kvt_free(c);
}

static int open_tiers(kvt_cache *c, const char *spec)
{
	kvt_tier_spec specs[KVT_TIER_COUNT + 1];
	size_t n;
	int err;

	if (!spec || !*spec)
		return kvti_fail(KVT_ESPEC, "cache: no tier spec");
	err = kvt_tier_spec_parse(spec, specs, KVT_ARRAY_SIZE(specs), &n);
	if (err)
		return err;
	for (size_t i = 0; i < n; i++) {
		kvt_tier_kind k = specs[i].kind;

		if (k == KVT_TIER_HBM)
			return kvti_fail(KVT_ESPEC, "cache: '%s' names an %s tier: "
					 "the engine's own memory is registered "
					 "with kvt_cache_register(), not opened "
					 "as a tier", spec, specs[i].hostdev ?
					 "hostdev" : "hbm");
		if (k == KVT_TIER_REMOTE)
			return kvti_fail(KVT_ESPEC, "cache: the remote tier is "
					 "not an owned tier: give its spec in "
					 "kvt_cache_config.remote");
		if (c->tiers[k])
			return kvti_fail(KVT_ESPEC, "cache: two %s tiers in '%s'",
					 kvt_tier_kind_name(k), spec);
		if ((err = kvt_tier_open(&c->tiers[k], &specs[i], &c->geom)))
			return err;
	}
	for (c->top = 0; c->top < KVT_TIER_COUNT && !c->tiers[c->top]; c->top++)
		;
	if (c->top == KVT_TIER_COUNT)
		return kvti_fail(KVT_ESPEC, "cache: '%s' has no tier", spec);
	return 0;
}

static int config_take(kvt_cache_config *cfg, const kvt_cache_config *in)
{
	memset(cfg, 0, sizeof(*cfg));
	if (!in)
		return kvti_fail(-EINVAL, "cache: no configuration");
	if (in->size < offsetof(kvt_cache_config, xfer_threads) +
			       sizeof(in->xfer_threads) ||
	    in->size > 4096)
		return kvti_fail(-EINVAL, "cache: configuration size %u: start "
				 "from KVT_CACHE_CONFIG_INIT", in->size);
	memcpy(cfg, in, KVT_MIN(in->size, sizeof(*cfg)));
	if (cfg->flags & ~(KVT_CACHE_NO_VERIFY | KVT_CACHE_STAGE_SSD |
			   KVT_CACHE_NO_BACKGROUND))
		return kvti_fail(-EINVAL, "cache: unknown flags 0x%x",
				 cfg->flags);
	if (!cfg->high)
		cfg->high = KVT_CACHE_HIGH;
	if (!cfg->low)
		cfg->low = KVT_MIN(KVT_CACHE_LOW, cfg->high);
	if (cfg->thread_nice < 0 || cfg->thread_nice > 19)
		return kvti_fail(-EINVAL, "cache: thread_nice %d: 0 (as "
				 "created) to 19", cfg->thread_nice);
	if (!(cfg->low > 0 && cfg->low <= cfg->high && cfg->high <= 1))
		return kvti_fail(-EINVAL, "cache: watermarks low %g, high %g: "
				 "need 0 < low <= high <= 1", cfg->low,
				 cfg->high);
	return 0;
}

static int geom_take(kvt_cache *c, const kvt_cache_config *cfg)
{
	uint32_t P = cfg->page_tokens ? cfg->page_tokens : 16;
	uint32_t tp = cfg->tp_size ? cfg->tp_size : 1;
	int err;

	if (cfg->geom) {
		c->geom = *cfg->geom;
		return kvt_geom_finish(&c->geom);
	}
	if (!cfg->model || !*cfg->model)
		return kvti_fail(-EINVAL, "cache: no geometry (set model or "
				 "geom)");
	if (strchr(cfg->model, '/') && access(cfg->model, R_OK) == 0)
		err = kvt_geom_from_config(&c->geom, cfg->model, P, tp,
					   cfg->tp_rank);
	else
		err = kvt_geom_preset(&c->geom, cfg->model, P, tp, cfg->tp_rank);
	return err;
}

int kvt_cache_open(kvt_cache **out, const kvt_cache_config *in)
{
	kvt_index_config ic = { 0 };
	kvt_xfer_config xc = { 0 };
	kvt_cache_config cfg;
	kvt_cache *c;
	int err;

	kvti_errclear();
	if (!out)
		return kvti_fail(-EINVAL, "cache open: no handle to fill");
	if ((err = config_take(&cfg, in)))
		return err;
	c = kvt_calloc(1, sizeof(*c));
	if (!c)
		return -ENOMEM;
	pthread_mutex_init(&c->mu, NULL);
	pthread_mutex_init(&c->smu, NULL);
	pthread_mutex_init(&c->wmu, NULL);
	pthread_mutex_init(&c->stage_mu, NULL);
	pthread_mutex_init(&c->rmu, NULL);
	kvti_cond_init_mono(&c->rcv);
	kvti_cond_init_mono(&c->scv);
	c->run_next = 1; /* the first batch id */
	kvti_cond_init_mono(&c->wcv);
	kvti_cond_init_mono(&c->bgcv);
	c->verify = !(cfg.flags & KVT_CACHE_NO_VERIFY);
	c->background = !(cfg.flags & KVT_CACHE_NO_BACKGROUND);
	c->stage_ssd = !!(cfg.flags & KVT_CACHE_STAGE_SSD);
	c->high = cfg.high;
	c->low = cfg.low;
	if ((err = geom_take(c, &cfg)) || (err = open_tiers(c, cfg.tiers)))
		goto fail;
	c->L = c->geom.layers;
	for (int t = 0; t < KVT_TIER_COUNT; t++) {
		if (!c->tiers[t])
			continue;
		if ((err = kvti_cache_meta_init(c, t)))
			goto fail;
		ic.pools[t] = kvt_tier_pool(c->tiers[t]);
	}
	xc.cpu_threads = cfg.xfer_threads;
	xc.cuda_load = cfg.dev_load;
	xc.cuda_store = cfg.dev_store;
	c->nice = cfg.thread_nice;
	if ((err = kvti_xfer_create_nice(&c->x, &xc, c->nice)))
		goto fail;
	ic.page_tokens = c->geom.page_tokens;
	ic.key_mode = KVT_KEY_HASH;
	ic.evict = cfg.evict;
	ic.write = cfg.write;
	ic.selective_hits = cfg.selective_hits;
	ic.mover.copy = kvti_cache_mover_copy;
	/* no flush: the copies run once c->mu is dropped (mover.c) */
	ic.mover.release = kvti_cache_mover_release;
	ic.mover.arg = c;
	if ((err = kvt_index_create(&c->idx, &ic)) ||
	    (err = persist_open(c)))
		goto fail;
	for (; c->nworkers < KVTI_CACHE_WORKERS; c->nworkers++)
		if ((err = -pthread_create(&c->workers[c->nworkers], NULL,
					   kvti_cache_worker_main, c))) {
			kvti_fail(err, "cache: starting the worker threads");
			goto fail;
		}
	if ((err = -pthread_create(&c->room, NULL, kvti_cache_room_main, c))) {
		kvti_fail(err, "cache: starting the room thread");
		goto fail;
	}
	c->have_room = 1;
	if (c->background) {
		if ((err = -pthread_create(&c->bg, NULL, kvti_cache_bg_main,
					   c))) {
			kvti_fail(err, "cache: starting the background thread");
			goto fail;
		}
		c->have_bg = 1;
	}
	if ((err = kvti_cache_devices_open(c, cfg.devices)))
		goto fail;
	/* last: it attaches staging memory to the finished cache */
	if (cfg.remote && (err = kvti_cache_remote_open(c, cfg.remote)))
		goto fail;
	*out = c;
	return 0;
fail:
	cache_free(c);
	return err;
}

void kvt_cache_close(kvt_cache *c)
{
	const struct kvti_cache_ext *ext;
	void *arg;

	if (!c)
		return;
	ext = c->ext;
	arg = c->ext_arg;
	if (ext)
		ext->stop(arg); /* the remote writer's jobs end first */
	/* cancel what is still running (a job stays on the list, and so
	 * valid, until it is finished, which takes smu) */
	pthread_mutex_lock(&c->smu);
	for (kvt_cache_job *j = c->live; j; j = j->lnext)
		kvt_cache_job_cancel(j);
	while (c->jobs)
		pthread_cond_wait(&c->scv, &c->smu);
	pthread_mutex_unlock(&c->smu);
	cache_free(c);
	if (ext)
		ext->free(arg); /* its staging memory outlived the copies */
}

int kvti_cache_open_stage(kvt_cache *c)
{
	kvt_tier_spec s;
	char spec[96];
	size_t n;
	int err;

	if (!c->tiers[KVT_TIER_SSD] || c->stage)
		return 0;
	/* registered with the devices by devices.c, like the owned tiers */
	snprintf(spec, sizeof(spec), "dram:%llu",
		 (unsigned long long)(STAGE_SLOTS * kvti_cache_page_bytes(c)));
	if ((err = kvt_tier_spec_parse(spec, &s, 1, &n)))
		return err;
	return kvt_tier_open(&c->stage, &s, &c->geom);
}

/* One (token, head) row: D*s bytes, the head stride of packed memory. */
static uint64_t row_bytes(const kvt_cache *c)
{
	return c ? (uint64_t)c->geom.head_dim * c->geom.dtype_bytes : 0;
}

/* kvt_cache_register() (@reg), kvt_cache_attach(), kvt_cache_attach_rows():
 * check, wrap, link. */
static int mem_attach(kvt_cache *c, void *const *base, uint32_t nlayers,
		      uint64_t nblocks, uint64_t block_stride,
		      uint64_t kv_stride, uint64_t token_stride,
		      uint64_t head_stride, int device, int reg,
		      kvt_cache_mem **out)
{
	kvt_cache_mem *m;
	kvt_layout l;
	kvt_tier *t = NULL;
	int err;

	kvti_errclear();
	if (!c || !base)
		return kvti_fail(-EINVAL, "cache register: no base pointers");
	if (nlayers != c->L)
		return kvti_fail(KVT_EGEOM, "cache register: %u layers, the "
				 "geometry (%s) has %u", nlayers, c->geom.name,
				 c->L);
	if (!nblocks || nblocks > KVT_POOL_MAX_SLOTS)
		return kvti_fail(-EINVAL, "cache register: %llu blocks",
				 (unsigned long long)nblocks);
	if ((err = kvt_layout_init_rows(&l, &c->geom, nblocks, block_stride,
					kv_stride, token_stride, head_stride)))
		return err;
	if (device >= 0 && kvt_layout_rows(&l) > 1)
		return kvti_fail(KVT_ENOTBUILT, "cache register: device memory "
				 "whose chunks are kept in rows (token stride "
				 "%llu, head stride %llu) is not supported: the "
				 "device copies move whole chunks",
				 (unsigned long long)token_stride,
				 (unsigned long long)head_stride);
	if (device >= 0 && !kvti_dev_is_emu(device)) {
		char note[128] = "";
		int ngpu = 0;

		if (!kvti_cuda_built())
			return kvti_fail(KVT_ENOTBUILT, "cache register: GPU "
					 "memory in a build without CUDA");
		if ((err = kvti_cuda_device_count(&ngpu, note, sizeof(note))))
			return kvti_fail(err, "cache register: GPU memory in a "
					 "build without CUDA");
		if (device >= ngpu)
			return kvti_fail(KVT_ENODEV, "cache register: no GPU %d "
					 "(%d found%s%s)", device, ngpu,
					 note[0] ? ": " : "", note);
	} else if (device >= 0 && device >= KVT_DEVICE_EMU + KVT_DEVICE_EMU_MAX) {
		return kvti_fail(-EINVAL, "cache register: device %d", device);
	}
	if (!(m = kvt_calloc(1, sizeof(*m))))
		return -ENOMEM;
	pthread_mutex_lock(&c->mu);
	if (reg && c->reg) {
		pthread_mutex_unlock(&c->mu);
		kvt_free(m);
		return kvti_fail(KVT_EBUSY, "cache register: memory is already "
				 "registered");
	}
	err = kvt_tier_wrap(&t, &l, base, device);
	if (!err && (device >= 0 || c->stage_ssd))
		err = kvti_cache_open_stage(c);
	/* the device's copies reach the host tiers once they are
	 * registered with it: the first memory of a device does it */
	if (!err && device >= 0)
		err = kvti_cache_dev_use(c, device);
	if (!err) {
		m->c = c;
		m->t = t;
		m->next = c->mems;
		c->mems = m;
		if (reg)
			c->reg = m;
		if (out)
			*out = m;
	} else {
		kvt_tier_close(t);
		kvt_free(m);
	}
	pthread_mutex_unlock(&c->mu);
	return err;
}

int kvt_cache_register(kvt_cache *c, void *const *base, uint32_t nlayers,
		       uint64_t nblocks, uint64_t block_stride,
		       uint64_t kv_stride, uint64_t token_stride, int device)
{
	return mem_attach(c, base, nlayers, nblocks, block_stride, kv_stride,
			  token_stride, row_bytes(c), device, 1, NULL);
}

int kvt_cache_attach(kvt_cache *c, void *const *base, uint32_t nlayers,
		     uint64_t nblocks, uint64_t block_stride,
		     uint64_t kv_stride, uint64_t token_stride, int device,
		     kvt_cache_mem **out)
{
	if (!out)
		return kvti_fail(-EINVAL, "cache attach: no handle to fill");
	return mem_attach(c, base, nlayers, nblocks, block_stride, kv_stride,
			  token_stride, row_bytes(c), device, 0, out);
}

int kvt_cache_attach_rows(kvt_cache *c, void *const *base, uint32_t nlayers,
			  uint64_t nblocks, uint64_t block_stride,
			  uint64_t kv_stride, uint64_t token_stride,
			  uint64_t head_stride, int device,
			  kvt_cache_mem **out)
{
	if (!out)
		return kvti_fail(-EINVAL, "cache attach: no handle to fill");
	return mem_attach(c, base, nlayers, nblocks, block_stride, kv_stride,
			  token_stride, head_stride, device, 0, out);
}

void kvt_cache_detach(kvt_cache_mem *m)
{
	kvt_cache *c;

	if (!m)
		return;
	c = m->c;
	pthread_mutex_lock(&c->smu);
	m->gone = 1;
	while (m->jobs) {
		/* cancel what runs on it; a job between kvti_cache_job_new()
		 * and kvti_cache_job_start() is not live yet: it starts,
		 * then ends */
		for (kvt_cache_job *j = c->live; j; j = j->lnext)
			if (j->mem == m)
				kvt_cache_job_cancel(j);
		pthread_cond_wait(&c->scv, &c->smu);
	}
	pthread_mutex_unlock(&c->smu);
	pthread_mutex_lock(&c->mu);
	for (kvt_cache_mem **p = &c->mems; *p; p = &(*p)->next)
		if (*p == m) {
			*p = m->next;
			break;
		}
	if (c->reg == m)
		c->reg = NULL;
	pthread_mutex_unlock(&c->mu);
	kvt_tier_close(m->t);
	kvt_free(m);
}

/* kvt_cache_tenant_add() with a persistent tier (c->mu held): 1 when the
 * tenant was restored with this salt (nothing to add), 0 to add it, or an
 * error. A tenant restored with another salt loses its pages first. */
static int persist_tenant(kvt_cache *c, uint32_t tenant, uint64_t salt)
{
	int keep, drop;

	pthread_mutex_lock(&c->smu);
	keep = kvtp_tenant_add(c->persist, tenant, salt, &drop);
	pthread_mutex_unlock(&c->smu);
	if (drop)
		return kvt_index_tenant_remove(c->idx, tenant);
	return keep;
}

int kvt_cache_tenant_add(kvt_cache *c, uint32_t tenant, uint64_t salt)
{
	int err = 0;

	pthread_mutex_lock(&c->mu);
	if (c->persist)
		err = persist_tenant(c, tenant, salt);
	if (!err)
		err = kvt_index_tenant_add(c->idx, tenant, salt);
	if (!err && c->persist) {
		pthread_mutex_lock(&c->smu);
		err = kvtp_tenant_note(c->persist, tenant, salt);
		pthread_mutex_unlock(&c->smu);
	}
	kvti_cache_unlock(c);
	return err > 0 ? 0 : err;
}

int kvt_cache_tenant_quota(kvt_cache *c, uint32_t tenant, kvt_tier_kind tier,
			   uint64_t max_pages)
{
	int err;

	kvti_errclear();
	if ((unsigned)tier >= KVT_TIER_COUNT || !c->tiers[tier])
		return kvti_fail(KVT_ENOTFOUND, "cache: no owned %s tier for a "
				 "quota", (unsigned)tier < KVT_TIER_COUNT ?
				 kvt_tier_kind_name(tier) : "?");
	pthread_mutex_lock(&c->mu);
	err = kvt_index_tenant_quota(c->idx, tenant, tier, max_pages);
	kvti_cache_unlock(c);
	return err;
}

int kvt_cache_tenant_usage(kvt_cache *c, uint32_t tenant,
			   kvt_tenant_usage *u)
{
	int err;

	kvti_errclear();
	pthread_mutex_lock(&c->mu);
	err = kvt_index_tenant_usage(c->idx, tenant, u);
	pthread_mutex_unlock(&c->mu);
	return err;
}

int kvt_cache_hash_tokens(kvt_cache *c, uint32_t tenant,
			  const uint32_t *tokens, size_t ntokens,
			  kvt_page_key *keys)
{
	int err;

	pthread_mutex_lock(&c->mu);
	err = kvt_index_hash_tokens(c->idx, tenant, tokens, ntokens, keys);
	pthread_mutex_unlock(&c->mu);
	return err;
}

/* ---- lookup ----------------------------------------------------------------- */

/* Per-page records of keys[0..n) (c->mu held): how many are in the tree. */
int kvti_cache_inspect(kvt_cache *c, uint32_t tenant, const kvt_page_key *keys,
		   size_t n, kvt_page_info **info, size_t *found)
{
	kvt_prefix px = { .tenant = tenant, .keys = keys, .nkeys = n };

	*info = NULL;
	*found = 0;
	if (!n)
		return 0;
	*info = kvt_malloc(n * sizeof(**info));
	if (!*info)
		return -ENOMEM;
	return kvt_index_inspect(c->idx, &px, *info, n, found);
}

/* Runs of the leading loadable pages, as kvt_cache_lookup_runs() says. */
struct runs {
	kvt_cache_run *v;
	size_t max, n;
};

static void run_add(struct runs *ru, int t)
{
	kvt_cache_run *last;

	if (!ru)
		return;
	last = ru->n ? &ru->v[ru->n - 1] : NULL;
	if (last && (last->tier == (uint32_t)t || ru->n == ru->max)) {
		last->pages++;
		if ((uint32_t)t > last->tier) /* the overflow run: slowest */
			last->tier = (uint32_t)t;
		return;
	}
	ru->v[ru->n++] = (kvt_cache_run){ (uint32_t)t, 1 };
}

/* KVT_LOOKUP_EACH: keys[i] is a one-page prefix of its own; the leading
 * run of cached ones, then the run being stored (one inspect per key,
 * under one hold of the locks). */
static int lookup_each(kvt_cache *c, uint32_t tenant, const kvt_page_key *keys,
		       size_t nkeys, unsigned flags, kvt_cache_lookup_result *r,
		       struct runs *ru)
{
	kvt_page_info info;
	int err = 0, hits = 1;

	pthread_mutex_lock(&c->mu);
	for (size_t i = 0; i < nkeys && !err; i++) {
		kvt_prefix px = kvti_cache_page_prefix(tenant, keys + i);
		size_t found = 0;
		int pend = 0, t = -1;

		err = kvt_index_inspect(c->idx, &px, &info, 1, &found);
		if (err)
			break;
		if (found) {
			pthread_mutex_lock(&c->smu);
			t = kvti_cache_best_copy(c, &info, &pend);
			pthread_mutex_unlock(&c->smu);
		}
		if (hits && t >= 0) {
			r->pages++;
			r->tier_pages[t]++;
			run_add(ru, t);
			if (flags & KVT_LOOKUP_TOUCH) {
				kvt_match m;

				err = kvt_index_match(c->idx, &px,
						      KVT_MATCH_TOUCH,
						      kvt_now_ns(), &m, NULL, 0);
			}
			continue;
		}
		hits = 0;
		if (t >= 0 || !pend)
			break;
		r->inflight++;
	}
	kvti_cache_unlock(c);
	return err;
}

static int lookup(kvt_cache *c, uint32_t tenant, const kvt_page_key *keys,
		  size_t nkeys, unsigned flags, kvt_cache_lookup_result *r,
		  struct runs *ru)
{
	kvt_page_info *info;
	size_t found, i;
	int err;

	kvti_errclear();
	if (!r || (nkeys && !keys) ||
	    (flags & ~(KVT_LOOKUP_TOUCH | KVT_LOOKUP_EACH)))
		return kvti_fail(-EINVAL, "cache lookup: bad arguments");
	memset(r, 0, sizeof(*r));
	if (flags & KVT_LOOKUP_EACH)
		return lookup_each(c, tenant, keys, nkeys, flags, r, ru);
	pthread_mutex_lock(&c->mu);
	err = kvti_cache_inspect(c, tenant, keys, nkeys, &info, &found);
	if (!err) {
		pthread_mutex_lock(&c->smu);
		for (i = 0; i < found; i++) {
			int pend, t = kvti_cache_best_copy(c, &info[i], &pend);

			if (t < 0)
				break;
			r->pages++;
			r->tier_pages[t]++;
			run_add(ru, t);
		}
		for (; i < found; i++) {
			int pend;

			if (kvti_cache_best_copy(c, &info[i], &pend) >= 0 ||
			    !pend)
				break;
			r->inflight++;
		}
		pthread_mutex_unlock(&c->smu);
	}
	if (!err && r->pages && (flags & KVT_LOOKUP_TOUCH)) {
		kvt_prefix px = { .tenant = tenant, .keys = keys,
				  .nkeys = r->pages };
		kvt_match m;

		err = kvt_index_match(c->idx, &px, KVT_MATCH_TOUCH, kvt_now_ns(),
				      &m, NULL, 0);
	}
	kvti_cache_unlock(c);
	kvt_free(info);
	if (!err && c->ext) /* network: outside the lock */
		c->ext->lookup(c->ext_arg, keys, nkeys, r);
	return err;
}

int kvt_cache_lookup(kvt_cache *c, uint32_t tenant, const kvt_page_key *keys,
		     size_t nkeys, unsigned flags, kvt_cache_lookup_result *r)
{
	return lookup(c, tenant, keys, nkeys, flags, r, NULL);
}

int kvt_cache_lookup_runs(kvt_cache *c, uint32_t tenant,
			  const kvt_page_key *keys, size_t nkeys,
			  unsigned flags, kvt_cache_lookup_result *r,
			  kvt_cache_run *runs, size_t max, size_t *nruns)
{
	struct runs ru = { runs, max, 0 };
	int err;

	if (!runs || !max || !nruns)
		return kvti_fail(-EINVAL, "cache lookup: no room for runs");
	err = lookup(c, tenant, keys, nkeys, flags, r, &ru);
	*nruns = err ? 0 : ru.n;
	return err;
}

int kvt_cache_rates(kvt_cache *c,
		    kvt_xfer_rate rates[KVT_TIER_COUNT][KVT_TIER_COUNT])
{
	if (!c || !rates)
		return kvti_fail(-EINVAL, "kvt_cache_rates: NULL argument");
	for (int s = 0; s < KVT_TIER_COUNT; s++)
		for (int d = 0; d < KVT_TIER_COUNT; d++)
			kvt_xfer_rate_get(c->x, (kvt_tier_kind)s,
					  (kvt_tier_kind)d, &rates[s][d]);
	return 0;
}

/* ---- accounting, checking -------------------------------------------------- */

void kvt_cache_stat_get(kvt_cache *c, kvt_cache_stat *st)
{
	pthread_mutex_lock(&c->smu);
	*st = c->st;
	pthread_mutex_unlock(&c->smu);
}

int kvt_cache_verify(kvt_cache *c, kvt_cache_check *r)
{
	uint64_t pb = kvti_cache_page_bytes(c), lb = pb / c->L;
	char first[128] = "";
	void *page;
	int err = 0;

	memset(r, 0, sizeof(*r));
	if (!c->verify)
		return kvti_fail(-EINVAL, "cache verify: this cache keeps no "
				 "checksums (KVT_CACHE_NO_VERIFY)");
	page = kvti_aligned_alloc(4096, pb);
	if (!page)
		return -ENOMEM;
	pthread_mutex_lock(&c->smu);
	while (c->jobs) /* job_finish takes c->mu: wait before taking it */
		pthread_cond_wait(&c->scv, &c->smu);
	pthread_mutex_unlock(&c->smu);
	kvt_cache_quiesce(c);
	pthread_mutex_lock(&c->mu);
	pthread_mutex_lock(&c->smu);
	for (int t = 0; t < KVT_TIER_COUNT && !err; t++) {
		struct meta *m = &c->m[t];
		kvt_pool *pool;

		if (!c->tiers[t])
			continue;
		pool = kvt_tier_pool(c->tiers[t]);
		for (uint64_t s = 0; s < m->n; s++) {
			int ok = 1;

			if (!kvt_pool_is_used(pool, (uint32_t)s) ||
			    m->state[s] != ST_OK)
				continue;
			if ((err = kvt_tier_read(c->tiers[t], (uint32_t)s, page)))
				break;
			for (uint32_t l = 0; l < c->L && ok; l++)
				ok = XXH3_64bits((char *)page + l * lb, lb) ==
				     m->sums[s * c->L + l];
			r->checked++;
			r->per_tier[t]++;
			if (!ok && !r->bad++)
				snprintf(first, sizeof(first), "%s slot %llu",
					 kvt_tier_kind_name((kvt_tier_kind)t),
					 (unsigned long long)s);
		}
	}
	pthread_mutex_unlock(&c->smu);
	pthread_mutex_unlock(&c->mu);
	kvt_free(page);
	if (err)
		return err;
	if (r->bad)
		return kvti_fail(KVT_ECORRUPT, "cache: %llu of %llu page copies "
				 "do not match their checksums (first: %s)",
				 (unsigned long long)r->bad,
				 (unsigned long long)r->checked, first);
	return 0;
}

const kvt_geom *kvt_cache_geom(const kvt_cache *c)
{
	return &c->geom;
}

kvt_tier *kvt_cache_tier(kvt_cache *c, kvt_tier_kind k)
{
	if ((unsigned)k >= KVT_TIER_COUNT)
		return NULL;
	if (k == KVT_TIER_HBM)
		return c->reg ? c->reg->t : NULL;
	return c->tiers[k];
}

int kvt_cache_restore_info(kvt_cache *c, kvt_cache_restore *r)
{
	if (!c->persist)
		return kvti_fail(-EINVAL, "cache: no persistent ssd tier (ssd "
				 "spec option 'persist')");
	pthread_mutex_lock(&c->smu);
	kvtp_restore_stat(c->persist, r);
	pthread_mutex_unlock(&c->smu);
	return 0;
}

kvt_index *kvt_cache_index(kvt_cache *c)
{
	return c->idx;
}

kvt_xfer *kvt_cache_xfer(kvt_cache *c)
{
	return c->x;
}

/* ---- extensions (cache_ext.h) ------------------------------------------ */

void kvti_cache_ext_set(kvt_cache *c, const struct kvti_cache_ext *ops,
			void *arg)
{
	c->ext = ops;
	c->ext_arg = arg;
}

void *kvti_cache_ext_arg(const kvt_cache *c, const struct kvti_cache_ext *ops)
{
	return c && c->ext == ops ? c->ext_arg : NULL;
}

void kvti_cache_ext_quiet(kvt_cache_mem *m)
{
	m->quiet = 1;
}
