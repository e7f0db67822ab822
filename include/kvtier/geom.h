/*
 * kvtier/geom.h — model geometry and KV layouts. Included by <kvtier.h>.
 *
 * GEOMETRY
 *
 * A model's KV shape on one tensor-parallel rank: L layers, H KV heads on
 * this rank, head dim D, s bytes per element, P tokens per page. Standard
 * attention stores a K and a V vector per token, head and layer; MLA
 * (DeepSeek-V2/V3) stores one latent of kv_lora_rank + qk_rope_head_dim
 * elements per token and layer, with no separate V, and every rank holds the
 * whole latent. So:
 *
 *     kv        = mla ? 1 : 2                 K and V, or the latent alone
 *     chunk     = P * H * D * s               one (page, layer, k|v) piece
 *     page      = L * kv * chunk              one page, all layers
 *     per token = L * kv * H * D * s          (= page / P)
 *
 * KV heads are split evenly over TP ranks; when a model has fewer KV heads
 * than ranks each rank holds one head (replicated, as vLLM does).
 *
 * LAYOUTS
 *
 * The same page is stored in one of three arrangements. Every chunk — the
 * P*H*D*s bytes of one (page, layer, k|v) — is contiguous in all of them;
 * what differs is where chunks sit. A layout spans one or more *buffers*
 * (separate allocations, as an engine's KV tensors are):
 *
 *   PAGE_FIRST  (host tiers, ssd, remote) one buffer; a page is one block
 *               buf[slot][layer][kv][P][H][D]
 *   VLLM        (GPU, vLLM's per-layer tensor [2][blocks][P][H][D])
 *               L buffers; buffer l = [kv][slot][P][H][D]
 *   SGLANG      (GPU, SGLang's k_buffer / v_buffer per layer [tokens][H][D])
 *               L*kv buffers; buffer l*kv+k = [slot*P + t][H][D]
 *
 *   page-first, one page:      layer-first (vLLM), one layer buffer:
 *   +------+------+------+--   +----------------------+----------------------+
 *   |L0 K  |L0 V  |L1 K  |..   | K: slot0 slot1 ...   | V: slot0 slot1 ...   |
 *   +------+------+------+--   +----------------------+----------------------+
 *    one chunk each             a page's chunk for layer l lies at slot*chunk
 *
 * So a page moving between a host tier and the GPU becomes L*kv separate
 * chunks of P*H*D*s bytes on the GPU side. kvt_layout_convert_ref() moves
 * pages between any two layouts byte by byte — slow, obviously right, and
 * the oracle every faster path in the transfer engine is tested against.
 *
 * ROWS. An engine's own memory (STRIDED, kvt_layout_init_rows()) need not
 * keep a chunk in one piece: its (token, head) rows of D*s bytes may sit
 * @token_stride and @head_stride apart — heads before tokens (vLLM's HND
 * cache layout, its CPU attention backend's [2][blocks][H][P][D]) or
 * layers interleaved between a page's tokens (SGLang's page_first host
 * pool [2][tokens][L][H][D], page_head [2][pages][H][P][L][D]). Such a
 * chunk is P*H rows; every copy and checksum walks them in [P][H][D]
 * order, so a page's bytes in a host tier are the same whatever layout
 * the engine that stored it had. kvt_layout_rows() says which kind a
 * layout is; kvt_layout_row_off() places row r = t*H + h.
 */
#ifndef KVTIER_GEOM_H
#define KVTIER_GEOM_H

#include <kvtier.h>

#ifdef __cplusplus
extern "C" {
#endif

#define KVT_NAME_MAX 64

/**
 * struct kvt_geom - a model's KV geometry on one TP rank, plus the few
 * model figures the cost model needs. A plain value: copy it freely.
 * Fill it with kvt_geom_preset() or kvt_geom_from_config(); if you fill it
 * by hand, call kvt_geom_finish() to split heads and check it.
 */
typedef struct kvt_geom {
	char name[KVT_NAME_MAX];   /* preset or config name */
	uint32_t layers;           /* L */
	uint32_t kv_heads_total;   /* KV heads of the whole model (MLA: 1) */
	uint32_t kv_heads;         /* H: KV heads on this rank */
	uint32_t head_dim;         /* D (MLA: kv_lora_rank + qk_rope_head_dim) */
	uint32_t dtype_bytes;      /* s: 2 for bf16/fp16, 1 for fp8, 4 for fp32 */
	uint32_t page_tokens;      /* P: tokens per page */
	uint32_t tp_size;          /* tensor-parallel degree (>= 1) */
	uint32_t tp_rank;          /* this rank, < tp_size */
	uint32_t mla;              /* 1: one latent per token and layer */
	/* model figures for the cost model (not part of the KV shape) */
	uint32_t q_heads;          /* attention (query) heads, whole model */
	uint32_t hidden;           /* hidden size */
	uint64_t params;           /* parameters, whole model */
	uint64_t active_params;    /* parameters used per token (MoE: < params) */
} kvt_geom;

/**
 * kvt_geom_preset() - geometry of a known model.
 * @g:           filled on success, untouched on failure.
 * @name:        a preset ("llama-3.1-8b", ...); case is ignored, and a
 *               Hugging Face org prefix ("meta-llama/") is dropped.
 * @page_tokens: P, >= 1.
 * @tp_size:     tensor-parallel degree, >= 1; @tp_rank < @tp_size.
 *
 * Returns 0, KVT_EPRESET for an unknown name (kvt_errdetail() lists the
 * known ones) or KVT_EGEOM for impossible P or TP values (e.g. 8 KV heads
 * cannot be split evenly over 3 ranks).
 */
KVT_API int kvt_geom_preset(kvt_geom *g, const char *name, uint32_t page_tokens,
		    uint32_t tp_size, uint32_t tp_rank);

/** The i-th preset name, or NULL past the end. */
KVT_API const char *kvt_geom_preset_name(size_t i);

/**
 * kvt_geom_from_config() - geometry from a Hugging Face config.json file.
 * Reads num_hidden_layers, num_key_value_heads (default: num_attention_heads),
 * head_dim (default: hidden_size / num_attention_heads), torch_dtype or dtype;
 * MLA models (kv_lora_rank present) use kv_lora_rank + qk_rope_head_dim.
 * Multimodal configs are read from their "text_config". The parameter count
 * is estimated from the sizes in the file (documented in docs/FORMATS.md).
 *
 * Returns 0, -errno if the file cannot be read, KVT_ECONFIG naming the key
 * that is missing or wrong, KVT_EGEOM as kvt_geom_preset().
 */
KVT_API int kvt_geom_from_config(kvt_geom *g, const char *path, uint32_t page_tokens,
			 uint32_t tp_size, uint32_t tp_rank);
/** The same from config.json text held in memory; @name labels it. */
KVT_API int kvt_geom_from_json(kvt_geom *g, const char *json, const char *name,
		       uint32_t page_tokens, uint32_t tp_size,
		       uint32_t tp_rank);

/** Bytes of one element of type @name ("bfloat16", "bf16", "float16",
 *  "fp16", "float32", "fp8", "float8_e4m3fn", "float8_e5m2", ...: the
 *  config.json torch_dtype names and short ones); 0 or KVT_ECONFIG. An
 *  engine whose KV cache is fp8 while its model is bf16 (vLLM's
 *  --kv-cache-dtype fp8) sets the geometry's dtype_bytes from this. */
KVT_API int kvt_geom_dtype_bytes(const char *name, uint32_t *out);

/** Split kv_heads_total over the TP ranks into kv_heads and check every
 *  field; 0 or KVT_EGEOM. Used by the constructors above. */
KVT_API int kvt_geom_finish(kvt_geom *g);

/** K and V (2), or the MLA latent alone (1). */
static inline uint32_t kvt_geom_kv(const kvt_geom *g)
{
	return g->mla ? 1u : 2u;
}
/** Bytes of one (page, layer, k|v) chunk: P*H*D*s. */
static inline uint64_t kvt_geom_chunk_bytes(const kvt_geom *g)
{
	return (uint64_t)g->page_tokens * g->kv_heads * g->head_dim *
	       g->dtype_bytes;
}
/** Bytes of one page on this rank, all layers. */
static inline uint64_t kvt_geom_page_bytes(const kvt_geom *g)
{
	return (uint64_t)g->layers * kvt_geom_kv(g) * kvt_geom_chunk_bytes(g);
}
/** KV bytes of one token on this rank. */
static inline uint64_t kvt_geom_token_bytes(const kvt_geom *g)
{
	return (uint64_t)g->layers * kvt_geom_kv(g) * g->kv_heads *
	       g->head_dim * g->dtype_bytes;
}

/* ------------------------------------------------------------------------
 * Layouts
 * ------------------------------------------------------------------------ */
typedef enum kvt_layout_kind {
	KVT_LAYOUT_PAGE_FIRST = 0, /* host tiers: [slot][layer][kv][P][H][D] */
	KVT_LAYOUT_VLLM = 1,       /* per layer: [kv][slot][P][H][D] */
	KVT_LAYOUT_SGLANG = 2,     /* per layer and kv: [slot*P+t][H][D] */
	KVT_LAYOUT_STRIDED = 3,    /* an engine's own memory: per layer a
				      base, chunk at slot*block_stride +
				      kv*kv_stride (kvt_layout_init_strided) */
} kvt_layout_kind;

/**
 * struct kvt_layout - where each chunk of each page slot lives.
 * A value: build with kvt_layout_init(), then read its fields.
 */
typedef struct kvt_layout {
	kvt_layout_kind kind;
	uint32_t head_stride; /* rows only: bytes between a chunk's heads */
	kvt_geom geom;
	uint64_t slots;       /* page slots the layout spans */
	uint32_t kv;          /* 2, or 1 for MLA */
	uint32_t token_stride; /* rows only: bytes between a chunk's tokens */
	uint64_t chunk_bytes; /* P*H*D*s */
	uint64_t page_bytes;  /* L*kv*chunk */
	uint32_t nbufs;       /* 1 (page-first), L (vLLM, strided), L*kv
				 (SGLang) */
	uint32_t rows;        /* 1: a chunk is chunk_bytes in one piece; P*H:
				 rows of D*s bytes (token_stride, head_stride) */
	uint64_t buf_bytes;   /* size of each buffer (strided: the span from
				 the base to the end of its last chunk) */
	uint64_t block_stride, kv_stride; /* strided only */
} kvt_layout;
/* head_stride, token_stride and rows sit in what were alignment holes:
 * the struct keeps its size and every older field its offset (ABI 1). */

/** Where one chunk lives: buffer index and byte offset inside it. */
typedef struct kvt_chunk_loc {
	uint32_t buf;
	uint64_t off;
} kvt_chunk_loc;

/**
 * kvt_layout_init() - describe @slots page slots of geometry @g in @kind.
 * Returns 0, -EINVAL for a bad kind or zero slots, KVT_EGEOM for a geometry
 * kvt_geom_finish() rejects, -EOVERFLOW if the sizes overflow 64 bits.
 */
KVT_API int kvt_layout_init(kvt_layout *l, kvt_layout_kind kind, const kvt_geom *g,
		    uint64_t slots);

/**
 * kvt_layout_init_strided() - @slots blocks of an engine's per-layer KV
 * memory: chunk (slot, layer, kv) at buffer @layer, offset slot *
 * @block_stride + kv * @kv_stride; a chunk's tokens @token_stride apart.
 * A token's heads must be contiguous (head stride D*s, @token_stride >=
 * H*D*s; kvt_layout_init_rows() takes any) and no two chunks may overlap:
 * K/V outer (kv_stride >= slots * block_stride, block stride >= chunk) or
 * block outer (block_stride >= kv * kv_stride, kv_stride >= chunk); MLA
 * ignores @kv_stride. Returns 0, KVT_EGEOM naming the stride that does not
 * fit, the errors of kvt_layout_init().
 */
KVT_API int kvt_layout_init_strided(kvt_layout *l, const kvt_geom *g,
				    uint64_t slots, uint64_t block_stride,
				    uint64_t kv_stride, uint64_t token_stride);

/**
 * kvt_layout_init_rows() - kvt_layout_init_strided() for memory whose
 * chunks need not be in one piece: row (t, h) of chunk (slot, layer, kv) —
 * D*s contiguous bytes — at slot*@block_stride + kv*@kv_stride +
 * t*@token_stride + h*@head_stride from buffer @layer. Rows may not
 * overlap: token-major (@head_stride >= D*s, @token_stride >= H *
 * @head_stride) or head-major (@token_stride >= D*s, @head_stride >= P *
 * @token_stride); neither stride above 4 GiB (H == 1 ignores
 * @head_stride). Chunks are placed as in kvt_layout_init_strided(), each
 * taking the span from its first byte to the end of its last row. Packed
 * strides (H*D*s, D*s) give exactly kvt_layout_init_strided()'s layout,
 * rows == 1; any other gives rows == P*H. Buffers of different layers may
 * interleave (SGLang's page-first pools): each buffer is checked alone.
 * Returns 0, KVT_EGEOM naming the stride that does not fit, -EOVERFLOW,
 * the errors of kvt_layout_init().
 */
KVT_API int kvt_layout_init_rows(kvt_layout *l, const kvt_geom *g,
				 uint64_t slots, uint64_t block_stride,
				 uint64_t kv_stride, uint64_t token_stride,
				 uint64_t head_stride);

/** 1 when a chunk is one piece of chunk_bytes, else P*H rows of D*s. */
static inline uint32_t kvt_layout_rows(const kvt_layout *l)
{
	return l->rows > 1 ? l->rows : 1;
}

/**
 * kvt_layout_row_off() - byte offset, from its chunk's location, of row
 * @r = t*H + h of a chunk (t < P, h < H): the D*s bytes of token t, head
 * h. For a one-piece chunk that is simply r*D*s.
 */
static inline uint64_t kvt_layout_row_off(const kvt_layout *l, uint32_t r)
{
	uint32_t H = l->geom.kv_heads;

	if (l->rows <= 1)
		return (uint64_t)r * l->geom.head_dim * l->geom.dtype_bytes;
	return (uint64_t)(r / H) * l->token_stride +
	       (uint64_t)(r % H) * l->head_stride;
}

/** Short name: "page-first", "vllm", "sglang", "strided". */
KVT_API const char *kvt_layout_name(kvt_layout_kind kind);
/** Parse such a name; -EINVAL if unknown. */
KVT_API int kvt_layout_parse(const char *s, kvt_layout_kind *out);

/**
 * kvt_layout_chunk() - location of chunk (@slot, @layer, @kv).
 * Preconditions (checked by assert only; this sits on hot paths):
 * slot < l->slots, layer < L, kv < l->kv.
 */
static inline kvt_chunk_loc kvt_layout_chunk(const kvt_layout *l,
					     uint64_t slot, uint32_t layer,
					     uint32_t kv)
{
	kvt_chunk_loc c;
	switch (l->kind) {
	case KVT_LAYOUT_VLLM:
		c.buf = layer;
		c.off = ((uint64_t)kv * l->slots + slot) * l->chunk_bytes;
		break;
	case KVT_LAYOUT_SGLANG:
		c.buf = layer * l->kv + kv;
		c.off = slot * l->chunk_bytes;
		break;
	case KVT_LAYOUT_STRIDED:
		c.buf = layer;
		c.off = slot * l->block_stride + kv * l->kv_stride;
		break;
	default: /* KVT_LAYOUT_PAGE_FIRST */
		c.buf = 0;
		c.off = slot * l->page_bytes +
			((uint64_t)layer * l->kv + kv) * l->chunk_bytes;
		break;
	}
	return c;
}

/**
 * kvt_layout_bufs_carve() - split one region of kvt_layout_region_bytes()
 * bytes at @base into the layout's buffers, back to back: bufs[i] =
 * base + i * buf_bytes. @bufs must hold l->nbufs pointers.
 */
KVT_API void kvt_layout_bufs_carve(const kvt_layout *l, void *base, void **bufs);
/** Bytes of one region holding all buffers back to back. */
static inline uint64_t kvt_layout_region_bytes(const kvt_layout *l)
{
	return (uint64_t)l->nbufs * l->buf_bytes;
}

/**
 * kvt_layout_convert_ref() - the reference conversion (the oracle).
 * Copies @npages pages: page i goes from slot @src_slots[i] of the @src
 * layout (buffers @src_bufs) to slot @dst_slots[i] of @dst (@dst_bufs),
 * byte by byte, every (layer, kv, token, head, element) addressed on its
 * own. Both layouts must share the KV shape (L, H, D, s, P, mla):
 * KVT_EGEOM otherwise. -ERANGE if a slot is out of range. Source and
 * destination must not overlap. Deliberately simple and slow.
 */
KVT_API int kvt_layout_convert_ref(const kvt_layout *src, void *const *src_bufs,
			   const uint64_t *src_slots, const kvt_layout *dst,
			   void *const *dst_bufs, const uint64_t *dst_slots,
			   size_t npages);

/** 1 if two geometries have the same KV shape (L, H, D, s, P, mla). */
KVT_API int kvt_geom_same_shape(const kvt_geom *a, const kvt_geom *b);

#ifdef __cplusplus
}
#endif

#endif /* KVTIER_GEOM_H */
