/*
 * test_cache_attach — one cache serving several engines' memories (what the
 * node daemon does with one memory per client): pages stored out of one
 * attached memory load bit-exact into another with different strides;
 * progress callbacks report layers in order and end with exactly one done
 * report; detaching memory cancels the jobs on it and leaves the other
 * memories working; bad kvt_cache_io arguments are refused.
 */
#include "cache_util.h"

#include <pthread.h>

#define P 4
#define NB 32
#define NL 8

static kvt_geom geom;

struct rec {
	pthread_mutex_t mu;
	uint32_t last;      /* layers last reported */
	int calls, dones, result, backwards, after_done;
};

static void on_progress(void *arg, const kvt_cache_progress *p)
{
	struct rec *r = arg;

	pthread_mutex_lock(&r->mu);
	r->calls++;
	if (r->dones)
		r->after_done++;
	if (p->layers < r->last)
		r->backwards++;
	r->last = p->layers;
	if (p->done) {
		r->dones++;
		r->result = p->result;
	}
	pthread_mutex_unlock(&r->mu);
}

static kvt_cache_mem *attach(kvt_cache *c, const eng *e)
{
	kvt_cache_mem *m = NULL;

	CHECK_OK(kvt_cache_attach(c, e->base, e->L, e->nblocks, e->bs, e->ks,
				  e->ts, e->device, &m));
	return m;
}

int main(void)
{
	kvt_cache_config cfg = KVT_CACHE_CONFIG_INIT;
	kvt_cache *c = NULL;
	eng a, b, r;
	kvt_cache_mem *ma, *mb;
	kvt_page_key keys[NB];
	uint32_t blk[NB], rev[NB];
	kvt_cache_job *j;

	small_geom(&geom, NL, P);
	cfg.tiers = "dram:4M";
	cfg.geom = &geom;
	CHECK_OK(kvt_cache_open(&c, &cfg));
	if (!c)
		TEST_DONE();
	CHECK_OK(eng_init(&a, &geom, NB, ENG_KV_OUTER, 64, -1));
	CHECK_OK(eng_init(&b, &geom, NB, ENG_BLOCK_OUTER, 32, -1));
	CHECK_OK(eng_init(&r, &geom, NB, ENG_KV_OUTER, 0, -1));
	ma = attach(c, &a);
	mb = attach(c, &b);
	/* the registered memory is separate from attached ones */
	CHECK_OK(eng_register(c, &r));
	CHECK_ERR(eng_register(c, &r), KVT_EBUSY);
	CHECK_ERR(kvt_cache_attach(c, a.base, a.L, a.nblocks, a.bs, a.ks, a.ts,
				   -1, NULL), -EINVAL);
	CHECK_ERR(kvt_cache_attach(c, a.base, a.L - 1, a.nblocks, a.bs, a.ks,
				   a.ts, -1, &mb), KVT_EGEOM);
	CHECK_OK(session_keys(c, 0, 1, NB, keys));
	for (uint32_t i = 0; i < NB; i++) {
		blk[i] = i;
		rev[i] = NB - 1 - i;
	}

	/* store out of A with a progress record */
	struct rec sr = { .mu = PTHREAD_MUTEX_INITIALIZER };
	kvt_cache_io io = KVT_CACHE_IO_INIT;

	eng_fill(&a, keys, NB, 0, blk);
	io.mem = ma;
	io.progress = on_progress;
	io.arg = &sr;
	CHECK_OK(kvt_cache_store_ex(c, 0, keys, NB, 0, blk, &io, &j));
	CHECK_OK(job_finish(j, NULL, 0, NULL));
	CHECK_EQ(sr.dones, 1);
	CHECK_EQ(sr.after_done, 0);
	CHECK_EQ(sr.backwards, 0);
	CHECK_EQ(sr.result, 0);
	CHECK_EQ(sr.last, NL);

	/* load into B (other strides, blocks reversed), with progress */
	struct rec lr = { .mu = PTHREAD_MUTEX_INITIALIZER };

	for (uint32_t i = 0; i < NB; i++)
		eng_poison(&b, i);
	io.mem = mb;
	io.arg = &lr;
	CHECK_OK(kvt_cache_load_ex(c, 0, keys, NB, 0, rev, &io, &j));
	CHECK_OK(kvt_cache_job_wait_layer(j, 0, -1));
	CHECK_OK(job_finish(j, NULL, 0, NULL));
	CHECK_EQ(lr.dones, 1);
	CHECK_EQ(lr.backwards, 0);
	CHECK_EQ(lr.after_done, 0);
	CHECK_EQ(lr.last, NL);
	CHECK(lr.calls >= 2); /* at least one layer report before done */
	for (uint32_t i = 0; i < NB; i++)
		CHECK(eng_block_is(&b, rev[i], keys[i]));
	CHECK(eng_gaps_intact(&b));

	/* and into the registered memory through the plain call */
	CHECK_OK(kvt_cache_load(c, 0, keys, NB, 0, blk, &j));
	CHECK_OK(job_finish(j, NULL, 0, NULL));
	for (uint32_t i = 0; i < NB; i++)
		CHECK(eng_block_is(&r, i, keys[i]));

	/* a load of absent pages: one done report, every block failed */
	struct rec fr = { .mu = PTHREAD_MUTEX_INITIALIZER };
	kvt_page_key miss[4];
	long nf;

	CHECK_OK(session_keys(c, 0, 99, 4, miss));
	io.arg = &fr;
	CHECK_OK(kvt_cache_load_ex(c, 0, miss, 4, 0, blk, &io, &j));
	CHECK_ERR(job_finish(j, NULL, 0, &nf), KVT_ENOTFOUND);
	CHECK_EQ(nf, 4);
	CHECK_EQ(fr.dones, 1);
	CHECK_EQ(fr.last, 0);
	CHECK_EQ(fr.result, KVT_ENOTFOUND);

	/* bad io */
	kvt_cache_io bad = KVT_CACHE_IO_INIT;

	bad.size = 0;
	CHECK_ERR(kvt_cache_load_ex(c, 0, keys, NB, 0, blk, &bad, &j), -EINVAL);
	bad.size = 4096;
	CHECK_ERR(kvt_cache_load_ex(c, 0, keys, NB, 0, blk, &bad, &j), -EINVAL);

	/* detach with jobs running on it: they end (cancelled or done),
	 * the handles stay valid, the other memory keeps working */
	kvt_cache_job *jobs[8];

	io.mem = mb;
	io.progress = NULL;
	for (int k = 0; k < 8; k++)
		CHECK_OK(kvt_cache_load_ex(c, 0, keys, NB, 0, rev, &io,
					   &jobs[k]));
	kvt_cache_detach(mb);
	for (int k = 0; k < 8; k++) {
		int e = kvt_cache_job_poll(jobs[k]);

		CHECK(e == 0 || e == -ECANCELED);
		kvt_cache_job_free(jobs[k]);
	}
	io.mem = ma;
	for (uint32_t i = 0; i < NB; i++)
		eng_poison(&a, i);
	CHECK_OK(kvt_cache_load_ex(c, 0, keys, NB, 0, blk, &io, &j));
	CHECK_OK(job_finish(j, NULL, 0, NULL));
	for (uint32_t i = 0; i < NB; i++)
		CHECK(eng_block_is(&a, i, keys[i]));
	kvt_cache_detach(ma);
	kvt_cache_detach(NULL);

	kvt_cache_check chk;
	CHECK_OK(kvt_cache_verify(c, &chk));
	CHECK_EQ(chk.bad, 0);
	kvt_cache_close(c);
	eng_free(&a);
	eng_free(&b);
	eng_free(&r);
	TEST_DONE();
}
