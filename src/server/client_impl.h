/*
 * client_impl.h — what client.c (connect, memory, keys, lookup, stats, close)
 * and client_job.c (jobs, events, waits, release) share: the handles' structs
 * and the request helpers. Internal; include/kvtier/client.h is the manual.
 */
#ifndef KVT_SERVER_CLIENT_IMPL_H
#define KVT_SERVER_CLIENT_IMPL_H

#include <kvtier/client.h>
#include "dev/dev.h"
#include "server/io.h"
#include "server/proto.h"
#include "core/core.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <linux/futex.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>


#define SLOT_DEVS 8

struct kvt_client_mem {
	kvt_client *cl;
	uint32_t id;
	int device;           /* -1: host memory */
	int fd;               /* ours (kvt_client_mem_alloc), or -1 */
	void *map;
	size_t len;
	kvt_client_mem *next; /* cl->mu */
};

struct kvt_client_job {
	kvt_client *cl;
	uint32_t slot;
	uint32_t gen;         /* the slot's generation for this job */
	int device;           /* its memory's device (-1: host) */
	int released;         /* cl->mu: RELEASE done, fields below valid */
	int lost;             /* cl->mu: ...or not: lost, not done, with the
				 connection (every block failed) */
	int result;
	kvt_cache_job_stat st;
	uint32_t *failed;
	long nfailed;
	kvt_client_job *prev, *next; /* cl->mu */
};

struct kvt_client {
	int fd;
	pthread_mutex_t mu;   /* the socket, the lists, slot allocation */
	uint32_t seq;
	kvt_geom g;
	uint32_t id, max_jobs, slot_bytes, lease_ms;
	uint64_t page_bytes;
	const uint8_t *slots;
	size_t slots_len;
	int efd;
	uint8_t *used;        /* max_jobs */
	uint32_t njobs;
	kvt_client_job *jobs;
	kvt_client_mem *mems;
	kvt_client_event *events;
	uint32_t *waits;      /* our wait words (WAITS, proto.h): word[slot]
				 is the slot's stream value, written by the
				 daemon and, once it is lost, by us */
	size_t waits_len;
	kvti_dev *wait_dev[SLOT_DEVS]; /* cl->mu: devices the wait words are
					  registered with (stream waits) */
	int wait_reg[SLOT_DEVS];       /* ...by us (unregistered at close) */
	pthread_t watch;      /* watches the socket while stream waits may
				 be pending (client_job.c) */
	int watching;         /* cl->mu: the thread runs */
	int watch_efd;        /* tells it to stop */
	kvtd_buf out, in;
	uint32_t timeout_ms;  /* per request */
	int broken;           /* cl->mu: no more requests (see above) */
	_Atomic int gone;     /* the daemon's end closed: it let go */
	_Atomic int closing;  /* kvt_client_shutdown() ran */
	int users;            /* cl->mu: threads inside a wait */
	pthread_cond_t cv;    /* users dropped */
};

struct kvt_client_event {
	kvt_client *cl;
	kvti_dev *d;
	kvti_dev_event *e;
	uint32_t id;
	kvt_client_event *next; /* cl->mu */
};


/* client.c: requests (serialized by cl->mu; see its design comment) */
int kvti_client_drain_to_eof(kvt_client *cl, uint64_t deadline);
void kvti_client_conn_break(kvt_client *cl);          /* the "broken" end */
uint64_t kvti_client_letgo_ns(const kvt_client *cl); /* lease + timeout */
void kvti_client_begin(kvt_client *cl, uint16_t op); /* a request in cl->out */
int kvti_client_rpc(kvt_client *cl, const int *fds, int nfds, kvtd_rd *rd);
int kvti_client_body_end(kvtd_rd *rd);               /* the reply was whole */

/* client_mem.c: a registration's end; @tell: UNREGISTER first (cl->mu
 * held) */
void kvti_client_mem_release(kvt_client_mem *m, int tell);

/* client_job.c: what close, shutdown and the stream-wait registration use */
const _Atomic uint32_t *kvti_client_word_of(kvt_client_job *j);
int kvti_client_waits_make(kvt_client *cl, uint32_t nwords); /* WAITS */
void kvti_client_watch_stop(kvt_client *cl);   /* cl->mu not held */
void kvti_client_job_unlink_free(kvt_client_job *j); /* cl->mu held */
void kvti_client_event_release(kvt_client_event *e);

#endif
