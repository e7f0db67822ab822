/*
 * dplane.c — the cache as the demo's engine reaches it: in this process
 * (kvt_cache_*), or, with --daemon, in a node daemon child process through
 * the client library (kvt_client_*: the engine's KV memory shared as a
 * memfd, every call over the socket). One job type (struct djob) for both;
 * one fd that becomes readable when a job is done (in process: an eventfd
 * the jobs' progress callback ticks; the daemon: the client's done
 * eventfd), so the engine's event loop can sleep on it.
 *
 * The daemon child serves until SIGTERM, then checks every copy as the
 * in-process pass does (kvt_cache_verify()) and reports through a pipe.
 */
#include "demo/demo_impl.h"
#include "server/server.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

/* ---- jobs -------------------------------------------------------------- */

int kvti_dj_wait(struct djob *j, int64_t t)
{
	return j->j ? kvt_cache_job_wait(j->j, t) : kvt_client_job_wait(j->c, t);
}

int kvti_dj_wait_layer(struct djob *j, uint32_t l, int64_t t)
{
	return j->j ? kvt_cache_job_wait_layer(j->j, l, t) :
	       kvt_client_job_wait_layer(j->c, l, t);
}

uint64_t kvti_dj_layer_ns(struct djob *j, uint32_t l)
{
	return j->j ? kvt_cache_job_layer_ns(j->j, l) :
	       kvt_client_job_layer_ns(j->c, l);
}

int kvti_dj_poll(struct djob *j)
{
	return j->j ? kvt_cache_job_poll(j->j) : kvt_client_job_poll(j->c);
}

long kvti_dj_failed(struct djob *j, uint32_t *b, size_t max)
{
	return j->j ? kvt_cache_job_failed(j->j, b, max) :
	       kvt_client_job_failed(j->c, b, max);
}

void kvti_dj_stat(struct djob *j, kvt_cache_job_stat *st)
{
	if (j->j)
		kvt_cache_job_stat_get(j->j, st);
	else
		kvt_client_job_stat_get(j->c, st);
}

void kvti_dj_free(struct djob *j)
{
	if (!j)
		return;
	kvt_cache_job_free(j->j);
	kvt_client_job_free(j->c);
	kvt_free(j);
}

/* In process: a done job ticks the plane's eventfd (the progress callback
 * runs under the job's lock: record and wake only). */
static void on_progress(void *arg, const kvt_cache_progress *p)
{
	uint64_t one = 1;

	if (p->done && write((int)(intptr_t)arg, &one, sizeof(one)) < 0) {
		/* a full counter still wakes the loop */
	}
}

int kvti_dp_job(struct dplane *d, int store, const kvt_page_key *keys,
		size_t n, size_t first, const uint32_t *blocks,
		struct djob **out)
{
	kvt_cache_job *j = NULL;
	kvt_client_job *c = NULL;
	int err;

	if (d->cl) {
		err = store ? kvt_client_store(d->cl, d->cm, keys, n, first,
					       blocks, &c)
			    : kvt_client_load(d->cl, d->cm, keys, n, first,
					      blocks, &c);
	} else {
		kvt_cache_io io = KVT_CACHE_IO_INIT;

		io.progress = on_progress;
		io.arg = (void *)(intptr_t)d->efd;
		err = store ? kvt_cache_store_ex(d->cache, 0, keys, n, first,
						 blocks, &io, &j)
			    : kvt_cache_load_ex(d->cache, 0, keys, n, first,
						blocks, &io, &j);
	}
	if (err)
		return err;
	if (!(*out = kvt_calloc(1, sizeof(**out)))) {
		kvt_cache_job_free(j);
		kvt_client_job_free(c);
		return -ENOMEM;
	}
	(*out)->j = j;
	(*out)->c = c;
	return 0;
}

int kvti_dp_hash(struct dplane *d, const uint32_t *tok, size_t n,
		 kvt_page_key *keys)
{
	return d->cl ? kvt_client_hash_tokens(d->cl, tok, n, keys) :
	       kvt_cache_hash_tokens(d->cache, 0, tok, n, keys);
}

int kvti_dp_lookup(struct dplane *d, const kvt_page_key *keys, size_t n,
		   unsigned flags, kvt_cache_lookup_result *r,
		   kvt_cache_run *runs, size_t *nruns)
{
	return d->cl ? kvt_client_lookup_runs(d->cl, keys, n, flags, r, runs,
					      KVT_CACHE_MAX_RUNS, nruns) :
	       kvt_cache_lookup_runs(d->cache, 0, keys, n, flags, r, runs,
				     KVT_CACHE_MAX_RUNS, nruns);
}

int kvti_dp_rates(struct dplane *d,
		  kvt_xfer_rate rates[KVT_TIER_COUNT][KVT_TIER_COUNT])
{
	return d->cl ? kvt_client_rates(d->cl, rates) :
	       kvt_cache_rates(d->cache, rates);
}

void kvti_dp_quiesce(struct dplane *d)
{
	if (d->cl)
		kvt_client_quiesce(d->cl);
	else if (d->cache)
		kvt_cache_quiesce(d->cache);
}

int kvti_dplane_fd(const struct dplane *d)
{
	return d->cl ? kvt_client_fd(d->cl) : d->efd;
}

void kvti_dplane_drain_fd(const struct dplane *d)
{
	uint64_t v;

	while (read(kvti_dplane_fd(d), &v, sizeof(v)) == sizeof(v))
		;
}

/* ---- --daemon: the cache in a kvtierd child process --------------------- */

/* What the daemon child reports: once ready (or failed), once drained. */
struct dreport {
	int err;
	char detail[256];
	char where[KVT_PATH_MAX];
	int check_err;
	char check_detail[256];
	kvt_cache_check check;
	kvt_cache_stat cache;
	kvt_index_stat index;
};

static kvtd *demo_daemon;

static void demo_daemon_term(int sig)
{
	(void)sig;
	kvtd_stop(demo_daemon);
}

/* All @n bytes through a pipe (@out: write), or -1. */
static int pipe_all(int fd, void *p, size_t n, int out)
{
	char *b = p;

	while (n) {
		ssize_t k = out ? write(fd, b, n) : read(fd, b, n);

		if (k < 0 && errno == EINTR)
			continue;
		if (k <= 0)
			return -1;
		b += k;
		n -= (size_t)k;
	}
	return 0;
}

static void fabric_where(kvt_cache *cache, char *where, size_t len)
{
	kvt_tier_desc t;

	kvt_tier_info(kvt_cache_tier(cache, KVT_TIER_FABRIC), &t);
	snprintf(where, len, "%s%s%s", t.where, t.emulated ? ", EMULATED: " : "",
		 t.emulated ? (t.note[0] ? t.note : "emulated") : "");
}

static void __attribute__((noreturn))
daemon_child(const kvtd_config *dc, int fd)
{
	struct sigaction sa = { .sa_handler = demo_daemon_term };
	struct dreport *rep = calloc(1, sizeof(*rep));
	kvt_cache *cache;

	if (!rep)
		_exit(1);
	rep->err = kvtd_open(&demo_daemon, dc);
	if (rep->err) {
		snprintf(rep->detail, sizeof(rep->detail), "%s", kvt_errdetail());
		pipe_all(fd, rep, sizeof(*rep), 1);
		_exit(1);
	}
	cache = kvtd_cache(demo_daemon);
	fabric_where(cache, rep->where, sizeof(rep->where));
	sigaction(SIGTERM, &sa, NULL);
	if (pipe_all(fd, rep, sizeof(*rep), 1))
		_exit(1);
	rep->err = kvtd_run(demo_daemon);
	kvt_cache_quiesce(cache);
	rep->check_err = kvt_cache_verify(cache, &rep->check);
	snprintf(rep->check_detail, sizeof(rep->check_detail), "%s",
		 kvt_errdetail());
	kvt_cache_stat_get(cache, &rep->cache);
	kvt_index_stat_get(kvt_cache_index(cache), &rep->index);
	pipe_all(fd, rep, sizeof(*rep), 1);
	kvtd_close(demo_daemon);
	_exit(0);
}

static int daemon_open(struct dplane *d, const kvt_demo_config *c,
		       const kvt_cache_config *cc, char *where, size_t wlen)
{
	kvt_client_config cl = KVT_CLIENT_CONFIG_INIT;
	kvtd_config dc = { 0 };
	struct dreport rep;
	static unsigned seq;
	int fds[2], err;

	snprintf(d->sock, sizeof(d->sock), "/tmp/kvtier-demo-%d-%u.sock",
		 (int)getpid(), seq++);
	dc.socket = d->sock;
	dc.tiers = cc->tiers;
	dc.model = c->model;
	dc.page_tokens = c->page_tokens;
	dc.tp = 1;
	dc.write = cc->write;
	dc.evict = cc->evict;
	dc.cache_flags = cc->flags;
	dc.thread_nice = cc->thread_nice;
	dc.lease_ms = 3600 * 1000; /* a slow run is not a stuck client */
	if (pipe2(fds, O_CLOEXEC))
		return kvti_fail(-errno, "demo: pipe: %s", strerror(errno));
	d->dpid = fork();
	if (d->dpid < 0) {
		err = -errno;
		close(fds[0]);
		close(fds[1]);
		return kvti_fail(err, "demo: fork: %s", strerror(-err));
	}
	if (d->dpid == 0) {
		close(fds[0]);
		daemon_child(&dc, fds[1]);
	}
	close(fds[1]);
	d->dfd = fds[0];
	if (pipe_all(d->dfd, &rep, sizeof(rep), 0))
		return kvti_fail(-ECHILD, "demo: the daemon exited at start");
	if (rep.err)
		return kvti_fail(rep.err, "demo: the daemon: %s", rep.detail);
	snprintf(where, wlen, "%s", rep.where);
	cl.socket = d->sock;
	cl.model = c->model;
	cl.page_tokens = c->page_tokens;
	return kvt_client_connect(&d->cl, &cl);
}

/* Disconnect, stop the daemon, take its final check. */
static void daemon_finish(struct dplane *d, kvt_demo_pass *out)
{
	struct dreport rep;
	int st;

	kvt_client_close(d->cl);
	d->cl = NULL;
	d->cm = NULL;
	kill(d->dpid, SIGTERM);
	if (pipe_all(d->dfd, &rep, sizeof(rep), 0)) {
		out->check_err = kvti_fail(-ECHILD, "demo: the %s daemon died "
					   "before its final check",
					   out->policy);
	} else {
		out->check_err = rep.check_err;
		out->check = rep.check;
		out->cache = rep.cache;
		out->index = rep.index;
		if (rep.check_err)
			kvti_fail(rep.check_err, "%s", rep.check_detail);
	}
	close(d->dfd);
	d->dfd = -1;
	waitpid(d->dpid, &st, 0);
	d->dpid = 0;
}

int kvti_dplane_open(struct dplane *d, const kvt_demo_config *c,
		     const kvt_cache_config *cc, const kvt_geom *g,
		     uint64_t nblocks, struct dmem *m, char *where,
		     size_t wlen)
{
	int err;

	memset(d, 0, sizeof(*d));
	d->efd = -1;
	d->dfd = -1;
	if (c->daemon) {
		void **base = kvt_calloc(g->layers, sizeof(*base));

		if (!base)
			return -ENOMEM;
		err = daemon_open(d, c, cc, where, wlen);
		if (!err)
			err = kvt_client_mem_alloc(d->cl, nblocks, base, NULL,
						   NULL, NULL, &d->cm);
		if (!err)
			err = kvti_dmem_open(m, g, nblocks, base);
		kvt_free(base);
		return err;
	}
	d->efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
	if (d->efd < 0)
		return kvti_fail(-errno, "demo: eventfd: %s", strerror(errno));
	if ((err = kvt_cache_open(&d->cache, cc)))
		return err;
	fabric_where(d->cache, where, wlen);
	if ((err = kvti_dmem_open(m, g, nblocks, NULL)))
		return err;
	/* vLLM's layout: per layer [2][nblocks][P][H][D] */
	return kvt_cache_register(d->cache, m->base, m->layers, m->nblocks,
				  m->chunk, m->nblocks * m->chunk,
				  (uint64_t)g->kv_heads * g->head_dim *
				  g->dtype_bytes, -1);
}

void kvti_dplane_finish(struct dplane *d, kvt_demo_pass *out)
{
	if (d->dpid > 0) {
		if (d->cl)
			kvt_client_quiesce(d->cl);
		daemon_finish(d, out);
	} else if (d->cache) {
		kvt_cache_quiesce(d->cache);
		out->check_err = kvt_cache_verify(d->cache, &out->check);
		kvt_cache_stat_get(d->cache, &out->cache);
		kvt_index_stat_get(kvt_cache_index(d->cache), &out->index);
	}
}

void kvti_dplane_close(struct dplane *d)
{
	kvt_cache_close(d->cache); /* temp: removes the ssd files */
	d->cache = NULL;
	if (d->dpid > 0) { /* failed before its finish */
		kvt_demo_pass scratch;

		memset(&scratch, 0, sizeof(scratch));
		daemon_finish(d, &scratch);
	}
	if (d->efd >= 0)
		close(d->efd);
	d->efd = -1;
}

/* ---- the tamper hook ------------------------------------------------------- */

/* The ssd tier of the demo is 'temp': its files lose their names as soon as
 * it is open (a killed demo leaves no data behind), so the hook reaches
 * them through the open descriptors of the process that holds the cache —
 * this one, or the daemon child (same user: /proc/PID/fd/N reopens them). */
static void tamper_fd(const char *fdpath)
{
	static const char junk[65536] = { [0 ... 65535] = 0x5a };
	struct stat sb;
	off_t end;
	int fd = open(fdpath, O_WRONLY | O_CLOEXEC);

	if (fd < 0)
		return;
	if (fstat(fd, &sb) == 0 && S_ISREG(sb.st_mode)) {
		end = KVT_MIN(sb.st_size, (off_t)(64 << 20));
		for (off_t o = 4096; o < end; o += (off_t)sizeof(junk))
			if (pwrite(fd, junk, (size_t)KVT_MIN(
				   (off_t)sizeof(junk), end - o), o) < 0)
				break;
	}
	close(fd);
}

int kvti_demo_tamper(const struct dplane *d, const char *dir)
{
	pid_t pid = d->dpid > 0 ? d->dpid : getpid();
	char path[64], link[KVT_PATH_MAX + 64], real[PATH_MAX];
	struct dirent *e;
	size_t dl;
	DIR *fds;
	int n = 0;

	if (!realpath(dir, real)) /* the links name canonical paths */
		return kvti_fail(-errno, "demo tamper: %s: %s", dir,
				 strerror(errno));
	dl = strlen(real);
	snprintf(path, sizeof(path), "/proc/%d/fd", (int)pid);
	if (!(fds = opendir(path)))
		return kvti_fail(-errno, "demo tamper: %s: %s", path,
				 strerror(errno));
	while ((e = readdir(fds))) {
		char fdpath[96];
		ssize_t k;

		if (e->d_name[0] == '.')
			continue;
		snprintf(fdpath, sizeof(fdpath), "%s/%s", path, e->d_name);
		k = readlink(fdpath, link, sizeof(link) - 1);
		if (k <= 0)
			continue;
		link[k] = 0;
		if (strncmp(link, real, dl) || link[dl] != '/' ||
		    !strstr(link + dl, "/kvtier-ssd-"))
			continue;
		tamper_fd(fdpath);
		n++;
	}
	closedir(fds);
	kvti_warn("demo: overwrote %d ssd file descriptor%s of process %d "
		  "under %s (test hook)", n, n == 1 ? "" : "s", (int)pid, dir);
	return n;
}
