/*
 * rows.h — copying one chunk between two layouts that may keep it in rows
 * (kvt_layout_init_rows(), include/kvtier/geom.h "ROWS").
 *
 * A chunk is P*H rows of D*s bytes, (token t, head h) as row r = t*H + h.
 * A packed chunk holds them back to back ([P][H][D]); a chunk of rows
 * places each with the layout's token and head strides. Copying walks the
 * rows in r order and merges runs that stay contiguous on both sides, so
 * packed <-> packed is one memcpy and head-major <-> packed is P*H small
 * ones. Internal to the library (tiers and the transfer engine).
 */
#ifndef KVT_GEOM_ROWS_H
#define KVT_GEOM_ROWS_H

#include <kvtier.h>
#include <string.h>

/* Both sides one piece: the common case, one memcpy. */
static inline int kvti_chunk_packed(const kvt_layout *a, const kvt_layout *b)
{
	return kvt_layout_rows(a) == 1 && kvt_layout_rows(b) == 1;
}

/* Copy one chunk: @s (in layout @sl) to @d (in layout @dl). The two
 * layouts share the KV shape. */
static inline void kvti_chunk_copy(const kvt_layout *dl, void *d,
				   const kvt_layout *sl, const void *s)
{
	const kvt_geom *g = &sl->geom;
	uint64_t row = (uint64_t)g->head_dim * g->dtype_bytes;
	uint32_t n = g->page_tokens * g->kv_heads;

	if (kvti_chunk_packed(dl, sl)) {
		memcpy(d, s, sl->chunk_bytes);
		return;
	}
	for (uint32_t r = 0; r < n; r++)
		memcpy((char *)d + kvt_layout_row_off(dl, r),
		       (const char *)s + kvt_layout_row_off(sl, r), row);
}

/* Gather one chunk of @l at @chunk into @packed ([P][H][D], chunk_bytes),
 * or (@to_packed 0) scatter @packed back into it. */
static inline void kvti_chunk_pack(const kvt_layout *l, void *chunk,
				   void *packed, int to_packed)
{
	uint64_t row = (uint64_t)l->geom.head_dim * l->geom.dtype_bytes;
	uint32_t n = l->geom.page_tokens * l->geom.kv_heads;

	if (kvt_layout_rows(l) == 1) {
		if (to_packed)
			memcpy(packed, chunk, l->chunk_bytes);
		else
			memcpy(chunk, packed, l->chunk_bytes);
		return;
	}
	for (uint32_t r = 0; r < n; r++) {
		char *c = (char *)chunk + kvt_layout_row_off(l, r);
		char *p = (char *)packed + (uint64_t)r * row;

		if (to_packed)
			memcpy(p, c, row);
		else
			memcpy(c, p, row);
	}
}

#endif
