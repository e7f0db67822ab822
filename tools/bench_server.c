/*
 * bench_server.c — kvtier bench server: how fast the node daemon gets
 * pages from its dram into a client process's registered memory, against
 * the in-process cache doing the same in the same run.
 *
 * Setup (untimed): a daemon in a child process (kvtierd, dram tier only),
 * --clients client processes, each with --pages blocks of registered
 * memory (a sealed memfd, vLLM layout) and its own --pages pages stored
 * through the daemon. In this process: an in-process cache with the same
 * tier, one attached memory and the same pages per client thread. Then,
 * each repeat, in alternating order:
 *
 *   daemon   every client process, released together, loads its pages
 *            into shuffled blocks and waits for the last layer (request,
 *            shared-memory progress, RELEASE of the job: the full
 *            client-library path)
 *   inproc   every client thread does kvt_cache_load_ex() of the same
 *            pages into its memory and waits for the job
 *
 * Both sides load into the same kind of memory (host: a sealed memfd in
 * vLLM's layout, as kvt_client_mem_alloc() makes), and a repeat's time for
 * each side is its makespan on this process's clock: from releasing every
 * client (or thread) to the last one done. GB/s = every client's bytes /
 * that time. Reported: medians over repeats, and load_ratio_vs_inprocess
 * (= daemon_vs_inproc) = the median of the per-repeat ratios (with min,
 * max). Goal (issues 11, 24): >= 0.9, printed as met or MISSED. Checksums
 * are on for both (the daemon's and the cache's defaults).
 *
 * Then (host runs; --reps / --load-seconds for device ones) the daemon's
 * control path, on a second daemon with a small model (16-token pages of
 * 8 KiB: a lookup's cost is in its keys, not in the bytes):
 *
 *   latency    one client holding a 32k-token prompt: LOOKUP of 1 key and
 *              of the prompt's 2,048 keys, HASH of its 32,768 tokens, back
 *              to back, p50 and p99 (goal: 1 key <= 25 us p50 from C);
 *              with --python, the same from the Python package (python -m
 *              kvtier.bench; goal: the 2,048 keys <= 200 us p50)
 *   load test  --load-clients processes for --load-seconds, each in a
 *              loop: LOOKUP of its 512-page prompt, LOAD of 64 of those
 *              pages, wait; every fourth request also a STORE of 8 new
 *              pages, wait. Requests per second, request latency p50 and
 *              p99, errors (goal 0).
 *
 * --device D (emu, cuda:N): the engines' KV is device memory instead —
 * each client allocates it on the device and registers it by handle, the
 * in-process cache attaches the same kind — so both sides load by device
 * copies from page-locked dram, verified by the device's checksum kernel
 * (issue 20's goal: daemon_vs_inproc >= 0.9). cpu_copy_bytes is the
 * daemon's own count of page bytes a CPU thread copied into engine memory
 * during the timed loads (its STATS: datapath.restore_cpu_copy_bytes):
 * 0 on this path. On the emulated device the "device" copies are made by
 * its stream threads — CPU copies, counted as the device's (the JSON says
 * so: emulated).
 */
#include "cli.h"
#include "server/server.h"

#include <kvtier/client.h>
#include <kvtier/dev.h>
#include <cjson/cJSON.h>

#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <xxhash.h>
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
	const char *model, *python;
	uint64_t pages, page_tokens, clients, repeats, seconds;
	uint64_t reps, load_clients, load_seconds; /* 0: that phase off */
	int json;
	int device;          /* KVT_DEVICE_HOST: memfd memory */
	int baselines;       /* --baselines */
};

/* Engine memory of one client or thread: host (a sealed memfd mapped
 * shared, the kind kvt_client_mem_alloc() registers: both sides load into
 * the same kind of memory) or device memory (kvt_dev_alloc()). */
struct emem {
	kvt_dev *dev;
	void *p;
	size_t len;          /* host: the mapping */
};

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

static int kvti_is_emu(int id)
{
	return id >= KVT_DEVICE_EMU && id < KVT_DEVICE_EMU + KVT_DEVICE_EMU_MAX;
}

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
	for (uint64_t i = n - 1; i > 0; i--) {
		uint64_t k;
		uint32_t t;

		seed = seed * 6364136223846793005ull + 1442695040888963407ull;
		k = (seed >> 33) % (i + 1);
		t = v[i];
		v[i] = v[k];
		v[k] = t;
	}
}

/* ---- the daemon and its clients (child processes) ------------------------ */

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

struct child {
	pid_t pid;
	int go, back; /* parent's ends: commands to, results from */
};

/* A client process: connect, register, store its pages, then per 'g' byte
 * one timed load; writes its seconds (double) back, < 0 on error. */
static int client_main(const struct sopt *o, const char *sock, uint64_t id,
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
		keys[i] = key_of(id, i);
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

		shuffle(blk, n, id * 1000 + (uint64_t)rep++);
		t0 = kvt_now_ns();
		if (kvt_client_load(cl, m, keys, n, 0, blk, &j))
			goto fail;
		if (kvt_client_job_wait(j, -1)) {
			kvt_client_job_free(j);
			goto fail;
		}
		kvt_client_job_free(j);
		s = secs(t0);
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

typedef int child_fn(const struct sopt *o, const char *sock, uint64_t id,
		     int in, int out);

/* Process @id running @fn; ch[0..id) are the ones started before (their
 * pipe ends are closed in the new child, or they would never see EOF). */
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

static int child_read(struct child *ch, double *s)
{
	return read(ch->back, s, sizeof(*s)) == sizeof(*s) && *s >= 0 ? 0 : -1;
}

/* ---- the in-process cache (threads) ---------------------------------------- */

struct ithread {
	kvt_cache *c;
	kvt_cache_mem *m;
	struct emem mem;
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

	io.mem = t->m;
	shuffle(t->blk, t->n, t->id * 1000 + (uint64_t)t->rep);
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
		t->keys[i] = key_of(id, i);
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

/* ---- the baselines (--baselines): the same bytes by other means ---------- */

/*
 * In this process, the transfer engine moves the same pages between
 * page-locked dram and device memory: one contiguous copy of all their
 * bytes (the link's limit), batched copy-engine DMA of the chunks
 * (cudaMemcpyBatchAsync), one copy per chunk (vLLM's swap_blocks), the
 * gather kernel without and with per-layer verification on the device;
 * and stores: device -> dram batched with device-side layer sums, against
 * one contiguous copy the other way.
 */
enum { B_CONTIG, B_BATCH, B_CHUNK, B_KERNEL, B_KERNEL_V, B_STORE,
       B_STORE_CONTIG, B_COUNT };
static const char *const b_names[B_COUNT] = {
	"contig_gbps", "batch_gbps", "chunk_gbps", "kernel_gbps",
	"kernel_verify_gbps", "store_gbps", "store_contig_gbps",
};

struct bl {
	kvt_xfer *x;
	kvt_dev *dev;
	kvt_tier *dram, *back, *hbm;
	uint32_t *ss, *ds;
	uint64_t *sums, n, bytes;
};

static kvt_tier *bl_tier(struct bl *b, const char *spec, const kvt_geom *g,
			 int reg)
{
	kvt_tier_spec ts;
	kvt_tier *t = NULL;
	size_t n;

	if (kvt_tier_spec_parse(spec, &ts, 1, &n) || kvt_tier_open(&t, &ts, g))
		return NULL;
	if (reg && kvt_dev_host_register(b->dev, kvt_tier_bufs(t)[0],
			kvt_layout_region_bytes(kvt_tier_layout(t)))) {
		kvt_tier_close(t);
		return NULL;
	}
	return t;
}

static void bl_free(struct bl *b)
{
	kvt_xfer_destroy(b->x);
	if (b->dram)
		kvt_dev_host_unregister(b->dev, kvt_tier_bufs(b->dram)[0]);
	if (b->back)
		kvt_dev_host_unregister(b->dev, kvt_tier_bufs(b->back)[0]);
	kvt_tier_close(b->dram);
	kvt_tier_close(b->back);
	kvt_tier_close(b->hbm);
	kvt_dev_close(b->dev);
	kvt_free(b->ss);
	kvt_free(b->ds);
	kvt_free(b->sums);
	memset(b, 0, sizeof(*b));
}

static int bl_setup(struct bl *b, const kvt_geom *g, int device, uint64_t n)
{
	uint64_t page = kvt_geom_page_bytes(g), lb = page / g->layers;
	char spec[96], dn[16];
	int err;

	memset(b, 0, sizeof(*b));
	b->n = n;
	b->bytes = n * page;
	if ((err = kvt_dev_open(device, &b->dev)) ||
	    (err = kvt_xfer_create(&b->x, NULL)))
		goto fail;
	snprintf(spec, sizeof(spec), "dram:%llu", (unsigned long long)b->bytes);
	b->dram = bl_tier(b, spec, g, 1);
	b->back = bl_tier(b, spec, g, 1);
	snprintf(spec, sizeof(spec), "hbm:%llu,device=%s",
		 (unsigned long long)b->bytes,
		 kvt_device_format(device, dn, sizeof(dn)));
	b->hbm = bl_tier(b, spec, g, 0);
	b->ss = kvt_malloc(n * sizeof(*b->ss));
	b->ds = kvt_malloc(n * sizeof(*b->ds));
	b->sums = kvt_malloc(n * g->layers * sizeof(*b->sums));
	if (!b->dram || !b->back || !b->hbm || !b->ss || !b->ds || !b->sums) {
		err = kvt_errdetail()[0] ? -EINVAL : -ENOMEM;
		goto fail;
	}
	for (uint64_t i = 0; i < b->bytes / 8; i++)
		((uint64_t *)kvt_tier_bufs(b->dram)[0])[i] = i * 0x9e3779b97f4a7c15ull;
	for (uint64_t i = 0; i < n; i++) {
		b->ss[i] = (uint32_t)i;
		for (uint32_t l = 0; l < g->layers; l++)
			b->sums[i * g->layers + l] = XXH3_64bits(
				(uint8_t *)kvt_tier_slot_ptr(b->dram, (uint32_t)i) +
				l * lb, lb);
	}
	shuffle(b->ds, n, 7);
	return 0;
fail:
	bl_free(b);
	return err ? err : -EINVAL;
}

static int bl_job(struct bl *b, int load, int method, unsigned flags,
		  double *gbps)
{
	kvt_xfer_desc d = { .src = load ? b->dram : b->hbm,
			    .dst = load ? b->hbm : b->back,
			    .src_slots = load ? b->ss : b->ds,
			    .dst_slots = load ? b->ds : b->ss, .npages = b->n,
			    .method = method, .flags = flags,
			    .sums = flags ? b->sums : NULL };
	kvt_xfer_job *j;
	uint64_t t0 = kvt_now_ns();
	int err = kvt_xfer_submit(b->x, &d, &j);

	if (!err) {
		err = kvt_xfer_wait(j, -1);
		kvt_xfer_job_free(j);
	}
	*gbps = (double)b->bytes / secs(t0) / 1e9;
	return err;
}

/* One round of every baseline, GB/s into @r. */
static int bl_run(struct bl *b, double *r)
{
	double sec;
	int err;

	if ((err = kvt_xfer_contig_copy(b->x, b->dram, b->hbm, b->bytes, 0,
					&sec)))
		return err;
	r[B_CONTIG] = (double)b->bytes / sec / 1e9;
	if ((err = kvt_xfer_contig_copy(b->x, b->hbm, b->back, b->bytes, 0,
					&sec)))
		return err;
	r[B_STORE_CONTIG] = (double)b->bytes / sec / 1e9;
	if ((err = bl_job(b, 1, KVT_XFER_CUDA_BATCH, 0, &r[B_BATCH])) ||
	    (err = bl_job(b, 1, KVT_XFER_CUDA_CHUNK, 0, &r[B_CHUNK])) ||
	    (err = bl_job(b, 1, KVT_XFER_CUDA_KERNEL, 0, &r[B_KERNEL])) ||
	    (err = bl_job(b, 1, KVT_XFER_CUDA_KERNEL, KVT_XFER_LVERIFY,
			  &r[B_KERNEL_V])) ||
	    (err = bl_job(b, 0, KVT_XFER_CUDA_BATCH, KVT_XFER_LSUM,
			  &r[B_STORE])))
		return err;
	return 0;
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

/* ---- the control path: a second daemon, a small model ------------------- */

/* Sorts @v; the @p quantile (0..1). */
static double quantile(double *v, uint64_t n, double p);

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

/* The control-path figures into the JSON (those measured). */
static void control_json(cJSON *root, const struct sopt *o,
			 const struct lat *l, const struct lt_sum *t,
			 cJSON *py)
{
	cJSON *x, *a, *goals = cJSON_AddObjectToObject(root, "goals");
	double py_all = -1;

	cJSON_AddNumberToObject(goals, "load_ratio_vs_inprocess", 0.9);
	if (o->reps) {
		x = cJSON_AddObjectToObject(root, "latency");
		cJSON_AddStringToObject(x, "model", "2 layers, 1 KV head of "
					"64, bf16 (8 KiB pages), a daemon of "
					"its own");
		cJSON_AddNumberToObject(x, "page_tokens", LAT_P);
		cJSON_AddNumberToObject(x, "tokens", LAT_TOKENS);
		cJSON_AddNumberToObject(x, "keys", (double)l->keys);
		cJSON_AddNumberToObject(x, "reps", (double)l->reps);
		a = cJSON_AddObjectToObject(x, "lookup_1_key");
		cJSON_AddNumberToObject(a, "lookup_us_p50", l->one_p50);
		cJSON_AddNumberToObject(a, "lookup_us_p99", l->one_p99);
		a = cJSON_AddObjectToObject(x, "lookup_32k_prompt");
		cJSON_AddNumberToObject(a, "lookup_us_p50", l->all_p50);
		cJSON_AddNumberToObject(a, "lookup_us_p99", l->all_p99);
		cJSON_AddNumberToObject(x, "hash_us_p50", l->hash_p50);
		cJSON_AddNumberToObject(x, "hash_us_p99", l->hash_p99);
		cJSON_AddNumberToObject(goals, "lookup_1_key_us_p50", 25);
		cJSON_AddBoolToObject(goals, "lookup_1_key_us_p50_met",
				      l->one_p50 <= 25);
	}
	if (o->load_seconds) {
		x = cJSON_AddObjectToObject(root, "load_test");
		cJSON_AddNumberToObject(x, "clients", (double)o->load_clients);
		cJSON_AddNumberToObject(x, "seconds", (double)o->load_seconds);
		cJSON_AddStringToObject(x, "request", "LOOKUP of a 512-page "
					"prompt, LOAD of 64 of its pages "
					"(waited), every 4th request a STORE "
					"of 8 new pages (waited)");
		cJSON_AddNumberToObject(x, "requests", (double)t->requests);
		cJSON_AddNumberToObject(x, "throughput_rps", t->rps);
		cJSON_AddNumberToObject(x, "latency_us_p50", t->p50);
		cJSON_AddNumberToObject(x, "latency_us_p99", t->p99);
		cJSON_AddNumberToObject(x, "errors", (double)t->errors);
		cJSON_AddBoolToObject(goals, "load_test_errors_0",
				      t->errors == 0);
	}
	if (py) {
		cJSON *p = cJSON_GetObjectItem(py, "lookup_32k_prompt");

		p = p ? cJSON_GetObjectItem(p, "us_p50") : NULL;
		py_all = cJSON_IsNumber(p) ? p->valuedouble : -1;
		cJSON_AddItemToObject(root, "python", cJSON_Duplicate(py, 1));
	} else {
		x = cJSON_AddObjectToObject(root, "python");
		cJSON_AddStringToObject(x, "skipped", o->reps ? "no --python" :
					"no latency phase");
	}
	cJSON_AddNumberToObject(goals, "python_lookup_32k_us_p50", 200);
	if (py_all >= 0)
		cJSON_AddBoolToObject(goals, "python_lookup_32k_us_p50_met",
				      py_all <= 200);
}

static void control_print(const struct sopt *o, const struct lat *l,
			  const struct lt_sum *t, cJSON *py, double load0,
			  double load1)
{
	printf("  load average %.2f -> %.2f on %ld cpus\n", load0, load1,
	       sysconf(_SC_NPROCESSORS_ONLN));
	if (o->reps) {
		printf("  latency from C (a small-model daemon, %llu samples "
		       "each):\n", (unsigned long long)l->reps);
		printf("    lookup 1 key           p50 %7.1f us  p99 %7.1f us  "
		       "goal p50 <= 25: %s\n", l->one_p50, l->one_p99,
		       l->one_p50 <= 25 ? "met" : "MISSED");
		printf("    lookup %llu keys (32k) p50 %7.1f us  p99 %7.1f us\n",
		       (unsigned long long)l->keys, l->all_p50, l->all_p99);
		printf("    hash %d tokens       p50 %7.1f us  p99 %7.1f us\n",
		       LAT_TOKENS, l->hash_p50, l->hash_p99);
	}
	if (o->load_seconds)
		printf("  load test: %llu clients, %llu s: %.0f requests/s, "
		       "p50 %.0f us, p99 %.0f us, %llu errors\n",
		       (unsigned long long)o->load_clients,
		       (unsigned long long)o->load_seconds, t->rps, t->p50,
		       t->p99, (unsigned long long)t->errors);
	if (py) {
		char *js = cJSON_PrintUnformatted(py);

		printf("  python: %s\n", js ? js : "?");
		free(js);
	}
}

/* ---- the run ---------------------------------------------------------------- */

static int cmp_d(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return x < y ? -1 : x > y;
}

static double quantile(double *v, uint64_t n, double p)
{
	if (!n)
		return 0;
	qsort(v, n, sizeof(*v), cmp_d);
	return v[(uint64_t)(p * (double)(n - 1) + 0.5)];
}

static double median(double *v, int n)
{
	double *s = malloc((size_t)n * sizeof(*s)), m;

	if (!s || !n) {
		free(s);
		return 0;
	}
	memcpy(s, v, (size_t)n * sizeof(*s));
	qsort(s, (size_t)n, sizeof(*s), cmp_d);
	m = n % 2 ? s[n / 2] : (s[n / 2 - 1] + s[n / 2]) / 2;
	free(s);
	return m;
}

/* The comparisons, each the median of per-repeat ratios (side by side in
 * one repeat), with their goals. */
static const struct {
	const char *name;
	int num, den;            /* B_* (num -1: the daemon's GB/s) */
	double goal;
	int le;                  /* goal is an upper bound */
} cmp[] = {
	{ "vs_contig", -1, B_CONTIG, 0.9, 0 },
	{ "vs_batch", -1, B_BATCH, 1.25, 0 },
	{ "vs_chunk", -1, B_CHUNK, 3.0, 0 },
	{ "verify_cost", B_KERNEL, B_KERNEL_V, 0.10, 1 },
	{ "stores_vs_contig", B_STORE, B_STORE_CONTIG, 0.8, 0 },
};

static double cmp_value(int c, double (*r)[B_COUNT], const double *dg, int n)
{
	double v[MAX_REP];

	for (int i = 0; i < n; i++) {
		double a = cmp[c].num < 0 ? dg[i] : r[i][cmp[c].num];

		v[i] = a / r[i][cmp[c].den];
		if (cmp[c].le) /* verify_cost: time with / without - 1 */
			v[i] = v[i] - 1;
	}
	return median(v, n);
}

static void bl_json(cJSON *root, double (*r)[B_COUNT], const double *dg,
		    int n)
{
	cJSON *b = cJSON_AddObjectToObject(root, "baselines");

	for (int k = 0; k < B_COUNT; k++) {
		double v[MAX_REP];

		for (int i = 0; i < n; i++)
			v[i] = r[i][k];
		cJSON_AddNumberToObject(b, b_names[k], median(v, n));
	}
	for (size_t c = 0; c < (sizeof(cmp) / sizeof(cmp[0])); c++) {
		double v = cmp_value((int)c, r, dg, n);
		char k[48];

		cJSON_AddNumberToObject(root, cmp[c].name, v);
		snprintf(k, sizeof(k), "%s_goal", cmp[c].name);
		cJSON_AddNumberToObject(root, k, cmp[c].goal);
		snprintf(k, sizeof(k), "%s_met", cmp[c].name);
		cJSON_AddBoolToObject(root, k, cmp[c].le ? v <= cmp[c].goal :
					       v >= cmp[c].goal);
	}
}

static void bl_print(double (*r)[B_COUNT], const double *dg, int n)
{
	for (int k = 0; k < B_COUNT; k++) {
		double v[MAX_REP];

		for (int i = 0; i < n; i++)
			v[i] = r[i][k];
		printf("  %-20s %8.2f GB/s (median)\n", b_names[k],
		       median(v, n));
	}
	for (size_t c = 0; c < (sizeof(cmp) / sizeof(cmp[0])); c++) {
		double v = cmp_value((int)c, r, dg, n);
		int met = cmp[c].le ? v <= cmp[c].goal : v >= cmp[c].goal;

		printf("  %-16s %.2f: goal %s %.2f %s\n", cmp[c].name, v,
		       cmp[c].le ? "<=" : ">=", cmp[c].goal,
		       met ? "met" : "MISSED");
	}
}

static void server_usage(FILE *f)
{
	fprintf(f,
"usage: kvtier bench server [options]\n"
"\n"
"Loads --pages pages from the node daemon's dram into each client\n"
"process's registered memory (the whole client-library path), against\n"
"the in-process cache doing the same from threads into the same kind of\n"
"memory, repeats alternating, makespans; then LOOKUP and HASH latency of a\n"
"32k-token prompt and a load test on a second daemon (a small model).\n"
"Goals: load_ratio_vs_inprocess >= 0.9; 1-key LOOKUP <= 25 us p50 from C;\n"
"with --python, the 32k prompt's LOOKUP <= 200 us p50; no load-test error.\n"
"\n"
"  --clients N       client processes (and in-process threads) (1)\n"
"  --pages N         pages per client (64)\n"
"  --model NAME      geometry preset (llama-3.1-8b)\n"
"  --page-tokens P   tokens per page (32: 4 MiB pages for Llama-3.1-8B)\n"
"  --repeats N       repeats (9, at most 64)\n"
"  --seconds S       stop repeating after S seconds (60)\n"
"  --device D        engine KV in device memory: emu (the emulated\n"
"                    device) or cuda:N; loads are device copies from\n"
"                    page-locked dram, verified on the device; goal >= 0.9\n"
"                    and no CPU copy (cpu_copy_bytes, the daemon's count)\n"
"  --reps N          LOOKUP / HASH latency samples per figure (2000; 0: no\n"
"                    latency phase; default 0 with --device)\n"
"  --load-clients N  load-test processes (8)\n"
"  --load-seconds S  load-test length (10; 0: none; default 0 with\n"
"                    --device)\n"
"  --python PY       also the latency through the Python package (PY -m\n"
"                    kvtier.bench; PYTHONPATH as in the environment)\n"
"  --baselines       with --device: each repeat also moves the same pages\n"
"                    in this process by one contiguous copy, batched DMA,\n"
"                    one copy per chunk, the kernel with and without\n"
"                    verification, and stores: vs_contig (goal >= 0.9),\n"
"                    vs_batch (>= 1.25), vs_chunk (>= 3), verify_cost\n"
"                    (<= 0.10), stores_vs_contig (>= 0.8)\n"
"  --json            one JSON object on stdout\n");
}

int bench_server(int argc, char **argv)
{
	static const struct option lo[] = {
		{ "clients", required_argument, 0, 'c' },
		{ "pages", required_argument, 0, 'n' },
		{ "model", required_argument, 0, 'm' },
		{ "page-tokens", required_argument, 0, 'p' },
		{ "repeats", required_argument, 0, 'r' },
		{ "seconds", required_argument, 0, 's' },
		{ "json", no_argument, 0, 'j' },
		{ "device", required_argument, 0, 'D' },
		{ "baselines", no_argument, 0, 'B' },
		{ "reps", required_argument, 0, 'R' },
		{ "load-clients", required_argument, 0, 'L' },
		{ "load-seconds", required_argument, 0, 'S' },
		{ "python", required_argument, 0, 'y' },
		{ "help", no_argument, 0, 'h' },
		{ 0, 0, 0, 0 }
	};
	struct sopt o = { .model = "llama-3.1-8b", .pages = 64,
			  .page_tokens = 32, .clients = 1, .repeats = 9,
			  .seconds = 60, .device = KVT_DEVICE_HOST,
			  .reps = UINT64_MAX, .load_clients = 8,
			  .load_seconds = UINT64_MAX };
	struct child ch[MAX_CLIENTS], lt[MAX_CLIENTS];
	struct ithread th[MAX_CLIENTS];
	kvtd_config ds = { 0 };
	char dir[64], cfgpath[128], ssock[108], stiers[64];
	struct lat lat = { 0 };
	struct lt_sum lts = { 0 };
	cJSON *py = NULL;
	double load0 = -1, load1 = -1;
	pid_t dsm = -1;
	int nlt = 0, small;
	FILE *f;
	double d_gbps[MAX_REP], i_gbps[MAX_REP], ratio[MAX_REP];
	kvt_cache_config cc = KVT_CACHE_CONFIG_INIT;
	kvtd_config dc = { 0 };
	char sock[108], tiers[64], tmp[32], devname[16] = "host";
	double cpu_copy = -1, dev_restore = -1, cpu_hash = -1;
	double goal, c0[3] = { 0 }, c1[3] = { 0 };
	double bl_r[MAX_REP][B_COUNT];
	struct bl bl = { 0 };
	kvt_cache *c = NULL;
	kvt_geom g;
	pid_t d = -1;
	int opt, rc = CLI_EXIT_FAIL, nrep = 0, nch = 0, nth = 0, err;
	uint64_t t_start, bytes;

	memset(th, 0, sizeof(th));
	optind = 1;
	while ((opt = getopt_long(argc, argv, "h", lo, NULL)) != -1) {
		switch (opt) {
		case 'c':
			if (cli_u64("--clients", optarg, 1, MAX_CLIENTS,
				    &o.clients))
				return CLI_EXIT_USAGE;
			break;
		case 'n':
			if (cli_u64("--pages", optarg, 1, 4096, &o.pages))
				return CLI_EXIT_USAGE;
			break;
		case 'm': o.model = optarg; break;
		case 'p':
			if (cli_u64("--page-tokens", optarg, 1, 4096,
				    &o.page_tokens))
				return CLI_EXIT_USAGE;
			break;
		case 'r':
			if (cli_u64("--repeats", optarg, 1, MAX_REP,
				    &o.repeats))
				return CLI_EXIT_USAGE;
			break;
		case 's':
			if (cli_u64("--seconds", optarg, 1, 3600, &o.seconds))
				return CLI_EXIT_USAGE;
			break;
		case 'j': o.json = 1; break;
		case 'D':
			if ((err = kvt_device_parse(optarg, &o.device)))
				return cli_usage("bench server", "%s",
						 kvt_errdetail());
			break;
		case 'B': o.baselines = 1; break;
		case 'R':
			if (cli_u64("--reps", optarg, 0, 1000000, &o.reps))
				return CLI_EXIT_USAGE;
			break;
		case 'L':
			if (cli_u64("--load-clients", optarg, 1, MAX_CLIENTS,
				    &o.load_clients))
				return CLI_EXIT_USAGE;
			break;
		case 'S':
			if (cli_u64("--load-seconds", optarg, 0, 3600,
				    &o.load_seconds))
				return CLI_EXIT_USAGE;
			break;
		case 'y': o.python = optarg; break;
		case 'h': server_usage(stdout); return 0;
		default: server_usage(stderr); return CLI_EXIT_USAGE;
		}
	}
	if (optind < argc)
		return cli_usage("bench server", "unexpected argument '%s'",
				 argv[optind]);
	goal = 0.9;
	/* the control-path phases: on by default for host runs */
	if (o.reps == UINT64_MAX)
		o.reps = o.device == KVT_DEVICE_HOST ? 2000 : 0;
	if (o.load_seconds == UINT64_MAX)
		o.load_seconds = o.device == KVT_DEVICE_HOST ? 10 : 0;
	if (o.reps && o.reps < 10)
		return cli_usage("bench server", "--reps %llu: at least 10",
				 (unsigned long long)o.reps);
	if (o.baselines && o.device == KVT_DEVICE_HOST)
		return cli_usage("bench server", "--baselines needs --device");
	if ((err = cli_geom(&g, o.model, (uint32_t)o.page_tokens, 1, 0)) ||
	    (err = kvt_geom_from_json(&g_tiny, tiny_json, "tiny", LAT_P, 1, 0)))
		return cli_fail("bench server", err);
	small = o.reps || o.load_seconds;
	/* the small daemon's model: a config.json of its own */
	snprintf(dir, sizeof(dir), "/tmp/kvtier-bench-%d", (int)getpid());
	snprintf(cfgpath, sizeof(cfgpath), "%s/config.json", dir);
	if (small && (mkdir(dir, 0700) < 0 || !(f = fopen(cfgpath, "w")) ||
		      fputs(tiny_json, f) < 0 || fclose(f)))
		return cli_fail("bench server", -errno);
	bytes = o.pages * kvt_geom_page_bytes(&g);
	/* room for every client's pages, and the watermark's slack */
	snprintf(tiers, sizeof(tiers), "dram:%llu",
		 (unsigned long long)(bytes * o.clients * 5 / 4 +
				      kvt_geom_page_bytes(&g) * 4));
	snprintf(sock, sizeof(sock), "/tmp/kvtier-bench-%d.sock", (int)getpid());
	snprintf(ssock, sizeof(ssock), "%s/small.sock", dir);
	snprintf(stiers, sizeof(stiers), "dram:%llu",
		 (unsigned long long)(kvt_geom_page_bytes(&g_tiny) * 4 *
				      (LAT_TOKENS / LAT_P + (LT_PAGES + 64) *
				       o.load_clients)));
	ds.socket = ssock;
	ds.tiers = stiers;
	ds.model = cfgpath;
	ds.page_tokens = LAT_P;
	ds.lease_ms = 3600 * 1000;
	dc.socket = sock;
	dc.tiers = tiers;
	dc.model = o.model;
	dc.page_tokens = (uint32_t)o.page_tokens;
	dc.lease_ms = 3600 * 1000;
	if (o.device != KVT_DEVICE_HOST) {
		kvt_device_format(o.device, devname, sizeof(devname));
		dc.devices = devname;
		cc.devices = devname;
	}
	signal(SIGPIPE, SIG_IGN);
	/* processes first, threads after */
	d = daemon_start(&dc);
	if (d < 0) {
		fprintf(stderr, "kvtier bench server: the daemon did not start\n");
		goto out;
	}
	if (small && (dsm = daemon_start(&ds)) < 0) {
		fprintf(stderr, "kvtier bench server: the small daemon did not "
			"start\n");
		goto out;
	}
	for (uint64_t i = 0; i < o.clients; i++, nch++)
		if (child_start(ch, &o, sock, i, client_main))
			goto out;
	for (uint64_t i = 0; o.load_seconds && i < o.load_clients; i++, nlt++)
		if (child_start(lt, &o, ssock, i, lt_client))
			goto out;
	for (int i = 0; i < nch + nlt; i++) {
		double s;
		if (child_read(i < nch ? &ch[i] : &lt[i - nch], &s)) {
			fprintf(stderr, "kvtier bench server: client %d failed "
				"to set up\n", i);
			goto out;
		}
	}
	loadavg(&load0);
	cc.tiers = tiers;
	cc.model = o.model;
	cc.page_tokens = (uint32_t)o.page_tokens;
	if ((err = kvt_cache_open(&c, &cc))) {
		rc = cli_fail("bench server", err);
		goto out;
	}
	for (uint64_t i = 0; i < o.clients; i++, nth++)
		if ((err = inproc_setup(c, &th[i], i, o.pages, o.device))) {
			rc = cli_fail("bench server", err);
			goto out;
		}
	kvt_cache_quiesce(c);
	if (o.baselines && (err = bl_setup(&bl, &g, o.device, o.pages))) {
		rc = cli_fail("bench server: baselines", err);
		goto out;
	}
	snprintf(tmp, sizeof(tmp), "%llu", (unsigned long long)o.clients);
	daemon_counts(sock, c0);
	t_start = kvt_now_ns();
	for (; nrep < (int)o.repeats && (nrep < 3 || secs(t_start) <
					 (double)o.seconds); nrep++) {
		double dmax = 0, imax = 0;

		for (int side = 0; side < 2; side++) {
			uint64_t t0;

			if ((side == 0) == (nrep % 2 == 0)) {
				/* daemon: release every client at once; the
				 * makespan on this process's clock */
				t0 = kvt_now_ns();
				for (int i = 0; i < nch; i++)
					if (write(ch[i].go, "g", 1) != 1)
						goto out;
				for (int i = 0; i < nch; i++) {
					double s;
					if (child_read(&ch[i], &s)) {
						fprintf(stderr, "kvtier bench "
							"server: client %d "
							"failed\n", i);
						goto out;
					}
				}
				dmax = secs(t0);
			} else {
				pthread_barrier_t bar;
				pthread_t tid[MAX_CLIENTS];

				pthread_barrier_init(&bar, NULL,
						     (unsigned)nth + 1);
				for (int i = 0; i < nth; i++) {
					th[i].bar = &bar;
					th[i].rep = nrep;
					pthread_create(&tid[i], NULL,
						       ithread_main, &th[i]);
				}
				pthread_barrier_wait(&bar);
				t0 = kvt_now_ns();
				for (int i = 0; i < nth; i++) {
					pthread_join(tid[i], NULL);
					if (th[i].err) {
						rc = cli_fail("bench server",
							      th[i].err);
						pthread_barrier_destroy(&bar);
						goto out;
					}
				}
				imax = secs(t0);
				pthread_barrier_destroy(&bar);
			}
		}
		d_gbps[nrep] = (double)bytes * (double)o.clients / dmax / 1e9;
		i_gbps[nrep] = (double)bytes * (double)o.clients / imax / 1e9;
		ratio[nrep] = d_gbps[nrep] / i_gbps[nrep];
		if (o.baselines && (err = bl_run(&bl, bl_r[nrep]))) {
			rc = cli_fail("bench server: baselines", err);
			goto out;
		}
	}
	daemon_counts(sock, c1);
	/* the control path on the small daemon */
	if (o.reps && (err = latency(ssock, &g_tiny, o.reps, &lat))) {
		rc = cli_fail("bench server: latency", err);
		goto out;
	}
	if (o.reps && o.python)
		py = python_figures(o.python, ssock, cfgpath, o.reps);
	if (nlt && (err = load_test(lt, nlt, (double)o.load_seconds, &lts))) {
		rc = cli_fail("bench server: load test", err);
		goto out;
	}
	loadavg(&load1);
	if (c0[0] >= 0 && c1[0] >= 0) {
		cpu_copy = c1[0] - c0[0];
		dev_restore = c1[1] - c0[1];
		cpu_hash = c1[2] - c0[2];
	}
	{
		double rmin = ratio[0], rmax = ratio[0], r = median(ratio, nrep);
		double dg = median(d_gbps, nrep), ig = median(i_gbps, nrep);
		int met = r >= goal && (o.device == KVT_DEVICE_HOST ||
					cpu_copy == 0);

		for (int i = 1; i < nrep; i++) {
			rmin = ratio[i] < rmin ? ratio[i] : rmin;
			rmax = ratio[i] > rmax ? ratio[i] : rmax;
		}
		if (o.json) {
			cJSON *root = cJSON_CreateObject(), *a;

			cJSON_AddNumberToObject(root, "version", 1);
			cJSON_AddStringToObject(root, "bench", "server");
			cJSON_AddStringToObject(root, "model", g.name);
			cJSON_AddNumberToObject(root, "page_tokens",
						g.page_tokens);
			cJSON_AddNumberToObject(root, "page_bytes",
						(double)kvt_geom_page_bytes(&g));
			cJSON_AddNumberToObject(root, "pages", (double)o.pages);
			cJSON_AddNumberToObject(root, "clients",
						(double)o.clients);
			cJSON_AddNumberToObject(root, "repeats", nrep);
			cJSON_AddBoolToObject(root, "verify", 1);
			cJSON_AddNumberToObject(root, "cpus",
						(double)sysconf(_SC_NPROCESSORS_ONLN));
			cJSON_AddNumberToObject(root, "daemon_gbps", dg);
			cJSON_AddNumberToObject(root, "inproc_gbps", ig);
			cJSON_AddNumberToObject(root, "daemon_vs_inproc", r);
			cJSON_AddNumberToObject(root, "daemon_vs_inproc_min",
						rmin);
			cJSON_AddNumberToObject(root, "daemon_vs_inproc_max",
						rmax);
			cJSON_AddNumberToObject(root, "load_ratio_vs_inprocess",
						r);
			cJSON_AddNumberToObject(root,
						"load_ratio_vs_inprocess_min",
						rmin);
			cJSON_AddNumberToObject(root,
						"load_ratio_vs_inprocess_max",
						rmax);
			cJSON_AddStringToObject(root, "timing", "makespan on "
						"the bench process's clock, "
						"the same kind of memory on "
						"both sides");
			cJSON_AddNumberToObject(root, "loadavg_before", load0);
			cJSON_AddNumberToObject(root, "loadavg_after", load1);
			control_json(root, &o, &lat, &lts, py);
			cJSON_AddStringToObject(root, "device", devname);
			cJSON_AddBoolToObject(root, "emulated",
					      kvti_is_emu(o.device));
			cJSON_AddNumberToObject(root, "cpu_copy_bytes", cpu_copy);
			cJSON_AddNumberToObject(root, "device_copy_bytes",
						dev_restore);
			cJSON_AddNumberToObject(root, "cpu_hashed_bytes",
						cpu_hash);
			if (kvti_is_emu(o.device))
				cJSON_AddStringToObject(root, "note",
					"emulated device: its copies are CPU "
					"copies by its stream threads, counted "
					"as device copies (device_copy_bytes); "
					"the baselines' goals are a GPU's and "
					"say nothing here");
			cJSON_AddNumberToObject(root, "goal", goal);
			cJSON_AddBoolToObject(root, "goal_met", met);
			if (o.baselines)
				bl_json(root, bl_r, d_gbps, nrep);
			a = cJSON_AddArrayToObject(root, "runs");
			for (int i = 0; i < nrep; i++) {
				cJSON *x = cJSON_CreateObject();

				cJSON_AddNumberToObject(x, "daemon_gbps",
							d_gbps[i]);
				cJSON_AddNumberToObject(x, "inproc_gbps",
							i_gbps[i]);
				cJSON_AddItemToArray(a, x);
			}
			cli_json_print(root);
		} else {
			printf("bench server: %s, %llu pages of %llu bytes per "
			       "client, %llu client%s, %d repeats\n", g.name,
			       (unsigned long long)o.pages,
			       (unsigned long long)kvt_geom_page_bytes(&g),
			       (unsigned long long)o.clients,
			       o.clients > 1 ? "s" : "", nrep);
			printf("  daemon   %8.2f GB/s (median)\n", dg);
			printf("  inproc   %8.2f GB/s (median)\n", ig);
			if (o.device != KVT_DEVICE_HOST)
				printf("  device %s%s: the daemon's counters over "
				       "the timed loads: %.0f bytes copied by a "
				       "CPU, %.0f by the device, %.0f hashed by "
				       "a CPU\n", devname,
				       kvti_is_emu(o.device) ? " (emulated: its "
				       "copies are CPU copies, counted as the "
				       "device's)" : "", cpu_copy, dev_restore,
				       cpu_hash);
			if (o.baselines)
				bl_print(bl_r, d_gbps, nrep);
			printf("  load_ratio_vs_inprocess %.2f (min %.2f, max "
			       "%.2f; makespans): goal >= %.1f%s %s\n", r, rmin,
			       rmax, goal, o.device == KVT_DEVICE_HOST ? "" :
			       ", no CPU copy", met ? "met" : "MISSED");
			control_print(&o, &lat, &lts, py, load0, load1);
		}
		rc = 0;
	}
out:
	for (int i = 0; i < nch; i++) {
		close(ch[i].go);
		close(ch[i].back);
		waitpid(ch[i].pid, NULL, 0);
	}
	for (int i = 0; i < nlt; i++) {
		close(lt[i].go);
		close(lt[i].back);
		waitpid(lt[i].pid, NULL, 0);
	}
	if (d > 0) {
		kill(d, SIGTERM);
		waitpid(d, NULL, 0);
	}
	if (dsm > 0) {
		kill(dsm, SIGTERM);
		waitpid(dsm, NULL, 0);
	}
	cJSON_Delete(py);
	if (small) {
		unlink(cfgpath);
		rmdir(dir);
	}
	bl_free(&bl);
	kvt_cache_close(c);
	for (int i = 0; i < nth || (i < MAX_CLIENTS && th[i].mem.p); i++) {
		emem_free(&th[i].mem);
		kvt_free(th[i].keys);
		kvt_free(th[i].blk);
	}
	return rc;
}
