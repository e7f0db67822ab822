/*
 * server.h — the node daemon kvtierd (daemon.c) as `kvtier serve` drives
 * it. Internal to libkvtier: engines use include/kvtier/client.h, and
 * docs/DAEMON.md is the operator's manual.
 */
#ifndef KVT_SERVER_SERVER_H
#define KVT_SERVER_SERVER_H

#include <kvtier.h>
#include <kvtier/cache.h>

typedef struct kvtd kvtd;

/**
 * struct kvtd_config - what `kvtier serve` takes (flags, KVT_* environment
 * or a config file with the same names). Zero means the default.
 * @socket:      path of the control socket (KVT_CLIENT_SOCKET); its
 *               directory must exist; a stale socket file is replaced,
 *               a live daemon's is not (-EADDRINUSE).
 * @socket_mode: permission bits of the socket (0660).
 * @tiers, @model, @page_tokens, @tp: the cache (kvt_cache_config), one
 *               namespace @ns ("default") whose clients must match it.
 * @kv_dtype:    the KV cache's element type when it is not the model's
 *               (an fp8 KV cache of a bf16 model); NULL or "auto": the
 *               model's.
 * @tenants:     "NAME:ID[,uid=U][,gid=G][,salt=S][,quota=TIER:SIZE]
 *               [,clients=N]" entries joined by ';'. A client acting as
 *               tenant ID must
 *               run as one of its uids or gids (SO_PEERCRED); root may act
 *               as any. A quota (repeatable, one per owned tier) caps what
 *               the tenant holds there, all its TP ranks together: at it,
 *               its own pages make room, never another's. clients=N caps
 *               the tenant's connections. rkey=FILE: its remote values
 *               MAC'd under a key of its own (kvt_cache_remote_tenant_key();
 *               needs a remote tier). Empty: one tenant "default:0"
 *               for the daemon's own uid.
 * @lease_ms:    a job's lease: cancelled (pins dropped) when it runs this
 *               long (30000).
 * @hello_ms:    a connection has this long from its accept to say a
 *               HELLO that succeeds (a deadline for the whole HELLO);
 *               any refusal before then is answered and closes it (5000).
 * @max_clients: connections served at once (64); more are refused with
 *               an error reply. Besides: a peer no tenant allows is
 *               refused at accept; a uid holds at most 8 connections that
 *               have not said HELLO, a uid other than root at most 3/4 of
 *               max_clients; monitors are at most 8, 2 a uid (root
 *               excepted).
 * @metrics:     "HOST:PORT" for GET /metrics, NULL or "" for none.
 * @remote:      a remote tier below the owned ones (kvtier/remote.h spec):
 *               lookups report its run after the local one, and the
 *               daemon prefetches it into the top tier until the client's
 *               LOAD of that prefix (whatever arrived is used).
 * @devices:     kvt_cache_config.devices: the devices engines will
 *               register memory on, the host tiers registered with them
 *               at open (NULL or "": at each device's first REGISTER).
 * @cache_flags, @write, @evict, @xfer_threads, @dev_load, @dev_store:
 *               kvt_cache_config's.
 */
typedef struct kvtd_config {
	const char *socket;
	uint32_t socket_mode;
	const char *tiers, *model, *ns;
	const char *kv_dtype;      /* the KV element type, NULL/"auto": the
				      model's (kvt_geom_dtype_bytes()) */
	uint32_t page_tokens, tp;
	const char *tenants;
	uint32_t lease_ms, hello_ms, max_clients;
	const char *metrics;
	const char *remote;        /* kvt_cache_config.remote, or NULL */
	const char *devices;       /* kvt_cache_config.devices, or NULL */
	unsigned cache_flags;      /* KVT_CACHE_* */
	int write, evict;          /* kvt_cache_config's (write-back, LRU) */
	uint32_t xfer_threads;
	int dev_load, dev_store;   /* KVT_XFER_CUDA_*; 0: kernel, batch */
	int thread_nice;           /* kvt_cache_config.thread_nice (0) */
} kvtd_config;

/** Open the cache, the tenants, the socket (and the metrics endpoint).
 *  Nothing is served until kvtd_run(). 0 or an error, detail set. */
int kvtd_open(kvtd **out, const kvtd_config *cfg);

/** Accept and serve until kvtd_stop(); 0, or an accept error. */
int kvtd_run(kvtd *d);

/** Make kvtd_run() return. Async-signal-safe (a SIGTERM handler). */
void kvtd_stop(kvtd *d);

/** Drain: refuse new work, wait for jobs in flight (at most a lease),
 *  disconnect every client, close the cache. NULL is fine. */
void kvtd_close(kvtd *d);

/** The cache it serves (tests). */
kvt_cache *kvtd_cache(kvtd *d);

#endif /* KVT_SERVER_SERVER_H */
