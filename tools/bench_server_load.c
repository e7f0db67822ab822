/*
 * bench_server_load.c — the timed comparison of `kvtier bench server`:
 * the same pages loaded through the daemon by client processes and by
 * the in-process cache from threads, into the same kind of engine memory,
 * one side after the other in each repeat (alternating which goes first).
 *
 *   daemon side:  'g' to every client process at once -> each loads its
 *                 pages into shuffled blocks, waits, writes its seconds
 *                 -> the makespan on this process's clock
 *   inproc side:  threads released by a barrier -> kvt_cache_load_ex()
 *                 of the same pages, wait -> the makespan likewise
 *   around it:    the daemon's own data-path counts (a monitor's STATS)
 *                 before and after; --baselines one round per repeat
 *
 * Invariants: both sides move the same bytes (clients x pages x page
 * bytes) into the same kind of memory with checksums on; a repeat counts
 * only when both sides finished without error; at least 3 repeats, then
 * as many as --repeats and --seconds allow.
 *
 * Locking: none shared; each thread owns its struct ithread, the barrier
 * is made and destroyed per repeat, the threads joined before the time is
 * taken.
 */
#include "bench_server.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

/* @len bytes of engine memory on @device, each layer @layer bytes set to a
 * pattern of @id (the checksums cover it). */
static int emem_alloc(struct emem *e, int device, uint64_t len,
		      uint32_t layers, uint64_t layer, uint64_t id)
{
	uint8_t *pat;
	int err;

	memset(e, 0, sizeof(*e));
	if (device == KVT_DEVICE_HOST) {
		int fd = memfd_create("kvtier-bench", MFD_CLOEXEC |
				      MFD_ALLOW_SEALING);

		if (fd < 0)
			return -errno;
		if (ftruncate(fd, (off_t)len) < 0 ||
		    fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW) < 0) {
			err = -errno;
			close(fd);
			return err;
		}
		e->p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd,
			    0);
		close(fd);
		if (e->p == MAP_FAILED) {
			e->p = NULL;
			return -errno;
		}
		e->len = len;
		for (uint32_t l = 0; l < layers; l++)
			memset((uint8_t *)e->p + l * layer, (int)(id * 31 + l),
			       layer);
		return 0;
	}
	if ((err = kvt_dev_open(device, &e->dev)) ||
	    (err = kvt_dev_alloc(e->dev, len, &e->p)))
		return err;
	if (!(pat = kvt_malloc(layer)))
		return -ENOMEM;
	for (uint32_t l = 0; l < layers && !err; l++) {
		memset(pat, (int)(id * 31 + l), layer);
		err = kvt_dev_memcpy(e->dev, (uint8_t *)e->p + l * layer, pat,
				     layer);
	}
	kvt_free(pat);
	return err;
}

static void emem_free(struct emem *e)
{
	if (e->dev) {
		kvt_dev_free(e->dev, e->p);
		kvt_dev_close(e->dev);
	} else if (e->p) {
		munmap(e->p, e->len);
	}
	memset(e, 0, sizeof(*e));
}

/* A client process: connect, register, store its pages, then per 'g' byte
 * one timed load; writes its seconds (double) back, < 0 on error. */
int kvti_bs_client_main(const struct sopt *o, const char *sock, uint64_t id,
			int in, int out)
{
	kvt_client_config cc = KVT_CLIENT_CONFIG_INIT;
	uint64_t n = o->pages;
	kvt_client *cl = NULL;
	kvt_client_mem *m = NULL;
	kvt_page_key *keys = malloc(n * sizeof(*keys));
	uint32_t *blk = malloc(n * sizeof(*blk));
	void *base[1024];
	uint64_t bs, ks, ts;
	kvt_client_job *j;
	double err_s = -1;
	struct emem em = { 0 };
	char cmd;
	int rep = 0;

	cc.socket = sock;
	cc.model = o->model;
	cc.page_tokens = (uint32_t)o->page_tokens;
	if (!keys || !blk || kvt_client_connect(&cl, &cc) ||
	    kvt_client_geom(cl)->layers > 1024)
		goto fail;
	if (o->device == KVT_DEVICE_HOST) {
		if (kvt_client_mem_alloc(cl, n, base, &bs, &ks, &ts, &m))
			goto fail;
		/* page bytes: a pattern per client (the checksums cover
		 * them) */
		for (uint32_t l = 0; l < kvt_client_geom(cl)->layers; l++)
			memset(base[l], (int)(id * 31 + l), 2 * ks);
	} else {
		const kvt_geom *g = kvt_client_geom(cl);
		uint64_t chunk = kvt_geom_chunk_bytes(g), layer = 2 * n * chunk;

		bs = chunk;
		ks = n * chunk;
		ts = (uint64_t)g->kv_heads * g->head_dim * g->dtype_bytes;
		if (emem_alloc(&em, o->device, layer * g->layers, g->layers,
			       layer, id))
			goto fail;
		for (uint32_t l = 0; l < g->layers; l++)
			base[l] = (uint8_t *)em.p + l * layer;
		if (kvt_client_register_ptrs(cl, em.dev, base, g->layers, n, bs,
					     ks, ts, &m))
			goto fail;
	}
	for (uint64_t i = 0; i < n; i++) {
		keys[i] = kvti_bs_key_of(id, i);
		blk[i] = (uint32_t)i;
	}
	if (kvt_client_store(cl, m, keys, n, 0, blk, &j) ||
	    kvt_client_job_wait(j, -1))
		goto fail;
	kvt_client_job_free(j);
	if (write(out, &(double){ 0 }, sizeof(double)) != sizeof(double))
		goto fail;
	while (read(in, &cmd, 1) == 1 && cmd == 'g') {
		uint64_t t0;
		double s;

		kvti_bs_shuffle(blk, n, id * 1000 + (uint64_t)rep++);
		t0 = kvt_now_ns();
		if (kvt_client_load(cl, m, keys, n, 0, blk, &j))
			goto fail;
		if (kvt_client_job_wait(j, -1)) {
			kvt_client_job_free(j);
			goto fail;
		}
		kvt_client_job_free(j);
		s = kvti_bs_secs(t0);
		if (write(out, &s, sizeof(s)) != sizeof(s))
			goto fail;
	}
	kvt_client_close(cl);
	emem_free(&em);
	return 0;
fail:
	fprintf(stderr, "kvtier bench server: client %llu: %s\n",
		(unsigned long long)id, kvt_errdetail());
	if (write(out, &err_s, sizeof(err_s)) < 0) {
		/* the parent sees the pipe close */
	}
	kvt_client_close(cl);
	emem_free(&em);
	return 1;
}

static void *ithread_main(void *arg)
{
	struct ithread *t = arg;
	kvt_cache_io io = KVT_CACHE_IO_INIT;
	kvt_cache_job *j;

	io.mem = t->m;
	kvti_bs_shuffle(t->blk, t->n, t->id * 1000 + (uint64_t)t->rep);
	pthread_barrier_wait(t->bar);
	t->err = kvt_cache_load_ex(t->c, 0, t->keys, t->n, 0, t->blk, &io, &j);
	if (!t->err) {
		t->err = kvt_cache_job_wait(j, -1);
		kvt_cache_job_free(j);
	}
	return NULL;
}

static int inproc_setup(kvt_cache *c, struct ithread *t, uint64_t id,
			uint64_t n, int device)
{
	const kvt_geom *g = kvt_cache_geom(c);
	uint64_t chunk = kvt_geom_chunk_bytes(g), layer = 2 * n * chunk;
	kvt_cache_io io = KVT_CACHE_IO_INIT;
	void *base[1024];
	kvt_cache_job *j;
	int err;

	if (g->layers > 1024)
		return -E2BIG;
	t->c = c;
	t->id = id;
	t->n = n;
	if ((err = emem_alloc(&t->mem, device, layer * g->layers, g->layers,
			      layer, id)))
		return err;
	t->keys = kvt_malloc(n * sizeof(*t->keys));
	t->blk = kvt_malloc(n * sizeof(*t->blk));
	if (!t->keys || !t->blk)
		return -ENOMEM;
	for (uint32_t l = 0; l < g->layers; l++)
		base[l] = (uint8_t *)t->mem.p + l * layer;
	for (uint64_t i = 0; i < n; i++) {
		t->keys[i] = kvti_bs_key_of(id, i);
		t->blk[i] = (uint32_t)i;
	}
	if ((err = kvt_cache_attach(c, base, g->layers, n, chunk, n * chunk,
				    (uint64_t)g->kv_heads * g->head_dim *
				    g->dtype_bytes, device, &t->m)))
		return err;
	io.mem = t->m;
	if ((err = kvt_cache_store_ex(c, 0, t->keys, n, 0, t->blk, &io, &j)))
		return err;
	err = kvt_cache_job_wait(j, -1);
	kvt_cache_job_free(j);
	return err;
}

/* The daemon's own data-path counters (a monitor's STATS): restore bytes
 * a CPU copied, restore bytes its devices moved, restore bytes a CPU
 * hashed. -1 each when they cannot be read. */
static void daemon_counts(const char *sock, double v[3])
{
	kvt_client_config cc = KVT_CLIENT_CONFIG_INIT;
	kvt_client *cl = NULL;
	char *js = NULL;
	cJSON *r, *dp, *x;

	v[0] = v[1] = v[2] = -1;
	cc.socket = sock;
	if (kvt_client_connect(&cl, &cc) || kvt_client_stats(cl, &js)) {
		kvt_client_close(cl);
		return;
	}
	r = cJSON_Parse(js);
	dp = cJSON_GetObjectItem(r, "datapath");
	if (cJSON_IsObject(dp)) {
		v[0] = cJSON_GetObjectItem(dp, "restore_cpu_copy_bytes")->valuedouble;
		v[1] = 0;
		cJSON_ArrayForEach(x, cJSON_GetObjectItem(dp, "bytes"))
			if (!strcmp(cJSON_GetObjectItem(x, "flow")->valuestring,
				    "restore") &&
			    (!strcmp(cJSON_GetObjectItem(x, "mover")->valuestring,
				     "kernel") ||
			     !strcmp(cJSON_GetObjectItem(x, "mover")->valuestring,
				     "copy_engine")))
				v[1] += cJSON_GetObjectItem(x, "bytes")->valuedouble;
		v[2] = cJSON_GetObjectItem(cJSON_GetObjectItem(dp, "cpu_hashed"),
					   "restore")->valuedouble;
	}
	cJSON_Delete(r);
	free(js);
	kvt_client_close(cl);
}

int kvti_bs_inproc_open(struct bsrv *r)
{
	int err;

	r->cc.tiers = r->tiers;
	r->cc.model = r->o.model;
	r->cc.page_tokens = (uint32_t)r->o.page_tokens;
	if ((err = kvt_cache_open(&r->c, &r->cc)))
		return cli_fail("bench server", err);
	for (uint64_t i = 0; i < r->o.clients; i++, r->nth++)
		if ((err = inproc_setup(r->c, &r->th[i], i, r->o.pages,
					r->o.device)))
			return cli_fail("bench server", err);
	kvt_cache_quiesce(r->c);
	return 0;
}

/* The daemon's side of one repeat: release every client at once; the
 * makespan on this process's clock into *@s. */
static int daemon_side(struct bsrv *r, double *s)
{
	uint64_t t0 = kvt_now_ns();

	for (int i = 0; i < r->nch; i++)
		if (write(r->ch[i].go, "g", 1) != 1)
			return CLI_EXIT_FAIL;
	for (int i = 0; i < r->nch; i++) {
		double cs;

		if (kvti_bs_child_read(&r->ch[i], &cs)) {
			fprintf(stderr, "kvtier bench server: client %d "
				"failed\n", i);
			return CLI_EXIT_FAIL;
		}
	}
	*s = kvti_bs_secs(t0);
	return 0;
}

/* The in-process side of one repeat: every thread released by a barrier;
 * the makespan from the release to the last one joined into *@s. */
static int inproc_side(struct bsrv *r, double *s)
{
	pthread_barrier_t bar;
	pthread_t tid[MAX_CLIENTS];
	uint64_t t0;
	int err = 0;

	pthread_barrier_init(&bar, NULL, (unsigned)r->nth + 1);
	for (int i = 0; i < r->nth; i++) {
		r->th[i].bar = &bar;
		r->th[i].rep = r->nrep;
		pthread_create(&tid[i], NULL, ithread_main, &r->th[i]);
	}
	pthread_barrier_wait(&bar);
	t0 = kvt_now_ns();
	for (int i = 0; i < r->nth; i++) {
		pthread_join(tid[i], NULL);
		if (!err)
			err = r->th[i].err;
	}
	*s = kvti_bs_secs(t0);
	pthread_barrier_destroy(&bar);
	return err ? cli_fail("bench server", err) : 0;
}

int kvti_bs_load_run(struct bsrv *r)
{
	const struct sopt *o = &r->o;
	double all = (double)r->bytes * (double)o->clients;
	uint64_t t_start;
	int err, rc;

	daemon_counts(r->sock, r->c0);
	t_start = kvt_now_ns();
	for (; r->nrep < (int)o->repeats &&
	       (r->nrep < 3 || kvti_bs_secs(t_start) < (double)o->seconds);
	     r->nrep++) {
		double dmax = 0, imax = 0;

		for (int side = 0; side < 2; side++) {
			int daemon = (side == 0) == (r->nrep % 2 == 0);

			rc = daemon ? daemon_side(r, &dmax) :
				      inproc_side(r, &imax);
			if (rc)
				return rc;
		}
		r->d_gbps[r->nrep] = all / dmax / 1e9;
		r->i_gbps[r->nrep] = all / imax / 1e9;
		r->ratio[r->nrep] = r->d_gbps[r->nrep] / r->i_gbps[r->nrep];
		if (o->baselines &&
		    (err = kvti_bs_bl_run(&r->bl, r->bl_r[r->nrep])))
			return cli_fail("bench server: baselines", err);
	}
	daemon_counts(r->sock, r->c1);
	return 0;
}

void kvti_bs_inproc_free(struct bsrv *r)
{
	for (int i = 0; i < r->nth || (i < MAX_CLIENTS && r->th[i].mem.p);
	     i++) {
		emem_free(&r->th[i].mem);
		kvt_free(r->th[i].keys);
		kvt_free(r->th[i].blk);
	}
}
