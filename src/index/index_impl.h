/*
 * index_impl.h — the radix index inside (not installed). The picture, the
 * invariants and the locking rule are in index.c's header comment; this
 * file holds the structures and the small helpers every index file shares.
 */
#ifndef KVT_INDEX_IMPL_H
#define KVT_INDEX_IMPL_H

#include "core/core.h"

#define POS_NONE UINT32_MAX

/*
 * One edge of the tree: a run of npages pages, all sharing the node-level
 * fields (pins, hits, last access, transient mark). Per page: its key, one
 * slot per managed tier and a residency mask (bit i = compact tier i, the
 * fastest tier is bit 0). The variable part follows the header:
 *
 *   data: | keys[cap] (P*4 or 16 bytes each) | slots[cap][nt] u32 | mask[cap] |
 */
struct knode {
	uint64_t id;             /* unique, never reused: child-table key part */
	struct knode *parent;    /* NULL for a tenant root */
	struct tacct *ta;        /* the tenant's heaps and quotas */
	struct knode *kid;       /* first child */
	struct knode *next, *prev; /* siblings */
	uint64_t fp;             /* fingerprint of page 0 (child-table key) */
	uint64_t salt;           /* the tenant's salt */
	uint64_t atime;          /* last access, caller's clock */
	uint64_t ord;            /* access order: LRU key, breaks ties */
	uint64_t ticket;         /* transient mark */
	uint64_t ready;          /* in flight: expected ready time */
	uint32_t npages, cap;
	uint32_t nchild;
	uint32_t pins;           /* leases covering these pages */
	uint32_t kpins;          /* sum of the children's pins */
	uint32_t hits;
	uint32_t nneed;          /* pages whose only copy has a tier below */
	uint8_t tstate;          /* 0, KVT_PAGE_QUEUED or KVT_PAGE_INFLIGHT */
	uint8_t is_root;
	uint32_t tenant;         /* roots: the tenant id */
	uint32_t hpos[KVT_TIER_COUNT]; /* place in tier i's heap, POS_NONE */
	uint32_t cnt[KVT_TIER_COUNT];  /* pages of this node in tier i */
	uint32_t sub[KVT_TIER_COUNT];  /* pages in tier i in this subtree */
	unsigned char data[];
};

struct tab_ent {
	uint64_t h;
	struct knode *n;
};

/*
 * One tenant's eviction heaps, node count, quotas and counters (quota.c).
 * Allocated with its root and pointed to by every node of its tree, so it
 * stays put while the tenant array moves. Per managed tier i: heap[i]
 * holds the tenant's evictable nodes (see index.c); the pages it holds in
 * tier i are its root's sub[i].
 */
struct tacct {
	struct knode **heap[KVT_TIER_COUNT];
	uint32_t hn[KVT_TIER_COUNT];
	size_t hcap;
	uint64_t nodes;                    /* its nodes, root excluded */
	uint64_t quota[KVT_TIER_COUNT];    /* pages; 0: no limit */
	uint64_t evicted[KVT_TIER_COUNT];  /* its pages that left tier i */
	uint64_t qevicted[KVT_TIER_COUNT]; /* of which for its own quota */
	struct knode *root;
};

struct tenant {
	uint32_t id;
	uint64_t salt;
	struct knode *root;
};

struct kvt_index {
	uint32_t P;
	int mode;                /* enum kvt_key_mode */
	int lfu;
	int write;
	uint32_t copy_hits;      /* hits from which pages are copied down; 0 never */
	uint32_t ksize;          /* bytes of one page key */
	int nt;                  /* managed tiers */
	int kind[KVT_TIER_COUNT];/* compact index -> kvt_tier_kind */
	int ti[KVT_TIER_COUNT];  /* kvt_tier_kind -> compact index, -1 absent */
	int hooked;              /* watermarks hooked */
	kvt_pool *pool[KVT_TIER_COUNT];
	uint64_t slot_bytes[KVT_TIER_COUNT];
	kvt_index_mover mover;
	struct kvti_rev *rev;    /* with a mover: slot -> page; else NULL */

	struct tab_ent *tab;     /* child table: (parent id, fp) -> node */
	size_t tabcap, tabcount;

	struct tenant *ten;
	size_t nten, capten;

	uint64_t next_id, tick, clock;
	int busy;                /* inside an index call: watermark calls wait */
	int issued;              /* copies issued since the last flush */
	uint64_t pending[KVT_TIER_COUNT];

	/* live counts and counters (stat) */
	uint64_t nodes, pages, transient, pinned, mem;
	uint64_t resident[KVT_TIER_COUNT];
	uint64_t matches, inserts, dropped, move_failed, splits;
	uint64_t evicted[KVT_TIER_COUNT], demoted[KVT_TIER_COUNT],
		copied[KVT_TIER_COUNT];
};

static inline uint64_t kvti_mix64(uint64_t z)
{
	z ^= z >> 30;
	z *= 0xbf58476d1ce4e5b9ull;
	z ^= z >> 27;
	z *= 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

/* Where a child lives in the child table. */
static inline uint64_t kvti_tab_hash(uint64_t parent_id, uint64_t fp)
{
	return kvti_mix64(fp ^ (parent_id * 0x9e3779b97f4a7c15ull));
}

/* ---- node layout ------------------------------------------------------ */

static inline unsigned char *nkeys(const kvt_index *x, struct knode *n)
{
	(void)x;
	return n->data;
}
static inline uint32_t *nslots(const kvt_index *x, struct knode *n)
{
	return (uint32_t *)(n->data + (size_t)n->cap * x->ksize);
}
static inline uint8_t *nmask(const kvt_index *x, struct knode *n)
{
	return (uint8_t *)(nslots(x, n) + (size_t)n->cap * x->nt);
}
static inline const void *nkey(const kvt_index *x, struct knode *n,
			       uint32_t j)
{
	return nkeys(x, n) + (size_t)j * x->ksize;
}
static inline uint32_t *nslot(const kvt_index *x, struct knode *n,
			      uint32_t j, int t)
{
	return nslots(x, n) + (size_t)j * x->nt + t;
}

/* A page whose mask has one bit, with a tier below that bit. */
static inline int mask_needs_copy(const kvt_index *x, uint8_t m)
{
	return m && !(m & (m - 1)) && m < (1u << (x->nt - 1));
}

/* The reverse map of an index with a mover (kvt_index_drop_copy()): per
 * managed tier, slot -> the page holding it (its node, its place there),
 * n[t][slot] NULL for a free slot. Kept where slots are taken, freed, and
 * where pages move between nodes (splits). */
struct kvti_rev {
	struct knode **n[KVT_TIER_COUNT];
	uint32_t *j[KVT_TIER_COUNT];
};

/* Page j of @n now holds slot @s of tier t (the reverse map, if kept). */
static inline void kvti_rev_set(kvt_index *x, int t, uint32_t s,
				struct knode *n, uint32_t j)
{
	if (x->rev) {
		x->rev->n[t][s] = n;
		x->rev->j[t][s] = j;
	}
}

/* A page is transient if its node is marked and it is not in the fastest
 * tier; empty if it has no copy and no mark. */
static inline int page_transient(struct knode *n, uint8_t m)
{
	return n->tstate && !(m & 1);
}
static inline int page_empty(struct knode *n, uint8_t m)
{
	return !m && !n->tstate;
}

/* ---- the prefix as a sequence of page keys ---------------------------- */

struct pk {
	kvt_index *x;
	const uint32_t *tok;      /* tokens (token mode, or hashed here) */
	const kvt_page_key *keys; /* given keys (hash mode) */
	size_t n;                 /* whole pages */
	size_t ntokens;           /* tokens the prefix stands for */
	struct tenant *ten;
	size_t ci;                /* chained hashing: index of ck, or SIZE_MAX */
	kvt_page_key ck;
};

/* index.c */
int kvti_px_open(kvt_index *x, const kvt_prefix *px, int whole,
		 struct pk *k);
const void *kvti_pk_key(struct pk *k, size_t i);
uint64_t kvti_fp(const kvt_index *x, uint64_t salt, const void *key);
struct knode *kvti_node_new(kvt_index *x, uint32_t cap);
void kvti_node_free(kvt_index *x, struct knode *n);
int kvti_reserve(kvt_index *x, size_t nodes);
void kvti_attach(kvt_index *x, struct knode *parent, struct knode *n);
void kvti_detach(kvt_index *x, struct knode *n);
/* Take @n out of the child table (nothing else: create.c frees trees). */
void kvti_tab_del(kvt_index *x, struct knode *n);
struct knode *kvti_child(kvt_index *x, struct knode *parent, struct pk *k,
			 size_t i);
int kvti_split(kvt_index *x, struct knode *n, uint32_t j,
	       struct knode **head);
void kvti_prune(kvt_index *x, struct knode *n);
void kvti_set_mask(kvt_index *x, struct knode *n, uint32_t j, uint8_t m);
void kvti_res_delta(kvt_index *x, struct knode *n, int t, int d);
void kvti_heap_fix(kvt_index *x, struct knode *n, int t);
void kvti_heap_fix_all(kvt_index *x, struct knode *n);
void kvti_heap_rekey(kvt_index *x, struct knode *n);
int kvti_key_less(const kvt_index *x, const struct knode *a,
		  const struct knode *b);
void kvti_pin_delta(kvt_index *x, struct knode *n, int d);
void kvti_touch(kvt_index *x, struct knode *n);
void kvti_set_clock(kvt_index *x, uint64_t now);
void kvti_release(kvt_index *x, int t, uint32_t slot);
struct tenant *kvti_tenant(kvt_index *x, uint32_t id);

/* evict.c */
uint64_t kvti_evict_n(kvt_index *x, int t, uint64_t n);
uint64_t kvti_evict_own(kvt_index *x, struct tacct *ta, int t, uint64_t n);
int kvti_make_room(kvt_index *x, int t, uint64_t n);
uint64_t kvti_pool_free(kvt_index *x, int t);
void kvti_copy_down(kvt_index *x, struct knode *n, uint32_t j);
void kvti_enter(kvt_index *x);
void kvti_leave(kvt_index *x);
void kvti_wm_evict(kvt_pool *p, uint64_t want, void *arg);

/* quota.c */
struct tacct *kvti_tacct_new(kvt_index *x);
void kvti_tacct_free(kvt_index *x, struct tacct *ta);
int kvti_tacct_reserve(kvt_index *x, struct tacct *ta, uint64_t nodes);
uint64_t kvti_quota_free(const struct tacct *ta, int t);
int kvti_quota_room(kvt_index *x, struct tacct *ta, int t, uint64_t n);

/* What @ta holds in tier t; whether that is over its quota there. */
static inline uint64_t kvti_quota_used(const struct tacct *ta, int t)
{
	return ta->root->sub[t];
}
static inline int kvti_quota_over(const struct tacct *ta, int t)
{
	return ta->quota[t] && ta->root->sub[t] > ta->quota[t];
}

/* A walk down the tree along a prefix. */
struct walker {
	struct knode *n; /* the node reached (a root at first) */
	uint32_t j;      /* its pages [0, j) matched */
	size_t i;        /* prefix pages consumed */
};
void kvti_walk_init(struct pk *k, struct walker *w);
uint32_t kvti_walk_next(kvt_index *x, struct pk *k, struct walker *w,
			size_t limit);

/* ops.c: the path helpers mark.c shares. Split so that the prefix's first
 * @np pages (in the tree) end on an edge boundary; apply @fn to each node
 * of the first @np pages (on edge boundaries), root side first; walk the
 * whole prefix, returning the pages the tree holds (the walker left at
 * the end); a node for the pages from @have on, with table and heap room. */
int kvti_split_at(kvt_index *x, struct pk *k, size_t np);
void kvti_for_path(kvt_index *x, struct pk *k, size_t np,
		   void (*fn)(kvt_index *x, struct knode *n, void *arg),
		   void *arg);
size_t kvti_walk_all(kvt_index *x, struct pk *k, struct walker *w);
int kvti_new_tail(kvt_index *x, struct pk *k, size_t have,
		  struct knode **nn);

#endif
