/*
 * test_index_faults — fail the N-th allocation inside each changing index
 * call, for every N until the call succeeds (the rax-oom-test idea): each
 * failure must be -ENOMEM with the cached contents unchanged (every page
 * of every prefix the test knows, and the counts), kvt_index_check()
 * clean, and nothing leaked once the index is gone.
 */
#include "harness.h"

#define P 4
#define NPFX 96
#define LEN 12 /* pages */

static uint32_t tok[NPFX][LEN * P];
static kvt_pool *hbm, *dram;

struct snap {
	kvt_page_info pi[NPFX][LEN];
	size_t found[NPFX];
	kvt_index_stat st;
};

static kvt_prefix px(int i, int np)
{
	kvt_prefix p = { .tenant = 0, .tokens = tok[i],
			 .ntokens = (size_t)np * P };
	return p;
}

static void snap_take(kvt_index *x, struct snap *s)
{
	for (int i = 0; i < NPFX; i++) {
		kvt_prefix p = px(i, LEN);
		CHECK_OK(kvt_index_inspect(x, &p, s->pi[i], LEN, &s->found[i]));
	}
	kvt_index_stat_get(x, &s->st);
}

static int snap_same(const struct snap *a, const struct snap *b)
{
	for (int i = 0; i < NPFX; i++) {
		if (a->found[i] != b->found[i])
			return 0;
		for (size_t j = 0; j < a->found[i]; j++) {
			const kvt_page_info *p = &a->pi[i][j], *q = &b->pi[i][j];
			if (p->resident != q->resident || p->state != q->state ||
			    p->pins != q->pins || p->hits != q->hits ||
			    p->atime != q->atime || p->ticket != q->ticket ||
			    memcmp(p->slot, q->slot, sizeof(p->slot)))
				return 0;
		}
	}
	return a->st.pages == b->st.pages &&
	       a->st.transient == b->st.transient &&
	       a->st.pinned == b->st.pinned &&
	       !memcmp(a->st.resident, b->st.resident, sizeof(a->st.resident));
}

/* A populated index: prefixes sharing first pages in a few groups. */
static kvt_index *populate(int npop)
{
	kvt_index_config c = { .page_tokens = P,
			       .write = KVT_WRITE_THROUGH };
	kvt_index *x;

	CHECK_OK(kvt_pool_create(&hbm, 4096, 64));
	CHECK_OK(kvt_pool_create(&dram, 4096, 64));
	c.pools[KVT_TIER_HBM] = hbm;
	c.pools[KVT_TIER_DRAM] = dram;
	CHECK_OK(kvt_index_create(&x, &c));
	for (int i = 0; i < npop; i++) {
		kvt_prefix p = px(i, 3 + i % (LEN - 3));
		CHECK_OK(kvt_index_insert(x, &p, KVT_TIER_HBM, 0, (uint64_t)i,
					  NULL, NULL, 0));
	}
	return x;
}

static void teardown(kvt_index *x)
{
	kvt_index_destroy(x);
	kvt_pool_destroy(hbm);
	kvt_pool_destroy(dram);
}

enum { OP_INSERT, OP_QUEUE, OP_START, OP_PIN, OP_TOUCH, OP_TENANT,
       OP_CANCEL, NOPS };
static const char *const names[] = { "insert", "queue", "start", "pin",
				     "match+touch", "tenant_add", "cancel" };

static int call(kvt_index *x, int op, int i)
{
	kvt_prefix p = px(i, LEN), q = px(i % 4, 1);
	kvt_match m;

	switch (op) {
	case OP_INSERT:
		return kvt_index_insert(x, &p, KVT_TIER_HBM, 0, 100, NULL,
					NULL, 0);
	case OP_QUEUE:
		return kvt_index_queue(x, &p, 7, 100, NULL);
	case OP_START:
		return kvt_index_start(x, &p, 7, 200, 100, NULL);
	case OP_PIN:
		return kvt_index_pin(x, &q);
	case OP_TOUCH:
		return kvt_index_match(x, &q, KVT_MATCH_TOUCH, 100, &m, NULL, 0);
	case OP_TENANT:
		return kvt_index_tenant_add(x, 1000 + (uint32_t)i, 5);
	default:
		return kvt_index_cancel(x, &q, 7, NULL);
	}
}

/* For populations of growing size (so the child table and the heaps
 * reach their growth points) and each N: a fresh index, fail allocation N
 * inside the call, compare. */
static void walk(int op)
{
	uint64_t injected = 0, most = 0;

	for (int npop = 4; npop < 72; npop++) {
		int i = npop + 1; /* a prefix not inserted yet */
		uint64_t n;
		for (n = 1; n < 64; n++) {
			int64_t live = kvt_alloc_live();
			kvt_index *x = populate(npop);
			struct snap *before = calloc(1, sizeof(*before));
			struct snap *after = calloc(1, sizeof(*after));
			int err;

			if (op == OP_CANCEL)
				CHECK_OK(call(x, OP_QUEUE, i));
			snap_take(x, before);
			kvt_alloc_fail_at(n);
			err = call(x, op, i);
			kvt_alloc_fail_at(0);
			CHECK_OK(kvt_index_check(x));
			if (err) {
				injected++;
				CHECK_ERR(err, -ENOMEM);
				snap_take(x, after);
				if (!snap_same(before, after)) {
					fprintf(stderr, "%s: %d prefixes, failed "
						"allocation %llu changed the "
						"contents\n", names[op], npop,
						(unsigned long long)n);
					CHECK(0);
				}
			}
			free(before);
			free(after);
			teardown(x);
			CHECK_EQ(kvt_alloc_live(), live);
			if (!err)
				break;
		}
		if (n - 1 > most)
			most = n - 1;
	}
	fprintf(stderr, "%-12s %llu failures injected, at most %llu in one "
		"call\n", names[op], (unsigned long long)injected,
		(unsigned long long)most);
	CHECK(injected >= 60);
	if (op == OP_INSERT || op == OP_QUEUE || op == OP_START)
		CHECK(most >= 2); /* a growth point was reached */
}

int main(void)
{
	uint64_t r = 42;

	for (int i = 0; i < NPFX; i++)
		for (int j = 0; j < LEN * P; j++)
			/* groups of 4 prefixes share their first 2 pages */
			tok[i][j] = j < 2 * P ? (uint32_t)(i / 4 * 100 + j) :
				    (uint32_t)(test_rand(&r) % 5);
	for (int op = 0; op < NOPS; op++)
		walk(op);
	{
		/* creation fails cleanly at every allocation too */
		kvt_index_config c = { .page_tokens = 8 };
		int64_t live = kvt_alloc_live();
		kvt_index *x;
		CHECK_OK(kvt_pool_create(&hbm, 8, 64));
		c.pools[KVT_TIER_HBM] = hbm;
		for (uint64_t n = 1;; n++) {
			int err;
			kvt_alloc_fail_at(n);
			err = kvt_index_create(&x, &c);
			kvt_alloc_fail_at(0);
			if (!err) {
				kvt_index_destroy(x);
				break;
			}
			CHECK_ERR(err, -ENOMEM);
		}
		kvt_pool_destroy(hbm);
		CHECK_EQ(kvt_alloc_live(), live);
	}
	TEST_DONE();
}
