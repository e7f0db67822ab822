/*
 * kvtier/remote.h — the remote tier: KV pages shared across nodes through
 * Redis or Valkey, standalone or cluster. Included by <kvtier.h>.
 *
 * kvtier does not invent a distributed store: it keeps whole page-first
 * pages as values in one that operators already run. A page computed on one
 * node is found and loaded by any other node that serves the same model,
 * because the Redis key is the index's chained page key (kvt_page_key:
 * tenant salt and parent chain included) under a model namespace.
 *
 * SPEC STRINGS
 *
 *   remote:redis://HOST:PORT[,OPTION...]
 *   remote:redis-cluster://HOST:PORT[,HOST:PORT...][,OPTION...]
 *
 * ("remote:" may be left out.) HOST is an IPv4 address or a name, PORT
 * 1..65535. A cluster spec lists seed nodes; the whole slot map is learnt
 * from them (CLUSTER SLOTS). Options, comma-separated NAME=VALUE:
 *
 *   prefix=STR    start of every key name (default "kvt:"); 1..64 printable
 *                 characters without blanks, commas, braces or '='
 *   ns=STR        model namespace (default: the geometry's name); pages of
 *                 different models never meet even with equal page keys
 *   ttl=N[s|m|h|d] expiry of every value written (default 0: none)
 *   auth=PASS     AUTH PASS after connecting; auth=USER:PASS for ACL users
 *   timeout=MS    connect and socket timeout per operation (default 2000)
 *   db=N          SELECT N after connecting (standalone only)
 *   window=SIZE   value bytes in flight per node (default 16M; 0: a
 *                 whole batch at once, see BATCHES)
 *   tag=none|ns   none (default): pages spread over the cluster's slots;
 *                 ns: the namespace is a hash tag, so every page of the
 *                 namespace lives in one slot (one node: a batch is one
 *                 round trip, at the price of spreading nothing)
 *   key=PATH      authenticate every value with a MAC: PATH holds a secret
 *                 of at least 32 bytes, readable by its owner only (mode
 *                 600; refused otherwise); every node of the namespace
 *                 uses the same file. The MAC key is derived from it per
 *                 namespace. Without key= values are not authenticated
 *                 (a warning at open says so): anyone who can write to the
 *                 Redis can make a node serve pages of their choosing.
 *
 * TLS ("rediss://", tls=...) is not built (Debian's hiredis 0.14 has none):
 * KVT_ENOTBUILT. Anything else malformed is KVT_ESPEC, kvt_errdetail()
 * naming the bad part.
 *
 * KEYS AND VALUES
 *
 * Key name (ASCII): PREFIX NS16 ':' LO16 HI16, e.g.
 *
 *   kvt:9c1f0e4d2a7b3c58:00000000000000070000000000000000
 *       ^ XXH3-64 of ns    ^ page key lo, hi (16 hex digits each)
 *
 * with tag=ns the namespace is wrapped in braces ("kvt:{9c1f...}:..."), the
 * Redis Cluster hash tag. The value is a header, per-layer checksums, then
 * the page itself in page-first order (all layers, K and V):
 *
 *   OFFSET  SIZE   DESCRIPTION (little-endian)
 *   0       4      magic "KVTR"
 *   4       2      format version (1)
 *   6       2      header bytes before the sums (64)
 *   8       8      geometry hash: XXH3-64 of (L, H total, H, D, s, P, TP
 *                  size, TP rank, mla) as nine u32
 *   16      8      namespace hash (as in the key name)
 *   24      16     page key lo, hi
 *   40      8      page bytes that follow the sums
 *   48      4      number of sums (L: one per layer)
 *   52      4      flags: KVT_REMOTE_F_MAC (1) with key=, else 0
 *   56      8      header check: XXH3-64 of bytes 0..55 and the sums
 *   64      8*L    XXH3-64 of each layer of the page (its kv chunks, in
 *                  page-first order): the same value the node cache keeps
 *   64+8L   page   the page
 *   then, with key= only (KVT_REMOTE_F_MAC):
 *   +0      16     nonce: random, fresh for every value written
 *   +16     16     tag: Poly1305 of every byte before it (header, sums,
 *                  page, nonce) under a one-time key, keyed BLAKE2b-256
 *                  of (header, nonce) under the namespace's MAC key
 *
 * A value whose length, magic, version, geometry, namespace, key, flags
 * (a value without a MAC where this node has a key, or the reverse), MAC,
 * header check or any layer's checksum does not match is a miss counted
 * in bad_values: its bytes are never handed out as a page. The header
 * check and the layer sums catch accidents; only the MAC stops a writer
 * who knows the format (the sums are not secret).
 *
 * CLUSTER
 *
 * Keys are routed by hash slot: CRC16 (XMODEM, as the Redis Cluster spec
 * defines it) of the key name, or of its hash tag, modulo 16384. A MOVED
 * reply updates that slot and the request goes to the named node; ASK
 * sends ASKING then the request to the named node once; any error from a
 * node (connection refused or reset, timeout, CLUSTERDOWN, TRYAGAIN) fails
 * that node's pages of the batch (counted) and makes the next call reload
 * the slot map (CLUSTER SLOTS from any node that answers), at most every
 * 100 ms. So after a master dies its pages miss until its replica takes
 * over, then the same handle serves them again, without a restart.
 *
 * BATCHES
 *
 * Every call takes a list of pages. Requests are grouped by node and
 * pipelined on one connection per node, every node's requests in flight
 * together. EXISTS: all of a batch's requests are written, then all
 * replies read (one round trip per node). GET and SET keep a window of
 * window= bytes of values in flight per node: the first window is written
 * at once, and each reply read lets one more request go. A window as large
 * as the batch is one round trip per node; the default (16 MiB: four 4 MiB
 * pages) keeps the server from building a whole batch of replies at once,
 * which is several times slower than a stream (docs/REMOTE.md has the
 * figures). A redirected page costs one more round trip.
 *
 * ERRORS AND FAULTS
 *
 * Only the arguments can make a call fail (-EINVAL, -ENOMEM). Whatever
 * the servers do — down at open or mid-run, killed, slow, full (OOM
 * errors under maxmemory), evicting, answering garbage — is a per-page
 * miss or store failure, counted in kvt_remote_stat; the caller's local
 * tiers are not affected. kvt_remote_open() itself succeeds even when no
 * server answers yet (it reports so through kvt_remote_stat.nodes_up = 0);
 * it fails only for a bad spec or geometry.
 *
 * THREADS
 *
 * Every call is safe from any thread; calls on one handle are serialized
 * by a mutex inside it (one connection per node). Open one handle per
 * thread for parallel requests.
 *
 * MEMORY
 *
 * kvtier's own allocations go through kvt_malloc(); hiredis 0.14's (its
 * replies and buffers) use the C library's malloc and are not counted by
 * the fault injector.
 */
#ifndef KVTIER_REMOTE_H
#define KVTIER_REMOTE_H

#include <kvtier.h>
#include <kvtier/geom.h>
#include <kvtier/index.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct kvt_remote kvt_remote;

/** Version of the value format above. */
#define KVT_REMOTE_VERSION 2
/** Header bytes before the per-layer sums. */
#define KVT_REMOTE_HDR 64
/** Header flag: the value ends with the MAC trailer (key=). */
#define KVT_REMOTE_F_MAC 1u

/**
 * kvt_remote_open() - connect to a Redis / Valkey server or cluster.
 * @out:  the handle, on success.
 * @spec: a spec string (above).
 * @g:    the geometry of every page this handle moves (copied).
 *
 * Connects to the node(s) and, for a cluster, loads the slot map. No
 * server answering is not an error (see above): calls then miss and count.
 * Returns 0, KVT_ESPEC for a malformed spec, KVT_ENOTBUILT for TLS,
 * KVT_EGEOM for a geometry kvt_geom_finish() rejects, -ENOMEM.
 */
KVT_API int kvt_remote_open(kvt_remote **out, const char *spec,
			    const kvt_geom *g);

/** Close the connections and free the handle (NULL is fine). */
KVT_API void kvt_remote_close(kvt_remote *r);

/** Bytes of one stored value: header, sums and page (and the MAC trailer
 *  with key=; a tenant's own key adds it where key= is not set). */
KVT_API uint64_t kvt_remote_value_bytes(const kvt_remote *r);

/**
 * kvt_remote_key_name() - the Redis key name of page @key, NUL-terminated
 * into @buf (@len >= 128 is always enough). Returns its length, or -ERANGE
 * if @len is too small. For tools and tests that look at values by hand.
 */
KVT_API int kvt_remote_key_name(const kvt_remote *r, const kvt_page_key *key,
				char *buf, size_t len);

/**
 * kvt_remote_exists() - how many leading pages the store holds.
 * @keys:    @n page keys, a prefix in order.
 * @leading: out: the number of pages from keys[0] on that exist.
 * @present: optional, @n bytes: 1 where that page exists, 0 where it does
 *           not or its node failed.
 *
 * One pipelined EXISTS per page, one round trip per node. Existing is not
 * being valid: a value that fails its checks is found here and missed by
 * kvt_remote_get(). Returns 0 or -EINVAL.
 */
KVT_API int kvt_remote_exists(kvt_remote *r, const kvt_page_key *keys,
			      size_t n, size_t *leading, uint8_t *present);

/**
 * kvt_remote_get() - fetch pages.
 * @keys:  @n page keys.
 * @bufs:  @n destinations of kvt_geom_page_bytes() each (page-first).
 * @ok:    @n bytes, out: 1 where bufs[i] now holds the verified page;
 *         0 for a miss, a bad value or a failed node (then bufs[i] holds
 *         unspecified bytes).
 * @sums:  optional, @n * L: out, the per-layer XXH3-64 of each page
 *         fetched (verified against the value's), for a cache that keeps
 *         them.
 *
 * Returns the number of pages fetched (>= 0), or -EINVAL.
 */
KVT_API int kvt_remote_get(kvt_remote *r, const kvt_page_key *keys, size_t n,
			   void *const *bufs, uint8_t *ok, uint64_t *sums);

/**
 * kvt_remote_set() - store pages (SET, with PX when a ttl is set).
 * @bufs:  @n pages of kvt_geom_page_bytes() each, page-first.
 * @sums:  optional, @n * L per-layer XXH3-64 the caller already has (they
 *         are written as given: a wrong one makes the page a bad value
 *         for every reader); NULL: computed here.
 * @ok:    optional, @n bytes, out: 1 where the server took the value.
 *
 * Returns the number of pages stored (>= 0), or -EINVAL / -ENOMEM.
 * Refusals (OOM under maxmemory, a failed node) are counted per page.
 */
KVT_API int kvt_remote_set(kvt_remote *r, const kvt_page_key *keys, size_t n,
			   const void *const *bufs, const uint64_t *sums,
			   uint8_t *ok);

/** No tenant of its own: the namespace's key (the spec's key=). */
#define KVT_REMOTE_ANY_TENANT 0xffffffffu

/**
 * kvt_remote_tenant_key() - give tenant @tenant a MAC key of its own.
 * @path: a key file as key= takes (at least 32 bytes, mode 600; else
 *        KVT_ECONFIG); the tenant's key is derived from it and the
 *        namespace as the namespace's is from key=.
 *
 * From then on kvt_remote_get_as() / kvt_remote_set_as() with @tenant
 * write values under that key and accept only values with a valid MAC
 * under it, even where the spec has no key=. Tenants that must not
 * trust each other's nodes get different files, and a node holds only
 * the files of the tenants it serves: it can then neither forge another
 * tenant's pages nor have its values taken by another tenant. Tenants
 * that share (the same salt, the same pages) name the same file; the
 * spec's own key file gives the namespace's key (shared with tenants
 * without one). Called again for @tenant: the key is replaced. Returns
 * 0, KVT_ECONFIG, KVT_EFULL (4096 tenants), -EINVAL, -ENOMEM.
 */
KVT_API int kvt_remote_tenant_key(kvt_remote *r, uint32_t tenant,
				  const char *path);

/** kvt_remote_get() of tenant @tenant's values: verified under its own key
 *  (kvt_remote_tenant_key()) when it has one, else the namespace's. A
 *  value under another key is a bad value (counted, never served). */
KVT_API int kvt_remote_get_as(kvt_remote *r, uint32_t tenant,
			      const kvt_page_key *keys, size_t n,
			      void *const *bufs, uint8_t *ok, uint64_t *sums);
/** kvt_remote_set() of tenant @tenant's values (MAC'd under its key). */
KVT_API int kvt_remote_set_as(kvt_remote *r, uint32_t tenant,
			      const kvt_page_key *keys, size_t n,
			      const void *const *bufs, const uint64_t *sums,
			      uint8_t *ok);

/** Counters since open. Pages are counted once per call that asks. */
typedef struct kvt_remote_stat {
	uint64_t calls;          /* exists + get + set calls */
	uint64_t get_pages;      /* pages asked for by get */
	uint64_t hits;           /* pages fetched and verified */
	uint64_t misses;         /* pages absent (nil), bad or failed */
	uint64_t bad_values;     /* of the misses: a value that failed a check */
	uint64_t read_failures;  /* get/exists pages lost to a node's error */
	uint64_t exists_pages;   /* pages asked for by exists */
	uint64_t exists_found;   /* of those, present */
	uint64_t set_pages;      /* pages asked to be stored */
	uint64_t stored;         /* pages the server took */
	uint64_t write_failures; /* pages refused or lost to a node's error */
	uint64_t oom_errors;     /* of those, refused with OOM (maxmemory) */
	uint64_t bytes_read;     /* value bytes received (all replies) */
	uint64_t bytes_written;  /* value bytes sent */
	uint64_t moved;          /* MOVED redirects followed */
	uint64_t asked;          /* ASK redirects followed */
	uint64_t slot_refreshes; /* slot maps loaded (cluster) */
	uint64_t connects;       /* connections made (first and again) */
	uint64_t connect_failures;
	uint64_t node_errors;    /* connection errors, timeouts, error replies */
	uint64_t lat_ns_total;   /* wall time inside calls, summed */
	uint64_t lat_ns_max;     /* the longest call */
	uint32_t nodes;          /* nodes known (masters in the slot map) */
	uint32_t nodes_up;       /* of those, connected after the last call */
} kvt_remote_stat;

/** Copy the counters into @st. Returns 0. */
KVT_API int kvt_remote_stat_get(kvt_remote *r, kvt_remote_stat *st);

/** CRC16 of the Redis Cluster spec (XMODEM: poly 0x1021, init 0); the
 *  spec's check value: "123456789" -> 0x31C3. */
KVT_API uint16_t kvt_remote_crc16(const void *buf, size_t len);

/** The hash slot of a key name (0..16383): CRC16 of the whole name, or of
 *  the part between the first '{' and the next '}' when that is not
 *  empty, modulo 16384. */
KVT_API uint16_t kvt_remote_slot(const char *key, size_t len);

#ifdef __cplusplus
}
#endif

#endif /* KVTIER_REMOTE_H */
