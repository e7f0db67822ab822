/*
 * xxh.h — XXH3 for the transfer engine's checksums. On x86-64 the
 * library's runtime dispatch picks the widest vectors the CPU has (AVX2,
 * AVX-512): about 6x the SSE2 default on the dev machine. The values are
 * the same whichever code computes them.
 */
#ifndef KVT_XFER_XXH_H
#define KVT_XFER_XXH_H

#define XXH_STATIC_LINKING_ONLY
#include <xxhash.h>
#if defined(__x86_64__) && defined(__has_include)
#if __has_include(<xxh_x86dispatch.h>)
#include <xxh_x86dispatch.h>
#endif
#endif

#include <kvtier.h>

/* Feed one chunk of layout @l at @p to @h in [P][H][D] order: its bytes
 * as they are when it is one piece, else row by row (geom.h "ROWS"), so
 * a chunk hashes the same whatever layout holds it. */
static inline void kvti_chunk_hash(XXH3_state_t *h, const kvt_layout *l,
				   const void *p)
{
	uint64_t row = (uint64_t)l->geom.head_dim * l->geom.dtype_bytes;
	uint32_t n = l->geom.page_tokens * l->geom.kv_heads;

	if (kvt_layout_rows(l) == 1) {
		XXH3_64bits_update(h, p, l->chunk_bytes);
		return;
	}
	for (uint32_t r = 0; r < n; r++)
		XXH3_64bits_update(h, (const char *)p + kvt_layout_row_off(l, r),
				   row);
}

#endif
