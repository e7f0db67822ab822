/*
 * remote_impl.h — internals of the remote tier (include/kvtier/remote.h):
 * the parsed spec, the value format's codec, the node table and slot map.
 *
 *   remote.c   spec parser, value codec, connections, the batch engine
 *              (group by node, pipeline, redirects), open/close/stat
 *   mac.c      key files, MAC keys (the namespace's, per tenant), the
 *              values' MAC
 *   cluster.c  CRC16 and hash slots, CLUSTER SLOTS, MOVED/ASK parsing
 *
 * Locking: one mutex per handle (kvt_remote.mu) guards everything below
 * it; every public call holds it from start to end.
 */
#ifndef KVT_REMOTE_IMPL_H
#define KVT_REMOTE_IMPL_H

#include "core/core.h"

#include <hiredis/hiredis.h>
#include <kvtier/remote.h>

#define KVTI_RSEEDS_MAX 64    /* seed nodes in one spec */
#define KVTI_RHOST_MAX 256    /* host name bytes, NUL included */
#define KVTI_RKEY_MAX 160     /* key name bytes, NUL included */
#define KVTI_RNODES_MAX 1024  /* nodes one handle ever learns */
#define KVTI_RSLOTS 16384
#define KVTI_RHOPS_MAX 5      /* redirects one page may follow per call */
#define KVTI_RREFRESH_NS 100000000ull /* slot map reloads at most every */
#define KVTI_RBACKOFF_NS 100000000ull /* no reconnect to a failed node for */
#define KVTI_RWINDOW_BYTES (16ull << 20) /* default window= */
#define KVTI_RTKEYS_MAX 4096  /* tenant keys one handle holds */

/* ---- the spec --------------------------------------------------------- */

struct kvti_raddr {
	char host[KVTI_RHOST_MAX];
	int port;
};

struct kvti_rspec {
	int cluster;
	size_t nseeds;
	struct kvti_raddr seeds[KVTI_RSEEDS_MAX];
	char prefix[65];
	char ns[129];          /* "" until open fills the geometry's name */
	uint64_t ttl_ms;
	int auth;
	char user[128];        /* "" for plain AUTH PASS */
	char pass[256];
	uint32_t timeout_ms;
	int db;
	int tag_ns;
	uint64_t window;       /* window= bytes, 0: a whole batch */
	char keyfile[256];     /* key=PATH, "" for none */
};

/* Parse @text (grammar in remote.h) into @s: 0, KVT_ESPEC or KVT_ENOTBUILT
 * (kvt_errdetail() says what). */
int kvti_remote_spec_parse(const char *text, struct kvti_rspec *s);

/* ---- the value format ------------------------------------------------- */

struct kvti_rfmt {
	uint64_t geom_hash, ns_hash;
	uint64_t page_bytes, layer_bytes;
	uint32_t nsums;        /* L */
	int mac;               /* values carry the MAC trailer (key=) */
	uint8_t key[32];       /* the namespace's MAC key, when @mac */
};

#define KVTI_RMAC_NONCE 16
#define KVTI_RMAC_TAG 16
#define KVTI_RMAC_BYTES (KVTI_RMAC_NONCE + KVTI_RMAC_TAG)

/* Fill @f for geometry @g and namespace @ns (no MAC: kvti_remote_fmt_key()
 * adds one). */
void kvti_remote_fmt(struct kvti_rfmt *f, const kvt_geom *g, const char *ns);
/* The namespace's MAC key from a secret of @len bytes (a key file's):
 * keyed BLAKE2b of the namespace, so each namespace has its own. */
void kvti_remote_fmt_key(struct kvti_rfmt *f, const void *secret, size_t len,
			 const char *ns);
/* The spec's key= (or the warning that there is none): into r->fmt. */
int kvti_remote_load_key(kvt_remote *r);
/* The format of tenant @tenant's values: r->fmt with the tenant's own
 * key when it has one (KVT_REMOTE_ANY_TENANT: r->fmt). r->mu held. */
void kvti_remote_fmt_for(const kvt_remote *r, uint32_t tenant,
			 struct kvti_rfmt *f);
void kvti_remote_tkeys_free(kvt_remote *r);
/* Bytes before the page: the header and L sums. */
static inline uint64_t kvti_remote_head_bytes(const struct kvti_rfmt *f)
{
	return KVT_REMOTE_HDR + 8ull * f->nsums;
}
/* Bytes of a whole value: head, page, and the MAC trailer when keyed. */
static inline uint64_t kvti_remote_value_len(const struct kvti_rfmt *f)
{
	return kvti_remote_head_bytes(f) + f->page_bytes +
	       (f->mac ? KVTI_RMAC_BYTES : 0);
}
/* Write the header and @sums (L values) of page @key into @out. */
void kvti_remote_head_write(const struct kvti_rfmt *f, const kvt_page_key *key,
			    const uint64_t *sums, uint8_t *out);
/* With a key: the trailer of a value whose head and page are written at
 * @v (a fresh random nonce, then the tag). */
void kvti_remote_mac_write(const struct kvti_rfmt *f, uint8_t *v);
/* With a key: 0 if the value's tag is right, else KVT_ECORRUPT. */
int kvti_remote_mac_check(const struct kvti_rfmt *f, const void *v);
/* Check the header of a value @v of @len bytes for page @key: 0, or
 * KVT_ECORRUPT with *why naming the first field that does not match. The
 * page's layer sums are checked by kvti_remote_value_take(). */
int kvti_remote_head_check(const struct kvti_rfmt *f, const kvt_page_key *key,
			   const void *v, size_t len, const char **why);
/* Copy the page of a checked value @v into @dst layer by layer, each
 * layer's XXH3-64 checked against the header's: 0 or KVT_ECORRUPT. @sums
 * (L values, optional) gets the sums. */
int kvti_remote_value_take(const struct kvti_rfmt *f, const void *v,
			   void *dst, uint64_t *sums);

/* ---- nodes and the slot map ------------------------------------------- */

struct kvti_rnode {
	struct kvti_raddr a;
	redisContext *c;       /* NULL while not connected */
	uint64_t retry_ns;     /* no connect before this (after a failure) */
	int warned;            /* its failure was logged */
	/* one call's queue: the pages for this node in this round, of
	 * which @sent were sent and @got answered */
	size_t nq, capq, sent, got;
	size_t *q;
};

struct kvti_rtkey {
	uint32_t tenant;
	uint8_t key[32];
};

struct kvt_remote {
	pthread_mutex_t mu;
	struct kvti_rspec spec;
	kvt_geom g;
	struct kvti_rfmt fmt;
	uint64_t value_bytes;
	struct kvti_rnode *nodes;
	size_t nnodes, capnodes;
	int16_t *slots;        /* cluster: owner node per slot, -1 none */
	int refresh;           /* the slot map may be stale */
	uint64_t refresh_ns;   /* when it was last loaded */
	uint64_t window_bytes; /* values in flight per node, 0: all */
	uint8_t *scratch;      /* one value being built by set */
	uint64_t *lsums;       /* its layer sums (L) */
	struct kvti_rtkey *tkeys; /* per-tenant MAC keys (mac.c) */
	size_t ntkeys, captkeys;
	kvt_remote_stat st;
};

/* CLUSTER SLOTS from the first node that answers; 0 or -EIO (no node
 * answered). Resets r->refresh on success. */
int kvti_remote_refresh(kvt_remote *r);
/* The node with address (@host, @port), added when new: index or -ENOMEM
 * (table full). */
int kvti_remote_node(kvt_remote *r, const char *host, size_t hlen, int port);
/* Connect node @i if it is not and its back-off has passed: 0 or -EIO. */
int kvti_remote_connect(kvt_remote *r, size_t i);
/* Drop node @i's connection after an error (backs off reconnects). */
void kvti_remote_drop(kvt_remote *r, size_t i, const char *why);
/* Parse "MOVED 3999 127.0.0.1:6381" / "ASK ...": 1 for MOVED, 2 for ASK,
 * 0 for any other error; fills *slot, host (@hlen bytes) and *port. */
int kvti_remote_redirect(const char *err, size_t len, int *slot, char *host,
			 size_t hlen, int *port);

#endif
