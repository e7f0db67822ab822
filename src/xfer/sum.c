/*
 * sum.c — a job's checksums: XXH3-64 of each page in page-first byte
 * order (KVT_XFER_SUM records, KVT_XFER_VERIFY checks) or one per layer
 * over its K and V chunks (LSUM / LVERIFY), from whichever side or bounce
 * buffer holds the page's bytes. The lanes call these as pages land;
 * the device lane checks on the device and reports only a mismatch.
 *
 *   kvti_job_sum_pf (page-first bytes)  \
 *   kvti_job_sum_side (a tier's layout)  > kvti_job_sum (page) or
 *                                       /  kvti_job_lsum (layer): record
 *                                          into d.sums[], or compare
 *
 * Invariants: a record writes only its own d.sums[] entry (page i, or
 * i * layers + layer), so lanes record pages concurrently without a lock;
 * a mismatch under VERIFY fails the job with KVT_ECORRUPT naming the
 * lowest bad page (bad_page, a CAS minimum); under LVERIFY with a d.bad
 * array it marks the page bad instead and the job goes on.
 *
 * Locking: none; d.sums[], d.bad[], bad_page and the counters are written
 * per entry or atomically, the job's error through kvti_job_fail().
 */
#include "xfer/xfer_impl.h"
#include "xfer/xxh.h"

#include <stdint.h>

void kvti_job_sum(struct kvt_xfer_job *j, size_t i, uint64_t h)
{
	if (j->d.flags & KVT_XFER_SUM) {
		j->d.sums[i] = h;
		return;
	}
	if (!(j->d.flags & KVT_XFER_VERIFY) || j->d.sums[i] == h)
		return;
	if (lane_is_dev(j->lane))
		XFER_ADD(j->x->dev_failed, 1);
	/* keep the lowest bad page */
	size_t cur = atomic_load(&j->bad_page);
	while (i < cur && !atomic_compare_exchange_weak(&j->bad_page, &cur, i))
		;
	kvti_job_fail(j, KVT_ECORRUPT, "page %zu (slot %u of %s) failed its "
		      "checksum: XXH3 %016llx, expected %016llx", i,
		      job_src_slot(j, i), kvt_tier_kind_name(
			      kvt_tier_kind_of(j->d.src)),
		      (unsigned long long)h, (unsigned long long)j->d.sums[i]);
}

void kvti_job_lsum(struct kvt_xfer_job *j, size_t i, uint32_t layer,
		   uint64_t h)
{
	size_t k = i * j->layers + layer;

	if (j->d.flags & KVT_XFER_LSUM) {
		j->d.sums[k] = h;
		return;
	}
	if (!(j->d.flags & KVT_XFER_LVERIFY) || j->d.sums[k] == h)
		return;
	if (lane_is_dev(j->lane))
		XFER_ADD(j->x->dev_failed, 1);
	if (j->d.bad) {
		__atomic_store_n(&j->d.bad[i], 1, __ATOMIC_RELAXED);
		return;
	}
	size_t cur = atomic_load(&j->bad_page);
	while (i < cur && !atomic_compare_exchange_weak(&j->bad_page, &cur, i))
		;
	kvti_job_fail(j, KVT_ECORRUPT, "page %zu (slot %u of %s) layer %u "
		      "failed its checksum: XXH3 %016llx, expected %016llx", i,
		      job_src_slot(j, i), kvt_tier_kind_name(
			      kvt_tier_kind_of(j->d.src)), layer,
		      (unsigned long long)h, (unsigned long long)j->d.sums[k]);
}

void kvti_job_sum_pf(struct kvt_xfer_job *j, size_t i, const void *pf)
{
	const kvt_layout *l = j->sl;
	uint64_t lb = l->page_bytes / j->layers;

	if (j->d.flags & XFER_PAGE_SUMS) {
		kvti_job_sum(j, i, XXH3_64bits(pf, l->page_bytes));
		return;
	}
	for (uint32_t layer = 0; layer < j->layers; layer++)
		kvti_job_lsum(j, i, layer,
			      XXH3_64bits((const char *)pf + layer * lb, lb));
}

uint64_t kvti_layer_sum(const kvt_layout *l, void *const *bufs, uint32_t slot,
			uint32_t layer)
{
	XXH3_state_t h;

	XXH3_64bits_reset(&h);
	for (uint32_t k = 0; k < l->kv; k++) {
		kvt_chunk_loc c = kvt_layout_chunk(l, slot, layer, k);
		kvti_chunk_hash(&h, l, (const char *)bufs[c.buf] + c.off);
	}
	return XXH3_64bits_digest(&h);
}

void kvti_job_sum_side(struct kvt_xfer_job *j, size_t i, const kvt_layout *l,
		       void *const *bufs, uint32_t slot)
{
	if (j->d.flags & XFER_PAGE_SUMS) {
		kvti_job_sum(j, i, kvti_page_sum(l, bufs, slot));
		return;
	}
	for (uint32_t layer = 0; layer < j->layers; layer++)
		kvti_job_lsum(j, i, layer, kvti_layer_sum(l, bufs, slot, layer));
}
