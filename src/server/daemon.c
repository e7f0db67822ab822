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
 *   main      kvtd_run() here: accept, check the peer's credentials,
 *             start a connection thread (at most max_clients).
 *   conn      one per client (conn.c): blocking reads, one request, one
 *             reply. A connection owns its jobs (job.c), memories (mem.c)
 *             and job-slot page; it is the only thread that frees them
 *             (RELEASE, disconnect).
 *   reaper    here: cancels jobs past their lease (d->mu, then each
 *             conn->mu), waking at the earliest lease's end (and at
 *             least every 50 ms), so no lease overruns by a tick.
 *   cache     the cache's own threads run the copies and call on_progress()
 *             (job.c) which writes the job's slot, wakes futex waiters, and
 *             signals the client's eventfd when a job is done.
 *
 * LOCKS: d->mu (the connection list, counts) before conn->mu (the job
 * table); neither is held across a cache call that waits. Which lock
 * guards which field: daemon_impl.h.
 *
 * This file: open (the cache, the tenants through tenant.c, the socket,
 * the metrics endpoint), run, stop, close (drain), the reaper, and the
 * metrics collect hook (what each tenant holds, read before a render).
 *
 * TENANTS AND RANKS: each (tenant, TP rank) is its own tenant of the cache
 * (index id 1 + tenant# * tp + rank, with the tenant's salt mixed with the
 * rank): pages of different tenants or ranks never match, while one cache
 * and one set of tiers serves them all.
 *
 * A DEAD CLIENT: its socket reads end, the connection thread cancels all
 * its jobs, then frees each (leases dropped; a store not committed is
 * never served),
 * detaches and unmaps its memory, closes its fds. kill -9 of a client is
 * the same path.
 */
#include "server/daemon_impl.h"
#include "server/io.h"
#include <kvtier/client.h>

#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

kvt_cache *kvtd_cache(kvtd *d)
{
	return d->c;
}

#define REAPER_TICK_NS (50ull * 1000 * 1000)

static void *reaper_main(void *arg)
{
	kvtd *d = arg;

	pthread_mutex_lock(&d->mu);
	while (!d->stopping) {
		struct timespec ts;
		uint64_t now = kvt_now_ns(), next = now + REAPER_TICK_NS;

		for (struct conn *c = d->conns; c; c = c->next) {
			pthread_mutex_lock(&c->mu);
			for (int s = 0; s < MAX_JOBS; s++) {
				struct job *j = c->jobs[s];

				if (!j)
					continue;
				if (kvt_cache_job_poll(j->cj) != -EINPROGRESS)
					continue;
				if (!j->expired && now < j->deadline)
					next = KVT_MIN(next, j->deadline);
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
		/* up at the next lease's end (a job started since wakes it:
		 * job.c), at least every tick */
		kvti_deadline(&ts, (int64_t)(KVT_MAX(next, now + 1000000) -
					     now));
		pthread_cond_timedwait(&d->cv, &d->mu, &ts);
	}
	pthread_mutex_unlock(&d->mu);
	return NULL;
}

/* ---- open, run, close ------------------------------------------------- */

/* Before each metrics render: the jobs in flight (counted as they start
 * and end: job.c), and what each tenant holds per tier (all its ranks),
 * and its quota there. */
static void collect(kvtd_metrics *m, void *arg)
{
	kvtd *d = arg;
	int64_t jobs = atomic_load(&d->running_jobs);
	int64_t pinned = atomic_load(&d->running_pages);

	/* every job in flight holds one lease over its prefix */
	kvtd_metrics_gauge_set(m, KVTD_G_JOBS, (uint64_t)KVT_MAX(jobs, 0));
	kvtd_metrics_gauge_set(m, KVTD_G_LEASES, (uint64_t)KVT_MAX(jobs, 0));
	kvtd_metrics_gauge_set(m, KVTD_G_PINNED_PAGES,
			       (uint64_t)KVT_MAX(pinned, 0));

	for (int i = 0; i < d->nten; i++) {
		uint64_t used[KVT_TIER_COUNT] = { 0 }, quota[KVT_TIER_COUNT] = { 0 };
		uint64_t ev[KVT_TIER_COUNT] = { 0 };
		struct tenant *t = &d->ten[i];

		for (uint32_t r = 0; r < d->g->tp_size; r++) {
			kvt_tenant_usage u;

			if (kvt_cache_tenant_usage(d->c, kvti_itenant(d, i, r), &u))
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
	if ((err = kvti_tenants_parse(d, cfg->tenants)))
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
	cc.thread_nice = cfg->thread_nice;
	cc.devices = cfg->devices && *cfg->devices ? cfg->devices : NULL;
	cc.dev_load = cfg->dev_load;
	cc.dev_store = cfg->dev_store;
	if ((err = kvt_cache_open(&d->c, &cc)))
		goto fail;
	d->g = kvt_cache_geom(d->c);
	if ((err = kvtd_metrics_create(&d->m)))
		goto fail;
	kvtd_metrics_set_cache(d->m, d->c);
	kvtd_metrics_set_collect(d->m, collect, d);
	if ((err = kvti_tenants_open(d)))
		goto fail;
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

/* A connection refused at accept: told why (a reply with op 0 and the
 * error, sent without waiting), counted, logged (at most once a second),
 * closed. Freed here. */
static void refuse(kvtd *d, struct conn *c, int err)
{
	kvtd_hdr h = { .op = 0, .seq = 0 };
	char why[256];

	snprintf(why, sizeof(why), "%s", kvt_errdetail());
	kvtd_metrics_protocol_error(d->m, NULL, err == -EACCES ?
				    KVTD_PERR_AUTH : KVTD_PERR_OTHER);
	kvtd_set_timeout(c->fd, 100);
	kvti_reply_status(c, &h, err);
	kvti_refused_log(d, c, why);
	kvtd_buf_free(&c->out);
	close(c->fd);
	pthread_mutex_destroy(&c->mu);
	kvt_free(c);
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
		kvti_peer_groups(c);
		pthread_mutex_lock(&d->mu);
		err = kvti_admit_accept(d, c);
		pthread_mutex_unlock(&d->mu);
		if (err) {
			refuse(d, c, err);
			continue;
		}
		pthread_mutex_lock(&d->mu);
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
			err = pthread_create(&th, &a, kvti_conn_main, c);
			pthread_attr_destroy(&a);
		}
		if (err) {
			kvti_warn("daemon: thread: %s", strerror(err));
			c->hello = 0;
			kvti_conn_free(c);
		}
	}
}

/* Jobs of every connection not done yet (d->mu, then each c->mu, held
 * only for the count). */
static uint64_t jobs_in_flight(kvtd *d)
{
	uint64_t n = 0;

	pthread_mutex_lock(&d->mu);
	for (struct conn *c = d->conns; c; c = c->next) {
		pthread_mutex_lock(&c->mu);
		for (int s = 0; s < MAX_JOBS; s++)
			n += c->jobs[s] &&
			     kvt_cache_job_poll(c->jobs[s]->cj) == -EINPROGRESS;
		pthread_mutex_unlock(&c->mu);
	}
	pthread_mutex_unlock(&d->mu);
	return n;
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
	/* drain: no new job starts; the jobs in flight get one lease in all
	 * to finish (the reaper, which needs d->mu, cancels any that runs
	 * past its own), watched without holding a lock; then every client
	 * is disconnected and its thread frees what it holds (cancelling
	 * what is left) */
	atomic_store(&d->draining, 1);
	{
		uint64_t end = kvt_now_ns() +
			       (uint64_t)d->cfg.lease_ms * 1000000ull;

		while (jobs_in_flight(d) && kvt_now_ns() < end)
			usleep(2000);
	}
	pthread_mutex_lock(&d->mu);
	for (struct conn *c = d->conns; c; c = c->next)
		shutdown(c->fd, SHUT_RDWR);
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
