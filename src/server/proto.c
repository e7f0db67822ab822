/*
 * proto.c — encoding and decoding of the kvtierd protocol (proto.h has the
 * tables). The decoders read through a bounds-checked cursor and check
 * every count against the bytes present before anything is used, so the
 * daemon can hand them whatever a client sent.
 */
#include "server/proto.h"
#include "core/core.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

static const char *op_names[] = {
	[KVTD_MSG_HELLO] = "HELLO", [KVTD_MSG_REGISTER] = "REGISTER",
	[KVTD_MSG_UNREGISTER] = "UNREGISTER", [KVTD_MSG_HASH] = "HASH",
	[KVTD_MSG_LOOKUP] = "LOOKUP", [KVTD_MSG_LOAD] = "LOAD",
	[KVTD_MSG_STORE] = "STORE", [KVTD_MSG_CANCEL] = "CANCEL",
	[KVTD_MSG_RELEASE] = "RELEASE", [KVTD_MSG_STATS] = "STATS",
	[KVTD_MSG_QUIESCE] = "QUIESCE", [KVTD_MSG_LOAD_EACH] = "LOAD_EACH",
	[KVTD_MSG_STORE_EACH] = "STORE_EACH", [KVTD_MSG_EVENT] = "EVENT",
	[KVTD_MSG_RATES] = "RATES",
	[KVTD_MSG_REGISTER_ROWS] = "REGISTER_ROWS",
	[KVTD_MSG_WAITS] = "WAITS",
	[KVTD_MSG_FPRINT] = "FPRINT",
};

const char *kvtd_msg_name(uint16_t op)
{
	op &= (uint16_t)~KVTD_REPLY;
	return op >= 1 && op <= KVTD_MSG_MAX ? op_names[op] : "?";
}

int kvtd_msg_fds(uint16_t op)
{
	return op == KVTD_MSG_REGISTER || op == KVTD_MSG_REGISTER_ROWS ?
	       KVTD_MAX_SEGS :
	       op == KVTD_MSG_EVENT || op == KVTD_MSG_WAITS ? 1 : 0;
}

int kvtd_req_fds(const kvtd_req *q)
{
	switch (q->h.op) {
	case KVTD_MSG_REGISTER:
	case KVTD_MSG_REGISTER_ROWS:
		return (int)q->u.reg.nfds;
	case KVTD_MSG_EVENT:
		return q->u.event.kind == KVTD_EV_EMU_FD;
	case KVTD_MSG_WAITS:
		return 1;
	default:
		return 0;
	}
}

int kvtd_hdr_decode(const uint8_t *buf, kvtd_hdr *h, int reply)
{
	uint16_t op;

	h->magic = kvtd_u32_at(buf, 0);
	h->version = (uint16_t)(buf[4] | buf[5] << 8);
	h->op = (uint16_t)(buf[6] | buf[7] << 8);
	h->len = kvtd_u32_at(buf, 2);
	h->seq = kvtd_u32_at(buf, 3);
	if (h->magic != KVTD_MAGIC)
		return kvti_fail(KVT_EPROTO, "protocol: bad magic %#x",
				 h->magic);
	if (h->version != KVTD_VERSION)
		return kvti_fail(KVT_EPROTO, "protocol: version %u (this side "
				 "speaks %u)", h->version, KVTD_VERSION);
	if (!!(h->op & KVTD_REPLY) != !!reply)
		return kvti_fail(KVT_EPROTO, "protocol: a %s where a %s was "
				 "expected", reply ? "request" : "reply",
				 reply ? "reply" : "request");
	op = h->op & (uint16_t)~KVTD_REPLY;
	if (reply && op == 0)
		; /* the answer to a header the daemon could not read */
	else if (op < 1 || op > KVTD_MSG_MAX)
		return kvti_fail(KVT_EPROTO, "protocol: unknown op %u", op);
	if (h->len > KVTD_MAX_PAYLOAD)
		return kvti_fail(KVT_EPROTO, "protocol: %s payload of %u bytes "
				 "(limit %u)", kvtd_msg_name(op), h->len,
				 KVTD_MAX_PAYLOAD);
	return 0;
}

/* ---- reading ---------------------------------------------------------------- */

const uint8_t *kvtd_get_bytes(kvtd_rd *r, size_t n)
{
	const uint8_t *p;

	if (r->err || n > r->len - r->off) {
		r->err = KVT_EPROTO;
		return NULL;
	}
	p = r->p + r->off;
	r->off += n;
	return p;
}

uint32_t kvtd_get_u32(kvtd_rd *r)
{
	const uint8_t *p = kvtd_get_bytes(r, 4);
	return p ? kvtd_u32_at(p, 0) : 0;
}

uint64_t kvtd_get_u64(kvtd_rd *r)
{
	const uint8_t *p = kvtd_get_bytes(r, 8);
	return p ? kvtd_u64_at(p, 0) : 0;
}

double kvtd_get_f64(kvtd_rd *r)
{
	uint64_t v = kvtd_get_u64(r);
	double d;

	memcpy(&d, &v, sizeof(d));
	return d;
}

/* @n items of @size bytes, checked against what is left (no overflow:
 * n < 2^32, size <= 16). */
static const uint8_t *get_array(kvtd_rd *r, uint64_t n, size_t size)
{
	if (r->err || n * size > r->len - r->off) {
		r->err = KVT_EPROTO;
		return NULL;
	}
	return kvtd_get_bytes(r, (size_t)(n * size));
}

int kvtd_req_decode(const uint8_t *buf, size_t len, kvtd_req *q)
{
	kvtd_rd r;
	uint16_t op, nslen;
	const uint8_t *ns;
	int err;

	memset(q, 0, sizeof(*q));
	if (len < KVTD_HDR)
		return kvti_fail(KVT_EPROTO, "protocol: %zu bytes, less than "
				 "a header", len);
	if ((err = kvtd_hdr_decode(buf, &q->h, 0)))
		return err;
	if (q->h.len != len - KVTD_HDR)
		return kvti_fail(KVT_EPROTO, "protocol: header says %u payload "
				 "bytes, %zu came", q->h.len, len - KVTD_HDR);
	r = (kvtd_rd){ .p = buf + KVTD_HDR, .len = q->h.len };
	op = q->h.op;
	switch (op) {
	case KVTD_MSG_HELLO:
		q->u.hello.tenant = kvtd_get_u32(&r);
		q->u.hello.tp_rank = kvtd_get_u32(&r);
		q->u.hello.tp_size = kvtd_get_u32(&r);
		q->u.hello.page_tokens = kvtd_get_u32(&r);
		q->u.hello.layers = kvtd_get_u32(&r);
		q->u.hello.kv_heads_total = kvtd_get_u32(&r);
		q->u.hello.kv_heads = kvtd_get_u32(&r);
		q->u.hello.head_dim = kvtd_get_u32(&r);
		q->u.hello.dtype_bytes = kvtd_get_u32(&r);
		q->u.hello.mla = kvtd_get_u32(&r);
		{
			const uint8_t *p = kvtd_get_bytes(&r, 2);
			nslen = p ? (uint16_t)(p[0] | p[1] << 8) : 0;
		}
		if (!r.err && nslen > KVTD_NS_MAX)
			return kvti_fail(KVT_EPROTO, "protocol: HELLO namespace "
					 "of %u bytes (limit %u)", nslen,
					 KVTD_NS_MAX);
		ns = get_array(&r, nslen, 1);
		if (ns) {
			memcpy(q->u.hello.ns, ns, nslen);
			q->u.hello.ns[nslen] = 0;
			if (strlen(q->u.hello.ns) != nslen)
				return kvti_fail(KVT_EPROTO, "protocol: HELLO "
						 "namespace holds a NUL byte");
		}
		break;
	case KVTD_MSG_REGISTER:
	case KVTD_MSG_REGISTER_ROWS:
		q->u.reg.device = (int32_t)kvtd_get_u32(&r);
		q->u.reg.nlayers = kvtd_get_u32(&r);
		q->u.reg.nblocks = kvtd_get_u64(&r);
		q->u.reg.block_stride = kvtd_get_u64(&r);
		q->u.reg.kv_stride = kvtd_get_u64(&r);
		q->u.reg.token_stride = kvtd_get_u64(&r);
		q->u.reg.head_stride = op == KVTD_MSG_REGISTER_ROWS ?
				       kvtd_get_u64(&r) : 0;
		q->u.reg.uuid = kvtd_get_bytes(&r, KVTD_UUID_BYTES);
		q->u.reg.nseg = kvtd_get_u32(&r);
		if (!r.err && (!q->u.reg.nlayers ||
			       q->u.reg.nlayers > KVTD_MAX_LAYERS))
			return kvti_fail(KVT_EPROTO, "protocol: REGISTER of %u "
					 "layers", q->u.reg.nlayers);
		if (!r.err && (!q->u.reg.nseg || q->u.reg.nseg > KVTD_MAX_SEGS))
			return kvti_fail(KVT_EPROTO, "protocol: REGISTER of %u "
					 "segments (1..%d)", q->u.reg.nseg,
					 KVTD_MAX_SEGS);
		q->u.reg.segs = get_array(&r, q->u.reg.nseg, KVTD_SEG_BYTES);
		q->u.reg.layers = get_array(&r, q->u.reg.nlayers, 12);
		for (uint32_t i = 0; !r.err && i < q->u.reg.nseg; i++) {
			uint32_t k = kvtd_seg_kind(q, i);

			if (k < KVTD_SEG_MEMFD || k > KVTD_SEG_EMU_FD)
				return kvti_fail(KVT_EPROTO, "protocol: REGISTER "
						 "segment %u of kind %u", i, k);
			q->u.reg.nfds += (uint32_t)kvtd_seg_has_fd(k);
		}
		for (uint32_t l = 0; !r.err && l < q->u.reg.nlayers; l++)
			if (kvtd_layer_seg(q, l) >= q->u.reg.nseg)
				return kvti_fail(KVT_EPROTO, "protocol: REGISTER "
						 "layer %u in segment %u of %u", l,
						 kvtd_layer_seg(q, l),
						 q->u.reg.nseg);
		break;
	case KVTD_MSG_EVENT:
		q->u.event.device = (int32_t)kvtd_get_u32(&r);
		q->u.event.kind = kvtd_get_u32(&r);
		q->u.event.uuid = kvtd_get_bytes(&r, KVTD_UUID_BYTES);
		q->u.event.handle = kvtd_get_bytes(&r, KVTD_HANDLE_BYTES);
		if (!r.err && q->u.event.kind != KVTD_EV_CUDA_IPC &&
		    q->u.event.kind != KVTD_EV_EMU_FD)
			return kvti_fail(KVT_EPROTO, "protocol: EVENT of kind %u",
					 q->u.event.kind);
		break;
	case KVTD_MSG_UNREGISTER:
	case KVTD_MSG_CANCEL:
	case KVTD_MSG_RELEASE:
		q->u.id = kvtd_get_u32(&r);
		break;
	case KVTD_MSG_WAITS:
		q->u.id = kvtd_get_u32(&r);
		if (!r.err && (!q->u.id || q->u.id > (1u << 20)))
			return kvti_fail(KVT_EPROTO, "protocol: WAITS of %u "
					 "words (1..%u)", q->u.id, 1u << 20);
		break;
	case KVTD_MSG_HASH:
		q->u.hash.ntokens = kvtd_get_u32(&r);
		q->u.hash.tokens = get_array(&r, q->u.hash.ntokens, 4);
		break;
	case KVTD_MSG_LOOKUP:
		q->u.lookup.flags = kvtd_get_u32(&r);
		q->u.lookup.nkeys = kvtd_get_u32(&r);
		q->u.lookup.keys = get_array(&r, q->u.lookup.nkeys, 16);
		break;
	case KVTD_MSG_LOAD:
	case KVTD_MSG_STORE:
	case KVTD_MSG_LOAD_EACH:
	case KVTD_MSG_STORE_EACH:
		q->u.job.mem_id = kvtd_get_u32(&r);
		q->u.job.slot = kvtd_get_u32(&r);
		q->u.job.nkeys = kvtd_get_u32(&r);
		q->u.job.first = kvtd_get_u32(&r);
		q->u.job.event_id = kvtd_get_u32(&r);
		if (!r.err && q->u.job.first > q->u.job.nkeys)
			return kvti_fail(KVT_EPROTO, "protocol: %s first %u of "
					 "%u keys", kvtd_msg_name(op),
					 q->u.job.first, q->u.job.nkeys);
		q->u.job.keys = get_array(&r, q->u.job.nkeys, 16);
		q->u.job.blocks = get_array(&r, q->u.job.nkeys -
					    q->u.job.first, 4);
		break;
	case KVTD_MSG_FPRINT:
		q->u.fprint.scheme = kvtd_get_u32(&r);
		q->u.fprint.fp = kvtd_get_bytes(&r, KVTD_FP_BYTES);
		if (!r.err && (!q->u.fprint.scheme ||
			       q->u.fprint.scheme > KVTD_FP_SCHEMES))
			return kvti_fail(KVT_EPROTO, "protocol: FPRINT of "
					 "scheme %u (1..%d)",
					 q->u.fprint.scheme, KVTD_FP_SCHEMES);
		break;
	case KVTD_MSG_STATS:
	case KVTD_MSG_QUIESCE:
	case KVTD_MSG_RATES:
		break;
	}
	if (r.err)
		return kvti_fail(KVT_EPROTO, "protocol: %s truncated (%u "
				 "payload bytes)", kvtd_msg_name(op), q->h.len);
	if (r.off != r.len)
		return kvti_fail(KVT_EPROTO, "protocol: %s has %zu bytes past "
				 "its end", kvtd_msg_name(op), r.len - r.off);
	return 0;
}

int kvtd_reply_decode(const uint8_t *payload, size_t len, int32_t *status,
		      char *detail, size_t dmax, const uint8_t **body,
		      size_t *blen)
{
	kvtd_rd r = { .p = payload, .len = len };
	const uint8_t *d, *dl;
	uint16_t n;

	*status = (int32_t)kvtd_get_u32(&r);
	dl = kvtd_get_bytes(&r, 2);
	n = dl ? (uint16_t)(dl[0] | dl[1] << 8) : 0;
	d = get_array(&r, n, 1);
	if (r.err || n > 255)
		return kvti_fail(KVT_EPROTO, "protocol: malformed reply");
	if (detail && dmax) {
		size_t k = KVT_MIN((size_t)n, dmax - 1);
		memcpy(detail, d, k);
		detail[k] = 0;
	}
	*body = payload + r.off;
	*blen = len - r.off;
	return 0;
}

/* ---- writing ---------------------------------------------------------------- */

void kvtd_buf_free(kvtd_buf *b)
{
	free(b->p);
	memset(b, 0, sizeof(*b));
}

void kvtd_put_bytes(kvtd_buf *b, const void *p, size_t n)
{
	if (b->err)
		return;
	if (n > b->cap - b->len) {
		size_t cap = b->cap ? b->cap : 256;
		uint8_t *q;

		while (cap - b->len < n)
			cap *= 2;
		if (!(q = realloc(b->p, cap))) {
			b->err = -ENOMEM;
			return;
		}
		b->p = q;
		b->cap = cap;
	}
	if (n)
		memcpy(b->p + b->len, p, n);
	b->len += n;
}

void kvtd_put_u16(kvtd_buf *b, uint16_t v)
{
	uint8_t x[2] = { (uint8_t)v, (uint8_t)(v >> 8) };
	kvtd_put_bytes(b, x, 2);
}

void kvtd_put_u32(kvtd_buf *b, uint32_t v)
{
	uint8_t x[4] = { (uint8_t)v, (uint8_t)(v >> 8), (uint8_t)(v >> 16),
			 (uint8_t)(v >> 24) };
	kvtd_put_bytes(b, x, 4);
}

void kvtd_put_u64(kvtd_buf *b, uint64_t v)
{
	kvtd_put_u32(b, (uint32_t)v);
	kvtd_put_u32(b, (uint32_t)(v >> 32));
}

void kvtd_put_f64(kvtd_buf *b, double v)
{
	uint64_t u;

	memcpy(&u, &v, sizeof(u));
	kvtd_put_u64(b, u);
}

void kvtd_put_keys(kvtd_buf *b, const kvt_page_key *k, size_t n)
{
	for (size_t i = 0; i < n; i++) {
		kvtd_put_u64(b, k[i].lo);
		kvtd_put_u64(b, k[i].hi);
	}
}

void kvtd_begin(kvtd_buf *b, uint16_t op, uint32_t seq)
{
	b->len = 0;
	b->err = 0;
	kvtd_put_u32(b, KVTD_MAGIC);
	kvtd_put_u16(b, KVTD_VERSION);
	kvtd_put_u16(b, op);
	kvtd_put_u32(b, 0);
	kvtd_put_u32(b, seq);
}

int kvtd_end(kvtd_buf *b)
{
	size_t n;

	if (b->err)
		return b->err;
	n = b->len - KVTD_HDR;
	if (n > KVTD_MAX_PAYLOAD)
		return kvti_fail(KVT_EPROTO, "protocol: a %zu-byte message "
				 "(limit %u): split the request", n,
				 KVTD_MAX_PAYLOAD);
	b->p[8] = (uint8_t)n;
	b->p[9] = (uint8_t)(n >> 8);
	b->p[10] = (uint8_t)(n >> 16);
	b->p[11] = (uint8_t)(n >> 24);
	return 0;
}
