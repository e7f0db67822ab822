/*
 * layout.c — KV layout descriptors and the reference conversion.
 *
 * The arithmetic that places a chunk is inline in kvtier/geom.h (it sits on
 * the transfer engine's hot path). This file builds descriptors and holds
 * kvt_layout_convert_ref(): a byte-at-a-time copy in which every element is
 * addressed on its own, deliberately plain, the oracle every faster path is
 * tested against. kvt_layout_init_rows() describes engine memory whose
 * chunks are kept in rows (geom.h "ROWS"); the oracle then addresses each
 * element through that layout's own token and head strides.
 */
#include "core/core.h"

#include <errno.h>
#include <string.h>

static const char *layout_names[] = { "page-first", "vllm", "sglang",
				       "strided" };

const char *kvt_layout_name(kvt_layout_kind kind)
{
	return (unsigned)kind < KVT_ARRAY_SIZE(layout_names) ?
		       layout_names[kind] : "?";
}

int kvt_layout_parse(const char *s, kvt_layout_kind *out)
{
	for (size_t i = 0; i <= KVT_LAYOUT_SGLANG; i++) /* not strided */
		if (kvti_streq_ci(s, layout_names[i])) {
			*out = (kvt_layout_kind)i;
			return 0;
		}
	if (kvti_streq_ci(s, "page_first") || kvti_streq_ci(s, "host")) {
		*out = KVT_LAYOUT_PAGE_FIRST;
		return 0;
	}
	return kvti_fail(-EINVAL, "unknown layout '%s' (page-first, vllm, "
			 "sglang)", s);
}

int kvt_layout_init(kvt_layout *l, kvt_layout_kind kind, const kvt_geom *g,
		    uint64_t slots)
{
	kvt_geom t = *g;
	uint64_t chunk, page, region;
	int err;

	if ((unsigned)kind > KVT_LAYOUT_SGLANG)
		return kvti_fail(-EINVAL, "bad layout kind %d", (int)kind);
	if (!slots)
		return kvti_fail(-EINVAL, "layout of zero slots");
	err = kvt_geom_finish(&t);
	if (err)
		return err;
	chunk = kvt_geom_chunk_bytes(&t);
	page = kvt_geom_page_bytes(&t);
	if (__builtin_mul_overflow(page, slots, &region))
		return kvti_fail(-EOVERFLOW, "%llu slots of %llu bytes overflow",
				 (unsigned long long)slots,
				 (unsigned long long)page);
	memset(l, 0, sizeof(*l));
	l->kind = kind;
	l->geom = t;
	l->slots = slots;
	l->kv = kvt_geom_kv(&t);
	l->chunk_bytes = chunk;
	l->page_bytes = page;
	switch (kind) {
	case KVT_LAYOUT_VLLM:
		l->nbufs = t.layers;
		l->buf_bytes = region / t.layers;
		break;
	case KVT_LAYOUT_SGLANG:
		l->nbufs = t.layers * l->kv;
		l->buf_bytes = chunk * slots;
		break;
	default:
		l->nbufs = 1;
		l->buf_bytes = region;
		break;
	}
	return 0;
}

int kvt_layout_init_strided(kvt_layout *l, const kvt_geom *g,
			    uint64_t slots, uint64_t block_stride,
			    uint64_t kv_stride, uint64_t token_stride)
{
	return kvt_layout_init_rows(l, g, slots, block_stride, kv_stride,
				    token_stride,
				    (uint64_t)g->head_dim * g->dtype_bytes);
}

/* The rows of a chunk: token-major or head-major, none overlapping; the
 * span from the chunk's first byte to the end of its last row. */
static int rows_check(const kvt_geom *g, uint64_t ts, uint64_t hs,
		      uint64_t *span)
{
	uint64_t row = (uint64_t)g->head_dim * g->dtype_bytes;
	uint64_t P = g->page_tokens, H = g->kv_heads;
	int tok_major, head_major;

	if (H == 1)
		hs = row; /* one head: its stride means nothing */
	if (ts > UINT32_MAX || hs > UINT32_MAX)
		return kvti_fail(KVT_EGEOM, "token stride %llu, head stride "
				 "%llu: above 4 GiB",
				 (unsigned long long)ts,
				 (unsigned long long)hs);
	tok_major = hs >= row && (P == 1 || ts >= H * hs);
	head_major = ts >= row && (H == 1 || hs >= P * ts);
	if (!tok_major && !head_major)
		return kvti_fail(KVT_EGEOM, "token stride %llu, head stride "
				 "%llu: the %u x %u rows of %llu bytes "
				 "overlap (need heads >= %llu apart and "
				 "tokens >= heads * %u, or tokens >= %llu "
				 "apart and heads >= tokens * %u)",
				 (unsigned long long)ts,
				 (unsigned long long)hs, (unsigned)P,
				 (unsigned)H, (unsigned long long)row,
				 (unsigned long long)row, (unsigned)H,
				 (unsigned long long)row, (unsigned)P);
	*span = (P - 1) * ts + (H - 1) * hs + row;
	return 0;
}

int kvt_layout_init_rows(kvt_layout *l, const kvt_geom *g, uint64_t slots,
			 uint64_t block_stride, uint64_t kv_stride,
			 uint64_t token_stride, uint64_t head_stride)
{
	uint64_t row, span = 0, last, end;
	int err, ok;

	if ((err = kvt_layout_init(l, KVT_LAYOUT_VLLM, g, slots)))
		return err;
	row = (uint64_t)l->geom.head_dim * l->geom.dtype_bytes;
	if (l->geom.kv_heads == 1)
		head_stride = row;
	if ((err = rows_check(&l->geom, token_stride, head_stride, &span)))
		return err;
	if (l->kv == 1)
		kv_stride = 0;
	if (l->kv == 1)
		ok = block_stride >= span;
	else
		ok = (block_stride >= span &&
		      kv_stride / slots >= block_stride) ||
		     (kv_stride >= span && block_stride >= 2 * kv_stride);
	if (!ok)
		return kvti_fail(KVT_EGEOM, "strides block %llu, kv %llu over "
				 "%llu blocks of chunks spanning %llu bytes: "
				 "chunks overlap (need K/V outer: kv >= "
				 "blocks * block, block >= span; or block "
				 "outer: block >= 2 * kv, kv >= span)",
				 (unsigned long long)block_stride,
				 (unsigned long long)kv_stride,
				 (unsigned long long)slots,
				 (unsigned long long)span);
	if (__builtin_mul_overflow(slots - 1, block_stride, &last) ||
	    __builtin_add_overflow(last, (l->kv - 1) * kv_stride, &end) ||
	    __builtin_add_overflow(end, span, &end))
		return kvti_fail(-EOVERFLOW, "strided layout overflows 64 bits");
	l->kind = KVT_LAYOUT_STRIDED;
	l->block_stride = block_stride;
	l->kv_stride = kv_stride;
	l->buf_bytes = end;
	if (head_stride != row ||
	    token_stride != (uint64_t)l->geom.kv_heads * row) {
		l->rows = l->geom.page_tokens * l->geom.kv_heads;
		l->token_stride = (uint32_t)token_stride;
		l->head_stride = (uint32_t)head_stride;
	}
	return 0;
}

void kvt_layout_bufs_carve(const kvt_layout *l, void *base, void **bufs)
{
	for (uint32_t i = 0; i < l->nbufs; i++)
		bufs[i] = (char *)base + (uint64_t)i * l->buf_bytes;
}

/* Offset of token @t, head @h within a chunk, addressed on its own (not
 * through kvt_layout_row_off(): the oracle shares no arithmetic with the
 * paths it checks). */
static uint64_t elem_off(const kvt_layout *l, uint32_t t, uint32_t h)
{
	const kvt_geom *g = &l->geom;
	uint64_t row = (uint64_t)g->head_dim * g->dtype_bytes;

	if (l->kind == KVT_LAYOUT_STRIDED && l->rows > 1)
		return (uint64_t)t * l->token_stride +
		       (uint64_t)h * l->head_stride;
	return ((uint64_t)t * g->kv_heads + h) * row;
}

int kvt_layout_convert_ref(const kvt_layout *src, void *const *src_bufs,
			   const uint64_t *src_slots, const kvt_layout *dst,
			   void *const *dst_bufs, const uint64_t *dst_slots,
			   size_t npages)
{
	const kvt_geom *g = &src->geom;
	const uint64_t s = g->dtype_bytes;

	if (!kvt_geom_same_shape(&src->geom, &dst->geom))
		return kvti_fail(KVT_EGEOM, "layouts of different KV shape "
				 "(%s vs %s)", src->geom.name, dst->geom.name);
	for (size_t i = 0; i < npages; i++)
		if (src_slots[i] >= src->slots || dst_slots[i] >= dst->slots)
			return kvti_fail(-ERANGE, "page %zu: slot %llu -> %llu "
					 "out of range (%llu, %llu slots)", i,
					 (unsigned long long)src_slots[i],
					 (unsigned long long)dst_slots[i],
					 (unsigned long long)src->slots,
					 (unsigned long long)dst->slots);

	for (size_t i = 0; i < npages; i++)
	for (uint32_t layer = 0; layer < g->layers; layer++)
	for (uint32_t kv = 0; kv < src->kv; kv++) {
		kvt_chunk_loc a = kvt_layout_chunk(src, src_slots[i], layer, kv);
		kvt_chunk_loc b = kvt_layout_chunk(dst, dst_slots[i], layer, kv);
		const unsigned char *from = (const unsigned char *)src_bufs[a.buf] + a.off;
		unsigned char *to = (unsigned char *)dst_bufs[b.buf] + b.off;

		for (uint32_t t = 0; t < g->page_tokens; t++)
		for (uint32_t h = 0; h < g->kv_heads; h++)
		for (uint32_t d = 0; d < g->head_dim; d++) {
			/* element (t, h, d) of the chunk, where each layout
			 * keeps it: [P][H][D] packed, or its own rows */
			uint64_t ea = elem_off(src, t, h) + (uint64_t)d * s;
			uint64_t eb = elem_off(dst, t, h) + (uint64_t)d * s;
			for (uint64_t byte = 0; byte < s; byte++)
				to[eb + byte] = from[ea + byte];
		}
	}
	return 0;
}
