/*
 * client.c — the engine side of the daemon protocol (include/kvtier/
 * client.h is the contract, proto.h the wire format).
 *
 * One blocking socket per client; requests are serialized by cl->mu (send,
 * then read the one reply, by a deadline of timeout_ms). Job progress
 * needs no request: the daemon writes each job's slot in a shared page
 * (mapped read-only here) and wakes futex waiters; a waiter also wakes
 * every 100 ms to see whether the daemon's end of the socket has gone
 * (POLLRDHUP), so no wait outlives a dead daemon. Device streams wait on
 * our own wait words instead (WAITS, sent at connect), which a watch
 * thread ends when the daemon goes (client_job.c). A job's failed list and
 * statistics come with RELEASE, sent once by the first call that needs
 * them after the job is done.
 *
 * TWO WAYS A CONNECTION ENDS
 *
 *   broken  we can send no more requests: one timed out (its reply may
 *           still come: the stream would be out of step for good), a
 *           reply was not the one asked for, or we are closing. We shut
 *           our sending side (SHUT_WR); the daemon reads the end of the
 *           stream and tears the connection down. Requests fail with
 *           -ECONNRESET from then on; waits go on.
 *   gone    the daemon's end has closed. It closes a connection only
 *           after cancelling its jobs, waiting for their copies and
 *           unmapping its memory (conn.c), or it died: either way nothing
 *           of ours is read or written by it any more. Only now do waits
 *           end with -ECONNRESET.
 *
 * So a LOAD or STORE whose reply did not come (the daemon may have
 * started it) returns only once the daemon has let go (gone), at most
 * lease_ms + timeout_ms later; then no block of the request is written
 * after the call returns. A daemon hung longer than that is reported
 * (the detail says the memory may still be written) and the connection
 * stays broken.
 *
 * THREADS AND LIFETIMES: every call may run in any thread; a thread in a
 * wait is counted (cl->users) so kvt_client_shutdown() can wake it and
 * kvt_client_close() can wait for it to leave before freeing. Calls that
 * start after kvt_client_close() began are the caller's bug (the handles
 * are being freed); kvt_client_shutdown() is the call that may race them.
 */
#include "server/client_impl.h"

/* ---- requests ------------------------------------------------------------- */

static int is_job_start(uint16_t op)
{
	return op == KVTD_MSG_LOAD || op == KVTD_MSG_STORE ||
	       op == KVTD_MSG_LOAD_EACH || op == KVTD_MSG_STORE_EACH;
}

/* Read and drop what the daemon still sends until its end closes, by
 * @deadline: 1 once it has (cl->gone), else 0. */
int kvti_client_drain_to_eof(kvt_client *cl, uint64_t deadline)
{
	char buf[4096];

	while (!atomic_load(&cl->gone)) {
		struct pollfd p = { .fd = cl->fd, .events = POLLIN | POLLRDHUP };
		uint64_t now = kvt_now_ns();
		ssize_t n;

		if (now >= deadline)
			return 0;
		if (poll(&p, 1, (int)KVT_MIN((deadline - now) / 1000000 + 1,
					      1000u)) <= 0)
			continue;
		n = recv(cl->fd, buf, sizeof(buf), MSG_DONTWAIT);
		if (n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR))
			atomic_store(&cl->gone, 1);
	}
	return 1;
}

/* cl->mu held: no more requests on this connection; tell the daemon (the
 * end of our stream makes it tear the connection down). */
void kvti_client_conn_break(kvt_client *cl)
{
	if (!cl->broken) {
		cl->broken = 1;
		shutdown(cl->fd, SHUT_WR);
	}
}

/* The daemon's lease plus one request's time: the longest a live daemon
 * takes to let go of a connection it was told to drop. */
uint64_t kvti_client_letgo_ns(const kvt_client *cl)
{
	return ((uint64_t)cl->lease_ms + cl->timeout_ms) * 1000000ull;
}

/* cl->mu held; cl->out built (kvtd_begin .. puts). Send it, read the one
 * reply into cl->in by the request's deadline; on status 0, *@rd reads the
 * reply body. A timeout or a reply out of step breaks the connection: it
 * is never left out of step. */
int kvti_client_rpc(kvt_client *cl, const int *fds, int nfds, kvtd_rd *rd)
{
	uint16_t op = (uint16_t)(cl->out.p ? cl->out.p[6] | cl->out.p[7] << 8
					   : 0);
	uint64_t deadline = kvt_now_ns() + (uint64_t)cl->timeout_ms * 1000000;
	char detail[256];
	const uint8_t *body;
	size_t blen;
	int32_t status;
	kvtd_hdr h;
	int err;

	if (atomic_load(&cl->gone))
		return kvti_fail(-ECONNRESET, "client: the daemon has gone");
	if (cl->broken)
		return kvti_fail(-ECONNRESET, "client: the connection was "
				 "dropped (a request timed out or the client "
				 "is closing); connect again");
	if ((err = kvtd_end(&cl->out)))
		return err;
	err = kvtd_send(cl->fd, cl->out.p, cl->out.len, fds, nfds);
	if (!err) {
		err = kvtd_recv(cl->fd, &cl->in, &h, NULL, NULL, 1, deadline);
		if (err == 1)
			err = kvti_fail(-ECONNRESET, "client: the daemon closed "
					"the connection");
	}
	if (err == -EPIPE || err == -ECONNRESET) {
		atomic_store(&cl->gone, 1);
		kvti_client_conn_break(cl);
	}
	if (err == -ETIMEDOUT) {
		kvti_client_conn_break(cl);
		if (!is_job_start(op))
			return kvti_fail(err, "client: %s #%u: no reply in %u ms:"
					 " the connection is dropped (connect "
					 "again)", kvtd_msg_name(op), cl->seq,
					 cl->timeout_ms);
		/* the daemon may have started the job: return once it let go */
		if (kvti_client_drain_to_eof(cl, kvt_now_ns() + kvti_client_letgo_ns(cl)))
			return kvti_fail(err, "client: %s #%u: no reply in %u ms:"
					 " the connection is dropped; the daemon"
					 " has stopped its jobs and let go of "
					 "this client's memory",
					 kvtd_msg_name(op), cl->seq,
					 cl->timeout_ms);
		kvti_warn("client: %s #%u: no reply in %u ms, and the daemon "
			  "has not let go of the connection %llu ms later: it "
			  "may still write this client's memory",
			  kvtd_msg_name(op), cl->seq, cl->timeout_ms,
			  (unsigned long long)(kvti_client_letgo_ns(cl) / 1000000));
		return kvti_fail(err, "client: %s #%u: no reply, and the daemon "
				 "has not let go: its blocks may still be "
				 "written", kvtd_msg_name(op), cl->seq);
	}
	if (err)
		return err;
	if ((h.op & ~KVTD_REPLY) == 0) { /* our header was refused */
		kvti_client_conn_break(cl);
	} else if ((h.op & ~KVTD_REPLY) != op || h.seq != cl->seq) {
		kvti_client_conn_break(cl);
		return kvti_fail(KVT_EPROTO, "client: reply %s #%u to %s #%u: "
				 "the connection is dropped",
				 kvtd_msg_name(h.op), h.seq,
				 kvtd_msg_name(op), cl->seq);
	}
	if ((err = kvtd_reply_decode(cl->in.p + KVTD_HDR, h.len, &status,
				     detail, sizeof(detail), &body, &blen)))
		return err;
	if (status)
		return kvti_fail(status, "daemon: %s", detail[0] ? detail :
				 kvt_strerror(status));
	*rd = (kvtd_rd){ .p = body, .len = blen };
	return 0;
}

void kvti_client_begin(kvt_client *cl, uint16_t op)
{
	kvtd_begin(&cl->out, op, ++cl->seq);
}

int kvti_client_body_end(kvtd_rd *rd)
{
	if (rd->err)
		return kvti_fail(KVT_EPROTO, "client: a reply shorter than its "
				 "op's body");
	return 0;
}

/* ---- connect ---------------------------------------------------------------- */

static int geom_of(kvt_geom *g, const kvt_client_config *cfg)
{
	uint32_t P = cfg->page_tokens ? cfg->page_tokens : 16;
	uint32_t tp = cfg->tp_size ? cfg->tp_size : 1;
	const char *model = cfg->model;

	if (cfg->geom) {
		*g = *cfg->geom;
		return kvt_geom_finish(g);
	}
	if (!model || !*model) { /* a monitor: statistics only */
		memset(g, 0, sizeof(*g));
		return 0;
	}
	if (strchr(model, '/') && access(model, R_OK) == 0)
		return kvt_geom_from_config(g, model, P, tp, cfg->tp_rank);
	return kvt_geom_preset(g, model, P, tp, cfg->tp_rank);
}

static int dial(const char *path, int *out)
{
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	int fd, err;

	if (strlen(path) >= sizeof(sa.sun_path))
		return kvti_fail(-EINVAL, "client: socket path '%s' too long",
				 path);
	strcpy(sa.sun_path, path);
	fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return kvti_fail(-errno, "client: socket: %s", strerror(errno));
	if (connect(fd, (struct sockaddr *)&sa, sizeof(sa))) {
		err = -errno;
		close(fd);
		return kvti_fail(err, "client: no daemon at %s: %s", path,
				 strerror(-err));
	}
	*out = fd;
	return 0;
}

static const char *socket_path(const char *s)
{
	if (s && *s)
		return s;
	return getenv("KVT_SOCKET") ? getenv("KVT_SOCKET") : KVT_CLIENT_SOCKET;
}

int kvt_client_wait_daemon(const char *socket, uint32_t timeout_ms)
{
	uint64_t end = kvt_now_ns() + (uint64_t)timeout_ms * 1000000ull;
	const char *path = socket_path(socket);
	int fd, err;

	kvti_errclear();
	for (;;) {
		err = dial(path, &fd);
		if (!err) {
			close(fd);
			kvti_errclear();
			return 0;
		}
		if (err == -EINVAL)
			return err;
		if (kvt_now_ns() >= end)
			return kvti_fail(-ETIMEDOUT, "client: no daemon at %s "
					 "after %u ms", path, timeout_ms);
		usleep(10000);
	}
}

int kvt_client_connect(kvt_client **out, const kvt_client_config *in)
{
	kvt_client_config cfg = { 0 };
	const char *path, *ns;
	kvt_client *cl;
	kvtd_rd rd;
	int fds[KVTD_MAX_FDS], nfds = 0, err;
	uint32_t max_jobs, slot_bytes;

	kvti_errclear();
	if (!out || !in)
		return kvti_fail(-EINVAL, "client connect: no config");
	if (in->size < sizeof(uint32_t) || in->size > sizeof(cfg))
		return kvti_fail(-EINVAL, "client connect: config size %u (this "
				 "library knows %zu)", in->size, sizeof(cfg));
	memcpy(&cfg, in, in->size);
	path = socket_path(cfg.socket);
	ns = cfg.ns && *cfg.ns ? cfg.ns : "default";
	if (strlen(ns) > KVTD_NS_MAX)
		return kvti_fail(-EINVAL, "client connect: namespace longer "
				 "than %d bytes", KVTD_NS_MAX);
	if (!(cl = kvt_calloc(1, sizeof(*cl))))
		return -ENOMEM;
	cl->fd = cl->efd = cl->watch_efd = -1;
	cl->timeout_ms = cfg.timeout_ms ? cfg.timeout_ms : 10000;
	pthread_mutex_init(&cl->mu, NULL);
	kvti_cond_init_mono(&cl->cv);
	if ((err = geom_of(&cl->g, &cfg)))
		goto fail;
	if ((err = dial(path, &cl->fd)))
		goto fail;
	if ((err = kvtd_set_timeout(cl->fd, cl->timeout_ms)))
		goto fail;
	kvti_client_begin(cl, KVTD_MSG_HELLO);
	kvtd_put_u32(&cl->out, cfg.tenant);
	kvtd_put_u32(&cl->out, cl->g.tp_rank);
	kvtd_put_u32(&cl->out, cl->g.tp_size);
	kvtd_put_u32(&cl->out, cl->g.page_tokens);
	kvtd_put_u32(&cl->out, cl->g.layers);
	kvtd_put_u32(&cl->out, cl->g.kv_heads_total);
	kvtd_put_u32(&cl->out, cl->g.kv_heads);
	kvtd_put_u32(&cl->out, cl->g.head_dim);
	kvtd_put_u32(&cl->out, cl->g.dtype_bytes);
	kvtd_put_u32(&cl->out, cl->g.mla);
	kvtd_put_u16(&cl->out, (uint16_t)strlen(ns));
	kvtd_put_bytes(&cl->out, ns, strlen(ns));
	if ((err = kvtd_end(&cl->out)))
		goto fail;
	/* HELLO's reply carries fds: receive it by hand. A daemon that
	 * refused us at accept has answered and closed already: the send
	 * may fail, the reply says why. */
	if ((err = kvtd_send(cl->fd, cl->out.p, cl->out.len, NULL, 0)) &&
	    err != -EPIPE && err != -ECONNRESET)
		goto fail;
	{
		char detail[256];
		const uint8_t *body;
		size_t blen;
		int32_t status;
		kvtd_hdr h;

		int serr = err;

		err = kvtd_recv(cl->fd, &cl->in, &h, fds, &nfds, 1, 0);
		if (err == 1 || (err && serr))
			err = kvti_fail(-ECONNRESET, "client: the daemon closed "
					"the connection at HELLO");
		if (err)
			goto fail;
		if ((err = kvtd_reply_decode(cl->in.p + KVTD_HDR, h.len,
					     &status, detail, sizeof(detail),
					     &body, &blen)))
			goto fail;
		if (status) {
			err = kvti_fail(status, "daemon: %s", detail);
			goto fail;
		}
		rd = (kvtd_rd){ .p = body, .len = blen };
	}
	cl->id = kvtd_get_u32(&rd);
	max_jobs = kvtd_get_u32(&rd);
	slot_bytes = kvtd_get_u32(&rd);
	cl->lease_ms = kvtd_get_u32(&rd);
	cl->page_bytes = kvtd_get_u64(&rd);
	if ((err = kvti_client_body_end(&rd)))
		goto fail;
	if (nfds != 2 || !max_jobs || max_jobs > (1u << 20) ||
	    slot_bytes < KVTD_SLOT_BYTES || slot_bytes > 4096) {
		err = kvti_fail(KVT_EPROTO, "client: HELLO reply with %d fds, "
				"%u slots of %u bytes", nfds, max_jobs,
				slot_bytes);
		goto fail;
	}
	if (cl->g.layers && cl->page_bytes != kvt_geom_page_bytes(&cl->g)) {
		err = kvti_fail(KVT_EGEOM, "client: the daemon's pages are %llu "
				"bytes, ours %llu",
				(unsigned long long)cl->page_bytes,
				(unsigned long long)kvt_geom_page_bytes(&cl->g));
		goto fail;
	}
	cl->max_jobs = KVT_MIN(max_jobs, (uint32_t)KVT_CLIENT_MAX_JOBS);
	cl->slot_bytes = slot_bytes;
	cl->slots_len = (size_t)max_jobs * slot_bytes;
	cl->slots = mmap(NULL, cl->slots_len, PROT_READ, MAP_SHARED, fds[0], 0);
	if (cl->slots == MAP_FAILED) {
		cl->slots = NULL;
		err = kvti_fail(-errno, "client: job slots: %s", strerror(errno));
		goto fail;
	}
	close(fds[0]);
	cl->efd = fds[1];
	nfds = 0;
	if (!(cl->used = kvt_calloc(cl->max_jobs, 1))) {
		err = -ENOMEM;
		goto fail;
	}
	/* an engine's wait words, before any job (a monitor has no jobs) */
	if (cl->g.layers && (err = kvti_client_waits_make(cl, max_jobs)))
		goto fail;
	*out = cl;
	return 0;
fail:
	for (int i = 0; i < nfds; i++)
		close(fds[i]);
	kvt_client_close(cl);
	return err;
}

const kvt_geom *kvt_client_geom(const kvt_client *cl)
{
	return &cl->g;
}

uint32_t kvt_client_lease_ms(const kvt_client *cl)
{
	return cl->lease_ms;
}

uint32_t kvt_client_timeout_ms(const kvt_client *cl)
{
	return cl->timeout_ms;
}

int kvt_client_fd(kvt_client *cl)
{
	return cl->efd;
}

/* ---- keys, lookup ---------------------------------------------------------------- */

int kvt_client_hash_tokens(kvt_client *cl, const uint32_t *tokens,
			   size_t ntokens, kvt_page_key *keys)
{
	size_t want = ntokens / cl->g.page_tokens;
	kvtd_rd rd;
	int err;

	kvti_errclear();
	if ((ntokens && !tokens) || (want && !keys) || ntokens > UINT32_MAX)
		return kvti_fail(-EINVAL, "client hash: bad arguments");
	pthread_mutex_lock(&cl->mu);
	kvti_client_begin(cl, KVTD_MSG_HASH);
	kvtd_put_u32(&cl->out, (uint32_t)ntokens);
	for (size_t i = 0; i < ntokens; i++)
		kvtd_put_u32(&cl->out, tokens[i]);
	err = kvti_client_rpc(cl, NULL, 0, &rd);
	if (!err && kvtd_get_u32(&rd) != want)
		err = kvti_fail(KVT_EPROTO, "client hash: wrong key count");
	for (size_t i = 0; !err && i < want; i++) {
		keys[i].lo = kvtd_get_u64(&rd);
		keys[i].hi = kvtd_get_u64(&rd);
	}
	if (!err)
		err = kvti_client_body_end(&rd);
	pthread_mutex_unlock(&cl->mu);
	return err;
}

static int lookup(kvt_client *cl, const kvt_page_key *keys, size_t nkeys,
		  unsigned flags, kvt_cache_lookup_result *r,
		  kvt_cache_run *runs, size_t max, size_t *nruns)
{
	kvtd_rd rd;
	uint32_t nt;
	int err;

	kvti_errclear();
	if (!r || (nkeys && !keys) || nkeys > UINT32_MAX ||
	    (flags & KVTD_LOOKUP_RUNS) || (runs && (!max || !nruns)))
		return kvti_fail(-EINVAL, "client lookup: bad arguments");
	pthread_mutex_lock(&cl->mu);
	kvti_client_begin(cl, KVTD_MSG_LOOKUP);
	kvtd_put_u32(&cl->out, flags | (runs ? KVTD_LOOKUP_RUNS : 0));
	kvtd_put_u32(&cl->out, (uint32_t)nkeys);
	kvtd_put_keys(&cl->out, keys, nkeys);
	err = kvti_client_rpc(cl, NULL, 0, &rd);
	if (!err) {
		memset(r, 0, sizeof(*r));
		r->pages = kvtd_get_u64(&rd);
		nt = kvtd_get_u32(&rd);
		for (uint32_t t = 0; t < nt && !rd.err; t++) {
			uint64_t v = kvtd_get_u64(&rd);
			if (t < KVT_TIER_COUNT)
				r->tier_pages[t] = v;
		}
		r->inflight = kvtd_get_u64(&rd);
		if (runs) {
			uint32_t n = kvtd_get_u32(&rd);

			if (!rd.err && n > max)
				rd.err = kvti_fail(KVT_EPROTO, "client lookup: "
						   "%u runs, room for %zu", n,
						   max);
			for (uint32_t i = 0; i < n && !rd.err; i++) {
				runs[i].tier = kvtd_get_u32(&rd);
				runs[i].pages = kvtd_get_u32(&rd);
			}
			*nruns = rd.err ? 0 : n;
		}
		err = kvti_client_body_end(&rd);
	}
	pthread_mutex_unlock(&cl->mu);
	return err;
}

int kvt_client_lookup(kvt_client *cl, const kvt_page_key *keys, size_t nkeys,
		      unsigned flags, kvt_cache_lookup_result *r)
{
	return lookup(cl, keys, nkeys, flags, r, NULL, 0, NULL);
}

int kvt_client_lookup_runs(kvt_client *cl, const kvt_page_key *keys,
			   size_t nkeys, unsigned flags,
			   kvt_cache_lookup_result *r, kvt_cache_run *runs,
			   size_t max, size_t *nruns)
{
	if (!runs)
		return kvti_fail(-EINVAL, "client lookup: no room for runs");
	return lookup(cl, keys, nkeys, flags, r, runs,
		      KVT_MIN(max, (size_t)KVT_CACHE_MAX_RUNS), nruns);
}

int kvt_client_rates(kvt_client *cl,
		     kvt_xfer_rate rates[KVT_TIER_COUNT][KVT_TIER_COUNT])
{
	kvtd_rd rd;
	int err;

	kvti_errclear();
	if (!cl || !rates)
		return kvti_fail(-EINVAL, "client rates: bad arguments");
	memset(rates, 0, sizeof(kvt_xfer_rate) * KVT_TIER_COUNT *
			 KVT_TIER_COUNT);
	pthread_mutex_lock(&cl->mu);
	kvti_client_begin(cl, KVTD_MSG_RATES);
	err = kvti_client_rpc(cl, NULL, 0, &rd);
	if (!err) {
		uint32_t nt = kvtd_get_u32(&rd);

		if (!rd.err && nt > 64)
			rd.err = kvti_fail(KVT_EPROTO, "client rates: %u tiers",
					   nt);
		for (uint32_t s = 0; s < nt && !rd.err; s++)
			for (uint32_t t = 0; t < nt && !rd.err; t++) {
				kvt_xfer_rate x;

				x.gbps = kvtd_get_f64(&rd);
				x.bytes = kvtd_get_f64(&rd);
				x.busy_s = kvtd_get_f64(&rd);
				x.jobs = kvtd_get_u64(&rd);
				x.total_bytes = kvtd_get_f64(&rd);
				if (s < KVT_TIER_COUNT && t < KVT_TIER_COUNT)
					rates[s][t] = x;
			}
		err = kvti_client_body_end(&rd);
	}
	pthread_mutex_unlock(&cl->mu);
	return err;
}

int kvt_client_stats(kvt_client *cl, char **json)
{
	const uint8_t *p;
	kvtd_rd rd;
	uint32_t n;
	int err;

	kvti_errclear();
	if (!cl || !json)
		return kvti_fail(-EINVAL, "client stats: bad arguments");
	pthread_mutex_lock(&cl->mu);
	kvti_client_begin(cl, KVTD_MSG_STATS);
	err = kvti_client_rpc(cl, NULL, 0, &rd);
	if (!err) {
		n = kvtd_get_u32(&rd);
		p = kvtd_get_bytes(&rd, n);
		if (!(err = kvti_client_body_end(&rd))) {
			*json = malloc((size_t)n + 1);
			if (!*json) {
				err = -ENOMEM;
			} else {
				memcpy(*json, p, n);
				(*json)[n] = 0;
			}
		}
	}
	pthread_mutex_unlock(&cl->mu);
	return err;
}

int kvt_client_fingerprint(kvt_client *cl, uint32_t scheme,
			   const uint8_t fp[KVT_CLIENT_FP_BYTES],
			   uint32_t *others, uint64_t *conflicts)
{
	kvtd_rd rd;
	uint32_t o = 0;
	uint64_t n = 0;
	int err;

	kvti_errclear();
	if (!cl || !fp || !scheme || scheme > KVTD_FP_SCHEMES)
		return kvti_fail(-EINVAL, "client fingerprint: bad arguments "
				 "(scheme %u: 1..%d)", scheme, KVTD_FP_SCHEMES);
	pthread_mutex_lock(&cl->mu);
	kvti_client_begin(cl, KVTD_MSG_FPRINT);
	kvtd_put_u32(&cl->out, scheme);
	kvtd_put_bytes(&cl->out, fp, KVTD_FP_BYTES);
	err = kvti_client_rpc(cl, NULL, 0, &rd);
	if (!err) {
		o = kvtd_get_u32(&rd);
		n = kvtd_get_u64(&rd);
		err = kvti_client_body_end(&rd);
	}
	pthread_mutex_unlock(&cl->mu);
	if (!err) {
		if (others)
			*others = o;
		if (conflicts)
			*conflicts = n;
	}
	return err;
}

int kvt_client_quiesce(kvt_client *cl)
{
	kvtd_rd rd;
	int err;

	kvti_errclear();
	pthread_mutex_lock(&cl->mu);
	kvti_client_begin(cl, KVTD_MSG_QUIESCE);
	err = kvti_client_rpc(cl, NULL, 0, &rd);
	pthread_mutex_unlock(&cl->mu);
	return err;
}

/* Wake every thread waiting on a job of @cl (the slot words are shared:
 * a wake from here reaches them). cl->mu held. */
static void wake_waiters(kvt_client *cl)
{
	for (kvt_client_job *j = cl->jobs; j; j = j->next)
		syscall(SYS_futex, kvti_client_word_of(j), FUTEX_WAKE, INT_MAX, NULL, NULL,
			0);
}

void kvt_client_shutdown(kvt_client *cl)
{
	if (!cl || cl->fd < 0 || atomic_exchange(&cl->closing, 1))
		return;
	/* the end of our stream: the daemon cancels our jobs, waits for
	 * their copies, unmaps our memory, then closes its end */
	pthread_mutex_lock(&cl->mu);
	kvti_client_conn_break(cl);
	pthread_mutex_unlock(&cl->mu);
	if (!kvti_client_drain_to_eof(cl, kvt_now_ns() + kvti_client_letgo_ns(cl)))
		kvti_warn("client: the daemon has not let go of the connection "
			  "%llu ms after it was dropped (hung?): its jobs may "
			  "still write this client's memory",
			  (unsigned long long)(kvti_client_letgo_ns(cl) / 1000000));
	atomic_store(&cl->gone, 1);
	pthread_mutex_lock(&cl->mu);
	wake_waiters(cl);
	pthread_mutex_unlock(&cl->mu);
}

void kvt_client_close(kvt_client *cl)
{
	if (!cl)
		return;
	kvt_client_shutdown(cl);
	kvti_client_watch_stop(cl);
	pthread_mutex_lock(&cl->mu);
	while (cl->users) /* waits of other threads: they end now */
		pthread_cond_wait(&cl->cv, &cl->mu);
	while (cl->jobs)
		kvti_client_job_unlink_free(cl->jobs);
	while (cl->mems) {
		kvt_client_mem *m = cl->mems;

		cl->mems = m->next;
		kvti_client_mem_release(m, 0);
	}
	while (cl->events) {
		kvt_client_event *e = cl->events;

		cl->events = e->next;
		kvti_client_event_release(e);
	}
	for (int k = 0; k < SLOT_DEVS && cl->wait_dev[k]; k++) {
		if (cl->wait_reg[k])
			cl->wait_dev[k]->ops->host_unregister(cl->wait_dev[k],
							      cl->waits);
		kvti_dev_put(cl->wait_dev[k]);
	}
	pthread_mutex_unlock(&cl->mu);
	if (cl->fd >= 0)
		close(cl->fd);
	if (cl->efd >= 0)
		close(cl->efd);
	if (cl->slots)
		munmap((void *)cl->slots, cl->slots_len);
	if (cl->waits)
		munmap(cl->waits, cl->waits_len);
	kvtd_buf_free(&cl->out);
	kvtd_buf_free(&cl->in);
	kvt_free(cl->used);
	pthread_cond_destroy(&cl->cv);
	pthread_mutex_destroy(&cl->mu);
	kvt_free(cl);
}
