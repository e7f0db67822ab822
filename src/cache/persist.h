/*
 * persist.h — the node cache's restart-safe ssd tier (inside; not
 * installed). persist.c's header comment has the picture, the record
 * format and the crash argument; the cache calls these hooks (slot.c,
 * mover.c, store.c; open and tenants in cache.c) at the points
 * where a slot's state changes, all with the cache's slot lock (c->smu)
 * held, except open-time rebuild and free (single-threaded).
 */
#ifndef KVT_CACHE_PERSIST_H
#define KVT_CACHE_PERSIST_H

#include "core/core.h"

typedef struct kvtp kvtp;

/* What a page is, carried from slot to slot as its bytes move. */
struct kvtp_ident {
	kvt_page_key key, parent; /* parent: zero at depth 0 */
	uint64_t salt;            /* the tenant's */
	uint32_t tenant, depth;   /* depth: the page's index in its prefix */
};

/* A persistence state over @ssd's record area (kvt_tier_ssd_records())
 * with page identities for every owned tier in @tiers (NULL: absent).
 * 0, -ENOMEM, the tier's error. */
int kvtp_open(kvtp **out, kvt_tier *ssd, kvt_tier *const *tiers, uint32_t L);
/* Free the state; the records stay as they are (no release runs). */
void kvtp_free(kvtp *p);

/* The salt of @tenant as last added (0 for tenant 0 and unknown ones). */
uint64_t kvtp_salt(kvtp *p, uint32_t tenant);
/* kvt_cache_tenant_add(): 1 if @tenant was re-created by the rebuild with
 * this @salt (nothing to do: the caller returns 0), 0 to add it as usual;
 * *@drop set when it was re-created with another salt (its pages were
 * keyed with that one: the caller removes it from the index first). */
int kvtp_tenant_add(kvtp *p, uint32_t tenant, uint64_t salt, int *drop);
/* The salt to remember for a tenant the cache added (0 or -ENOMEM). */
int kvtp_tenant_note(kvtp *p, uint32_t tenant, uint64_t salt);

/* Slot @slot of tier @t will hold page @i of the prefix keys[0..]. */
void kvtp_ident_set(kvtp *p, int t, uint32_t slot, uint32_t tenant,
		    const kvt_page_key *keys, size_t i);
/* The page of (@st, @ss) is being copied to (@dt, @ds). */
void kvtp_ident_copy(kvtp *p, int st, uint32_t ss, int dt, uint32_t ds);
/* ssd slot @slot is about to be written, or no longer holds its page:
 * its record goes (before any byte of the slot changes). */
void kvtp_drop(kvtp *p, uint32_t slot);
/* ssd slot @slot holds its page, bytes verified against @sums (L of
 * them): write its record. */
void kvtp_commit(kvtp *p, uint32_t slot, const uint64_t *sums);

/* Rebuild at open: put every page whose record and chain are whole back
 * in @idx at its ssd slot; set sums[slot * L ...] and state[slot] = @ok
 * for them; drop every other record. 0, -ENOMEM (nothing restored). */
int kvtp_rebuild(kvtp *p, kvt_index *idx, uint64_t *sums, uint8_t *state,
		 uint8_t ok);
/* What the rebuild found. */
void kvtp_restore_stat(kvtp *p, kvt_cache_restore *r);

#endif
