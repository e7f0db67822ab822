/* fuzz_proto — the daemon's message decoders (src/server/proto.c), what
 * kvtierd runs on every byte a client sends. A request the decoder accepts
 * encodes back to exactly the bytes it came from (so every field was read,
 * and read from where the tables say); a reply body decodes or is refused. */
#include "fuzz.h"
#include "server/proto.h"

static void encode(kvtd_buf *b, const kvtd_req *q)
{
	kvtd_begin(b, q->h.op, q->h.seq);
	switch (q->h.op) {
	case KVTD_MSG_HELLO:
		kvtd_put_u32(b, q->u.hello.tenant);
		kvtd_put_u32(b, q->u.hello.tp_rank);
		kvtd_put_u32(b, q->u.hello.tp_size);
		kvtd_put_u32(b, q->u.hello.page_tokens);
		kvtd_put_u32(b, q->u.hello.layers);
		kvtd_put_u32(b, q->u.hello.kv_heads_total);
		kvtd_put_u32(b, q->u.hello.kv_heads);
		kvtd_put_u32(b, q->u.hello.head_dim);
		kvtd_put_u32(b, q->u.hello.dtype_bytes);
		kvtd_put_u32(b, q->u.hello.mla);
		kvtd_put_u16(b, (uint16_t)strlen(q->u.hello.ns));
		kvtd_put_bytes(b, q->u.hello.ns, strlen(q->u.hello.ns));
		break;
	case KVTD_MSG_REGISTER:
	case KVTD_MSG_REGISTER_ROWS:
		kvtd_put_u32(b, (uint32_t)q->u.reg.device);
		kvtd_put_u32(b, q->u.reg.nlayers);
		kvtd_put_u64(b, q->u.reg.nblocks);
		kvtd_put_u64(b, q->u.reg.block_stride);
		kvtd_put_u64(b, q->u.reg.kv_stride);
		kvtd_put_u64(b, q->u.reg.token_stride);
		if (q->h.op == KVTD_MSG_REGISTER_ROWS)
			kvtd_put_u64(b, q->u.reg.head_stride);
		kvtd_put_bytes(b, q->u.reg.uuid, KVTD_UUID_BYTES);
		kvtd_put_u32(b, q->u.reg.nseg);
		for (uint32_t i = 0; i < q->u.reg.nseg; i++) {
			kvtd_put_u32(b, kvtd_seg_kind(q, i));
			kvtd_put_u64(b, kvtd_seg_size(q, i));
			kvtd_put_bytes(b, kvtd_seg_handle(q, i),
				       KVTD_HANDLE_BYTES);
		}
		for (uint32_t l = 0; l < q->u.reg.nlayers; l++) {
			kvtd_put_u32(b, kvtd_layer_seg(q, l));
			kvtd_put_u64(b, kvtd_layer_off(q, l));
		}
		break;
	case KVTD_MSG_EVENT:
		kvtd_put_u32(b, (uint32_t)q->u.event.device);
		kvtd_put_u32(b, q->u.event.kind);
		kvtd_put_bytes(b, q->u.event.uuid, KVTD_UUID_BYTES);
		kvtd_put_bytes(b, q->u.event.handle, KVTD_HANDLE_BYTES);
		break;
	case KVTD_MSG_UNREGISTER:
	case KVTD_MSG_CANCEL:
	case KVTD_MSG_RELEASE:
	case KVTD_MSG_WAITS:
		kvtd_put_u32(b, q->u.id);
		break;
	case KVTD_MSG_HASH:
		kvtd_put_u32(b, q->u.hash.ntokens);
		for (uint32_t i = 0; i < q->u.hash.ntokens; i++)
			kvtd_put_u32(b, kvtd_u32_at(q->u.hash.tokens, i));
		break;
	case KVTD_MSG_LOOKUP:
		kvtd_put_u32(b, q->u.lookup.flags);
		kvtd_put_u32(b, q->u.lookup.nkeys);
		for (uint32_t i = 0; i < q->u.lookup.nkeys; i++) {
			kvt_page_key k = kvtd_key_at(q->u.lookup.keys, i);
			kvtd_put_keys(b, &k, 1);
		}
		break;
	case KVTD_MSG_LOAD:
	case KVTD_MSG_STORE:
	case KVTD_MSG_LOAD_EACH:
	case KVTD_MSG_STORE_EACH:
		kvtd_put_u32(b, q->u.job.mem_id);
		kvtd_put_u32(b, q->u.job.slot);
		kvtd_put_u32(b, q->u.job.nkeys);
		kvtd_put_u32(b, q->u.job.first);
		kvtd_put_u32(b, q->u.job.event_id);
		for (uint32_t i = 0; i < q->u.job.nkeys; i++) {
			kvt_page_key k = kvtd_key_at(q->u.job.keys, i);
			kvtd_put_keys(b, &k, 1);
		}
		for (uint32_t i = 0; i < q->u.job.nkeys - q->u.job.first; i++)
			kvtd_put_u32(b, kvtd_u32_at(q->u.job.blocks, i));
		break;
	case KVTD_MSG_FPRINT:
		kvtd_put_u32(b, q->u.fprint.scheme);
		kvtd_put_bytes(b, q->u.fprint.fp, KVTD_FP_BYTES);
		break;
	}
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	kvtd_buf b = { 0 };
	kvtd_req q;

	if (size > (1u << 20))
		return 0;
	if (kvtd_req_decode(data, size, &q) == 0) {
		FUZZ_ASSERT(q.h.len == size - KVTD_HDR);
		encode(&b, &q);
		FUZZ_ASSERT(kvtd_end(&b) == 0);
		FUZZ_ASSERT(b.len == size);
		FUZZ_ASSERT(!memcmp(b.p, data, size));
	}
	if (size >= KVTD_HDR) {
		kvtd_hdr h;
		const uint8_t *body;
		size_t blen;
		int32_t st;
		char det[64];

		if (kvtd_hdr_decode(data, &h, 1) == 0 &&
		    kvtd_reply_decode(data + KVTD_HDR, size - KVTD_HDR, &st,
				      det, sizeof(det), &body, &blen) == 0) {
			FUZZ_ASSERT(body >= data + KVTD_HDR);
			FUZZ_ASSERT(body + blen == data + size);
			FUZZ_ASSERT(strlen(det) < sizeof(det));
		}
	}
	kvtd_buf_free(&b);
	return 0;
}
