/*
 * bench_server_bl.c — `kvtier bench server --device D --baselines`: in
 * this process, each repeat, the transfer engine moves the same pages
 * between page-locked dram and device memory by other means, side by side
 * with the daemon's loads:
 *
 *   contig        one contiguous copy of all their bytes (the link's limit)
 *   batch         batched copy-engine DMA of the chunks
 *                 (cudaMemcpyBatchAsync)
 *   chunk         one copy per chunk (vLLM's swap_blocks)
 *   kernel        the gather kernel, without and with per-layer
 *                 verification on the device
 *   store         device -> dram batched with device-side layer sums,
 *                 against one contiguous copy the other way
 *
 * and the comparisons (vs_contig, vs_batch, vs_chunk, verify_cost,
 * stores_vs_contig): each the median of per-repeat ratios, with its goal.
 *
 * Invariants: the same pages (dram slots in order, device slots shuffled
 * once) and bytes as the daemon's loads; the verified kernel checks sums
 * taken here from dram's bytes, so a wrong copy fails the run.
 *
 * Locking: none; one transfer engine, one job at a time, waited for.
 */
#include "bench_server.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <xxhash.h>

static const char *const b_names[B_COUNT] = {
	"contig_gbps", "batch_gbps", "chunk_gbps", "kernel_gbps",
	"kernel_verify_gbps", "store_gbps", "store_contig_gbps",
};

static kvt_tier *bl_tier(struct bl *b, const char *spec, const kvt_geom *g,
			 int reg)
{
	kvt_tier_spec ts;
	kvt_tier *t = NULL;
	size_t n;

	if (kvt_tier_spec_parse(spec, &ts, 1, &n) || kvt_tier_open(&t, &ts, g))
		return NULL;
	if (reg && kvt_dev_host_register(b->dev, kvt_tier_bufs(t)[0],
			kvt_layout_region_bytes(kvt_tier_layout(t)))) {
		kvt_tier_close(t);
		return NULL;
	}
	return t;
}

void kvti_bs_bl_free(struct bl *b)
{
	kvt_xfer_destroy(b->x);
	if (b->dram)
		kvt_dev_host_unregister(b->dev, kvt_tier_bufs(b->dram)[0]);
	if (b->back)
		kvt_dev_host_unregister(b->dev, kvt_tier_bufs(b->back)[0]);
	kvt_tier_close(b->dram);
	kvt_tier_close(b->back);
	kvt_tier_close(b->hbm);
	kvt_dev_close(b->dev);
	kvt_free(b->ss);
	kvt_free(b->ds);
	kvt_free(b->sums);
	memset(b, 0, sizeof(*b));
}

int kvti_bs_bl_setup(struct bl *b, const kvt_geom *g, int device, uint64_t n)
{
	uint64_t page = kvt_geom_page_bytes(g), lb = page / g->layers;
	char spec[96], dn[16];
	int err;

	memset(b, 0, sizeof(*b));
	b->n = n;
	b->bytes = n * page;
	if ((err = kvt_dev_open(device, &b->dev)) ||
	    (err = kvt_xfer_create(&b->x, NULL)))
		goto fail;
	snprintf(spec, sizeof(spec), "dram:%llu", (unsigned long long)b->bytes);
	b->dram = bl_tier(b, spec, g, 1);
	b->back = bl_tier(b, spec, g, 1);
	snprintf(spec, sizeof(spec), "hbm:%llu,device=%s",
		 (unsigned long long)b->bytes,
		 kvt_device_format(device, dn, sizeof(dn)));
	b->hbm = bl_tier(b, spec, g, 0);
	b->ss = kvt_malloc(n * sizeof(*b->ss));
	b->ds = kvt_malloc(n * sizeof(*b->ds));
	b->sums = kvt_malloc(n * g->layers * sizeof(*b->sums));
	if (!b->dram || !b->back || !b->hbm || !b->ss || !b->ds || !b->sums) {
		err = kvt_errdetail()[0] ? -EINVAL : -ENOMEM;
		goto fail;
	}
	for (uint64_t i = 0; i < b->bytes / 8; i++)
		((uint64_t *)kvt_tier_bufs(b->dram)[0])[i] = i * 0x9e3779b97f4a7c15ull;
	for (uint64_t i = 0; i < n; i++) {
		b->ss[i] = (uint32_t)i;
		for (uint32_t l = 0; l < g->layers; l++)
			b->sums[i * g->layers + l] = XXH3_64bits(
				(uint8_t *)kvt_tier_slot_ptr(b->dram, (uint32_t)i) +
				l * lb, lb);
	}
	kvti_bs_shuffle(b->ds, n, 7);
	return 0;
fail:
	kvti_bs_bl_free(b);
	return err ? err : -EINVAL;
}

static int bl_job(struct bl *b, int load, int method, unsigned flags,
		  double *gbps)
{
	kvt_xfer_desc d = { .src = load ? b->dram : b->hbm,
			    .dst = load ? b->hbm : b->back,
			    .src_slots = load ? b->ss : b->ds,
			    .dst_slots = load ? b->ds : b->ss, .npages = b->n,
			    .method = method, .flags = flags,
			    .sums = flags ? b->sums : NULL };
	kvt_xfer_job *j;
	uint64_t t0 = kvt_now_ns();
	int err = kvt_xfer_submit(b->x, &d, &j);

	if (!err) {
		err = kvt_xfer_wait(j, -1);
		kvt_xfer_job_free(j);
	}
	*gbps = (double)b->bytes / kvti_bs_secs(t0) / 1e9;
	return err;
}

/* One round of every baseline, GB/s into @r. */
int kvti_bs_bl_run(struct bl *b, double *r)
{
	double sec;
	int err;

	if ((err = kvt_xfer_contig_copy(b->x, b->dram, b->hbm, b->bytes, 0,
					&sec)))
		return err;
	r[B_CONTIG] = (double)b->bytes / sec / 1e9;
	if ((err = kvt_xfer_contig_copy(b->x, b->hbm, b->back, b->bytes, 0,
					&sec)))
		return err;
	r[B_STORE_CONTIG] = (double)b->bytes / sec / 1e9;
	if ((err = bl_job(b, 1, KVT_XFER_CUDA_BATCH, 0, &r[B_BATCH])) ||
	    (err = bl_job(b, 1, KVT_XFER_CUDA_CHUNK, 0, &r[B_CHUNK])) ||
	    (err = bl_job(b, 1, KVT_XFER_CUDA_KERNEL, 0, &r[B_KERNEL])) ||
	    (err = bl_job(b, 1, KVT_XFER_CUDA_KERNEL, KVT_XFER_LVERIFY,
			  &r[B_KERNEL_V])) ||
	    (err = bl_job(b, 0, KVT_XFER_CUDA_BATCH, KVT_XFER_LSUM,
			  &r[B_STORE])))
		return err;
	return 0;
}

/* The comparisons, each the median of per-repeat ratios (side by side in
 * one repeat), with their goals. */
static const struct {
	const char *name;
	int num, den;            /* B_* (num -1: the daemon's GB/s) */
	double goal;
	int le;                  /* goal is an upper bound */
} cmp[] = {
	{ "vs_contig", -1, B_CONTIG, 0.9, 0 },
	{ "vs_batch", -1, B_BATCH, 1.25, 0 },
	{ "vs_chunk", -1, B_CHUNK, 3.0, 0 },
	{ "verify_cost", B_KERNEL, B_KERNEL_V, 0.10, 1 },
	{ "stores_vs_contig", B_STORE, B_STORE_CONTIG, 0.8, 0 },
};

static double cmp_value(int c, double (*r)[B_COUNT], const double *dg, int n)
{
	double v[MAX_REP];

	for (int i = 0; i < n; i++) {
		double a = cmp[c].num < 0 ? dg[i] : r[i][cmp[c].num];

		v[i] = a / r[i][cmp[c].den];
		if (cmp[c].le) /* verify_cost: time with / without - 1 */
			v[i] = v[i] - 1;
	}
	return cli_median(v, n);
}

void kvti_bs_bl_json(cJSON *root, double (*r)[B_COUNT], const double *dg,
		     int n)
{
	cJSON *b = cJSON_AddObjectToObject(root, "baselines");

	for (int k = 0; k < B_COUNT; k++) {
		double v[MAX_REP];

		for (int i = 0; i < n; i++)
			v[i] = r[i][k];
		cJSON_AddNumberToObject(b, b_names[k], cli_median(v, n));
	}
	for (size_t c = 0; c < (sizeof(cmp) / sizeof(cmp[0])); c++) {
		double v = cmp_value((int)c, r, dg, n);
		char k[48];

		cJSON_AddNumberToObject(root, cmp[c].name, v);
		snprintf(k, sizeof(k), "%s_goal", cmp[c].name);
		cJSON_AddNumberToObject(root, k, cmp[c].goal);
		snprintf(k, sizeof(k), "%s_met", cmp[c].name);
		cJSON_AddBoolToObject(root, k, cmp[c].le ? v <= cmp[c].goal :
					       v >= cmp[c].goal);
	}
}

void kvti_bs_bl_print(double (*r)[B_COUNT], const double *dg, int n)
{
	for (int k = 0; k < B_COUNT; k++) {
		double v[MAX_REP];

		for (int i = 0; i < n; i++)
			v[i] = r[i][k];
		printf("  %-20s %8.2f GB/s (median)\n", b_names[k],
		       cli_median(v, n));
	}
	for (size_t c = 0; c < (sizeof(cmp) / sizeof(cmp[0])); c++) {
		double v = cmp_value((int)c, r, dg, n);
		int met = cmp[c].le ? v <= cmp[c].goal : v >= cmp[c].goal;

		printf("  %-16s %.2f: goal %s %.2f %s\n", cmp[c].name, v,
		       cmp[c].le ? "<=" : ">=", cmp[c].goal,
		       met ? "met" : "MISSED");
	}
}
