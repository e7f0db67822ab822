/*
 * test_server_dev_threads — the GPU data path end to end, on the emulated
 * device, through a real daemon (kvtierd in its own process, this program
 * re-executed) and the client library, the way an engine with its KV in
 * GPU memory uses them:
 *   - register: the engine's device memory by handle (the emulated
 *     device's memfd), opened by the daemon on its own device; stores and
 *     loads move the pages by device copies, verified by the device's
 *     checksum kernel; the daemon's own counters say no CPU thread copied
 *     or hashed a byte on the restore path;
 *   - per-layer readiness on the engine's stream: a stream wait on the job
 *     slot's word before each layer's "attention" (a host function on the
 *     engine's stream) — each runs once its layer is in place and verified,
 *     while later layers are still moving;
 *   - store ordering: the engine's writes run late on its stream, the
 *     store names the IPC event recorded after them, and the stored pages
 *     are the written ones; without the event the daemon stores what was
 *     there before (the missing synchronisation, shown);
 *   - failed pages (not cached) and a corrupted page (a byte flipped in the
 *     daemon's fabric file): those blocks fail, the others land, the device
 *     checksum failure is counted;
 *   - a client killed (kill -9) in the middle of a slow load: the daemon
 *     closes its memory only after its device work is done — no access
 *     outside known memory (the emulated device's faults stay 0), nothing
 *     left open — and serves the next client;
 *   - a daemon restarted over a persistent ssd tier: the pages come back
 *     into device memory through the page-locked bounce, verified on the
 *     device;
 *   - two engines on one device at once, each getting its own pages;
 *   - a daemon killed (kill -9) in the middle of a slow load on which the
 *     engine's stream waits for the last layer: the client library sees
 *     the connection gone and releases the wait itself (the client's wait
 *     words), within a bounded time and without the stream's wait timing
 *     out; the job reports the failure (-ECONNRESET, no failed-list of
 *     zero blocks), and at the moment the stream goes on the engine sees
 *     the job failed, never the missing layers as ready.
 */
#include "server_util.h"
#include "dev/dev.h"

#include <cjson/cJSON.h>
#include <fcntl.h>
#include <pthread.h>
#include <sys/mman.h>
#include <sys/stat.h>

static char sock[108], model[600], dir[512];

/* ---- the daemon, exec'd fresh (this process has devices and threads) ---- */

static pid_t daemon_start(const char *tiers, const char *delay, int write)
{
	char w[8];
	pid_t pid;

	snprintf(w, sizeof(w), "%d", write);
	pid = fork();
	if (pid < 0)
		return -1;
	if (pid == 0) {
		if (delay)
			setenv("KVT_EMU_DELAY_NS_PER_MIB", delay, 1);
		else
			unsetenv("KVT_EMU_DELAY_NS_PER_MIB");
		execl("/proc/self/exe", "test_server_dev_threads", "--daemon",
		      sock, tiers, model, w, (char *)NULL);
		_exit(127);
	}
	for (int i = 0; i < 100; i++) {
		int st;

		if (!kvt_client_wait_daemon(sock, 100))
			return pid;
		if (waitpid(pid, &st, WNOHANG) == pid)
			return -1;
	}
	kill(pid, SIGKILL);
	waitpid(pid, NULL, 0);
	return -1;
}

static int daemon_main(char **argv)
{
	kvtd_config cfg = { 0 };
	struct sigaction sa = { .sa_handler = srv_on_term };
	int err;

	cfg.socket = argv[2];
	cfg.tiers = argv[3];
	cfg.model = argv[4];
	cfg.write = atoi(argv[5]);
	cfg.page_tokens = SRV_P;
	cfg.tp = 1;
	cfg.lease_ms = 20000;
	cfg.devices = "emu"; /* the tiers page-locked for it at start */
	if ((err = kvtd_open(&srv_child_daemon, &cfg))) {
		fprintf(stderr, "daemon: %s (%s)\n", kvt_strerror(err),
			kvt_errdetail());
		return 3;
	}
	sigaction(SIGTERM, &sa, NULL);
	err = kvtd_run(srv_child_daemon);
	kvtd_close(srv_child_daemon);
	return err ? 4 : 0;
}

/* ---- an engine: KV in emulated device memory ----------------------------- */

struct eng {
	kvt_client *cl;
	kvt_dev *dev;
	kvt_dev_stream *s;
	void *mem;
	srv_mem sm;
};

static int eng_open(struct eng *e, uint64_t nb)
{
	uint64_t chunk, layer;
	int err;

	memset(e, 0, sizeof(*e));
	if ((err = srv_connect(&e->cl, sock, model, 0, 1, 0)) ||
	    (err = kvt_dev_open(KVT_DEVICE_EMU, &e->dev)) ||
	    (err = kvt_dev_stream_create(e->dev, &e->s)))
		return err;
	chunk = kvt_geom_chunk_bytes(kvt_client_geom(e->cl));
	layer = 2 * nb * chunk;
	if ((err = kvt_dev_alloc(e->dev, SRV_L * layer, &e->mem)))
		return err;
	memset(e->mem, 0, SRV_L * layer);
	e->sm.nblocks = nb;
	e->sm.chunk = chunk;
	e->sm.bs = chunk;
	e->sm.ks = nb * chunk;
	e->sm.ts = chunk / SRV_P;
	for (uint32_t l = 0; l < SRV_L; l++)
		e->sm.base[l] = (uint8_t *)e->mem + l * layer;
	return kvt_client_register_ptrs(e->cl, e->dev, e->sm.base, SRV_L, nb,
					e->sm.bs, e->sm.ks, e->sm.ts, &e->sm.m);
}

static void eng_close(struct eng *e)
{
	kvt_client_close(e->cl); /* the daemon lets go of the memory */
	kvt_dev_stream_destroy(e->s);
	if (e->mem)
		kvt_dev_free(e->dev, e->mem);
	kvt_dev_close(e->dev);
}

static void keys_of(struct eng *e, uint32_t session, size_t n,
		    kvt_page_key *keys)
{
	uint32_t tok[256 * SRV_P];

	srv_tokens(session, tok, n * SRV_P);
	CHECK_OK(kvt_client_hash_tokens(e->cl, tok, n * SRV_P, keys));
}

/* The daemon's STATS, parsed (cJSON_Delete() it). */
static cJSON *stats(kvt_client *cl)
{
	char *js = NULL;
	cJSON *r;

	CHECK_OK(kvt_client_stats(cl, &js));
	r = cJSON_Parse(js ? js : "");
	free(js);
	CHECK(r != NULL);
	return r;
}

static double jget(cJSON *r, const char *a, const char *b)
{
	cJSON *x = cJSON_GetObjectItem(r, a);

	x = b ? cJSON_GetObjectItem(x, b) : x;
	return cJSON_IsNumber(x) ? x->valuedouble : -1;
}

static double dev0(cJSON *r, const char *k)
{
	cJSON *d = cJSON_GetArrayItem(cJSON_GetObjectItem(r, "devices"), 0);

	return cJSON_IsNumber(cJSON_GetObjectItem(d, k)) ?
	       cJSON_GetObjectItem(d, k)->valuedouble : -1;
}

static double moved(cJSON *r, const char *mover, const char *flow)
{
	cJSON *x;

	cJSON_ArrayForEach(x, cJSON_GetObjectItem(
				cJSON_GetObjectItem(r, "datapath"), "bytes"))
		if (!strcmp(cJSON_GetObjectItem(x, "mover")->valuestring, mover) &&
		    !strcmp(cJSON_GetObjectItem(x, "flow")->valuestring, flow))
			return cJSON_GetObjectItem(x, "bytes")->valuedouble;
	return -1;
}

/* Pages @keys of session @session into blocks 0..n-1, stored; blk2[] the
 * blocks n..2n-1 to load them into. */
static void fill_store(struct eng *e, uint32_t session, uint32_t n,
		       kvt_page_key *keys, uint32_t *blk, uint32_t *blk2)
{
	kvt_client_job *j;

	keys_of(e, session, n, keys);
	for (uint32_t i = 0; i < n; i++) {
		blk[i] = i;
		blk2[i] = n + i;
		srv_fill(&e->sm, blk[i], keys[i]);
	}
	CHECK_OK(kvt_client_store(e->cl, e->sm.m, keys, n, 0, blk, &j));
	CHECK_OK(srv_job_end(j, NULL));
}

/* ---- register, store, load: no CPU copy, verified on the device ---------- */

static void test_basic(void)
{
	enum { N = 24 };
	kvt_page_key keys[N];
	uint32_t blk[N], blk2[N];
	struct eng e;
	kvt_client_job *j;
	long nf = -1;
	double fail0;
	cJSON *r;

	if (eng_open(&e, 2 * N)) {
		fprintf(stderr, "engine: %s\n", kvt_errdetail());
		CHECK(0);
		eng_close(&e);
		return;
	}
	r = stats(e.cl);
	fail0 = jget(r, "datapath", "device_checksum_failures");
	cJSON_Delete(r);
	keys_of(&e, 1, N, keys);
	for (uint32_t i = 0; i < N; i++) {
		blk[i] = i;
		blk2[i] = 2 * N - 1 - i;
		srv_fill(&e.sm, blk[i], keys[i]);
	}
	CHECK_OK(kvt_client_store(e.cl, e.sm.m, keys, N, 0, blk, &j));
	CHECK_OK(srv_job_end(j, &nf));
	CHECK_EQ(nf, 0);
	CHECK_OK(kvt_client_load(e.cl, e.sm.m, keys, N, 0, blk2, &j));
	for (uint32_t l = 0; l < SRV_L; l++)
		CHECK_OK(kvt_client_job_wait_layer(j, l, 10ll * 1000000000));
	CHECK_OK(srv_job_end(j, &nf));
	CHECK_EQ(nf, 0);
	for (uint32_t i = 0; i < N; i++)
		CHECK(srv_holds(&e.sm, blk2[i], keys[i]));
	r = stats(e.cl);
	CHECK_EQ(jget(r, "datapath", "restore_cpu_copy_bytes"), 0);
	CHECK(moved(r, "kernel", "restore") >= N * 2.0 * SRV_L * e.sm.chunk);
	CHECK(moved(r, "copy_engine", "save") >= N * 2.0 * SRV_L * e.sm.chunk);
	CHECK_EQ(moved(r, "cpu", "restore"), 0);
	CHECK_EQ(moved(r, "cpu", "save"), 0);
	CHECK_EQ(jget(cJSON_GetObjectItem(r, "datapath"), "cpu_hashed",
		      "restore"), 0);
	CHECK(jget(cJSON_GetObjectItem(r, "datapath"), "device_hashed",
		   "restore") > 0);
	CHECK(jget(r, "datapath", "device_checksums") >= 2 * N * SRV_L);
	CHECK_EQ(jget(r, "datapath", "device_checksum_failures"), fail0);
	CHECK(cJSON_IsTrue(cJSON_GetObjectItem(cJSON_GetArrayItem(
		cJSON_GetObjectItem(r, "devices"), 0), "emulated")));
	CHECK_EQ(dev0(r, "live_imports"), 1);
	CHECK_EQ(dev0(r, "faults"), 0);
	cJSON_Delete(r);
	eng_close(&e);
}

/* ---- per-layer readiness on the engine's stream ------------------------- */

struct lcheck {
	struct eng *e;
	kvt_client_job *j;
	const kvt_page_key *keys;
	const uint32_t *blk;
	uint32_t n, layer;
	int ok, early;
};

/* Layer l of block @b holds page @key's layer l. */
static int layer_holds(const srv_mem *sm, uint64_t b, kvt_page_key key,
		       uint32_t l)
{
	for (uint32_t k = 0; k < 2; k++) {
		uint64_t s[4] = { key.lo, key.hi, l, k };
		uint64_t seed = XXH3_64bits(s, sizeof(s)) | 1;
		const uint8_t *p = srv_chunk(sm, l, b, k);

		for (uint64_t i = 0; i < sm->chunk; i += 8) {
			uint64_t v = test_rand(&seed);
			if (memcmp(p + i, &v, 8))
				return 0;
		}
	}
	return 1;
}

/* "Attention" for one layer, on the engine's stream. */
static void attend(void *arg)
{
	struct lcheck *c = arg;

	c->ok = 1;
	for (uint32_t i = 0; i < c->n; i++)
		c->ok &= layer_holds(&c->e->sm, c->blk[i], c->keys[i], c->layer);
	c->early = kvt_client_job_poll(c->j) == -EINPROGRESS;
}

static void test_layers(void)
{
	enum { N = 64 };
	kvt_page_key keys[N];
	uint32_t blk[N], blk2[N];
	struct lcheck lc[SRV_L];
	struct eng e;
	kvt_client_job *j;
	long nf = -1;
	int early = 0;

	if (eng_open(&e, 2 * N)) {
		CHECK(0);
		eng_close(&e);
		return;
	}
	fill_store(&e, 2, N, keys, blk, blk2);
	CHECK_OK(kvt_client_load(e.cl, e.sm.m, keys, N, 0, blk2, &j));
	for (uint32_t l = 0; l < SRV_L; l++) {
		lc[l] = (struct lcheck){ &e, j, keys, blk2, N, l, 0, 0 };
		CHECK_OK(kvt_client_job_stream_wait(j, l, e.s));
		CHECK_OK(kvt_dev_stream_host_fn(e.s, attend, &lc[l]));
	}
	CHECK_OK(kvt_dev_stream_sync(e.s));
	for (uint32_t l = 0; l < SRV_L; l++) {
		if (!lc[l].ok)
			fprintf(stderr, "layer %u was not in place when its "
				"stream wait ended\n", l);
		CHECK(lc[l].ok);
		early += lc[l].early;
	}
	/* the daemon's copies take 25 ms a layer here: the first layers'
	 * attention ran while the job was still moving the rest */
	CHECK(lc[0].early);
	CHECK_OK(srv_job_end(j, &nf));
	CHECK_EQ(nf, 0);
	/* a wait past the model's layers is refused */
	CHECK_OK(kvt_client_load(e.cl, e.sm.m, keys, 1, 0, blk2, &j));
	CHECK_ERR(kvt_client_job_stream_wait(j, SRV_L, e.s), -ERANGE);
	CHECK_OK(srv_job_end(j, NULL));
	fprintf(stderr, "layer waits: %d of %d layers' attention started "
		"before the load was done\n", early, SRV_L);
	eng_close(&e);
}

/* ---- store ordering: the engine's IPC event ------------------------------ */

struct writer {
	struct eng *e;
	const kvt_page_key *keys;
	uint32_t n;
};

/* The engine's "kernel" writing its KV, late. */
static void write_late(void *arg)
{
	struct writer *w = arg;

	usleep(300 * 1000);
	for (uint32_t i = 0; i < w->n; i++)
		srv_fill(&w->e->sm, i, w->keys[i]);
}

static int store_after_writes(struct eng *e, kvt_client_event *ev,
			      uint32_t session, int *held)
{
	enum { N = 8 };
	kvt_page_key keys[N];
	uint32_t blk[N], blk2[N];
	struct writer w = { e, keys, N };
	kvt_client_job *j;
	long nf = -1;

	keys_of(e, session, N, keys);
	for (uint32_t i = 0; i < N; i++) {
		blk[i] = i;
		blk2[i] = N + i;
		srv_zero(&e->sm, i);
		srv_zero(&e->sm, N + i);
	}
	CHECK_OK(kvt_dev_stream_host_fn(e->s, write_late, &w));
	if (ev)
		CHECK_OK(kvt_client_event_record(ev, e->s));
	CHECK_OK(kvt_client_store_ev(e->cl, e->sm.m, keys, N, 0, blk, 0,
				     ev ? kvt_client_event_id(ev) : 0, &j));
	CHECK_OK(srv_job_end(j, &nf));
	CHECK_OK(kvt_dev_stream_sync(e->s));
	CHECK_OK(kvt_client_load(e->cl, e->sm.m, keys, N, 0, blk2, &j));
	CHECK_OK(srv_job_end(j, &nf));
	*held = 0;
	for (uint32_t i = 0; i < N; i++)
		*held += srv_holds(&e->sm, blk2[i], keys[i]);
	return N;
}

static void test_store_order(void)
{
	kvt_client_event *ev = NULL;
	struct eng e;
	int n, held;

	if (eng_open(&e, 16)) {
		CHECK(0);
		eng_close(&e);
		return;
	}
	CHECK_OK(kvt_client_event_new(e.cl, e.dev, &ev));
	n = store_after_writes(&e, ev, 3, &held);
	CHECK_EQ(held, n); /* ordered: the written pages were stored */
	n = store_after_writes(&e, NULL, 4, &held);
	CHECK_EQ(held, 0); /* not ordered: what was there before */
	fprintf(stderr, "store ordering: with the event %d of %d pages right, "
		"without it %d\n", n, n, held);
	kvt_client_event_free(ev);
	eng_close(&e);
}

/* ---- failed and corrupted pages ----------------------------------------- */

static void test_failures(const char *fabric)
{
	enum { N = 6 };
	kvt_page_key keys[N];
	uint32_t blk[N], blk2[N], failed[N];
	struct eng e;
	kvt_client_job *j;
	long nf;
	cJSON *r;

	if (eng_open(&e, 2 * N)) {
		CHECK(0);
		eng_close(&e);
		return;
	}
	keys_of(&e, 5, N, keys);
	for (uint32_t i = 0; i < N; i++) {
		blk[i] = i;
		blk2[i] = N + i;
		srv_fill(&e.sm, blk[i], keys[i]);
	}
	/* pages 0..3 stored, 4..5 never */
	CHECK_OK(kvt_client_store(e.cl, e.sm.m, keys, N - 2, 0, blk, &j));
	CHECK_OK(srv_job_end(j, NULL));
	/* flip a byte of page 2, layer 2, in the daemon's fabric file */
	{
		int fd = open(fabric, O_RDWR);
		struct stat st;
		uint8_t *p = MAP_FAILED, *hit;

		CHECK(fd >= 0 && !fstat(fd, &st));
		if (fd >= 0)
			p = mmap(NULL, (size_t)st.st_size, PROT_READ | PROT_WRITE,
				 MAP_SHARED, fd, 0);
		CHECK(p != MAP_FAILED);
		hit = p == MAP_FAILED ? NULL :
		      memmem(p, (size_t)st.st_size, srv_chunk(&e.sm, 0, 2, 0),
			     e.sm.chunk);
		CHECK(hit != NULL);
		if (hit)
			hit[2 * 2 * e.sm.chunk + 5] ^= 0x40; /* layer 2, K */
		if (p != MAP_FAILED)
			munmap(p, (size_t)st.st_size);
		if (fd >= 0)
			close(fd);
	}
	CHECK_OK(kvt_client_load(e.cl, e.sm.m, keys, N, 0, blk2, &j));
	CHECK(kvt_client_job_wait(j, 10ll * 1000000000) != 0);
	nf = kvt_client_job_failed(j, failed, N);
	CHECK_EQ(nf, 3);
	if (nf == 3) {
		CHECK_EQ(failed[0], blk2[2]);
		CHECK_EQ(failed[1], blk2[4]);
		CHECK_EQ(failed[2], blk2[5]);
	}
	kvt_client_job_free(j);
	for (uint32_t i = 0; i < N - 2; i++)
		if (i != 2)
			CHECK(srv_holds(&e.sm, blk2[i], keys[i]));
	r = stats(e.cl);
	CHECK(jget(r, "datapath", "device_checksum_failures") >= 1);
	cJSON_Delete(r);
	eng_close(&e);
}

/* ---- a client killed mid-copy ------------------------------------------- */

static int victim_main(void)
{
	enum { N = 96 };
	kvt_page_key keys[N];
	uint32_t blk[N], blk2[N];
	struct eng e;
	kvt_client_job *j;

	if (eng_open(&e, 2 * N))
		return 2;
	keys_of(&e, 6, N, keys);
	for (uint32_t i = 0; i < N; i++) {
		blk[i] = i;
		blk2[i] = N + i;
		srv_fill(&e.sm, blk[i], keys[i]);
	}
	if (kvt_client_store(e.cl, e.sm.m, keys, N, 0, blk, &j) ||
	    srv_job_end(j, NULL))
		return 3;
	if (kvt_client_load(e.cl, e.sm.m, keys, N, 0, blk2, &j))
		return 4;
	if (write(1, "x", 1) != 1)
		return 5;
	for (;;)
		pause(); /* killed here, mid-load */
}

static void test_killed(void)
{
	int p[2], st;
	pid_t pid;
	char c = 0;
	kvt_client *cl = NULL;
	double live = -1, faults = -1;

	CHECK(pipe(p) == 0);
	pid = fork();
	if (pid == 0) {
		dup2(p[1], 1);
		execl("/proc/self/exe", "test_server_dev_threads", "--victim",
		      sock, model, (char *)NULL);
		_exit(127);
	}
	close(p[1]);
	CHECK(read(p[0], &c, 1) == 1);
	usleep(30 * 1000); /* well into the load's copies */
	kill(pid, SIGKILL);
	waitpid(pid, &st, 0);
	close(p[0]);
	CHECK(WIFSIGNALED(st));
	/* the daemon let go of its memory once its device work was done,
	 * touched nothing it did not know, and serves on */
	CHECK_OK(srv_connect(&cl, sock, model, 0, 1, 0));
	for (int i = 0; cl && i < 100; i++) {
		cJSON *r = stats(cl);

		live = dev0(r, "live_imports");
		faults = dev0(r, "faults");
		cJSON_Delete(r);
		if (live == 0)
			break;
		usleep(50 * 1000);
	}
	CHECK_EQ(live, 0);
	CHECK_EQ(faults, 0);
	kvt_client_close(cl);
	test_basic(); /* the next engine works */
}

/* ---- a daemon restarted over a persistent ssd tier ------------------------ */

static void test_restart(void)
{
	enum { N = 16 };
	char tiers[700];
	kvt_page_key keys[N];
	uint32_t blk[N];
	struct eng e;
	kvt_client_job *j;
	long nf = -1;
	pid_t d;
	cJSON *r;

	snprintf(tiers, sizeof(tiers), "dram:1M ssd:%s/ssd,8M,persist,fresh",
		 dir);
	d = daemon_start(tiers, NULL, KVT_WRITE_THROUGH);
	CHECK(d > 0);
	if (d <= 0)
		return;
	if (!eng_open(&e, N)) {
		keys_of(&e, 7, N, keys);
		for (uint32_t i = 0; i < N; i++) {
			blk[i] = i;
			srv_fill(&e.sm, i, keys[i]);
		}
		CHECK_OK(kvt_client_store(e.cl, e.sm.m, keys, N, 0, blk, &j));
		CHECK_OK(srv_job_end(j, NULL));
		CHECK_OK(kvt_client_quiesce(e.cl));
	}
	eng_close(&e);
	CHECK_EQ(srv_stop(d), 0);
	/* again, over the same directory: the pages come from ssd */
	snprintf(tiers, sizeof(tiers), "dram:1M ssd:%s/ssd,8M,persist", dir);
	d = daemon_start(tiers, NULL, KVT_WRITE_THROUGH);
	CHECK(d > 0);
	if (d <= 0)
		return;
	if (!eng_open(&e, N)) {
		keys_of(&e, 7, N, keys);
		CHECK_OK(kvt_client_load(e.cl, e.sm.m, keys, N, 0, blk, &j));
		CHECK_OK(srv_job_end(j, &nf));
		CHECK_EQ(nf, 0);
		for (uint32_t i = 0; i < N; i++)
			CHECK(srv_holds(&e.sm, i, keys[i]));
		r = stats(e.cl);
		CHECK_EQ(jget(r, "datapath", "restore_cpu_copy_bytes"), 0);
		/* ssd -> bounce is not hashed on the CPU: the device
		 * verified what landed */
		CHECK_EQ(jget(cJSON_GetObjectItem(r, "datapath"), "cpu_hashed",
			      "tier"), 0);
		CHECK(jget(r, "datapath", "device_checksums") >= N * SRV_L);
		cJSON_Delete(r);
	}
	eng_close(&e);
	CHECK_EQ(srv_stop(d), 0);
}

/* ---- two engines on one device --------------------------------------------- */

static void *engine_thread(void *arg)
{
	enum { N = 16 };
	uint32_t session = (uint32_t)(uintptr_t)arg;
	kvt_page_key keys[N];
	uint32_t blk[N], blk2[N];
	struct eng e;
	kvt_client_job *j;
	long nf = -1;
	int bad = 0;

	if (eng_open(&e, 2 * N)) {
		eng_close(&e);
		return (void *)1;
	}
	keys_of(&e, session, N, keys);
	for (int round = 0; round < 4; round++) {
		for (uint32_t i = 0; i < N; i++) {
			blk[i] = i;
			blk2[i] = N + i;
			srv_fill(&e.sm, i, keys[i]);
			srv_zero(&e.sm, N + i);
		}
		if (kvt_client_store(e.cl, e.sm.m, keys, N, 0, blk, &j) ||
		    srv_job_end(j, NULL) ||
		    kvt_client_load(e.cl, e.sm.m, keys, N, 0, blk2, &j) ||
		    srv_job_end(j, &nf) || nf)
			bad = 1;
		for (uint32_t i = 0; i < N; i++)
			bad |= !srv_holds(&e.sm, blk2[i], keys[i]);
	}
	eng_close(&e);
	return (void *)(uintptr_t)bad;
}

static void test_two_engines(void)
{
	pthread_t t[2];
	void *r[2];

	for (int i = 0; i < 2; i++)
		CHECK(!pthread_create(&t[i], NULL, engine_thread,
				      (void *)(uintptr_t)(100 + i)));
	for (int i = 0; i < 2; i++) {
		pthread_join(t[i], &r[i]);
		CHECK(r[i] == NULL);
	}
}

/* ---- a daemon killed while the engine's stream waits ---------------------- */

struct woke {
	kvt_client_job *j;
	_Atomic uint64_t at;     /* ns: when the stream went on */
	int poll;                /* the job, as the engine saw it then */
};

static void stream_woke(void *arg)
{
	struct woke *w = arg;

	w->poll = kvt_client_job_poll(w->j);
	atomic_store(&w->at, kvt_now_ns());
}

static void test_daemon_killed(void)
{
	enum { N = 64 };
	kvt_page_key keys[N];
	uint32_t blk[N], blk2[N], failed[N];
	struct woke w = { 0 };
	struct eng e;
	kvt_client_job *j = NULL;
	uint64_t t_kill;
	pid_t d;
	int st;

	/* 1 s per MiB: 64 pages' layer (128 KiB) takes 125 ms, the load
	 * half a second */
	d = daemon_start("dram:4M", "1000000000", 0);
	CHECK(d > 0);
	if (d <= 0)
		return;
	if (eng_open(&e, 2 * N)) {
		CHECK(0);
		kill(d, SIGKILL);
		waitpid(d, NULL, 0);
		eng_close(&e);
		return;
	}
	/* a stream wait the dead daemon fails to release must show as one:
	 * the emulated device gives up on a value after 10 s here, not 60 */
	kvti_dev_emu_set_wait_limit((kvti_dev *)e.dev, 10ull * 1000000000);
	fill_store(&e, 8, N, keys, blk, blk2);
	CHECK_OK(kvt_client_load(e.cl, e.sm.m, keys, N, 0, blk2, &j));
	w.j = j;
	CHECK_OK(kvt_client_job_stream_wait(j, SRV_L - 1, e.s));
	CHECK_OK(kvt_dev_stream_host_fn(e.s, stream_woke, &w));
	/* layer 0 is in: the load is under way; kill the daemon in it */
	CHECK_OK(kvt_client_job_wait_layer(j, 0, 10ll * 1000000000));
	CHECK_EQ(kvt_client_job_poll(j), -EINPROGRESS);
	t_kill = kvt_now_ns();
	kill(d, SIGKILL);
	waitpid(d, &st, 0);
	CHECK(WIFSIGNALED(st));
	/* the stream goes on within a bounded time (here: 3 s; it takes
	 * milliseconds), and not because its wait timed out */
	while (!atomic_load(&w.at) && kvt_now_ns() - t_kill < 3000000000ull)
		usleep(1000);
	CHECK(atomic_load(&w.at) != 0);
	if (atomic_load(&w.at))
		fprintf(stderr, "daemon killed mid-load: the engine's stream "
			"went on %.1f ms later\n",
			(double)(atomic_load(&w.at) - t_kill) / 1e6);
	CHECK_OK(kvt_dev_stream_sync(e.s));
	/* the engine saw the job failed when its stream went on, and the
	 * job says so: no layer past the kill is ready, no list of zero
	 * failed blocks */
	CHECK_EQ(w.poll, -ECONNRESET);
	CHECK_EQ(kvt_client_job_wait_layer(j, SRV_L - 1, 1000000000),
		 -ECONNRESET);
	CHECK_EQ(kvt_client_job_wait(j, 1000000000), -ECONNRESET);
	CHECK_EQ(kvt_client_job_failed(j, failed, N), -ECONNRESET);
	/* a stream wait enqueued after the loss does not block either */
	t_kill = kvt_now_ns();
	CHECK_OK(kvt_client_job_stream_wait(j, SRV_L - 1, e.s));
	CHECK_OK(kvt_dev_stream_sync(e.s));
	CHECK(kvt_now_ns() - t_kill < 3000000000ull);
	kvt_client_job_free(j);
	eng_close(&e); /* the daemon is gone: no hang, no crash */
}

int main(int argc, char **argv)
{
	const char *tmp = getenv("KVT_TEST_TMP");
	char fabric[600], tiers[700];
	pid_t d;

	if (argc == 6 && !strcmp(argv[1], "--daemon"))
		return daemon_main(argv);
	if (argc == 4 && !strcmp(argv[1], "--victim")) {
		snprintf(sock, sizeof(sock), "%s", argv[2]);
		snprintf(model, sizeof(model), "%s", argv[3]);
		return victim_main();
	}
	signal(SIGPIPE, SIG_IGN);
	snprintf(dir, sizeof(dir), "%s/kvtd-dev-%d", tmp ? tmp : "/tmp",
		 (int)getpid());
	if (mkdir(dir, 0700) && errno != EEXIST)
		SKIP("no scratch directory");
	snprintf(sock, sizeof(sock), "/tmp/kvtd-dev-%d.sock", (int)getpid());
	snprintf(model, sizeof(model), "%s", srv_model());
	snprintf(fabric, sizeof(fabric), "%s/fabric", dir);
	/* slow device copies (the daemon's): 200 ms per MiB, so a layer of
	 * 64 pages takes 25 ms and a killed client dies mid-copy */
	snprintf(tiers, sizeof(tiers), "fabric:file=%s,4M,temp dram:4M",
		 fabric);
	d = daemon_start(tiers, "200000000", 0);
	CHECK(d > 0);
	if (d > 0) {
		test_basic();
		test_layers();
		test_store_order();
		test_failures(fabric);
		test_killed();
		test_two_engines();
		CHECK_EQ(srv_stop(d), 0);
	}
	test_restart();
	test_daemon_killed();
	unlink(model);
	TEST_DONE();
}
