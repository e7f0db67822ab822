/*
 * mark.c — the index's transient marks: kvt_index_queue() (a load is
 * queued for the prefix's pages outside the fastest tier), _start() (it
 * is in flight, expected ready at a time), _cancel() (the mark is gone).
 *
 * A mark is node-level (tstate, ticket, ready), so a call first splits the
 * path where it must differ (mark_shape: the prefix's end, and for queue
 * and start wherever fastest-tier residency changes inside a markable
 * node), then marks or clears each node root side first, then, for queue
 * and start, hangs one placeholder node for the pages the tree lacks.
 * Pages in the fastest tier are never marked. Queue leaves every marked
 * node alone; start takes over a queued mark but not another ticket's
 * in-flight one; cancel clears only its own ticket's marks and prunes
 * what that leaves empty. The order of the steps, and why a failure
 * changes nothing, is ops.c's header comment; the locking rule (none: one
 * thread at a time) is index.c's.
 */
#include "index/index_impl.h"

#include <errno.h>

/* ---- transient marks -------------------------------------------------- */

enum { OP_QUEUE, OP_START, OP_CANCEL };

struct mark {
	int op;
	uint64_t ticket, ready, count;
};

/* May this call mark (or clear) node n, apart from the page-level rule? */
static int node_markable(const struct mark *mk, const struct knode *n)
{
	switch (mk->op) {
	case OP_QUEUE:
		return !n->tstate;
	case OP_START:
		return !(n->tstate == KVT_PAGE_INFLIGHT && n->ticket != mk->ticket);
	default:
		return n->tstate && n->ticket == mk->ticket;
	}
}

/* Split the first np pages so every path node is uniform for the mark:
 * at the prefix's end, and (queue/start) wherever fastest-tier residency
 * changes inside a markable node. */
static int mark_shape(kvt_index *x, struct pk *k, size_t np,
		      const struct mark *mk)
{
	struct walker w;
	struct knode *h;
	uint32_t got;
	int err;

	kvti_walk_init(k, &w);
	while ((got = kvti_walk_next(x, k, &w, np))) {
		struct knode *n = w.n;
		const uint8_t *b = nmask(x, n);
		uint32_t c = 1;

		if (mk->op == OP_CANCEL || !node_markable(mk, n))
			continue;
		while (c < got && (b[c] & 1) == (b[0] & 1))
			c++;
		if (c == got)
			continue;
		/* split before page c; walk on from the head */
		if ((err = kvti_split(x, n, c, &h)))
			return err;
		w.n = h;
		w.j = c;
		w.i = w.i - got + c;
	}
	return kvti_split_at(x, k, np);
}

static void mark_fn(kvt_index *x, struct knode *n, void *arg)
{
	struct mark *mk = arg;

	if (!node_markable(mk, n))
		return;
	if (mk->op == OP_CANCEL) {
		n->tstate = 0;
		n->ticket = 0;
		n->ready = 0;
		x->transient -= n->npages;
		mk->count += n->npages;
		return;
	}
	if (nmask(x, n)[0] & 1)
		return; /* in the fastest tier (uniform after mark_shape) */
	if (mk->op == OP_QUEUE && n->tstate)
		return;
	if (!n->tstate)
		x->transient += n->npages;
	n->tstate = mk->op == OP_QUEUE ? KVT_PAGE_QUEUED : KVT_PAGE_INFLIGHT;
	n->ticket = mk->ticket;
	n->ready = mk->op == OP_START ? mk->ready : 0;
	mk->count += n->npages;
}

static int do_mark(kvt_index *x, const kvt_prefix *px, struct mark *mk,
		   uint64_t now, uint64_t *marked)
{
	struct knode *nn = NULL;
	struct walker w;
	struct pk k;
	size_t have;
	int err;

	kvti_errclear();
	if (marked)
		*marked = 0;
	if ((err = kvti_px_open(x, px, 0, &k)))
		return err;
	if (!mk->ticket)
		return kvti_fail(-EINVAL, "ticket 0 is reserved (no ticket)");
	kvti_set_clock(x, now);
	have = kvti_walk_all(x, &k, &w);
	if ((err = mark_shape(x, &k, have, mk)))
		return err;
	if (mk->op != OP_CANCEL && have < k.n &&
	    (err = kvti_new_tail(x, &k, have, &nn)))
		return err;
	kvti_enter(x);
	kvti_for_path(x, &k, have, mark_fn, mk);
	if (nn) {
		kvti_walk_all(x, &k, &w);
		nn->tstate = 1; /* not empty while attaching */
		kvti_attach(x, w.n, nn);
		nn->tstate = 0;
		mark_fn(x, nn, mk);
	}
	if (mk->op == OP_CANCEL && have) {
		kvti_walk_all(x, &k, &w);
		kvti_prune(x, w.n);
	}
	kvti_leave(x);
	if (marked)
		*marked = mk->count;
	return 0;
}

int kvt_index_queue(kvt_index *x, const kvt_prefix *px, uint64_t ticket,
		    uint64_t now, uint64_t *marked)
{
	struct mark mk = { OP_QUEUE, ticket, 0, 0 };

	return do_mark(x, px, &mk, now, marked);
}

int kvt_index_start(kvt_index *x, const kvt_prefix *px, uint64_t ticket,
		    uint64_t ready_ns, uint64_t now, uint64_t *marked)
{
	struct mark mk = { OP_START, ticket, ready_ns, 0 };

	return do_mark(x, px, &mk, now, marked);
}

int kvt_index_cancel(kvt_index *x, const kvt_prefix *px, uint64_t ticket,
		     uint64_t *marked)
{
	struct mark mk = { OP_CANCEL, ticket, 0, 0 };

	return do_mark(x, px, &mk, 0, marked);
}
