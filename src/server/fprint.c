/*
 * fprint.c — FPRINT: engines say what their page hashes depend on, so
 * engines whose hashes can never match are noticed instead of silently
 * getting 0 hits.
 *
 *   engine (connector) ---- FPRINT scheme, fp[32] ---->  d->ten[i].fps[]
 *      warns once when       <--- others, conflicts ---  (first come,
 *      others > 0                                          first kept)
 *
 * An engine keys pages by its own chained block hashes (kvtier.keys,
 * keys_from_hashes), seeded by something only it knows: vLLM's NONE_HASH
 * comes from PYTHONHASHSEED and the prefix-caching hash algorithm. Two
 * engines of one tenant with different seeds store and look up disjoint
 * keys. The connector sends a fingerprint of those inputs (a one-way
 * hash: never the seed) and the daemon tells it whether its tenant's
 * engines published others before.
 *
 * Invariants: the table is per tenant, written only by connections that
 * completed HELLO as that tenant (monitors may not send FPRINT), so no
 * other tenant can plant a fingerprint that makes this one's engines
 * warn; it is bounded (KVTI_FP_KEEP entries of 36 bytes per tenant: a
 * fingerprint past it is answered and counted, not kept); it lives as
 * long as the daemon. A tenant's own processes can make its other
 * engines warn: they could as well store garbage under its keys.
 *
 * Locking: d->mu guards every tenant's @fps, @nfp, @fp_warned and
 * @fp_conflicts (held for a scan of at most KVTI_FP_KEEP entries, never
 * across I/O).
 */
#include "server/daemon_impl.h"

#include <string.h>

void kvti_fprint_publish(struct conn *c, uint32_t scheme, const uint8_t *fp,
			 uint32_t *others, uint64_t *conflicts)
{
	kvtd *d = c->d;
	struct tenant *t = c->t;
	uint32_t n = 0;
	int known = 0, warn = 0;

	pthread_mutex_lock(&d->mu);
	for (int i = 0; i < t->nfp; i++) {
		if (t->fps[i].scheme != scheme)
			continue;
		if (!memcmp(t->fps[i].fp, fp, KVTD_FP_BYTES))
			known = 1;
		else
			n++;
	}
	if (!known) {
		if (n) {
			kvtd_metrics_fp_conflict(d->m, t->mt);
			t->fp_conflicts++;
			warn = !t->fp_warned;
			t->fp_warned = 1;
		}
		if (t->nfp < KVTI_FP_KEEP) {
			t->fps[t->nfp].scheme = scheme;
			memcpy(t->fps[t->nfp].fp, fp, KVTD_FP_BYTES);
			t->nfp++;
		}
	}
	*conflicts = t->fp_conflicts;
	pthread_mutex_unlock(&d->mu);
	*others = n;
	if (warn)
		kvti_warn("daemon: tenant %s: client pid %d published a page-hash "
			  "fingerprint (scheme %u) that differs from the one its "
			  "engines published before: their page keys never match "
			  "(0 hits between them; vLLM: set the same "
			  "PYTHONHASHSEED and prefix-caching hash algorithm); "
			  "later conflicts are counted in "
			  "kvtier_fingerprint_conflicts_total", t->name,
			  (int)c->cred.pid, scheme);
}
