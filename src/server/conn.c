/*
 * conn.c — one connection's thread: read a request, answer it, repeat.
 *
 *   accept (daemon.c) --> kvti_conn_main():
 *     kvtd_recv (io.c: header, fds, payload) --> kvtd_req_decode (proto.c,
 *     total) --> serve_one(): HELLO here, REGISTER mem.c, LOAD/STORE/
 *     CANCEL/RELEASE job.c, FPRINT fprint.c, HASH / LOOKUP / STATS /
 *     QUIESCE here
 *     --> exactly one reply per request, in order
 *   EOF, a header it cannot read, a send that fails --> kvti_conn_free()
 *
 * Before HELLO a connection may only say HELLO, within hello_ms; the HELLO
 * reply carries the job-slot page (a memfd the client maps read-only) and
 * the eventfd signalled when a job is done. A monitor (HELLO without
 * geometry) may only ask for STATS.
 *
 * The thread owns its connection: jobs, memories, the slot page, fds. It
 * alone frees them, at the end: jobs all cancelled, then each waited for
 * (job.c, kvti_jobs_cancel_all()), memories
 * detached and unmapped, then the conn leaves d->conns (d->mu) and
 * d->cv is signalled for close (daemon.c).
 */
#include "server/daemon_impl.h"
#include "server/io.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

/* ---- replies ---------------------------------------------------------- */

void kvti_reply_begin(struct conn *c, const kvtd_hdr *h, int status)
{
	const char *det = status ? kvt_errdetail() : "";
	size_t n = KVT_MIN(strlen(det), (size_t)255);

	kvtd_begin(&c->out, (uint16_t)(h->op | KVTD_REPLY), h->seq);
	kvtd_put_u32(&c->out, (uint32_t)status);
	kvtd_put_u16(&c->out, (uint16_t)n);
	kvtd_put_bytes(&c->out, det, n);
}

int kvti_reply_send(struct conn *c, const int *fds, int nfds)
{
	int err = kvtd_end(&c->out);

	if (err)
		return err;
	return kvtd_send(c->fd, c->out.p, c->out.len, fds, nfds);
}

int kvti_reply_status(struct conn *c, const kvtd_hdr *h, int status)
{
	kvti_reply_begin(c, h, status);
	return kvti_reply_send(c, NULL, 0);
}

/* ---- requests --------------------------------------------------------- */

int kvti_perr(struct conn *c, enum kvtd_proto_err why, int err)
{
	kvtd_metrics_protocol_error(c->d->m, c->t ? c->t->mt : NULL, why);
	return err;
}

static int do_hello(struct conn *c, const kvtd_req *q)
{
	kvtd *d = c->d;
	const kvt_geom *g = d->g;
	int ti = -1, monitor, err;

	if (c->hello)
		return kvti_perr(c, KVTD_PERR_ORDER, kvti_fail(KVT_EPROTO,
			    "HELLO twice"));
	/* every geometry field 0: a monitor (kvtier stat), STATS only */
	monitor = !q->u.hello.layers && !q->u.hello.kv_heads_total &&
		  !q->u.hello.kv_heads && !q->u.hello.head_dim &&
		  !q->u.hello.dtype_bytes && !q->u.hello.page_tokens &&
		  !q->u.hello.tp_size && !q->u.hello.tp_rank &&
		  !q->u.hello.mla;
	if (strcmp(q->u.hello.ns, d->ns))
		return kvti_perr(c, KVTD_PERR_GEOMETRY, kvti_fail(KVT_ENOTFOUND,
			    "namespace '%s' is not served here (this daemon "
			    "serves '%s')", q->u.hello.ns, d->ns));
	if ((err = kvti_tenant_resolve(d, c, monitor, q->u.hello.tenant,
				       &ti)))
		return kvti_perr(c, KVTD_PERR_AUTH, err);
	if (!monitor &&
	    (q->u.hello.layers != g->layers ||
	     q->u.hello.kv_heads_total != g->kv_heads_total ||
	     q->u.hello.kv_heads != g->kv_heads ||
	     q->u.hello.head_dim != g->head_dim ||
	     q->u.hello.dtype_bytes != g->dtype_bytes ||
	     q->u.hello.page_tokens != g->page_tokens ||
	     q->u.hello.tp_size != g->tp_size || q->u.hello.mla != g->mla ||
	     q->u.hello.tp_rank >= g->tp_size))
		return kvti_perr(c, KVTD_PERR_GEOMETRY, kvti_fail(KVT_EGEOM,
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
	if ((err = kvti_admit_hello(d, c, ti, monitor)))
		return kvti_perr(c, KVTD_PERR_OTHER, err);
	c->rank = q->u.hello.tp_rank;
	c->itenant = kvti_itenant(d, ti, c->rank);
	return 0;
}

/*
 * The job-slot page: a memfd the daemon writes through its own mapping and
 * the client maps read-only. It is sealed before the client sees it:
 * F_SEAL_SHRINK and _GROW (a page that shrank would make the daemon's next
 * write a SIGBUS), F_SEAL_FUTURE_WRITE (no new writable mapping, no
 * write(), whoever reopens it, root included; the daemon's mapping, made
 * before, still writes), F_SEAL_SEAL; mode 0400 besides, so another uid
 * cannot even reopen it read-write through /proc/PID/fd. The client gets a
 * read-only reopen of it. Nothing falls back to a writable descriptor: a
 * kernel without the seals (before Linux 5.1) refuses HELLO.
 */
static int slots_make(struct conn *c, int *ro)
{
	const unsigned seals = F_SEAL_SHRINK | F_SEAL_GROW |
			       F_SEAL_FUTURE_WRITE | F_SEAL_SEAL;
	size_t len = (size_t)MAX_JOBS * KVTD_SLOT_BYTES;
	char path[64];

	c->slot_fd = memfd_create("kvtierd-slots",
				  MFD_CLOEXEC | MFD_ALLOW_SEALING);
	if (c->slot_fd < 0 || ftruncate(c->slot_fd, (off_t)len) ||
	    fchmod(c->slot_fd, 0400))
		return kvti_fail(-errno, "HELLO: job slots: %s",
				 strerror(errno));
	c->slots = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED,
			c->slot_fd, 0);
	if (c->slots == MAP_FAILED) {
		c->slots = NULL;
		return kvti_fail(-errno, "HELLO: job slots: %s",
				 strerror(errno));
	}
	errno = 0;
	if (fcntl(c->slot_fd, F_ADD_SEALS, seals) ||
	    (unsigned)fcntl(c->slot_fd, F_GET_SEALS) != seals)
		return kvti_fail(-errno ? -errno : -EINVAL, "HELLO: job slots "
				 "cannot be sealed (F_SEAL_FUTURE_WRITE needs "
				 "Linux 5.1): %s", strerror(errno ? errno :
							    EINVAL));
	snprintf(path, sizeof(path), "/proc/self/fd/%d", c->slot_fd);
	*ro = open(path, O_RDONLY | O_CLOEXEC);
	if (*ro < 0)
		return kvti_fail(-errno, "HELLO: job slots: a read-only "
				 "descriptor: %s", strerror(errno));
	return 0;
}

/* The HELLO reply: the job-slot page and the done eventfd. An error before
 * anything was sent is the caller's to answer. */
static int hello_reply(struct conn *c, const kvtd_hdr *h, int *sent)
{
	int fds[2], ro = -1, err;

	*sent = 0;
	if ((err = slots_make(c, &ro)))
		return err;
	c->efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
	if (c->efd < 0) {
		close(ro);
		return kvti_fail(-errno, "HELLO: eventfd: %s", strerror(errno));
	}
	kvti_reply_begin(c, h, 0);
	kvtd_put_u32(&c->out, c->id);
	kvtd_put_u32(&c->out, MAX_JOBS);
	kvtd_put_u32(&c->out, KVTD_SLOT_BYTES);
	kvtd_put_u32(&c->out, c->d->cfg.lease_ms);
	kvtd_put_u64(&c->out, kvt_geom_page_bytes(c->d->g));
	fds[0] = ro;
	fds[1] = c->efd;
	*sent = 1;
	err = kvti_reply_send(c, fds, 2);
	close(ro);
	return err;
}

/* One request (with the descriptors that came with it). A nonzero
 * return closes the connection. */
static int serve_one(struct conn *c, const kvtd_hdr *h, const int *fds,
		     int nfds)
{
	kvtd *d = c->d;
	kvtd_req q;
	uint64_t t0 = kvt_now_ns();
	int err, sent;

	kvti_errclear();
	err = kvtd_req_decode(c->in.p, c->in.len, &q);
	if (err)
		return kvti_perr(c, KVTD_PERR_MALFORMED,
				 kvti_reply_status(c, h, err));
	if (q.h.op != KVTD_MSG_HELLO && !c->hello)
		return kvti_reply_status(c, h, kvti_perr(c, KVTD_PERR_ORDER,
				    kvti_fail(KVT_EPROTO, "%s before HELLO",
					      kvtd_msg_name(q.h.op))));
	if (nfds != kvtd_req_fds(&q))
		return kvti_reply_status(c, h, kvti_perr(c, KVTD_PERR_MALFORMED,
				    kvti_fail(KVT_EPROTO, "%s with %d "
					      "descriptors (takes %d)",
					      kvtd_msg_name(q.h.op), nfds,
					      kvtd_req_fds(&q))));
	if (c->monitor && q.h.op != KVTD_MSG_STATS)
		return kvti_reply_status(c, h, kvti_perr(c, KVTD_PERR_ORDER,
				    kvti_fail(KVT_EPROTO, "%s on a monitoring "
					      "connection (HELLO without "
					      "geometry: STATS only)",
					      kvtd_msg_name(q.h.op))));
	switch (q.h.op) {
	case KVTD_MSG_HELLO:
		if ((err = do_hello(c, &q)))
			return kvti_reply_status(c, h, err);
		if ((err = hello_reply(c, h, &sent))) {
			kvti_warn("daemon: client pid %d: %s", (int)c->cred.pid,
				  kvt_errdetail());
			/* answered, then closed: no half-made connection */
			if (!sent)
				kvti_reply_status(c, h, err);
			return err;
		}
		kvti_info("daemon: client pid %d uid %u: tenant %s rank %u",
			  (int)c->cred.pid, (unsigned)c->cred.uid, c->t->name,
			  c->rank);
		return 0;
	case KVTD_MSG_REGISTER:
	case KVTD_MSG_REGISTER_ROWS: {
		uint32_t id = 0;

		err = kvti_mem_register(c, &q, fds, nfds, &id);
		if (err)
			return kvti_reply_status(c, h, err);
		kvti_reply_begin(c, h, 0);
		kvtd_put_u32(&c->out, id);
		return kvti_reply_send(c, NULL, 0);
	}
	case KVTD_MSG_EVENT: {
		uint32_t id = 0;

		err = kvti_event_register(c, &q, nfds ? fds[0] : -1, &id);
		if (err)
			return kvti_reply_status(c, h, err);
		kvti_reply_begin(c, h, 0);
		kvtd_put_u32(&c->out, id);
		return kvti_reply_send(c, NULL, 0);
	}
	case KVTD_MSG_WAITS:
		return kvti_reply_status(c, h, kvti_waits_register(c, &q,
								  fds[0]));
	case KVTD_MSG_UNREGISTER: {
		struct cmem *cm = kvti_mem_find(c, q.u.id);

		if (!cm)
			return kvti_reply_status(c, h, kvti_perr(c,
				KVTD_PERR_NOT_OWNER, kvti_fail(KVT_ENOTFOUND,
				"UNREGISTER: no memory %u", q.u.id)));
		kvti_mem_drop(c, cm);
		return kvti_reply_status(c, h, 0);
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
			return kvti_reply_status(c, h, -ENOMEM);
		}
		for (uint32_t i = 0; i < n; i++)
			tok[i] = kvtd_u32_at(q.u.hash.tokens, i);
		err = kvt_cache_hash_tokens(d->c, c->itenant, tok, n, keys);
		kvti_reply_begin(c, h, err);
		if (!err) {
			kvtd_put_u32(&c->out, (uint32_t)nk);
			kvtd_put_keys(&c->out, keys, nk);
		}
		kvt_free(tok);
		kvt_free(keys);
		return kvti_reply_send(c, NULL, 0);
	}
	case KVTD_MSG_LOOKUP: {
		kvt_page_key *keys = kvti_keys_copy(q.u.lookup.keys,
					       q.u.lookup.nkeys);
		unsigned lf = q.u.lookup.flags & (KVT_LOOKUP_TOUCH |
						  KVT_LOOKUP_EACH);
		int want_runs = (q.u.lookup.flags & KVTD_LOOKUP_RUNS) != 0;
		kvt_cache_run runs[KVT_CACHE_MAX_RUNS];
		size_t nruns = 0;
		kvt_cache_lookup_result r;

		if (!keys)
			return kvti_reply_status(c, h, -ENOMEM);
		err = want_runs ?
			kvt_cache_lookup_runs(d->c, c->itenant, keys,
					      q.u.lookup.nkeys, lf, &r, runs,
					      KVT_CACHE_MAX_RUNS, &nruns) :
			kvt_cache_lookup(d->c, c->itenant, keys,
					 q.u.lookup.nkeys, lf, &r);
		/* a remote run after the local one: bring it in while the
		 * request waits to be scheduled (its LOAD cuts it off) */
		if (!err && r.tier_pages[KVT_TIER_REMOTE] && !r.inflight)
			kvti_fetch_start(c, keys, r.pages +
				    r.tier_pages[KVT_TIER_REMOTE], r.pages);
		kvt_free(keys);
		kvti_reply_begin(c, h, err);
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
			if (want_runs) {
				kvtd_put_u32(&c->out, (uint32_t)nruns);
				for (size_t i = 0; i < nruns; i++) {
					kvtd_put_u32(&c->out, runs[i].tier);
					kvtd_put_u32(&c->out, runs[i].pages);
				}
			}
			if (q.u.lookup.nkeys > r.pages)
				kvtd_metrics_miss(d->m, c->t->mt,
						  q.u.lookup.nkeys - r.pages);
		}
		err = kvti_reply_send(c, NULL, 0);
		kvtd_metrics_observe(d->m, c->t->mt, KVTD_OP_LOOKUP,
				     kvt_now_ns() - t0);
		return err;
	}
	case KVTD_MSG_LOAD:
	case KVTD_MSG_STORE:
	case KVTD_MSG_LOAD_EACH:
	case KVTD_MSG_STORE_EACH:
		return kvti_reply_status(c, h, kvti_job_start(c, &q,
			q.h.op == KVTD_MSG_STORE ||
			q.h.op == KVTD_MSG_STORE_EACH,
			q.h.op >= KVTD_MSG_LOAD_EACH));
	case KVTD_MSG_CANCEL:
		return kvti_reply_status(c, h, kvti_job_cancel(c, q.u.id));
	case KVTD_MSG_RELEASE:
		return kvti_job_release(c, h, q.u.id);
	case KVTD_MSG_QUIESCE:
		kvt_cache_quiesce(d->c);
		return kvti_reply_status(c, h, 0);
	case KVTD_MSG_RATES: {
		kvt_xfer_rate (*rt)[KVT_TIER_COUNT] =
			kvt_calloc(KVT_TIER_COUNT, sizeof(*rt));

		if (!rt)
			return kvti_reply_status(c, h, -ENOMEM);
		err = kvt_cache_rates(d->c, rt);
		kvti_reply_begin(c, h, err);
		if (!err) {
			kvtd_put_u32(&c->out, KVT_TIER_COUNT);
			for (int s = 0; s < KVT_TIER_COUNT; s++)
				for (int t = 0; t < KVT_TIER_COUNT; t++) {
					const kvt_xfer_rate *x = &rt[s][t];

					kvtd_put_f64(&c->out, x->gbps);
					kvtd_put_f64(&c->out, x->bytes);
					kvtd_put_f64(&c->out, x->busy_s);
					kvtd_put_u64(&c->out, x->jobs);
					kvtd_put_f64(&c->out, x->total_bytes);
				}
		}
		kvt_free(rt);
		return kvti_reply_send(c, NULL, 0);
	}
	case KVTD_MSG_FPRINT: {
		uint32_t others;
		uint64_t conflicts;

		kvti_fprint_publish(c, q.u.fprint.scheme, q.u.fprint.fp,
				    &others, &conflicts);
		kvti_reply_begin(c, h, 0);
		kvtd_put_u32(&c->out, others);
		kvtd_put_u64(&c->out, conflicts);
		return kvti_reply_send(c, NULL, 0);
	}
	case KVTD_MSG_STATS: {
		char *json = NULL;
		size_t len = 0;

		/* a tenant sees its own figures; root and admin tenants all */
		err = kvtd_metrics_render_json_for(d->m, c->cred.uid == 0 ||
						   c->t->admin ? NULL :
						   c->t->mt, &json, &len);
		kvti_reply_begin(c, h, err);
		if (!err) {
			kvtd_put_u32(&c->out, (uint32_t)len);
			kvtd_put_bytes(&c->out, json, len);
		}
		kvt_free(json);
		return kvti_reply_send(c, NULL, 0);
	}
	}
	return kvti_reply_status(c, h, kvti_fail(KVT_EPROTO, "op %u", q.h.op));
}

void kvti_conn_free(struct conn *c)
{
	kvtd *d = c->d;

	pthread_mutex_lock(&d->mu);
	for (struct conn **p = &d->conns; *p; p = &(*p)->next)
		if (*p == c) {
			*p = c->next;
			break;
		}
	pthread_mutex_unlock(&d->mu);
	kvti_jobs_cancel_all(c); /* all at once, then each waited for */
	kvti_fetch_end(c, 1);
	for (uint32_t s = 0; s < MAX_JOBS; s++)
		kvti_job_free(c, s);
	for (int i = 0; i < MAX_MEMS; i++)
		if (c->mems[i].id)
			kvti_mem_drop(c, &c->mems[i]);
	kvti_events_drop(c); /* no job is left to wait on them */
	kvti_waits_drop(c);  /* nor to write a stream value */
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

/*
 * Before HELLO a connection has hello_ms from its accept, in all, to say a
 * HELLO that succeeds: a deadline for the whole exchange (a peer dripping
 * a byte a second gains nothing), and any refusal before it (a HELLO that
 * fails, another op, wrong descriptors) is answered and the connection
 * closed. After HELLO there is no timeout: engines may idle.
 */
void *kvti_conn_main(void *arg)
{
	struct conn *c = arg;
	kvtd *d = c->d;
	uint64_t deadline = kvt_now_ns() +
			    (uint64_t)d->cfg.hello_ms * 1000000ull;

	kvtd_set_timeout(c->fd, d->cfg.hello_ms);
	for (;;) {
		int fds[KVTD_MAX_FDS], nfds = 0, err;
		kvtd_hdr h;

		kvti_errclear();
		err = kvtd_recv(c->fd, &c->in, &h, fds, &nfds, 0,
				c->hello ? 0 : deadline);
		if (err == 1)
			break; /* the client closed */
		if (err == KVT_EPROTO) {
			/* no way to find the next message: answer, close */
			kvti_perr(c, hdr_reason(), 0);
			h.op = 0; /* op 0: the header was not understood */
			kvti_reply_status(c, &h, err);
			for (int i = 0; i < nfds; i++)
				close(fds[i]);
			break;
		}
		if (err) {
			kvti_perr(c, err == -ETIMEDOUT && !c->hello ?
			     KVTD_PERR_IDLE : KVTD_PERR_TRUNCATED, 0);
			if (err == -ETIMEDOUT && !c->hello)
				kvti_info("daemon: client pid %d uid %u said no "
					  "HELLO in %u ms: closed",
					  (int)c->cred.pid,
					  (unsigned)c->cred.uid,
					  d->cfg.hello_ms);
			for (int i = 0; i < nfds; i++)
				close(fds[i]);
			break;
		}
		if (nfds < 0 || nfds > kvtd_msg_fds(h.op)) {
			for (int i = 0; i < nfds; i++)
				close(fds[i]);
			kvti_perr(c, KVTD_PERR_MALFORMED, 0);
			if (nfds < 0) /* io.c closed what did arrive */
				kvti_fail(KVT_EPROTO, "%s with more than %d "
					  "descriptors (takes at most %d)",
					  kvtd_msg_name(h.op), KVTD_MAX_FDS,
					  kvtd_msg_fds(h.op));
			else
				kvti_fail(KVT_EPROTO, "%s with %d descriptors "
					  "(takes at most %d)",
					  kvtd_msg_name(h.op), nfds,
					  kvtd_msg_fds(h.op));
			err = kvti_reply_status(c, &h, KVT_EPROTO);
			if (err || !c->hello)
				break;
			continue;
		}
		err = serve_one(c, &h, fds, nfds);
		for (int i = 0; i < nfds; i++)
			close(fds[i]);
		if (err || !c->hello)
			break; /* before HELLO, a refusal closes */
		kvtd_set_timeout(c->fd, 0); /* engines may idle */
	}
	kvti_conn_free(c);
	return NULL;
}
