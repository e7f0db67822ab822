/*
 * daemon_impl.h — the inside of kvtierd, shared by its files. Internal to
 * libkvtier (server.h is what `kvtier serve` sees).
 *
 * FILES
 *
 *   daemon.c  open, run (accept, SO_PEERCRED, max_clients), stop, close
 *             (drain); the socket; the lease reaper; the metrics collect
 *             hook.
 *   tenant.c  the tenant table: --tenants parsing, peer-credential checks,
 *             the cache's tenant ids (tenant x TP rank), quotas.
 *   conn.c    a connection's thread: the request loop, replies, HELLO and
 *             its job-slot page, dispatch of every op, teardown.
 *   mem.c     REGISTER / UNREGISTER / EVENT: a client's memory (host
 *             memfds, device memory by handle), checked, mapped or
 *             imported, attached to the cache; its IPC events.
 *   job.c     LOAD / STORE / CANCEL / RELEASE: jobs in job slots, their
 *             progress on the shared page, the remote prefetch a LOOKUP
 *             starts.
 *   fprint.c  FPRINT: the engines' page-hash fingerprints per tenant,
 *             conflicts counted and logged.
 *
 * THE OBJECTS
 *
 *   struct kvtd ----- ten[nten]  (fixed after kvtd_open)
 *        |
 *        +-- conns --> struct conn --> next ...      (d->mu)
 *                        | jobs[MAX_JOBS] --> struct job (c->mu)
 *                        | mems[MAX_MEMS]     struct cmem (conn thread)
 *                        | events[MAX_EVENTS] struct cevent (conn thread)
 *                        | slots: MAX_JOBS * KVTD_SLOT_BYTES, shared with
 *                        |        the client read-only
 *                        | t --> struct tenant (one of d->ten[])
 *
 * LOCKS (a field not named here is fixed once set, or owned by the one
 * thread that uses it)
 *
 *   d->mu     d->conns, d->nconns, d->next_id, d->stopping, d->registered,
 *             d->refused_ns, each tenant's fingerprints (@fps, @nfp,
 *             @fp_warned, @fp_conflicts), each conn's @next; each
 *             conn's @hello, @monitor and @t are written under it
 *             (admission counts them; the conn's own thread reads them
 *             without it); d->cv is
 *             signalled when nconns drops and at stop. Taken before any
 *             c->mu (the reaper, close).
 *   c->mu     c->jobs[] and c->njobs as the reaper and close read them;
 *             each job's @expired. Only the connection thread writes
 *             jobs[] (under c->mu), so it reads them without the lock.
 *   none      everything else in struct conn belongs to its thread:
 *             hello, monitor, t, rank, itenant, mems, fetch, in, out. The
 *             cache's threads touch only a job's slot (on_progress) and
 *             the conn's efd, both fixed while the job lives.
 *   metrics   a tenant's @evicted is read and written by the collect hook
 *             only, which the metrics registry runs under its own mutex.
 *
 * No lock is held across a cache call that waits, except that close waits
 * for jobs (a lease at most) under d->mu and c->mu.
 */
#ifndef KVT_SERVER_DAEMON_IMPL_H
#define KVT_SERVER_DAEMON_IMPL_H

#include "server/server.h"
#include "server/metrics.h"
#include "server/proto.h"
#include "core/core.h"

#include <pthread.h>
#include <stdatomic.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <sys/un.h>

#define MAX_JOBS 1024
#define MAX_MEMS 8
#define MAX_EVENTS 16
#define MAX_TENANTS 64
#define MAX_IDS 16
#define MAX_GROUPS 64 /* a peer's supplementary groups looked at */
#define KVTI_FP_KEEP 8 /* distinct fingerprints kept per tenant (FPRINT) */

/* Admission (tenant.c): connections not past HELLO per uid; monitors in
 * all and per uid; a uid other than root holds at most UID_SHARE_NUM /
 * UID_SHARE_DEN of max_clients, so another always finds room. */
#define MAX_PREHELLO_PER_UID 8
#define MAX_MONITORS 8
#define MAX_MONITORS_PER_UID 2
#define UID_SHARE_NUM 3
#define UID_SHARE_DEN 4

struct tenant {
	char name[KVTD_METRICS_NAME_MAX + 1];
	uint32_t id;
	uint64_t salt;
	uid_t uid[MAX_IDS];
	gid_t gid[MAX_IDS];
	int nuid, ngid;
	uint32_t max_clients;           /* clients=N; 0: no cap of its own */
	int admin;                      /* admin: STATS shows every tenant */
	uint64_t mem_max;               /* mem=SIZE: bytes its connections
					   may register in all */
	_Atomic uint64_t mem_used;      /* registered now (mem.c) */
	uint64_t quota[KVT_TIER_COUNT]; /* bytes per owned tier; 0: none */
	char rkey[256];                 /* rkey=PATH: its own remote MAC key
					   file ("": the namespace's key) */
	uint64_t evicted[KVT_TIER_COUNT]; /* collect(): evictions seen */
	kvtd_mtenant *mt;
	/* FPRINT (fprint.c; d->mu): the distinct fingerprints its engines
	 * published, first come first kept, at most KVTI_FP_KEEP */
	struct {
		uint32_t scheme;
		uint8_t fp[KVTD_FP_BYTES];
	} fps[KVTI_FP_KEEP];
	int nfp;
	int fp_warned;                  /* its first conflict was logged */
	uint64_t fp_conflicts;          /* new fingerprints that differed */
};

struct conn;

struct job {
	struct conn *c;
	kvt_cache_job *cj;
	_Atomic int counted;  /* in d->running_*: set at start, cleared at
				 done (whichever thread gets there) */
	uint64_t pages;      /* the prefix it pins */
	uint32_t slot;
	uint32_t gen;        /* the slot's generation for this job */
	int store;
	uint64_t t0, deadline;
	int expired;         /* c->mu */
	int dropped;         /* conn thread: cancelled at the connection's
				end (kvti_jobs_cancel_all()), counted */
};

/* One allocation of a registered memory: a host mapping, or a device
 * import. */
struct cseg {
	void *base;
	size_t len;
	int dev;              /* 1: kvti_dev_unimport(), 0: munmap() */
};

struct cmem {
	uint32_t id;          /* 0: unused */
	kvt_cache_mem *m;
	int device;           /* -1: host memory; else the daemon's device id */
	struct kvti_dev *dev; /* device memory: the device (a reference) */
	uint32_t nseg;
	struct cseg seg[KVTD_MAX_SEGS];
	size_t len;           /* all segments' bytes */
	uint64_t reserved;    /* of its tenant's mem= (mem.c) */
};

/* An engine's IPC event, opened on its device. */
struct cevent {
	uint32_t id;          /* 0: unused */
	struct kvti_dev *dev;
	struct kvti_dev_event *ev;
};

struct conn {
	kvtd *d;
	int fd;
	struct ucred cred;
	gid_t groups[MAX_GROUPS];    /* SO_PEERGROUPS at accept */
	int ngroups;
	int hello;                   /* written under d->mu */
	int monitor;                 /* HELLO without geometry: STATS only;
					written under d->mu */
	struct tenant *t;            /* written under d->mu */
	uint32_t rank, itenant, id;
	int slot_fd, efd;
	uint8_t *slots;
	uint32_t *waits;             /* the client's wait words (WAITS), or
					NULL: set before the first job, by
					the conn thread */
	pthread_mutex_t mu;          /* jobs[] */
	struct job *jobs[MAX_JOBS];
	int njobs;
	struct cmem mems[MAX_MEMS];
	uint32_t next_mem;
	struct cevent events[MAX_EVENTS];
	uint32_t next_event;
	kvt_cache_fetch *fetch;      /* a remote prefetch this client's lookup
					started, ended by its next LOAD */
	kvtd_buf in, out;
	struct conn *next;           /* d->mu */
};

struct kvtd {
	kvtd_config cfg;
	kvt_cache *c;
	const kvt_geom *g;
	char ns[KVTD_NS_MAX + 1];
	struct tenant ten[MAX_TENANTS];
	int nten;
	int lfd, stopfd;
	char path[sizeof(((struct sockaddr_un *)0)->sun_path)];
	kvtd_metrics *m;
	kvtd_http *http;

	pthread_mutex_t mu;
	pthread_cond_t cv;
	struct conn *conns;
	int nconns;
	int stopping;
	pthread_t reaper;
	int have_reaper;
	uint64_t registered; /* bytes */
	uint32_t next_id;
	_Atomic int draining; /* kvtd_close(): no new job starts */
	_Atomic int64_t running_jobs;  /* jobs started, not done (job.c) */
	_Atomic int64_t running_pages; /* the pages they pin */
	uint64_t refused_ns; /* last refusal logged (one a second) */
	uint64_t refused;    /* refusals since then, not logged */
};

/* ---- tenant.c ---------------------------------------------------------- */

/* Parse @spec ("NAME:ID[,uid=U][,gid=G][,salt=S][,quota=TIER:SIZE]" joined
 * by ';'; empty: "default:0" for the daemon's uid) into d->ten[]. */
int kvti_tenants_parse(kvtd *d, const char *spec);

/* Make every (tenant, rank) a tenant of the cache, with its salt and its
 * share of the quotas; a metrics block per tenant. */
int kvti_tenants_open(kvtd *d);

/* The tenant a HELLO may act as: the one with id @id, or for a @monitor
 * the first that allows the peer; -EACCES (an unknown id and one the
 * peer may not act as are refused alike: no one learns which ids exist),
 * detail set. */
int kvti_tenant_resolve(kvtd *d, const struct conn *c, int monitor,
			uint32_t id, int *ti);

/* The peer's supplementary groups into c->groups (SO_PEERGROUPS). */
void kvti_peer_groups(struct conn *c);

/* At accept, d->mu held: may this peer hold a connection now? 0, or
 * -EACCES (no tenant allows it) / KVT_EBUSY (a limit), detail set. */
int kvti_admit_accept(kvtd *d, const struct conn *c);

/* At HELLO: take the connection in as tenant @ti (monitor or not) under
 * d->mu, or refuse it (KVT_EBUSY: a monitor or tenant limit). */
int kvti_admit_hello(kvtd *d, struct conn *c, int ti, int monitor);

/* Log a refused connection at warning level, at most once a second (with
 * how many were not logged). */
void kvti_refused_log(kvtd *d, const struct conn *c, const char *why);

/* The cache's tenant id of d->ten[@ti] at TP rank @rank. */
static inline uint32_t kvti_itenant(const kvtd *d, int ti, uint32_t rank)
{
	return 1 + (uint32_t)ti * d->g->tp_size + rank;
}

/* ---- fprint.c ---------------------------------------------------------- */

/* FPRINT of @c: record fingerprint @fp of @scheme for c's tenant; *@others
 * gets how many distinct fingerprints of @scheme it published before that
 * differ (0: all agree), *@conflicts the tenant's conflicts so far. A new
 * fingerprint that differs is a conflict: counted
 * (kvtier_fingerprint_conflicts_total), the tenant's first logged at
 * warning level. */
void kvti_fprint_publish(struct conn *c, uint32_t scheme, const uint8_t *fp,
			 uint32_t *others, uint64_t *conflicts);

/* ---- conn.c ------------------------------------------------------------ */

/* The connection thread (detached); frees @arg (a struct conn) at the end. */
void *kvti_conn_main(void *arg);

/* Cancel and free everything @c holds, close it, drop it from d->conns. */
void kvti_conn_free(struct conn *c);

/* Count a refused request (why), pass @err through. */
int kvti_perr(struct conn *c, enum kvtd_proto_err why, int err);

/* A reply to @h: status (with kvt_errdetail() when nonzero), then the
 * caller's body into c->out, then send. */
void kvti_reply_begin(struct conn *c, const kvtd_hdr *h, int status);
int kvti_reply_send(struct conn *c, const int *fds, int nfds);
int kvti_reply_status(struct conn *c, const kvtd_hdr *h, int status);

/* ---- mem.c ------------------------------------------------------------- */

/* REGISTER: check, map or import the segments (@fds: those that came),
 * attach; *@id its mem id. */
int kvti_mem_register(struct conn *c, const kvtd_req *q, const int *fds,
		      int nfds, uint32_t *id);
/* EVENT: import the engine's IPC event (@fd for an emulated one). */
int kvti_event_register(struct conn *c, const kvtd_req *q, int fd,
			uint32_t *id);
/* Event @id of @c (a struct kvti_dev_event *), or NULL. */
void *kvti_event_find(struct conn *c, uint32_t id);
/* Close every event (the jobs that named them are gone). */
void kvti_events_drop(struct conn *c);
/* Detach (waits for its jobs), unmap, forget. */
void kvti_mem_drop(struct conn *c, struct cmem *cm);
/* @c's memory @id, or NULL. */
struct cmem *kvti_mem_find(struct conn *c, uint32_t id);

/* ---- job.c ------------------------------------------------------------- */

/* LOAD / STORE (@store) [_EACH (@each)]: start a job in its slot. */
int kvti_job_start(struct conn *c, const kvtd_req *q, int store, int each);
/* CANCEL of slot @s. */
int kvti_job_cancel(struct conn *c, uint32_t s);
/* RELEASE of slot @s: the reply (result, stats, failed blocks) is sent. */
int kvti_job_release(struct conn *c, const kvtd_hdr *h, uint32_t s);
/* Free the job in slot @s, if any (cancels and waits if it runs). */
void kvti_job_free(struct conn *c, uint32_t s);
/* The connection's end: cancel every job still running, waiting for
 * none (each counted as a disconnect expiry); kvti_job_free() after. */
void kvti_jobs_cancel_all(struct conn *c);
/* WAITS: map the client's wait-word memfd @fd (checked: sealed, its size
 * exactly KVTD_WAITS_BYTES(MAX_JOBS)); kvti_waits_drop() at the end. */
int kvti_waits_register(struct conn *c, const kvtd_req *q, int fd);
void kvti_waits_drop(struct conn *c);

/* @n wire keys at @p as kvt_page_keys (kvt_malloc'd), or NULL. */
kvt_page_key *kvti_keys_copy(const uint8_t *p, uint32_t n);
/* Start prefetching keys[first..nkeys) from the remote tier (one at a
 * time per client: ends the last one). */
void kvti_fetch_start(struct conn *c, const kvt_page_key *keys, size_t nkeys,
		      size_t first);
/* End this client's prefetch: @cut 1 keeps what arrived and stops. */
void kvti_fetch_end(struct conn *c, int cut);

#endif /* KVT_SERVER_DAEMON_IMPL_H */
