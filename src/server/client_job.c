/*
 * client_job.c — the client's jobs: LOAD and STORE requests, IPC events,
 * waits on the job-slot page (futex, per layer, on a device stream), cancel,
 * RELEASE (the failed list and statistics, fetched once), free. The rules
 * of client.c's design comment hold here: a wait counts itself in
 * cl->users, ends at "gone" (the daemon let go), and a job's memory is never
 * written by the daemon after its free returns.
 */
#include "server/client_impl.h"

/* ---- jobs ------------------------------------------------------------------------ */

static int job_start(kvt_client *cl, kvt_client_mem *m, int store,
		     unsigned flags, uint32_t event, const kvt_page_key *keys,
		     size_t nkeys, size_t first, const uint32_t *blocks,
		     kvt_client_job **out)
{
	kvt_client_job *j;
	kvtd_rd rd;
	uint32_t s;
	int err;

	kvti_errclear();
	if (!cl || !m || m->cl != cl || !out || (nkeys && !keys) ||
	    first > nkeys || (nkeys > first && !blocks) || nkeys > UINT32_MAX ||
	    (flags & ~KVT_CACHE_IO_EACH) ||
	    ((flags & KVT_CACHE_IO_EACH) && first))
		return kvti_fail(-EINVAL, "client %s: bad arguments",
				 store ? "store" : "load");
	if (!(j = kvt_calloc(1, sizeof(*j))))
		return -ENOMEM;
	j->cl = cl;
	pthread_mutex_lock(&cl->mu);
	for (s = 0; s < cl->max_jobs && cl->used[s]; s++)
		;
	if (s == cl->max_jobs) {
		pthread_mutex_unlock(&cl->mu);
		kvt_free(j);
		return kvti_fail(KVT_EBUSY, "client: %u jobs not freed",
				 cl->max_jobs);
	}
	if (flags & KVT_CACHE_IO_EACH)
		kvti_client_begin(cl, store ? KVTD_MSG_STORE_EACH : KVTD_MSG_LOAD_EACH);
	else
		kvti_client_begin(cl, store ? KVTD_MSG_STORE : KVTD_MSG_LOAD);
	kvtd_put_u32(&cl->out, m->id);
	kvtd_put_u32(&cl->out, s);
	kvtd_put_u32(&cl->out, (uint32_t)nkeys);
	kvtd_put_u32(&cl->out, (uint32_t)first);
	kvtd_put_u32(&cl->out, event);
	kvtd_put_keys(&cl->out, keys, nkeys);
	for (size_t i = first; i < nkeys; i++)
		kvtd_put_u32(&cl->out, blocks[i - first]);
	err = kvti_client_rpc(cl, NULL, 0, &rd);
	if (!err) {
		cl->used[s] = 1;
		cl->njobs++;
		j->slot = s;
		j->device = m->device;
		/* the daemon wrote the slot's generation before it replied */
		j->gen = __atomic_load_n((const uint32_t *)(cl->slots +
				(size_t)s * cl->slot_bytes + 12), __ATOMIC_ACQUIRE);
		j->next = cl->jobs;
		if (cl->jobs)
			cl->jobs->prev = j;
		cl->jobs = j;
	}
	pthread_mutex_unlock(&cl->mu);
	if (err) {
		kvt_free(j);
		return err;
	}
	*out = j;
	return 0;
}

int kvt_client_load(kvt_client *cl, kvt_client_mem *m,
		    const kvt_page_key *keys, size_t nkeys, size_t first,
		    const uint32_t *blocks, kvt_client_job **out)
{
	return job_start(cl, m, 0, 0, 0, keys, nkeys, first, blocks, out);
}

int kvt_client_store(kvt_client *cl, kvt_client_mem *m,
		     const kvt_page_key *keys, size_t nkeys, size_t first,
		     const uint32_t *blocks, kvt_client_job **out)
{
	return job_start(cl, m, 1, 0, 0, keys, nkeys, first, blocks, out);
}

int kvt_client_load_ex(kvt_client *cl, kvt_client_mem *m,
		       const kvt_page_key *keys, size_t nkeys, size_t first,
		       const uint32_t *blocks, unsigned flags,
		       kvt_client_job **out)
{
	return job_start(cl, m, 0, flags, 0, keys, nkeys, first, blocks, out);
}

int kvt_client_store_ex(kvt_client *cl, kvt_client_mem *m,
			const kvt_page_key *keys, size_t nkeys, size_t first,
			const uint32_t *blocks, unsigned flags,
			kvt_client_job **out)
{
	return job_start(cl, m, 1, flags, 0, keys, nkeys, first, blocks, out);
}

int kvt_client_load_ev(kvt_client *cl, kvt_client_mem *m,
		       const kvt_page_key *keys, size_t nkeys, size_t first,
		       const uint32_t *blocks, unsigned flags, uint32_t event,
		       kvt_client_job **out)
{
	return job_start(cl, m, 0, flags, event, keys, nkeys, first, blocks,
			 out);
}

int kvt_client_store_ev(kvt_client *cl, kvt_client_mem *m,
			const kvt_page_key *keys, size_t nkeys, size_t first,
			const uint32_t *blocks, unsigned flags, uint32_t event,
			kvt_client_job **out)
{
	return job_start(cl, m, 1, flags, event, keys, nkeys, first, blocks,
			 out);
}

/* ---- events ------------------------------------------------------------------ */

int kvt_client_event_register(kvt_client *cl, int device, const uint8_t *uuid,
			      uint32_t kind, const uint8_t handle[64], int fd,
			      uint32_t *id)
{
	static const uint8_t zero[KVTD_UUID_BYTES + KVTD_HANDLE_BYTES];
	kvtd_rd rd;
	int err;

	kvti_errclear();
	if (!cl || !id || device < 0 ||
	    (kind != KVT_CLIENT_EVENT_CUDA_IPC &&
	     kind != KVT_CLIENT_EVENT_EMU_FD) ||
	    ((kind == KVT_CLIENT_EVENT_EMU_FD) != (fd >= 0)))
		return kvti_fail(-EINVAL, "client event: bad arguments");
	pthread_mutex_lock(&cl->mu);
	kvti_client_begin(cl, KVTD_MSG_EVENT);
	kvtd_put_u32(&cl->out, (uint32_t)device);
	kvtd_put_u32(&cl->out, kind);
	kvtd_put_bytes(&cl->out, uuid ? uuid : zero, KVTD_UUID_BYTES);
	kvtd_put_bytes(&cl->out, handle ? handle : zero, KVTD_HANDLE_BYTES);
	err = kvti_client_rpc(cl, fd >= 0 ? &fd : NULL, fd >= 0, &rd);
	if (!err) {
		*id = kvtd_get_u32(&rd);
		err = kvti_client_body_end(&rd);
	}
	pthread_mutex_unlock(&cl->mu);
	return err;
}

int kvt_client_event_new(kvt_client *cl, kvt_dev *dev, kvt_client_event **out)
{
	kvti_dev *d = (kvti_dev *)dev;
	kvt_client_event *e;
	kvti_dev_handle h;
	int err;

	kvti_errclear();
	if (!cl || !dev || !out)
		return kvti_fail(-EINVAL, "client event: bad arguments");
	if (!(e = kvt_calloc(1, sizeof(*e))))
		return -ENOMEM;
	e->cl = cl;
	e->d = d;
	if ((err = d->ops->event_create(d, KVTI_DEV_EV_IPC, &e->e)))
		goto fail;
	if ((err = kvti_dev_event_export(d, e->e, &h)) ||
	    (err = kvt_client_event_register(cl, d->id, d->uuid,
			h.kind == KVTI_DEV_H_EVENT_EMU ? KVT_CLIENT_EVENT_EMU_FD :
			KVT_CLIENT_EVENT_CUDA_IPC, h.data,
			h.kind == KVTI_DEV_H_EVENT_EMU ? h.fd : -1, &e->id))) {
		d->ops->event_destroy(e->e);
		goto fail;
	}
	pthread_mutex_lock(&cl->mu);
	e->next = cl->events;
	cl->events = e;
	pthread_mutex_unlock(&cl->mu);
	*out = e;
	return 0;
fail:
	kvt_free(e);
	return err;
}

int kvt_client_event_record(kvt_client_event *e, kvt_dev_stream *s)
{
	kvti_dev *d;
	kvti_dev_stream *ks = kvti_dev_stream_of(s, &d);

	kvti_errclear();
	if (d != e->d)
		return kvti_fail(-EINVAL, "client event of %s recorded on a "
				 "stream of %s", e->d->name, d->name);
	return d->ops->event_record(e->e, ks);
}

uint32_t kvt_client_event_id(const kvt_client_event *e)
{
	return e->id;
}

/* cl->mu held or the client closing. The daemon keeps its import until
 * the disconnect (jobs may still name it). */
void kvti_client_event_release(kvt_client_event *e)
{
	e->d->ops->event_destroy(e->e);
	kvt_free(e);
}

void kvt_client_event_free(kvt_client_event *e)
{
	kvt_client *cl;

	if (!e)
		return;
	cl = e->cl;
	pthread_mutex_lock(&cl->mu);
	for (kvt_client_event **p = &cl->events; *p; p = &(*p)->next)
		if (*p == e) {
			*p = e->next;
			break;
		}
	kvti_client_event_release(e);
	pthread_mutex_unlock(&cl->mu);
}

const _Atomic uint32_t *kvti_client_word_of(kvt_client_job *j)
{
	return (const _Atomic uint32_t *)(j->cl->slots +
					  (size_t)j->slot * j->cl->slot_bytes);
}

static int32_t slot_i32(kvt_client_job *j, int off)
{
	const uint8_t *p = j->cl->slots + (size_t)j->slot * j->cl->slot_bytes +
			   off;
	return __atomic_load_n((const int32_t *)p, __ATOMIC_RELAXED);
}

/* 1 once the daemon's end of the socket has gone. */
static int daemon_gone(kvt_client *cl)
{
	struct pollfd p = { .fd = cl->fd, .events = POLLRDHUP };

	if (atomic_load(&cl->gone))
		return 1;
	if (poll(&p, 1, 0) == 1 && (p.revents & (POLLRDHUP | POLLHUP |
						 POLLERR))) {
		atomic_store(&cl->gone, 1);
		return 1;
	}
	return 0;
}

/* A thread enters / leaves a wait on @cl (kvt_client_close() waits for
 * every one to leave before it frees). */
static void user_enter(kvt_client *cl)
{
	pthread_mutex_lock(&cl->mu);
	cl->users++;
	pthread_mutex_unlock(&cl->mu);
}

static void user_leave(kvt_client *cl)
{
	pthread_mutex_lock(&cl->mu);
	if (!--cl->users)
		pthread_cond_broadcast(&cl->cv);
	pthread_mutex_unlock(&cl->mu);
}

/* Wait until @ready(word) or the deadline; 0, -ETIMEDOUT, -ECONNRESET. */
static int wait_word(kvt_client_job *j, int (*ready)(uint32_t, uint32_t),
		     uint32_t arg, int64_t timeout_ns)
{
	uint64_t end = timeout_ns < 0 ? UINT64_MAX :
		       kvt_now_ns() + (uint64_t)timeout_ns;
	kvt_client *cl = j->cl;
	int err;

	for (;;) {
		uint32_t w = atomic_load_explicit(kvti_client_word_of(j),
						  memory_order_acquire);
		uint64_t now, slice = 100 * 1000 * 1000ull;
		struct timespec ts;

		if (ready(w, arg)) {
			err = 0;
			break;
		}
		if (daemon_gone(cl)) {
			err = -ECONNRESET;
			break;
		}
		now = kvt_now_ns();
		if (now >= end) {
			err = -ETIMEDOUT;
			break;
		}
		slice = KVT_MIN(slice, end - now);
		ts.tv_sec = (time_t)(slice / 1000000000ull);
		ts.tv_nsec = (long)(slice % 1000000000ull);
		syscall(SYS_futex, kvti_client_word_of(j), FUTEX_WAIT, w, &ts, NULL, 0);
	}
	return err;
}

static int is_done(uint32_t w, uint32_t arg)
{
	(void)arg;
	return !!(w & KVTD_SLOT_DONE);
}

static int layer_ready(uint32_t w, uint32_t layer)
{
	return (w & (KVTD_SLOT_DONE | KVTD_SLOT_FAILED)) ||
	       (w & KVTD_SLOT_LAYERS) > layer;
}

static int wait_layer_in(kvt_client_job *j, uint32_t layer,
			 int64_t timeout_ns)
{
	uint32_t w;
	int err;

	if (layer >= j->cl->g.layers)
		return kvti_fail(-ERANGE, "client job: layer %u of %u", layer,
				 j->cl->g.layers);
	if (j->released) /* done and released: the final word is gone */
		return j->result && j->nfailed == (long)j->st.pages ?
		       j->result : 0;
	if ((err = wait_word(j, layer_ready, layer, timeout_ns)))
		return err;
	w = atomic_load_explicit(kvti_client_word_of(j), memory_order_acquire);
	if (w & KVTD_SLOT_FAILED)
		return slot_i32(j, 8);
	if ((w & KVTD_SLOT_DONE) && (w & KVTD_SLOT_LAYERS) <= layer &&
	    slot_i32(j, 4) == -ECANCELED)
		return -ECANCELED;
	return 0;
}

/* ---- wait words, and the watch that ends their waits ---------------------- */

/*
 * The wait words (WAITS, proto.h) are a memfd we make and share once, right
 * after HELLO: the daemon writes each job's stream value into word[slot],
 * the engine's streams wait on it (kvt_client_job_stream_wait()). Unlike
 * the slot page we may write it too, and that is the point: a daemon that
 * dies mid-load leaves a stream wait on its value pending for good (CUDA
 * has no timeout), so when the connection is lost we set every pending
 * job's word to its end value ourselves — each wait of it is released, and
 * the job itself reports -ECONNRESET (kvt_client_job_failed() too), so
 * the engine sees a failure, never an unverified layer as ready.
 *
 * Who notices: a thread (the watch) started by the first stream wait,
 * blocked in poll() for the daemon's end of the socket (POLLRDHUP: the
 * daemon closed it or died; our own SHUT_WR does not raise it). The daemon
 * closes a connection only after it freed its jobs (conn.c), so after
 * that no one but us writes the words. CPU waits need no watch: they poll
 * the socket themselves (wait_word()).
 */
int kvti_client_waits_make(kvt_client *cl, uint32_t nwords)
{
	const int seals = F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL;
	size_t len = KVTD_WAITS_BYTES(nwords);
	kvtd_rd rd;
	void *p;
	int fd, err;

	fd = memfd_create("kvtier-waits", MFD_CLOEXEC | MFD_ALLOW_SEALING);
	if (fd < 0)
		return kvti_fail(-errno, "client: wait words: memfd_create: %s",
				 strerror(errno));
	if (ftruncate(fd, (off_t)len) || fcntl(fd, F_ADD_SEALS, seals)) {
		err = kvti_fail(-errno, "client: wait words: sizing and "
				"sealing %zu bytes: %s", len, strerror(errno));
		close(fd);
		return err;
	}
	p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	if (p == MAP_FAILED) {
		err = kvti_fail(-errno, "client: wait words: mmap: %s",
				strerror(errno));
		close(fd);
		return err;
	}
	cl->waits = p;
	cl->waits_len = len;
	pthread_mutex_lock(&cl->mu);
	kvti_client_begin(cl, KVTD_MSG_WAITS);
	kvtd_put_u32(&cl->out, nwords);
	err = kvti_client_rpc(cl, &fd, 1, &rd);
	pthread_mutex_unlock(&cl->mu);
	close(fd);
	return err;
}

/* The connection is lost: every job not released has its stream word set
 * to its end (its streams go on) and ends with -ECONNRESET. */
static void waits_abort(kvt_client *cl)
{
	atomic_store(&cl->gone, 1);
	pthread_mutex_lock(&cl->mu);
	for (kvt_client_job *j = cl->jobs; j; j = j->next) {
		uint32_t *w = &cl->waits[j->slot];

		if (j->released)
			continue;
		if (!kvtd_stream_advance(w, KVTD_STREAM_WORD(j->gen,
							     KVTD_STREAM_END)))
			/* only our own scribbling could do this */
			__atomic_store_n(w, KVTD_STREAM_WORD(j->gen,
				KVTD_STREAM_END), __ATOMIC_RELEASE);
		syscall(SYS_futex, w, FUTEX_WAKE, INT_MAX, NULL, NULL, 0);
		syscall(SYS_futex, kvti_client_word_of(j), FUTEX_WAKE, INT_MAX,
			NULL, NULL, 0);
	}
	pthread_mutex_unlock(&cl->mu);
}

static void *watch_main(void *arg)
{
	kvt_client *cl = arg;
	struct pollfd p[2] = { { .fd = cl->fd, .events = POLLRDHUP },
			       { .fd = cl->watch_efd, .events = POLLIN } };

	for (;;) {
		if (poll(p, 2, -1) < 0) {
			if (errno == EINTR)
				continue;
			kvti_warn("client: the connection watch stops: poll: "
				  "%s (a daemon that dies will leave stream "
				  "waits pending)", strerror(errno));
			return NULL;
		}
		if (p[1].revents)
			return NULL; /* kvt_client_close() */
		if (p[0].revents & (POLLRDHUP | POLLHUP | POLLERR))
			break;
	}
	waits_abort(cl);
	return NULL;
}

/* cl->mu held: start the watch once. */
static int watch_start(kvt_client *cl)
{
	int e;

	if (cl->watching)
		return 0;
	if (cl->watch_efd < 0 &&
	    (cl->watch_efd = eventfd(0, EFD_CLOEXEC)) < 0)
		return kvti_fail(-errno, "client: the connection watch: "
				 "eventfd: %s", strerror(errno));
	e = kvti_fault() ? EAGAIN : pthread_create(&cl->watch, NULL,
						    watch_main, cl);
	if (e)
		return kvti_fail(-e, "client: the connection watch thread: %s "
				 "(stream waits are refused without it: a "
				 "daemon that died would hold them for good)",
				 strerror(e));
	cl->watching = 1;
	return 0;
}

void kvti_client_watch_stop(kvt_client *cl)
{
	uint64_t one = 1;
	int watching;

	pthread_mutex_lock(&cl->mu);
	watching = cl->watching;
	cl->watching = 0;
	pthread_mutex_unlock(&cl->mu);
	if (watching) {
		if (write(cl->watch_efd, &one, sizeof(one)) != sizeof(one))
			kvti_warn("client: stopping the connection watch: %s",
				  strerror(errno));
		pthread_join(cl->watch, NULL);
	}
	if (cl->watch_efd >= 0)
		close(cl->watch_efd);
	cl->watch_efd = -1;
}

/* cl->mu held: the wait words registered with @d (once per device). */
static int waits_on(kvt_client *cl, kvti_dev *d)
{
	int k, err = 0;

	if (!cl->waits)
		return kvti_fail(-EINVAL, "client: a monitoring connection has "
				 "no jobs to wait on");
	for (k = 0; k < SLOT_DEVS && cl->wait_dev[k] && cl->wait_dev[k] != d;
	     k++)
		;
	if (k == SLOT_DEVS)
		return kvti_fail(-ENOSPC, "client: stream waits on more than %d "
				 "devices", SLOT_DEVS);
	if (cl->wait_dev[k])
		return 0;
	err = d->ops->host_register(d, cl->waits, cl->waits_len,
				    KVTI_DEV_HOST_PORTABLE);
	cl->wait_reg[k] = !err;
	if (err == -EEXIST) /* CUDA: another GPU of ours did it */
		err = 0;
	if (!err && (err = kvti_dev_get(d->id, &cl->wait_dev[k])) &&
	    cl->wait_reg[k])
		d->ops->host_unregister(d, cl->waits);
	return err;
}

int kvt_client_job_stream_wait(kvt_client_job *j, uint32_t layer,
			       kvt_dev_stream *s)
{
	kvt_client *cl = j->cl;
	kvti_dev *d;
	kvti_dev_stream *ks = kvti_dev_stream_of(s, &d);
	int err;

	kvti_errclear();
	if (layer >= cl->g.layers)
		return kvti_fail(-ERANGE, "client job: layer %u of %u", layer,
				 cl->g.layers);
	if (j->device != d->id)
		return kvti_fail(-EINVAL, "client job: its memory is on %d, the "
				 "stream on %s", j->device, d->name);
	pthread_mutex_lock(&cl->mu);
	if (!(err = waits_on(cl, d)))
		err = watch_start(cl);
	pthread_mutex_unlock(&cl->mu);
	if (err)
		return err;
	/* a connection lost before the watch began: its poll sees it at
	 * once and ends the wait enqueued here */
	return kvti_dev_stream_wait_value(d, ks, &cl->waits[j->slot],
					  KVTD_STREAM_WORD(j->gen, layer + 1));
}

static int wait_in(kvt_client_job *j, int64_t timeout_ns)
{
	int err;

	if (j->released)
		return j->result;
	if ((err = wait_word(j, is_done, 0, timeout_ns)))
		return err;
	return slot_i32(j, 4);
}

/* The waits run counted (user_enter/leave) from start to end: the job is
 * not freed under them by kvt_client_close() in another thread. */
int kvt_client_job_wait_layer(kvt_client_job *j, uint32_t layer,
			      int64_t timeout_ns)
{
	kvt_client *cl = j->cl;
	int err;

	user_enter(cl);
	err = wait_layer_in(j, layer, timeout_ns);
	user_leave(cl);
	return err;
}

uint64_t kvt_client_job_layer_ns(kvt_client_job *j, uint32_t layer)
{
	const uint8_t *p;
	uint32_t w;

	if (j->released || layer >= j->cl->g.layers ||
	    j->cl->slot_bytes < KVTD_SLOT_STAMP_OFF + 8 || j->cl->slot_bytes % 8)
		return 0;
	w = atomic_load_explicit(kvti_client_word_of(j), memory_order_acquire);
	if (!layer_ready(w, layer))
		return 0;
	p = j->cl->slots + (size_t)j->slot * j->cl->slot_bytes +
	    KVTD_SLOT_STAMP_OFF;
	return __atomic_load_n((const uint64_t *)p, __ATOMIC_RELAXED);
}

int kvt_client_job_wait(kvt_client_job *j, int64_t timeout_ns)
{
	kvt_client *cl = j->cl;
	int err;

	user_enter(cl);
	err = wait_in(j, timeout_ns);
	user_leave(cl);
	return err;
}

int kvt_client_job_poll(kvt_client_job *j)
{
	uint32_t w;

	if (j->released)
		return j->result;
	w = atomic_load_explicit(kvti_client_word_of(j), memory_order_acquire);
	if (w & KVTD_SLOT_DONE)
		return slot_i32(j, 4);
	return daemon_gone(j->cl) ? -ECONNRESET : -EINPROGRESS;
}

int kvt_client_job_cancel(kvt_client_job *j)
{
	kvt_client *cl = j->cl;
	kvtd_rd rd;
	int err;

	if (kvt_client_job_poll(j) != -EINPROGRESS)
		return -EALREADY;
	pthread_mutex_lock(&cl->mu);
	kvti_client_begin(cl, KVTD_MSG_CANCEL);
	kvtd_put_u32(&cl->out, j->slot);
	err = kvti_client_rpc(cl, NULL, 0, &rd);
	pthread_mutex_unlock(&cl->mu);
	return err;
}

/* cl->mu held: no RELEASE can be sent, the job ended with the connection.
 * One not done then failed as a whole: -ECONNRESET here and from every
 * later kvt_client_job_failed() (never a list of no failed blocks); one
 * done keeps its result, though the slot says nothing of which of its
 * blocks failed. */
static int job_lost(kvt_client_job *j)
{
	j->released = 1;
	j->result = -ECONNRESET;
	j->lost = !(atomic_load_explicit(kvti_client_word_of(j),
					 memory_order_acquire) & KVTD_SLOT_DONE);
	return j->lost ? kvti_fail(-ECONNRESET, "client: the job was lost "
				   "with the connection") : 0;
}

/* cl->mu held; the job is done (or the daemon gone): RELEASE once. */
static int job_release(kvt_client_job *j)
{
	kvt_client *cl = j->cl;
	kvtd_rd rd;
	uint32_t nt, nf;
	int err;

	if (j->released)
		return j->lost ? kvti_fail(-ECONNRESET, "client: the job was "
					   "lost with the connection") : 0;
	if (atomic_load(&cl->gone) || cl->broken)
		return job_lost(j);
	kvti_client_begin(cl, KVTD_MSG_RELEASE);
	kvtd_put_u32(&cl->out, j->slot);
	if ((err = kvti_client_rpc(cl, NULL, 0, &rd))) {
		if (atomic_load(&cl->gone) || cl->broken)
			return job_lost(j);
		return err;
	}
	j->result = (int32_t)kvtd_get_u32(&rd);
	j->st.pages = kvtd_get_u64(&rd);
	j->st.copied = kvtd_get_u64(&rd);
	j->st.skipped = kvtd_get_u64(&rd);
	j->st.failed = kvtd_get_u64(&rd);
	j->st.verified = kvtd_get_u64(&rd);
	j->st.bytes = kvtd_get_u64(&rd);
	nt = kvtd_get_u32(&rd);
	for (uint32_t t = 0; t < nt && !rd.err; t++) {
		uint64_t v = kvtd_get_u64(&rd);
		if (t < KVT_TIER_COUNT)
			j->st.from[t] = v;
	}
	j->st.wait_s = kvtd_get_f64(&rd);
	j->st.layer0_s = kvtd_get_f64(&rd);
	j->st.total_s = kvtd_get_f64(&rd);
	j->st.busy = kvtd_get_u64(&rd);
	j->st.absent = kvtd_get_u64(&rd);
	nf = kvtd_get_u32(&rd);
	if (!rd.err && nf > (rd.len - rd.off) / 4)
		rd.err = KVT_EPROTO;
	if ((err = kvti_client_body_end(&rd)))
		return err;
	if (nf && !(j->failed = kvt_malloc(nf * sizeof(*j->failed))))
		return -ENOMEM;
	for (uint32_t i = 0; i < nf; i++)
		j->failed[i] = kvtd_get_u32(&rd);
	j->nfailed = nf;
	j->released = 1;
	cl->used[j->slot] = 0;
	cl->njobs--;
	return 0;
}

static int job_fetch(kvt_client_job *j)
{
	int err = kvt_client_job_poll(j);

	if (err == -EINPROGRESS)
		return err;
	pthread_mutex_lock(&j->cl->mu);
	err = job_release(j);
	pthread_mutex_unlock(&j->cl->mu);
	return err;
}

long kvt_client_job_failed(kvt_client_job *j, uint32_t *blocks, size_t max)
{
	int err = job_fetch(j);

	if (err)
		return err;
	for (long i = 0; i < j->nfailed && (size_t)i < max; i++)
		blocks[i] = j->failed[i];
	return j->nfailed;
}

void kvt_client_job_stat_get(kvt_client_job *j, kvt_cache_job_stat *st)
{
	if (job_fetch(j))
		memset(st, 0, sizeof(*st));
	else
		*st = j->st;
}

/* cl->mu held. */
void kvti_client_job_unlink_free(kvt_client_job *j)
{
	kvt_client *cl = j->cl;

	if (j->prev)
		j->prev->next = j->next;
	else
		cl->jobs = j->next;
	if (j->next)
		j->next->prev = j->prev;
	kvt_free(j->failed);
	kvt_free(j);
}

void kvt_client_job_free(kvt_client_job *j)
{
	kvt_client *cl;

	if (!j)
		return;
	cl = j->cl;
	if (kvt_client_job_poll(j) == -EINPROGRESS) {
		/* a live daemon ends a cancelled job within its lease */
		kvt_client_job_cancel(j);
		if (kvt_client_job_wait(j, (int64_t)kvti_client_letgo_ns(cl)) ==
		    -ETIMEDOUT) {
			/* hung: drop the connection, the daemon's teardown is
			 * the only way left to end the job */
			pthread_mutex_lock(&cl->mu);
			kvti_client_conn_break(cl);
			pthread_mutex_unlock(&cl->mu);
			if (!kvti_client_drain_to_eof(cl, kvt_now_ns() + kvti_client_letgo_ns(cl)))
				kvti_warn("client: job slot %u did not stop in "
					  "%llu ms of a cancel, nor the daemon "
					  "let go of the connection: freed while "
					  "it may still run", j->slot,
					  (unsigned long long)
					  (2 * kvti_client_letgo_ns(cl) / 1000000));
		}
	}
	pthread_mutex_lock(&cl->mu);
	if (job_release(j) && !j->released) {
		/* the daemon holds the slot: keep it out of use */
		kvti_warn("client: job slot %u not released: %s", j->slot,
			  kvt_errdetail());
	}
	kvti_client_job_unlink_free(j);
	pthread_mutex_unlock(&cl->mu);
}

