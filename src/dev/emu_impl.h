/*
 * emu_impl.h — what the emulated device's three files share (internal;
 * dev.h is the manual, emu.c's comment the design):
 *
 *   emu.c         the device: open/close, test hooks, memory (alloc,
 *                 import, host registration) and THE ACCESS CHECK over its
 *                 ranges, the vtable
 *   emu_event.c   events: the shared {recorded, completed, status} record,
 *                 IPC events in a memfd page, query and CPU waits
 *   emu_stream.c  streams: a thread each running a FIFO of operations
 *                 (copies, gather, sum, records, waits, host functions)
 *
 * Locking (emu.c's comment): e->rw guards the ranges; a stream's mu its
 * queue; events are lock-free.
 */
#ifndef KVT_DEV_EMU_IMPL_H
#define KVT_DEV_EMU_IMPL_H

#include "dev/dev.h"
#include "dev/xxh3.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <linux/futex.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

enum { R_ALLOC, R_IMPORT, R_HOST, R_HOSTALLOC };

struct emu_range {
	char *base;
	size_t len;
	int kind;
	unsigned flags;          /* KVTI_DEV_HOST_* */
	int fd;                  /* R_ALLOC: the memfd */
	struct emu_range *next;
};

struct emu {
	pthread_rwlock_t rw;
	struct emu_range *ranges;
	_Atomic uint64_t delay;      /* ns per MiB moved */
	_Atomic uint64_t wait_limit; /* ns */
	_Atomic uint64_t damage;     /* copies still to land damaged */
};

#define EV_BYTES 4096u

/* An event's shared part: a private allocation, or a memfd page. */
struct emu_shev {
	_Atomic uint64_t recorded;
	_Atomic uint64_t completed;
	_Atomic int32_t status;
	_Atomic uint32_t futex;
	char detail[200];
};

struct kvti_dev_event {
	kvti_dev *d;
	struct emu_shev *sh;
	_Atomic int refs;
	int fd;                  /* IPC: the memfd; -1 */
	int imported;            /* a peer's: wait on it, never record */
	int mapped;              /* sh is a mapping (IPC, imported) */
};

enum { OP_COPY, OP_BATCH, OP_GATHER, OP_SUM, OP_RECORD, OP_WAIT_EVENT,
       OP_WAIT_VALUE, OP_FN, OP_SYNC };

struct emu_sync {
	int done, err;
	char detail[200];
};

struct emu_op {
	int type;
	union {
		struct { void *dst; const void *src; size_t n; } copy;
		struct { void *const *dst; const void *const *src;
			 const size_t *n; size_t count; } batch;
		kvti_dev_gather gather;
		kvti_dev_sum sum;
		struct { kvti_dev_event *e; uint64_t seq; } ev;
		struct { const uint32_t *addr; uint32_t value; } wv;
		struct { void (*fn)(void *); void *arg; } fn;
		struct emu_sync *sync;
	} u;
	struct emu_op *next;
};

struct kvti_dev_stream {
	kvti_dev *d;
	struct emu *e;
	pthread_t th;
	pthread_mutex_t mu;
	pthread_cond_t cv;        /* work arrived; an operation finished */
	struct emu_op *head, *tail;
	int stop;
	int err;                  /* thread: first failure since a record */
	char detail[200];
};

static inline struct emu *E(kvti_dev *d)
{
	return d->priv;
}

/* ---- futexes (shared: the words may live in memory of two processes) --- */

static inline void fwait(const void *addr, uint32_t val, int64_t ns)
{
	struct timespec ts = { .tv_sec = ns / 1000000000, .tv_nsec = ns % 1000000000 };

	syscall(SYS_futex, addr, FUTEX_WAIT, val, &ts, NULL, 0);
}

static inline void fwake(void *addr)
{
	syscall(SYS_futex, addr, FUTEX_WAKE, INT_MAX, NULL, NULL, 0);
}

/* emu.c: the ranges and the access check (rw read- or write-held) */
struct emu_range *kvti_emu_range_of(struct emu *e, const void *p, size_t n);
int kvti_emu_access_ok(kvti_dev *d, const void *p, size_t n, int write);

/* emu_event.c */
int kvti_emu_event_create(kvti_dev *d, unsigned flags, kvti_dev_event **out);
void kvti_emu_event_put(kvti_dev_event *ev);   /* drop a reference */
void kvti_emu_event_destroy(kvti_dev_event *ev);
int kvti_emu_event_export(kvti_dev_event *ev, kvti_dev_handle *h);
int kvti_emu_event_import(kvti_dev *d, const kvti_dev_handle *h,
			  kvti_dev_event **out);
int kvti_emu_event_query(kvti_dev_event *ev);
int kvti_emu_event_sync(kvti_dev_event *ev, int64_t timeout_ns);

/* emu_stream.c */
int kvti_emu_stream_create(kvti_dev *d, int high_prio, kvti_dev_stream **out);
void kvti_emu_stream_destroy(kvti_dev_stream *s);
int kvti_emu_stream_sync(kvti_dev_stream *s);
int kvti_emu_copy(kvti_dev_stream *s, void *dst, const void *src, size_t n);
int kvti_emu_copy_sync(kvti_dev *d, void *dst, const void *src, size_t n);
int kvti_emu_copy_batch(kvti_dev_stream *s, void *const *dst,
			const void *const *src, const size_t *n, size_t count);
int kvti_emu_gather(kvti_dev_stream *s, const kvti_dev_gather *g);
int kvti_emu_sum(kvti_dev_stream *s, const kvti_dev_sum *g);
int kvti_emu_event_record(kvti_dev_event *ev, kvti_dev_stream *s);
int kvti_emu_stream_wait_event(kvti_dev_stream *s, kvti_dev_event *ev);
int kvti_emu_stream_wait_value(kvti_dev_stream *s, const uint32_t *addr,
			       uint32_t value);
int kvti_emu_host_fn(kvti_dev_stream *s, void (*fn)(void *), void *arg);

#endif /* KVT_DEV_EMU_IMPL_H */
