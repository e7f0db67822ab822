/*
 * cost_fixture.h — a hand-filled cost model for scheduler tests: an
 * H200-like GPU and PCIe 5.0 link with the SPEC.md figures, so the tests
 * do not depend on profile files. Shared by test_cost.c and test_sched*.c.
 */
#ifndef KVT_TEST_COST_FIXTURE_H
#define KVT_TEST_COST_FIXTURE_H

#include <kvtier.h>
#include <string.h>

static inline void fixture_curve(kvt_copy_curve *k, double call_us, int n,
				 const double *kib, const double *gbps)
{
	k->n = (uint32_t)n;
	k->call_us = call_us;
	for (int i = 0; i < n; i++) {
		k->chunk_bytes[i] = kib[i] * 1024;
		k->gbps[i] = gbps[i];
	}
}

/* H200, PCIe 5.0 x16, model @name at @tp and 16-token pages. */
static inline int fixture_cost(kvt_cost *c, const char *name, uint32_t tp)
{
	static const double ck[] = { 64 * 1024 }, cg[] = { 54 };
	static const double bk[] = { 4, 16, 64, 1024 }, bg[] = { 4, 7, 38, 54 };
	static const double mk[] = { 4, 16, 64, 1024 }, mg[] = { 4, 7, 50, 54 };
	static const double gk[] = { 4, 64 }, gg[] = { 30, 48 };
	kvt_geom g;
	int err;

	memset(c, 0, sizeof(*c));
	if ((err = kvt_geom_preset(&g, name, 16, tp, 0)))
		return err;
	c->gpu_flops = 989e12;
	c->gemm_eff = 0.6;
	c->attn_eff = 0.5;
	c->hbm_gbps = 4800;
	c->hbm_eff = 0.8;
	c->step_us = 1000;
	c->ar_gbps = 300;
	c->ar_us = 10;
	c->link_gbps = 54;
	fixture_curve(&c->copy[KVT_COPY_CONTIG], 10, 1, ck, cg);
	fixture_curve(&c->copy[KVT_COPY_OBJECT], 5, 1, ck, cg);
	fixture_curve(&c->copy[KVT_COPY_MEMCPY], 3.34, 4, mk, mg);
	fixture_curve(&c->copy[KVT_COPY_BATCH], 10, 4, bk, bg);
	fixture_curve(&c->copy[KVT_COPY_GATHER], 5, 2, gk, gg);
	return kvt_cost_set_model(c, &g);
}

#endif
