/*
 * core.h — internals shared by every part of libkvtier (not installed).
 *
 * Cross-file internal names are kvti_* (the i is for internal); public
 * names are kvt_* and live in include/. Nothing here is exported.
 */
#ifndef KVT_CORE_H
#define KVT_CORE_H

#include <kvtier.h>

#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <sys/types.h>

#define KVT_ARRAY_SIZE(a) (sizeof(a) / sizeof((a)[0]))
#define KVT_MIN(a, b) ((a) < (b) ? (a) : (b))
#define KVT_MAX(a, b) ((a) > (b) ? (a) : (b))
#define KVT_ALIGN_UP(x, a) ((((x) + (a) - 1) / (a)) * (a))
#define KVT_UNUSED(x) ((void)(x))
#define KVT_LIKELY(x) __builtin_expect(!!(x), 1)
#define KVT_UNLIKELY(x) __builtin_expect(!!(x), 0)

/* ---- errors ------------------------------------------------------------ */

/* Record what the failing call objected to (kvt_errdetail()) and return
 * @err, so a failure site reads: return kvti_fail(KVT_ESPEC, "...", ...). */
int kvti_fail(int err, const char *fmt, ...)
	__attribute__((format(printf, 2, 3)));
/* Prefix the current detail with more context: "ctx: <old detail>". */
void kvti_errctx(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* Forget any detail (at the start of a call that may fail). */
void kvti_errclear(void);

/* ---- allocation -------------------------------------------------------- */

/* Counted by the fault injector like kvt_malloc(): an mmap that fails with
 * ENOMEM when injection says so. Same contract as mmap(2). */
void *kvti_mmap(void *addr, size_t len, int prot, int flags, int fd,
		off_t off);
/* True when the injector says this acquisition fails (for resources that
 * are not memory but can run out: used to test setup paths). */
bool kvti_fault(void);
/* kvt_fault_hold_jobs(): how long a hold of @kind (KVT_FAULT_LOADS,
 * _STORES, _ROOM) lasts, in ns (0: not armed), and whether a cancel ends
 * it; asked again while holding, so that disarming ends a hold. */
uint64_t kvti_fault_hold(unsigned kind, int *stuck);
/* Grow the array *@p of *@cap elements of @elem bytes (doubling, from
 * @first) until it holds @need; 0 or -ENOMEM (the array is unchanged). */
int kvti_grow(void **p, size_t *cap, size_t need, size_t elem, size_t first);
/* Aligned heap block (posix_memalign), counted; free with kvt_free(). */
void *kvti_aligned_alloc(size_t align, size_t n);

/* ---- clocks for waits ------------------------------------------------- */
/* Condition variables that time out on CLOCK_MONOTONIC (the clock of
 * kvt_now_ns()): pthread_cond_init's error as -errno. */
struct timespec;
int kvti_cond_init_mono(pthread_cond_t *cv);
/* The CLOCK_MONOTONIC time @ns from now, for pthread_cond_timedwait. */
void kvti_deadline(struct timespec *ts, int64_t ns);

/* ---- threads ------------------------------------------------------------ */
/* Give the calling thread the nice value @nice (1..19; 0: leave it as it
 * is): the library's copy threads below the engine's own (kvt_cache_config.
 * thread_nice). A failure is logged once per process, never fatal. */
void kvti_thread_nice(int nice);

/* ---- logging ----------------------------------------------------------- */
void kvti_log(int level, const char *fmt, ...)
	__attribute__((format(printf, 2, 3)));
#define kvti_warn(...) kvti_log(KVT_LOG_WARN, __VA_ARGS__)
#define kvti_info(...) kvti_log(KVT_LOG_INFO, __VA_ARGS__)
#define kvti_debug(...) kvti_log(KVT_LOG_DEBUG, __VA_ARGS__)

/* ---- small locks ------------------------------------------------------- */

/* A test-and-test-and-set spinlock for critical sections of a few dozen
 * instructions (pool free lists). Yields after a short spin so two threads
 * on two cores never livelock. */
typedef struct {
	atomic_int v;
} kvti_spin;
void kvti_spin_lock_slow(kvti_spin *l);
static inline void kvti_spin_lock(kvti_spin *l)
{
	if (KVT_LIKELY(!atomic_exchange_explicit(&l->v, 1,
						 memory_order_acquire)))
		return;
	kvti_spin_lock_slow(l);
}
static inline void kvti_spin_unlock(kvti_spin *l)
{
	atomic_store_explicit(&l->v, 0, memory_order_release);
}

/* ---- files and strings ------------------------------------------------- */

/* Read a whole (small) file into a NUL-terminated kvt_malloc'ed buffer.
 * 0 or -errno; *len may be NULL. Refuses files over @max bytes (-EFBIG),
 * directories (-EISDIR) and devices or sockets (-ENODEV); a pipe is read. */
int kvti_read_file(const char *path, size_t max, char **out, size_t *len);
/* Copy at most @srclen bytes of @src (less at a NUL) into @dst (room for
 * @len, always terminated), each byte outside printable ASCII as '?': for
 * messages that quote bytes read from outside. Returns @dst. */
char *kvti_printable(char *dst, size_t len, const char *src, size_t srclen);
/* kvt_strerror() for kvti_read_file()'s errors, in words for a user. */
const char *kvti_file_strerror(int err);
/* Read a sysfs-style file holding one integer: 0 or -errno/-EINVAL. */
int kvti_read_u64(const char *path, uint64_t *out);
/* Copy at most n-1 bytes and terminate; returns 1 if truncated. */
int kvti_strlcpy(char *dst, const char *src, size_t n);
/* Cut leading and trailing blanks: returns the first non-blank character
 * of @s and writes a NUL after its last one. */
char *kvti_trim(char *s);
/* Read "name = value" lines (# comments, blank lines) from @text, which is
 * modified, into @o as file-sourced values; errors name @name:LINE. */
struct kvt_opts;
int kvti_opts_parse(struct kvt_opts *o, char *text, const char *name);
/* Case-insensitive equality. */
bool kvti_streq_ci(const char *a, const char *b);

#endif /* KVT_CORE_H */
