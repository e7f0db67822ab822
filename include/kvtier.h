/*
 * kvtier.h — tiered KV-cache memory for LLM serving: the manual.
 *
 * kvtier gives an inference engine more KV-cache capacity than GPU HBM holds
 * (tiers: hbm, fabric, dram, ssd, remote), and gets cached KV back onto the
 * GPU before prefill needs it. This header is the whole public interface; the
 * parts live in <kvtier/...> and are all included from here:
 *
 *   kvtier/geom.h    model geometry (presets, HF config.json) and KV layouts
 *   kvtier/tier.h    memory tiers (dram, fabric, ssd, hbm/hostdev), tier
 *                    specs, page pools
 *   kvtier/index.h   the hierarchy-aware radix index (residency per tier,
 *                    transient pages, eviction and demotion, tenants)
 *   kvtier/trace.h   request traces (Mooncake format)
 *   kvtier/xfer.h    the transfer engine (pages between tiers, layout
 *                    conversion, checksums) and the memory stressor
 *   kvtier/sched.h   the cache-aware batch scheduler and its cost model
 *   kvtier/sim.h     the serving simulator: hardware profiles, workloads
 *   kvtier/remote.h  the remote tier: pages in Redis / Valkey (standalone,
 *                    cluster)
 *   kvtier/cache.h   the node cache: tiers + index + transfer engine wired
 *                    together, a checksum for every page copy
 *   kvtier/demo.h    the end-to-end demo (kvtier demo)
 *
 * CONVENTIONS (they hold for every call in every part)
 *
 *   Names     kvt_<object>_<verb>[_<noun>]. Opaque handles are typedef'd
 *             structs (kvt_pool, kvt_tier); plain value structs (kvt_geom,
 *             kvt_layout) are public and may be copied.
 *   Errors    every call that can fail returns int: 0 on success, a negative
 *             errno (-ENOMEM, -EINVAL, ...) or a KVT_E* code from the
 *             reserved range below. kvt_strerror() names both. A failing
 *             call also leaves a one-line description of *what* was wrong
 *             (the bad token of a spec, the config key, the path) in a
 *             thread-local buffer read by kvt_errdetail(). A failed call
 *             leaves its outputs and objects as they were (no half-made
 *             objects, files or mappings).
 *   Memory    everything kvtier allocates goes through kvt_malloc() and
 *             friends, so tests can fail the N-th allocation
 *             (kvt_alloc_fail_at()). Objects are freed by the matching
 *             _close/_destroy call; pointers returned by accessors are valid
 *             until then.
 *   Threads   unless a call says otherwise, an object may be used by one
 *             thread at a time. Page pools are fully thread-safe.
 *   Process   the library never calls exit() or abort() (except through
 *             assert() in debug builds) and installs no signal handlers.
 */
#ifndef KVTIER_H
#define KVTIER_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ------------------------------------------------------------------------
 * Version
 * ------------------------------------------------------------------------ */
#define KVT_VERSION_MAJOR 0
#define KVT_VERSION_MINOR 2
#define KVT_VERSION_PATCH 0
#define KVT_VERSION_STRING "0.2.0"
/* The ABI: the shared library's SONAME is libkvtier.so.KVT_ABI_VERSION,
 * raised on every change that breaks a binary built against an older
 * one. 1: the engine-facing cache (kvt_cache_config with its size field,
 * opaque jobs). Versioned structs (a size field first) may grow without a
 * new ABI. */
#define KVT_ABI_VERSION 1
/** Encode a version as one comparable integer. */
#define KVT_VERSION_NUM(a, b, c) (((a) << 16) | ((b) << 8) | (c))
#define KVT_VERSION \
	KVT_VERSION_NUM(KVT_VERSION_MAJOR, KVT_VERSION_MINOR, KVT_VERSION_PATCH)

#if defined(KVT_BUILDING)
#define KVT_API __attribute__((visibility("default")))
#else
#define KVT_API
#endif

/** The library's version string ("0.2.0"); the header's may differ when an
 *  application runs against a newer shared library. */
KVT_API const char *kvt_version(void);

/* ------------------------------------------------------------------------
 * Errors
 *
 * Negative errno values name system-level failures. kvtier's own conditions
 * live in [KVT_ERR_LAST, KVT_ERR_FIRST], far below any errno.
 * ------------------------------------------------------------------------ */
#define KVT_ERR_FIRST (-31900)
/*          code          value     meaning */
#define KVT_EFULL      (-31900) /* pool or tier has no free slot */
#define KVT_ESPEC      (-31901) /* malformed or impossible tier spec */
#define KVT_EPRESET    (-31902) /* unknown model preset */
#define KVT_ECONFIG    (-31903) /* malformed config file or option value */
#define KVT_ENODEV     (-31904) /* device absent: no GPU, no devdax, no node */
#define KVT_ECORRUPT   (-31905) /* data failed verification (checksum, header) */
#define KVT_EGEOM      (-31906) /* geometry or layout mismatch */
#define KVT_ENOTBUILT  (-31907) /* feature not compiled into this build */
#define KVT_ENOTFOUND  (-31908) /* no such key, slot, page or tenant */
#define KVT_EBUSY      (-31909) /* object in use (pinned, leased, in flight) */
#define KVT_EPROTO     (-31910) /* malformed or unexpected protocol message */
#define KVT_ERR_LAST   (-31910)

/**
 * kvt_strerror() - describe an error code.
 * @err: a value returned by any kvtier call (0, -errno or KVT_E*).
 *
 * Returns a static string; never NULL. For a positive errno (a mistake, but
 * common) it answers as for the negative one.
 */
KVT_API const char *kvt_strerror(int err);

/**
 * kvt_errdetail() - what the last failing call in this thread objected to.
 *
 * Returns a thread-local string such as "tier spec 'dram:8Q': bad size '8Q'"
 * or "" when the last failure left no detail. Valid until the next kvtier
 * call in the same thread.
 */
KVT_API const char *kvt_errdetail(void);

/* ------------------------------------------------------------------------
 * Allocation
 *
 * One wrapper for every allocation kvtier makes (heap and mmap alike), with
 * fault injection for tests: kvt_alloc_fail_at(n) makes the n-th allocation
 * from now fail (n = 1: the next one), as if the system were out of memory.
 * Counting is process-wide and thread-safe.
 * ------------------------------------------------------------------------ */
KVT_API void *kvt_malloc(size_t n);
KVT_API void *kvt_calloc(size_t nmemb, size_t size);
KVT_API void *kvt_realloc(void *p, size_t n);
KVT_API char *kvt_strdup(const char *s);
KVT_API void kvt_free(void *p);

/** Fail the n-th allocation from now (0 disables injection). */
KVT_API void kvt_alloc_fail_at(uint64_t n);
/** Allocations made since the process started (heap and mapped). */
KVT_API uint64_t kvt_alloc_count(void);
/** Heap blocks currently live (allocated by kvt_* and not yet freed). */
KVT_API int64_t kvt_alloc_live(void);

/* ------------------------------------------------------------------------
 * Fault hooks for tests
 *
 * Like the allocation injector: compiled into every build, off by default,
 * process-wide, armed only by a call in the process itself — the daemon
 * never calls them and no request reaches them, so no client can.
 * ------------------------------------------------------------------------ */

/** kvt_fault_hold_jobs() flags. */
enum {
	KVT_FAULT_LOADS = 1,  /* hold load jobs */
	KVT_FAULT_STORES = 2, /* hold store jobs */
	KVT_FAULT_STUCK = 4,  /* a cancel does not end the hold (a hung disk
				 or device); without it a cancel does */
	KVT_FAULT_ROOM = 8,   /* hold the copies making a store's room: the
				 cache's room thread waits before running
				 each store's demotions (the store's call
				 has returned; its job waits) */
};

/**
 * kvt_fault_hold_jobs() - hold cache jobs as a stuck disk or device would:
 * every kvt_cache job of the kinds in @flags that finishes from now on
 * (its transfers over, nothing published yet) stays in flight @ms more
 * milliseconds, kvt_cache_job_poll() answering -EINPROGRESS, before it
 * finishes as it would have; a cancel ends the hold at once unless
 * KVT_FAULT_STUCK. A held job occupies one of the cache's finishing
 * workers. With KVT_FAULT_ROOM, a store whose placement demoted waits
 * that long on the room thread before its demotions run (and the stores
 * queued behind it with it); the demotions run after the hold even if the
 * store was cancelled. @ms 0 turns it off (the default), and ends a hold
 * in progress.
 */
KVT_API void kvt_fault_hold_jobs(uint32_t ms, unsigned flags);

/* ------------------------------------------------------------------------
 * Sizes and clocks
 * ------------------------------------------------------------------------ */

/**
 * kvt_size_parse() - parse a byte size: "4096", "64K", "8G", "1.5T", "512MiB".
 * Suffixes K M G T P (optionally followed by "i", "iB" or "B") are powers of
 * 1024. Returns 0, or -EINVAL for anything else (empty, negative, junk after
 * the number) and -ERANGE for sizes beyond 2^63.
 */
KVT_API int kvt_size_parse(const char *s, uint64_t *out);

/** Format @bytes as "1.50 GiB" into @buf (at least 16 bytes); returns buf. */
KVT_API char *kvt_size_format(uint64_t bytes, char *buf, size_t len);

/** Monotonic time in nanoseconds (CLOCK_MONOTONIC). */
KVT_API uint64_t kvt_now_ns(void);

/* ------------------------------------------------------------------------
 * Devices
 *
 * Where engine memory lives, as one integer (kvt_cache_register(),
 * kvt_client_register_dev(), tier specs' device=):
 *   KVT_DEVICE_HOST (-1)        host memory
 *   0 .. KVT_DEVICE_EMU - 1     a CUDA GPU, by ordinal
 *   KVT_DEVICE_EMU + n          emulated device n (n < KVT_DEVICE_EMU_MAX):
 *                               no hardware; its memory is shared memory
 *                               (a memfd), its streams are threads, its
 *                               copies are CPU copies counted as the
 *                               device's. The whole GPU data path runs on
 *                               it in CI (docs/ARCHITECTURE.md "Devices").
 * ------------------------------------------------------------------------ */
#define KVT_DEVICE_HOST (-1)
#define KVT_DEVICE_EMU 0x10000
#define KVT_DEVICE_EMU_MAX 16

/** Parse "host", "cuda:N" (or "N"), "emu" (emu:0) or "emu:N" into *@id:
 *  0, or -EINVAL naming the forms. */
KVT_API int kvt_device_parse(const char *s, int *id);
/** "host", "cuda:N" or "emu:N" into @buf (16 bytes suffice); returns it. */
KVT_API char *kvt_device_format(int id, char *buf, size_t len);

/* ------------------------------------------------------------------------
 * Logging
 *
 * The library logs to stderr at or above a level set by KVT_LOG (error,
 * warn, info, debug; default warn) or kvt_log_set_level().
 * ------------------------------------------------------------------------ */
enum kvt_log_level {
	KVT_LOG_ERROR = 0,
	KVT_LOG_WARN = 1,
	KVT_LOG_INFO = 2,
	KVT_LOG_DEBUG = 3,
};
KVT_API void kvt_log_set_level(int level);
KVT_API int kvt_log_get_level(void);

/* ------------------------------------------------------------------------
 * Options
 *
 * One table of runtime options (src/core/opt.c). Each has a name such as
 * "page_tokens"; it is read, in increasing precedence, from its default, a
 * config file ("name = value" lines, '#' comments), the environment variable
 * KVT_<NAME> (KVT_PAGE_TOKENS) and a command-line flag --name / --page-tokens.
 * A kvt_opts holds one resolved set; create it, feed it, read it.
 * ------------------------------------------------------------------------ */
typedef struct kvt_opts kvt_opts;

/** Create a set holding every option's default. */
KVT_API int kvt_opts_create(kvt_opts **out);
KVT_API void kvt_opts_destroy(kvt_opts *o);
/** Set one option by name ('-' and '_' are the same). KVT_ENOTFOUND for an
 *  unknown name, KVT_ECONFIG for a value of the wrong type. */
KVT_API int kvt_opts_set(kvt_opts *o, const char *name, const char *value);
/** Read every KVT_<NAME> variable of the environment that names an option. */
KVT_API int kvt_opts_load_env(kvt_opts *o);
/** Read a config file; errors name the file and line. */
KVT_API int kvt_opts_load_file(kvt_opts *o, const char *path);
/** The option's value as a string (NULL for an unknown name). */
KVT_API const char *kvt_opts_get(const kvt_opts *o, const char *name);
/** The option's value as an integer (0 for an unknown name). */
KVT_API int64_t kvt_opts_get_int(const kvt_opts *o, const char *name);
/** Walk the table: name, default, help and where the value came from
 *  ("default", "file", "env", "flag"); returns -1 past the end. */
KVT_API int kvt_opts_describe(const kvt_opts *o, int i, const char **name,
			      const char **value, const char **help,
			      const char **source);

#ifdef __cplusplus
}
#endif

#include <kvtier/geom.h>
#include <kvtier/tier.h>
#include <kvtier/index.h>
#include <kvtier/trace.h>
#include <kvtier/xfer.h>
#include <kvtier/sched.h>
#include <kvtier/sim.h>
#include <kvtier/remote.h>
#include <kvtier/cache.h>
#include <kvtier/demo.h>
#include <kvtier/dev.h>

#endif /* KVTIER_H */
