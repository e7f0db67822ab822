/*
 * bench_server.c — kvtier bench server: the node daemon's figures, each
 * measured end to end through the client library.
 *
 *   load ratio   --clients client processes each load --pages pages from
 *                the daemon's dram into their registered memory (request,
 *                shared-memory progress, RELEASE: the whole client path),
 *                against as many threads of this process loading the same
 *                pages through an in-process cache of the same tier into
 *                the same kind of memory (--device: host = a sealed memfd
 *                in vLLM's layout on both sides). Each repeat, in
 *                alternating order, the makespan of each side: from the
 *                moment every client is released to the moment the last
 *                is done, taken by this process. load_ratio_vs_inprocess
 *                = median of the per-repeat ratios of GB/s (goal >= 0.9).
 *   latency      a second daemon with a small model (16-token pages, 8 KiB
 *                each: the lookup's cost is in its keys, not the bytes)
 *                holding one 32k-token prompt: from C, LOOKUP of 1 key and
 *                of the prompt's 2,048 keys, and HASH of its 32,768
 *                tokens, back to back, p50 and p99 (goal: 1 key <= 25 us
 *                p50); with --python, the same from the Python package
 *                (python -m kvtier.bench; goal: the 2,048 keys <= 200 us
 *                p50).
 *   load test    --load-clients processes on the second daemon for
 *                --load-seconds, each in a loop: LOOKUP of its 512-page
 *                prompt, LOAD of 64 of those pages, wait; every fourth
 *                request also a STORE of 8 new pages, wait. Requests per
 *                second, the request latency's p50 and p99, errors (goal
 *                0).
 *
 * Memory kinds are a table (struct memkind): a new --device kind gives the
 * two allocators, the client's and the in-process one.
 */
#include "cli.h"
#include "server/server.h"

#include <kvtier/client.h>

#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#define MAX_CLIENTS 16
#define MAX_REP 64
#define MAX_L 1024
#define LAT_TOKENS 32768        /* the latency prompt */
#define LAT_P 16
#define LT_PAGES 512            /* a load-test client's prompt */
#define LT_LOAD 64              /* pages loaded per request */
#define LT_STORE 8              /* pages stored every 4th request */
#define LT_MAX_SAMPLES (1u << 18)

struct sopt {
	const char *model, *device, *python;
	uint64_t pages, page_tokens, clients, repeats, seconds;
	uint64_t load_clients, load_seconds, reps;
	int json;
};

static double secs(uint64_t t0)
{
	return (kvt_now_ns() - t0) / 1e9;
}

static kvt_page_key key_of(uint64_t client, uint64_t i)
{
	kvt_page_key k = { 0x9e3779b97f4a7c15ull * (i + 1), client + 1 };
	return k;
}

static void shuffle(uint32_t *v, uint64_t n, uint64_t seed)
{
	for (uint64_t i = 0; i < n; i++)
		v[i] = (uint32_t)i;
	for (uint64_t i = n - 1; n && i > 0; i--) {
		uint64_t k;
		uint32_t t;

		seed = seed * 6364136223846793005ull + 1442695040888963407ull;
		k = (seed >> 33) % (i + 1);
		t = v[i];
		v[i] = v[k];
		v[k] = t;
	}
}

static int cmp_d(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return x < y ? -1 : x > y;
}

/* Sorts @v; the @p quantile (0..1). */
static double quantile(double *v, uint64_t n, double p)
{
	if (!n)
		return 0;
	qsort(v, n, sizeof(*v), cmp_d);
	return v[(uint64_t)(p * (double)(n - 1) + 0.5)];
}

static void loadavg(double *l)
{
	FILE *f = fopen("/proc/loadavg", "r");

	*l = -1;
	if (f) {
		if (fscanf(f, "%lf", l) != 1)
			*l = -1;
		fclose(f);
	}
}

/* ---- memory kinds ---------------------------------------------------------- */

/* Engine memory in this process, attached to the in-process cache. */
struct imem {
	uint8_t *map;
	size_t len;
	kvt_cache_mem *m;
	void *base[MAX_L];
};

struct memkind {
	const char *name, *about;
	/* a client process's @n blocks, registered with its daemon */
	int (*client)(kvt_client *cl, uint64_t n, void **base, uint64_t *ks,
		      kvt_client_mem **m);
	/* the same kind of memory here, attached to cache @c */
	int (*inproc)(kvt_cache *c, uint64_t n, struct imem *im);
	void (*inproc_free)(struct imem *im);
};

static int host_client(kvt_client *cl, uint64_t n, void **base, uint64_t *ks,
		       kvt_client_mem **m)
{
	return kvt_client_mem_alloc(cl, n, base, NULL, ks, NULL, m);
}

/* A sealed memfd, mapped shared, in the layout kvt_client_mem_alloc()
 * makes (per layer, page-aligned: K chunks of every block, then V). */
static int host_inproc(kvt_cache *c, uint64_t n, struct imem *im)
{
	const kvt_geom *g = kvt_cache_geom(c);
	uint64_t chunk = kvt_geom_chunk_bytes(g), ps = 4096;
	uint64_t layer = (kvt_geom_kv(g) * n * chunk + ps - 1) / ps * ps;
	int fd, err;

	if (g->layers > MAX_L)
		return -E2BIG;
	im->len = (size_t)(layer * g->layers);
	fd = memfd_create("kvtier-bench", MFD_CLOEXEC | MFD_ALLOW_SEALING);
	if (fd < 0)
		return -errno;
	if (ftruncate(fd, (off_t)im->len) < 0 ||
	    fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW) < 0) {
		err = -errno;
		close(fd);
		return err;
	}
	im->map = mmap(NULL, im->len, PROT_READ | PROT_WRITE, MAP_SHARED, fd,
		       0);
	close(fd);
	if (im->map == MAP_FAILED) {
		im->map = NULL;
		return -errno;
	}
	for (uint32_t l = 0; l < g->layers; l++)
		im->base[l] = im->map + l * layer;
	return kvt_cache_attach(c, im->base, g->layers, n, chunk, n * chunk,
				(uint64_t)g->kv_heads * g->head_dim *
				g->dtype_bytes, -1, &im->m);
}

static void host_inproc_free(struct imem *im)
{
	kvt_cache_detach(im->m);
	if (im->map)
		munmap(im->map, im->len);
	memset(im, 0, sizeof(*im));
}

static const struct memkind kinds[] = {
	{ "host", "a sealed memfd in vLLM's layout, shared with the daemon "
		  "(both sides)", host_client, host_inproc, host_inproc_free },
};
#define NKINDS (sizeof(kinds) / sizeof(kinds[0]))

/* The --device kind (parse() checked the name). */
static const struct memkind *kind_of(const char *name)
{
	for (size_t k = 0; k < NKINDS; k++)
		if (!strcmp(kinds[k].name, name))
			return &kinds[k];
	return &kinds[0];
}

/* ---- daemons and client processes ------------------------------------------ */

static kvtd *g_d;

static void on_term(int sig)
{
	(void)sig;
	kvtd_stop(g_d);
}

static pid_t daemon_start(const kvtd_config *cfg)
{
	pid_t pid = fork();

	if (pid == 0) {
		struct sigaction sa = { .sa_handler = on_term };

		if (kvtd_open(&g_d, cfg)) {
			fprintf(stderr, "kvtier bench server: daemon: %s\n",
				kvt_errdetail());
			_exit(3);
		}
		sigaction(SIGTERM, &sa, NULL);
		kvtd_run(g_d);
		kvtd_close(g_d);
		_exit(0);
	}
	for (int i = 0; pid > 0 && i < 300; i++) {
		int st;

		if (!kvt_client_wait_daemon(cfg->socket, 100))
			return pid;
		if (waitpid(pid, &st, WNOHANG) == pid)
			return -1;
	}
	return -1;
}

static void daemon_stop(pid_t d)
{
	if (d > 0) {
		kill(d, SIGTERM);
		waitpid(d, NULL, 0);
	}
}

struct child {
	pid_t pid;
	int go, back; /* parent's ends: commands to, results from */
};

typedef int child_fn(const struct sopt *o, const char *sock, uint64_t id,
		     int in, int out);

/* Process @id; ch[0..id) are the ones started before (their pipe ends are
 * closed in the new child, or they would never see EOF). */
static int child_start(struct child *ch, const struct sopt *o,
		       const char *sock, uint64_t id, child_fn *fn)
{
	struct child *me = &ch[id];
	int a[2], b[2];

	if (pipe(a) || pipe(b))
		return -errno;
	me->pid = fork();
	if (me->pid == 0) {
		for (uint64_t k = 0; k < id; k++) {
			close(ch[k].go);
			close(ch[k].back);
		}
		close(a[1]);
		close(b[0]);
		_exit(fn(o, sock, id, a[0], b[1]));
	}
	close(a[0]);
	close(b[1]);
	me->go = a[1];
	me->back = b[0];
	return me->pid < 0 ? -errno : 0;
}

static void children_end(struct child *ch, int n)
{
	for (int i = 0; i < n; i++) {
		close(ch[i].go);
		close(ch[i].back);
		waitpid(ch[i].pid, NULL, 0);
	}
}

static int read_all(int fd, void *p, size_t n)
{
	for (size_t got = 0; got < n;) {
		ssize_t r = read(fd, (char *)p + got, n - got);

		if (r <= 0)
			return -1;
		got += (size_t)r;
	}
	return 0;
}

static int child_read(struct child *ch, double *s)
{
	return read_all(ch->back, s, sizeof(*s)) || *s < 0 ? -1 : 0;
}

/* A load-ratio client: connect, register, store its pages; then per 'g'
 * one load waited for; writes 0 after setup and after each load, < 0 on
 * an error. */
static int ratio_client(const struct sopt *o, const char *sock, uint64_t id,
			int in, int out)
{
	const struct memkind *mk = kind_of(o->device);
	kvt_client_config cc = KVT_CLIENT_CONFIG_INIT;
	uint64_t n = o->pages, ks = 0;
	kvt_client *cl = NULL;
	kvt_client_mem *m = NULL;
	kvt_page_key *keys = malloc(n * sizeof(*keys));
	uint32_t *blk = malloc(n * sizeof(*blk));
	void *base[MAX_L];
	kvt_client_job *j;
	double ok = 0, bad = -1;
	char cmd;
	int rep = 0;

	cc.socket = sock;
	cc.model = o->model;
	cc.page_tokens = (uint32_t)o->page_tokens;
	if (!keys || !blk || kvt_client_connect(&cl, &cc) ||
	    kvt_client_geom(cl)->layers > MAX_L ||
	    mk->client(cl, n, base, &ks, &m))
		goto fail;
	for (uint64_t i = 0; i < n; i++) {
		keys[i] = key_of(id, i);
		blk[i] = (uint32_t)i;
	}
	for (uint32_t l = 0; l < kvt_client_geom(cl)->layers; l++)
		memset(base[l], (int)(id * 31 + l), 2 * ks);
	if (kvt_client_store(cl, m, keys, n, 0, blk, &j) ||
	    kvt_client_job_wait(j, -1))
		goto fail;
	kvt_client_job_free(j);
	if (write(out, &ok, sizeof(ok)) != sizeof(ok))
		goto fail;
	while (read(in, &cmd, 1) == 1 && cmd == 'g') {
		shuffle(blk, n, id * 1000 + (uint64_t)rep++);
		if (kvt_client_load(cl, m, keys, n, 0, blk, &j))
			goto fail;
		if (kvt_client_job_wait(j, -1)) {
			kvt_client_job_free(j);
			goto fail;
		}
		kvt_client_job_free(j);
		if (write(out, &ok, sizeof(ok)) != sizeof(ok))
			goto fail;
	}
	kvt_client_close(cl);
	return 0;
fail:
	fprintf(stderr, "kvtier bench server: client %llu: %s\n",
		(unsigned long long)id, kvt_errdetail());
	if (write(out, &bad, sizeof(bad)) < 0) {
		/* the parent sees the pipe close */
	}
	kvt_client_close(cl);
	return 1;
}

/* ---- the in-process side (threads) ---------------------------------------- */

struct ithread {
	kvt_cache *c;
	struct imem im;
	uint64_t id, n;
	kvt_page_key *keys;
	uint32_t *blk;
	pthread_barrier_t *bar;
	int err, rep;
};

static void *ithread_main(void *arg)
{
	struct ithread *t = arg;
	kvt_cache_io io = KVT_CACHE_IO_INIT;
	kvt_cache_job *j;

	io.mem = t->im.m;
	shuffle(t->blk, t->n, t->id * 1000 + (uint64_t)t->rep);
	pthread_barrier_wait(t->bar);
	t->err = kvt_cache_load_ex(t->c, 0, t->keys, t->n, 0, t->blk, &io, &j);
	if (!t->err) {
		t->err = kvt_cache_job_wait(j, -1);
		kvt_cache_job_free(j);
	}
	return NULL;
}

static int inproc_setup(kvt_cache *c, const struct memkind *mk,
			struct ithread *t, uint64_t id, uint64_t n)
{
	const kvt_geom *g = kvt_cache_geom(c);
	uint64_t chunk = kvt_geom_chunk_bytes(g);
	kvt_cache_io io = KVT_CACHE_IO_INIT;
	kvt_cache_job *j;
	int err;

	t->c = c;
	t->id = id;
	t->n = n;
	t->keys = kvt_malloc(n * sizeof(*t->keys));
	t->blk = kvt_malloc(n * sizeof(*t->blk));
	if (!t->keys || !t->blk)
		return -ENOMEM;
	if ((err = mk->inproc(c, n, &t->im)))
		return err;
	for (uint32_t l = 0; l < g->layers; l++)
		memset(t->im.base[l], (int)(id * 31 + l), 2 * n * chunk);
	for (uint64_t i = 0; i < n; i++) {
		t->keys[i] = key_of(id, i);
		t->blk[i] = (uint32_t)i;
	}
	io.mem = t->im.m;
	if ((err = kvt_cache_store_ex(c, 0, t->keys, n, 0, t->blk, &io, &j)))
		return err;
	err = kvt_cache_job_wait(j, -1);
	kvt_cache_job_free(j);
	return err;
}

/* One repeat of each side: makespans (this process's clock). */
static int ratio_once(struct child *ch, int nch, struct ithread *th, int nth,
		      int rep, double *dspan, double *ispan)
{
	for (int side = 0; side < 2; side++) {
		uint64_t t0;

		if ((side == 0) == (rep % 2 == 0)) {
			t0 = kvt_now_ns();
			for (int i = 0; i < nch; i++)
				if (write(ch[i].go, "g", 1) != 1)
					return -EIO;
			for (int i = 0; i < nch; i++) {
				double s;

				if (child_read(&ch[i], &s))
					return -EIO;
			}
			*dspan = secs(t0);
		} else {
			pthread_barrier_t bar;
			pthread_t tid[MAX_CLIENTS];
			int err = 0;

			pthread_barrier_init(&bar, NULL, (unsigned)nth + 1);
			for (int i = 0; i < nth; i++) {
				th[i].bar = &bar;
				th[i].rep = rep;
				pthread_create(&tid[i], NULL, ithread_main,
					       &th[i]);
			}
			pthread_barrier_wait(&bar);
			t0 = kvt_now_ns();
			for (int i = 0; i < nth; i++) {
				pthread_join(tid[i], NULL);
				err = err ? err : th[i].err;
			}
			*ispan = secs(t0);
			pthread_barrier_destroy(&bar);
			if (err)
				return err;
		}
	}
	return 0;
}

/* ---- latency: one client of the small daemon, from C ------------------------ */

struct lat {
	double hash_p50, hash_p99;
	double one_p50, one_p99, all_p50, all_p99;
	uint64_t keys, reps;
};

static const char *tiny_json =
	"{\"num_hidden_layers\":2,\"num_attention_heads\":1,"
	"\"hidden_size\":64,\"num_key_value_heads\":1,"
	"\"torch_dtype\":\"bfloat16\"}";

static void prompt_tokens(uint32_t *t, size_t n, uint32_t seed)
{
	for (size_t i = 0; i < n; i++)
		t[i] = (uint32_t)(i * 2654435761u) ^ seed;
}

/* Connect to the small daemon and store @n pages of prompt @seed out of
 * fresh memory; its keys in *@keys (kvt_free()). */
static int small_client(const char *sock, const kvt_geom *g, uint32_t seed,
			uint64_t n, kvt_client **cl, kvt_client_mem **m,
			kvt_page_key **keys)
{
	kvt_client_config cc = KVT_CLIENT_CONFIG_INIT;
	uint32_t *tok = kvt_malloc(n * LAT_P * sizeof(*tok));
	uint32_t *blk = kvt_malloc(n * sizeof(*blk));
	void *base[MAX_L];
	kvt_client_job *j;
	int err;

	*keys = kvt_malloc(n * sizeof(**keys));
	cc.socket = sock;
	cc.geom = g;
	if (!tok || !blk || !*keys) {
		err = -ENOMEM;
		goto out;
	}
	prompt_tokens(tok, n * LAT_P, seed);
	for (uint64_t i = 0; i < n; i++)
		blk[i] = (uint32_t)i;
	if ((err = kvt_client_connect(cl, &cc)) ||
	    (err = kvt_client_mem_alloc(*cl, n, base, NULL, NULL, NULL, m)) ||
	    (err = kvt_client_hash_tokens(*cl, tok, n * LAT_P, *keys)) ||
	    (err = kvt_client_store(*cl, *m, *keys, n, 0, blk, &j)))
		goto out;
	err = kvt_client_job_wait(j, -1);
	kvt_client_job_free(j);
out:
	kvt_free(tok);
	kvt_free(blk);
	return err;
}

static int latency(const char *sock, const kvt_geom *g, uint64_t reps,
		   struct lat *r)
{
	uint64_t n = LAT_TOKENS / LAT_P;
	double *v = kvt_malloc(reps * sizeof(*v));
	uint32_t *tok = kvt_malloc(LAT_TOKENS * sizeof(*tok));
	kvt_page_key *keys = NULL, *hk = kvt_malloc(n * sizeof(*hk));
	kvt_cache_lookup_result lr;
	kvt_client_mem *m = NULL;
	kvt_client *cl = NULL;
	int err;

	memset(r, 0, sizeof(*r));
	r->keys = n;
	r->reps = reps;
	if (!v || !tok || !hk) {
		err = -ENOMEM;
		goto out;
	}
	if ((err = small_client(sock, g, 7, n, &cl, &m, &keys)))
		goto out;
	prompt_tokens(tok, LAT_TOKENS, 7);
	for (int what = 0; what < 3 && !err; what++) {
		for (uint64_t i = 0; i < reps && !err; i++) {
			uint64_t t0 = kvt_now_ns();

			err = what == 0 ? kvt_client_hash_tokens(cl, tok,
						LAT_TOKENS, hk) :
			      kvt_client_lookup(cl, keys, what == 1 ? 1 : n, 0,
						&lr);
			v[i] = (kvt_now_ns() - t0) / 1e3;
			if (!err && what == 2 && lr.pages != n) {
				fprintf(stderr, "kvtier bench server: the "
					"prompt's lookup found %llu of %llu "
					"pages\n", (unsigned long long)lr.pages,
					(unsigned long long)n);
				err = KVT_ENOTFOUND;
			}
		}
		if (what == 0) {
			r->hash_p99 = quantile(v, reps, 0.99);
			r->hash_p50 = quantile(v, reps, 0.50);
		} else if (what == 1) {
			r->one_p99 = quantile(v, reps, 0.99);
			r->one_p50 = quantile(v, reps, 0.50);
		} else {
			r->all_p99 = quantile(v, reps, 0.99);
			r->all_p50 = quantile(v, reps, 0.50);
		}
	}
	if (!err && memcmp(hk, keys, n * sizeof(*hk))) {
		fprintf(stderr, "kvtier bench server: HASH gave other keys "
			"than at store\n");
		err = KVT_ECORRUPT;
	}
out:
	kvt_client_close(cl);
	kvt_free(v);
	kvt_free(tok);
	kvt_free(keys);
	kvt_free(hk);
	return err;
}

/* ---- the load test: processes on the small daemon ---------------------------- */

struct lt_result {
	uint64_t requests, errors, nsamples;
};

static kvt_geom g_tiny;

/* A load-test client: on 'g', requests for --load-seconds; writes a
 * struct lt_result, then nsamples latencies (us, doubles). */
static int lt_client(const struct sopt *o, const char *sock, uint64_t id,
		     int in, int out)
{
	struct lt_result res = { 0 };
	double *lat = malloc(LT_MAX_SAMPLES * sizeof(*lat));
	uint32_t blk[LT_LOAD], sblk[LT_STORE], stok[LT_STORE * LAT_P];
	kvt_page_key *keys = NULL, skeys[LT_STORE];
	kvt_client_mem *m = NULL;
	kvt_client *cl = NULL;
	uint64_t end, seq = 0;
	char cmd;
	int err;

	err = !lat ? -ENOMEM :
	      small_client(sock, &g_tiny, 100 + (uint32_t)id, LT_PAGES, &cl,
			   &m, &keys);
	if (write(out, &(double){ err ? -1.0 : 0.0 }, sizeof(double)) !=
	    sizeof(double) || err)
		goto out;
	if (read(in, &cmd, 1) != 1 || cmd != 'g')
		goto out;
	for (uint32_t i = 0; i < LT_STORE; i++)
		sblk[i] = LT_LOAD + i;
	end = kvt_now_ns() + o->load_seconds * 1000000000ull;
	while (kvt_now_ns() < end) {
		uint64_t t0 = kvt_now_ns(), r = res.requests;
		kvt_cache_lookup_result lr;
		kvt_client_job *j;
		int e;

		shuffle(blk, LT_LOAD, id * 7919 + r);
		e = kvt_client_lookup(cl, keys, LT_PAGES, KVT_LOOKUP_TOUCH,
				      &lr);
		if (!e && lr.pages != LT_PAGES)
			e = KVT_ENOTFOUND;
		if (!e && !(e = kvt_client_load(cl, m, keys, LT_LOAD, 0, blk,
						&j))) {
			e = kvt_client_job_wait(j, -1);
			kvt_client_job_free(j);
		}
		if (!e && r % 4 == 3) { /* a new 8-page prompt */
			prompt_tokens(stok, LT_STORE * LAT_P, (uint32_t)(100 +
				      id) ^ (uint32_t)(++seq << 20));
			if (!(e = kvt_client_hash_tokens(cl, stok, LT_STORE *
							 LAT_P, skeys)) &&
			    !(e = kvt_client_store(cl, m, skeys, LT_STORE, 0,
						   sblk, &j))) {
				e = kvt_client_job_wait(j, -1);
				kvt_client_job_free(j);
			}
		}
		res.errors += e != 0;
		res.requests++;
		if (res.nsamples < LT_MAX_SAMPLES)
			lat[res.nsamples++] = (kvt_now_ns() - t0) / 1e3;
	}
	if (write(out, &res, sizeof(res)) == sizeof(res) &&
	    write(out, lat, res.nsamples * sizeof(*lat)) !=
	    (ssize_t)(res.nsamples * sizeof(*lat)))
		err = -EIO;
out:
	kvt_client_close(cl);
	kvt_free(keys);
	free(lat);
	return err ? 1 : 0;
}

struct lt_sum {
	uint64_t requests, errors;
	double rps, p50, p99;
};

static int load_test(struct child *ch, int n, double seconds,
		     struct lt_sum *s)
{
	double *all = NULL;
	uint64_t nall = 0;
	int err = 0;

	memset(s, 0, sizeof(*s));
	for (int i = 0; i < n; i++)
		if (write(ch[i].go, "g", 1) != 1)
			return -EIO;
	for (int i = 0; i < n && !err; i++) {
		struct lt_result r;
		double *grow;

		if (read_all(ch[i].back, &r, sizeof(r)) ||
		    r.nsamples > LT_MAX_SAMPLES) {
			err = -EIO;
			break;
		}
		grow = realloc(all, (nall + r.nsamples + 1) * sizeof(*all));
		if (!grow) {
			err = -ENOMEM;
			break;
		}
		all = grow;
		if (read_all(ch[i].back, all + nall,
			     r.nsamples * sizeof(*all))) {
			err = -EIO;
			break;
		}
		nall += r.nsamples;
		s->requests += r.requests;
		s->errors += r.errors;
	}
	if (!err) {
		s->rps = (double)s->requests / seconds;
		s->p99 = quantile(all, nall, 0.99);
		s->p50 = quantile(all, nall, 0.50);
	}
	free(all);
	return err;
}

/* ---- the Python package's figures (--python) ----------------------------- */

/* Run `PY -m kvtier.bench --socket S ...` and take its JSON. */
static cJSON *python_figures(const char *py, const char *sock,
			     const char *model, uint64_t reps)
{
	char cmd[1024], buf[4096];
	size_t n = 0;
	FILE *f;
	cJSON *j;

	snprintf(cmd, sizeof(cmd), "%s -m kvtier.bench --socket '%s' --model "
		 "'%s' --page-tokens %d --tokens %d --reps %llu 2>&1", py, sock,
		 model, LAT_P, LAT_TOKENS, (unsigned long long)reps);
	if (!(f = popen(cmd, "r")))
		return NULL;
	while (n < sizeof(buf) - 1 && fgets(buf + n, (int)(sizeof(buf) - n), f))
		n += strlen(buf + n);
	buf[n] = 0;
	if (pclose(f) != 0 || !(j = cJSON_Parse(buf))) {
		j = cJSON_CreateObject();
		cJSON_AddStringToObject(j, "skipped", "python -m kvtier.bench "
					"failed");
		cJSON_AddStringToObject(j, "output", buf);
	}
	return j;
}

/* ---- the command -------------------------------------------------------------- */

static void server_usage(FILE *f)
{
	fprintf(f,
"usage: kvtier bench server [options]\n"
"\n"
"The node daemon's figures through the client library: load GB/s against\n"
"an in-process cache (same memory kind, makespans, repeats alternating),\n"
"LOOKUP and HASH latency of a 32k-token prompt, an N-client load test.\n"
"Goals: load_ratio_vs_inprocess >= 0.9; 1-key lookup p50 <= 25 us; with\n"
"--python, the 32k prompt's lookup <= 200 us p50 from Python; no errors.\n"
"\n"
"  --clients N        load-ratio client processes (and threads) (1)\n"
"  --pages N          pages per load-ratio client (64)\n"
"  --model NAME       load-ratio geometry preset (llama-3.1-8b)\n"
"  --page-tokens P    its tokens per page (32: 4 MiB pages)\n"
"  --device KIND      engine memory of both sides: host (a sealed memfd)\n"
"  --repeats N        load-ratio repeats (9, at most 64)\n"
"  --seconds S        stop repeating after S seconds (60)\n"
"  --reps N           latency samples per figure (2000)\n"
"  --load-clients N   load-test processes (8)\n"
"  --load-seconds S   load-test length (10)\n"
"  --python PY        also measure through the Python package (PY -m\n"
"                     kvtier.bench; PYTHONPATH as in the environment)\n"
"  --json             one JSON object on stdout (docs/FORMATS.md)\n");
}

static int parse(int argc, char **argv, struct sopt *o)
{
	static const struct option lo[] = {
		{ "clients", required_argument, 0, 'c' },
		{ "pages", required_argument, 0, 'n' },
		{ "model", required_argument, 0, 'm' },
		{ "page-tokens", required_argument, 0, 'p' },
		{ "device", required_argument, 0, 'd' },
		{ "repeats", required_argument, 0, 'r' },
		{ "seconds", required_argument, 0, 's' },
		{ "reps", required_argument, 0, 'R' },
		{ "load-clients", required_argument, 0, 'L' },
		{ "load-seconds", required_argument, 0, 'S' },
		{ "python", required_argument, 0, 'y' },
		{ "json", no_argument, 0, 'j' },
		{ "help", no_argument, 0, 'h' },
		{ 0, 0, 0, 0 }
	};
	int opt, known = 0;

	optind = 1;
	while ((opt = getopt_long(argc, argv, "h", lo, NULL)) != -1) {
		switch (opt) {
		case 'c': if (cli_u64("--clients", optarg, 1, MAX_CLIENTS, &o->clients)) return -1; break;
		case 'n': if (cli_u64("--pages", optarg, 1, 4096, &o->pages)) return -1; break;
		case 'm': o->model = optarg; break;
		case 'p': if (cli_u64("--page-tokens", optarg, 1, 4096, &o->page_tokens)) return -1; break;
		case 'd': o->device = optarg; break;
		case 'r': if (cli_u64("--repeats", optarg, 1, MAX_REP, &o->repeats)) return -1; break;
		case 's': if (cli_u64("--seconds", optarg, 1, 3600, &o->seconds)) return -1; break;
		case 'R': if (cli_u64("--reps", optarg, 10, 1000000, &o->reps)) return -1; break;
		case 'L': if (cli_u64("--load-clients", optarg, 1, MAX_CLIENTS, &o->load_clients)) return -1; break;
		case 'S': if (cli_u64("--load-seconds", optarg, 1, 3600, &o->load_seconds)) return -1; break;
		case 'y': o->python = optarg; break;
		case 'j': o->json = 1; break;
		case 'h': server_usage(stdout); return 1;
		default: server_usage(stderr); return -1;
		}
	}
	if (optind < argc) {
		cli_usage("bench server", "unexpected argument '%s'",
			  argv[optind]);
		return -1;
	}
	for (size_t k = 0; k < NKINDS; k++)
		known |= !strcmp(kinds[k].name, o->device);
	if (!known) {
		cli_usage("bench server", "--device %s: this build knows host",
			  o->device);
		return -1;
	}
	return 0;
}

struct results {
	double d_gbps[MAX_REP], i_gbps[MAX_REP], ratio[MAX_REP];
	int nrep;
	struct lat lat;
	struct lt_sum lt;
	cJSON *py;
	double load0, load1;
};

static void print_json(const struct sopt *o, const kvt_geom *g,
		       const struct results *r)
{
	cJSON *root = cJSON_CreateObject(), *x, *a;
	double rmin = 1e300, rmax = 0, py_all = -1;
	double ratio = cli_median(r->ratio, r->nrep);

	for (int i = 0; i < r->nrep; i++) {
		rmin = r->ratio[i] < rmin ? r->ratio[i] : rmin;
		rmax = r->ratio[i] > rmax ? r->ratio[i] : rmax;
	}
	cJSON_AddNumberToObject(root, "version", 2);
	cJSON_AddStringToObject(root, "bench", "server");
	cJSON_AddStringToObject(root, "device", o->device);
	cJSON_AddNumberToObject(root, "cpus", sysconf(_SC_NPROCESSORS_ONLN));
	cJSON_AddNumberToObject(root, "loadavg_before", r->load0);
	cJSON_AddNumberToObject(root, "loadavg_after", r->load1);
	x = cJSON_AddObjectToObject(root, "load");
	cJSON_AddStringToObject(x, "model", g->name);
	cJSON_AddNumberToObject(x, "page_tokens", g->page_tokens);
	cJSON_AddNumberToObject(x, "page_bytes", (double)kvt_geom_page_bytes(g));
	cJSON_AddNumberToObject(x, "pages", (double)o->pages);
	cJSON_AddNumberToObject(x, "clients", (double)o->clients);
	cJSON_AddNumberToObject(x, "repeats", r->nrep);
	cJSON_AddBoolToObject(x, "verify", 1);
	cJSON_AddStringToObject(x, "memory", kind_of(o->device)->about);
	cJSON_AddNumberToObject(x, "daemon_gbps", cli_median(r->d_gbps, r->nrep));
	cJSON_AddNumberToObject(x, "inproc_gbps", cli_median(r->i_gbps, r->nrep));
	a = cJSON_AddArrayToObject(x, "runs");
	for (int i = 0; i < r->nrep; i++) {
		cJSON *e = cJSON_CreateObject();

		cJSON_AddNumberToObject(e, "daemon_gbps", r->d_gbps[i]);
		cJSON_AddNumberToObject(e, "inproc_gbps", r->i_gbps[i]);
		cJSON_AddItemToArray(a, e);
	}
	cJSON_AddNumberToObject(root, "load_ratio_vs_inprocess", ratio);
	cJSON_AddNumberToObject(root, "load_ratio_vs_inprocess_min", rmin);
	cJSON_AddNumberToObject(root, "load_ratio_vs_inprocess_max", rmax);
	x = cJSON_AddObjectToObject(root, "latency");
	cJSON_AddStringToObject(x, "model", "2 layers, 1 KV head of 64, bf16 "
				"(8 KiB pages)");
	cJSON_AddNumberToObject(x, "page_tokens", LAT_P);
	cJSON_AddNumberToObject(x, "tokens", LAT_TOKENS);
	cJSON_AddNumberToObject(x, "keys", (double)r->lat.keys);
	cJSON_AddNumberToObject(x, "reps", (double)r->lat.reps);
	a = cJSON_AddObjectToObject(x, "lookup_1_key");
	cJSON_AddNumberToObject(a, "lookup_us_p50", r->lat.one_p50);
	cJSON_AddNumberToObject(a, "lookup_us_p99", r->lat.one_p99);
	a = cJSON_AddObjectToObject(x, "lookup_32k_prompt");
	cJSON_AddNumberToObject(a, "lookup_us_p50", r->lat.all_p50);
	cJSON_AddNumberToObject(a, "lookup_us_p99", r->lat.all_p99);
	cJSON_AddNumberToObject(x, "hash_us_p50", r->lat.hash_p50);
	cJSON_AddNumberToObject(x, "hash_us_p99", r->lat.hash_p99);
	x = cJSON_AddObjectToObject(root, "load_test");
	cJSON_AddNumberToObject(x, "clients", (double)o->load_clients);
	cJSON_AddNumberToObject(x, "seconds", (double)o->load_seconds);
	cJSON_AddStringToObject(x, "request", "LOOKUP of a 512-page prompt, "
				"LOAD of 64 of its pages (waited), every 4th "
				"request a STORE of 8 new pages (waited)");
	cJSON_AddNumberToObject(x, "requests", (double)r->lt.requests);
	cJSON_AddNumberToObject(x, "throughput_rps", r->lt.rps);
	cJSON_AddNumberToObject(x, "latency_us_p50", r->lt.p50);
	cJSON_AddNumberToObject(x, "latency_us_p99", r->lt.p99);
	cJSON_AddNumberToObject(x, "errors", (double)r->lt.errors);
	if (r->py) {
		cJSON *l = cJSON_GetObjectItem(r->py, "lookup_32k_prompt");
		cJSON *p = l ? cJSON_GetObjectItem(l, "lookup_us_p50") : NULL;

		py_all = cJSON_IsNumber(p) ? p->valuedouble : -1;
		cJSON_AddItemToObject(root, "python", cJSON_Duplicate(r->py, 1));
	} else {
		x = cJSON_AddObjectToObject(root, "python");
		cJSON_AddStringToObject(x, "skipped", "no --python");
	}
	x = cJSON_AddObjectToObject(root, "goals");
	cJSON_AddNumberToObject(x, "load_ratio_vs_inprocess", 0.9);
	cJSON_AddBoolToObject(x, "load_ratio_vs_inprocess_met", ratio >= 0.9);
	cJSON_AddNumberToObject(x, "lookup_1_key_us_p50", 25);
	cJSON_AddBoolToObject(x, "lookup_1_key_us_p50_met",
			      r->lat.one_p50 <= 25);
	cJSON_AddNumberToObject(x, "python_lookup_32k_us_p50", 200);
	if (py_all >= 0)
		cJSON_AddBoolToObject(x, "python_lookup_32k_us_p50_met",
				      py_all <= 200);
	cJSON_AddBoolToObject(x, "load_test_errors_0", r->lt.errors == 0);
	cli_json_print(root);
}

static void print_text(const struct sopt *o, const kvt_geom *g,
		       const struct results *r)
{
	double ratio = cli_median(r->ratio, r->nrep);

	printf("bench server (load average %.2f -> %.2f on %ld cpus)\n",
	       r->load0, r->load1, sysconf(_SC_NPROCESSORS_ONLN));
	printf("  load: %s, %llu pages of %llu bytes, %llu client%s, %s "
	       "memory, %d repeats\n", g->name, (unsigned long long)o->pages,
	       (unsigned long long)kvt_geom_page_bytes(g),
	       (unsigned long long)o->clients, o->clients > 1 ? "s" : "",
	       o->device, r->nrep);
	printf("    daemon %.2f GB/s, in-process %.2f GB/s (medians of "
	       "makespans)\n", cli_median(r->d_gbps, r->nrep),
	       cli_median(r->i_gbps, r->nrep));
	printf("    load_ratio_vs_inprocess %.2f: goal >= 0.9 %s\n", ratio,
	       ratio >= 0.9 ? "met" : "MISSED");
	printf("  latency (from C, %llu samples each):\n",
	       (unsigned long long)r->lat.reps);
	printf("    lookup 1 key           p50 %7.1f us  p99 %7.1f us  goal "
	       "p50 <= 25: %s\n", r->lat.one_p50, r->lat.one_p99,
	       r->lat.one_p50 <= 25 ? "met" : "MISSED");
	printf("    lookup %llu keys (32k) p50 %7.1f us  p99 %7.1f us\n",
	       (unsigned long long)r->lat.keys, r->lat.all_p50,
	       r->lat.all_p99);
	printf("    hash %d tokens       p50 %7.1f us  p99 %7.1f us\n",
	       LAT_TOKENS, r->lat.hash_p50, r->lat.hash_p99);
	printf("  load test: %llu clients, %llu s: %.0f requests/s, p50 %.0f "
	       "us, p99 %.0f us, %llu errors\n",
	       (unsigned long long)o->load_clients,
	       (unsigned long long)o->load_seconds, r->lt.rps, r->lt.p50,
	       r->lt.p99, (unsigned long long)r->lt.errors);
	if (r->py) {
		char *s = cJSON_PrintUnformatted(r->py);

		printf("  python: %s\n", s ? s : "?");
		free(s);
	}
}

int bench_server(int argc, char **argv)
{
	struct sopt o = { .model = "llama-3.1-8b", .device = "host",
			  .pages = 64, .page_tokens = 32, .clients = 1,
			  .repeats = 9, .seconds = 60, .reps = 2000,
			  .load_clients = 8, .load_seconds = 10 };
	static struct ithread th[MAX_CLIENTS];
	static struct results res;
	struct child ch[MAX_CLIENTS], lt[MAX_CLIENTS];
	kvt_cache_config cc = KVT_CACHE_CONFIG_INIT;
	kvtd_config dc = { 0 }, ds = { 0 };
	char sock[108], ssock[108], tiers[64], stiers[64];
	char dir[64], cfgpath[128];
	const struct memkind *mk = kind_of(o.device);
	kvt_cache *c = NULL;
	kvt_geom g;
	pid_t d = -1, dsm = -1;
	int rc = CLI_EXIT_FAIL, nch = 0, nlt = 0, nth = 0, err;
	uint64_t t_start, bytes;
	FILE *f;

	memset(th, 0, sizeof(th));
	memset(&res, 0, sizeof(res));
	if ((rc = parse(argc, argv, &o)))
		return rc > 0 ? 0 : CLI_EXIT_USAGE;
	rc = CLI_EXIT_FAIL;
	mk = kind_of(o.device);
	if ((err = cli_geom(&g, o.model, (uint32_t)o.page_tokens, 1, 0)) ||
	    (err = kvt_geom_from_json(&g_tiny, tiny_json, "tiny", LAT_P, 1, 0)))
		return cli_fail("bench server", err);
	/* the small daemon's model: a config.json of its own */
	snprintf(dir, sizeof(dir), "/tmp/kvtier-bench-%d", (int)getpid());
	snprintf(cfgpath, sizeof(cfgpath), "%s/config.json", dir);
	if (mkdir(dir, 0700) < 0 || !(f = fopen(cfgpath, "w")) ||
	    fputs(tiny_json, f) < 0 || fclose(f))
		return cli_fail("bench server", -errno);
	bytes = o.pages * kvt_geom_page_bytes(&g);
	/* room for every client's pages, and the watermark's slack */
	snprintf(tiers, sizeof(tiers), "dram:%llu",
		 (unsigned long long)(bytes * o.clients * 5 / 4 +
				      kvt_geom_page_bytes(&g) * 4));
	snprintf(stiers, sizeof(stiers), "dram:%llu",
		 (unsigned long long)(kvt_geom_page_bytes(&g_tiny) * 4 *
				      (LAT_TOKENS / LAT_P + (LT_PAGES + 64) *
				       o.load_clients)));
	snprintf(sock, sizeof(sock), "%s/load.sock", dir);
	snprintf(ssock, sizeof(ssock), "%s/small.sock", dir);
	dc.socket = sock;
	dc.tiers = tiers;
	dc.model = o.model;
	dc.page_tokens = (uint32_t)o.page_tokens;
	dc.lease_ms = 3600 * 1000;
	ds.socket = ssock;
	ds.tiers = stiers;
	ds.model = cfgpath;
	ds.page_tokens = LAT_P;
	ds.lease_ms = 3600 * 1000;
	signal(SIGPIPE, SIG_IGN);
	/* processes first, threads after */
	d = daemon_start(&dc);
	dsm = d > 0 ? daemon_start(&ds) : -1;
	if (d < 0 || dsm < 0) {
		fprintf(stderr, "kvtier bench server: a daemon did not start\n");
		goto out;
	}
	for (uint64_t i = 0; i < o.clients; i++, nch++)
		if (child_start(ch, &o, sock, i, ratio_client))
			goto out;
	for (uint64_t i = 0; i < o.load_clients; i++, nlt++)
		if (child_start(lt, &o, ssock, i, lt_client))
			goto out;
	for (int i = 0; i < nch + nlt; i++) {
		double s;

		if (child_read(i < nch ? &ch[i] : &lt[i - nch], &s)) {
			fprintf(stderr, "kvtier bench server: a client failed "
				"to set up\n");
			goto out;
		}
	}
	loadavg(&res.load0);

	/* load ratio */
	cc.tiers = tiers;
	cc.model = o.model;
	cc.page_tokens = (uint32_t)o.page_tokens;
	if ((err = kvt_cache_open(&c, &cc))) {
		rc = cli_fail("bench server", err);
		goto out;
	}
	for (uint64_t i = 0; i < o.clients; i++, nth++)
		if ((err = inproc_setup(c, mk, &th[i], i, o.pages))) {
			rc = cli_fail("bench server", err);
			goto out;
		}
	kvt_cache_quiesce(c);
	t_start = kvt_now_ns();
	for (; res.nrep < (int)o.repeats && (res.nrep < 3 ||
	       secs(t_start) < (double)o.seconds); res.nrep++) {
		double dspan = 0, ispan = 0, all = (double)bytes * o.clients;

		if ((err = ratio_once(ch, nch, th, nth, res.nrep, &dspan,
				      &ispan))) {
			rc = cli_fail("bench server: load", err);
			goto out;
		}
		res.d_gbps[res.nrep] = all / dspan / 1e9;
		res.i_gbps[res.nrep] = all / ispan / 1e9;
		res.ratio[res.nrep] = res.d_gbps[res.nrep] /
				      res.i_gbps[res.nrep];
	}
	for (int i = 0; i < nth; i++)
		mk->inproc_free(&th[i].im);
	kvt_cache_close(c);
	c = NULL;

	/* latency from C, then from Python; then the load test */
	if ((err = latency(ssock, &g_tiny, o.reps, &res.lat))) {
		rc = cli_fail("bench server: latency", err);
		goto out;
	}
	if (o.python)
		res.py = python_figures(o.python, ssock, cfgpath, o.reps);
	if ((err = load_test(lt, nlt, (double)o.load_seconds, &res.lt))) {
		rc = cli_fail("bench server: load test", err);
		goto out;
	}
	loadavg(&res.load1);
	if (o.json)
		print_json(&o, &g, &res);
	else
		print_text(&o, &g, &res);
	rc = 0;
out:
	children_end(ch, nch);
	children_end(lt, nlt);
	daemon_stop(d);
	daemon_stop(dsm);
	kvt_cache_close(c);
	for (int i = 0; i < MAX_CLIENTS; i++) {
		kvt_free(th[i].keys);
		kvt_free(th[i].blk);
	}
	cJSON_Delete(res.py);
	unlink(cfgpath);
	rmdir(dir);
	return rc;
}
