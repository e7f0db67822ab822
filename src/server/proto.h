/*
 * proto.h — the kvtierd wire protocol, version 3: the one place that says
 * what travels on the daemon's Unix socket. docs/PROTOCOL.md has the same
 * tables for people writing a client in another language.
 *
 * FRAMING
 *
 *   A stream socket (AF_UNIX, SOCK_STREAM). Every message, both ways, is a
 *   16-byte header and a payload. Integers are little-endian, unaligned;
 *   f64 is an IEEE-754 double. File descriptors ride with the first byte of
 *   a message's header (SCM_RIGHTS); only the messages below that say so
 *   carry any, and any others are closed and the message refused.
 *
 *   off size  header field
 *     0    4  magic   KVTD_MAGIC
 *     4    2  version KVTD_VERSION (a daemon refuses others: KVT_EPROTO)
 *     6    2  op      KVTD_MSG_*; a reply has KVTD_REPLY set
 *     8    4  len     payload bytes, <= KVTD_MAX_PAYLOAD
 *    12    4  seq     chosen by the client, echoed by the reply
 *
 *   One request at a time per connection: the daemon answers each request
 *   with exactly one reply, in order. A request whose header it cannot
 *   accept (magic, version, op, length) gets a reply with op 0 (KVTD_REPLY
 *   alone) and status KVT_EPROTO, and the connection is closed: there is
 *   no way to find the next message. A reply's payload starts with
 *
 *     0    4  status  0 or a kvtier error (i32)
 *     4    2  dlen    bytes of detail text (kvt_errdetail()), <= 255
 *     6 dlen  detail
 *   then, only when status is 0, the op's reply body below.
 *
 * REQUESTS (payload) and REPLY BODIES
 *
 *   HELLO      u32 tenant, u32 tp_rank, u32 tp_size, u32 page_tokens,
 *              u32 layers, u32 kv_heads_total, u32 kv_heads, u32 head_dim,
 *              u32 dtype_bytes, u32 mla, u16 nslen, ns[nslen] (<= 63);
 *              every geometry field 0: a monitor (STATS only; any
 *              tenant that allows the peer)
 *     reply    u32 client_id, u32 max_jobs, u32 slot_bytes, u32 lease_ms,
 *              u64 page_bytes; fds: the job-slot memfd (max_jobs *
 *              slot_bytes, map read-only), the done eventfd
 *   REGISTER   i32 device, u32 nlayers, u64 nblocks, u64 block_stride,
 *              u64 kv_stride, u64 token_stride, u8 uuid[16] (a GPU's
 *              UUID, or zeros: device is the ordinal), u32 nseg (1..8),
 *              nseg * (u32 kind, u64 bytes, u8 handle[64]),
 *              nlayers * (u32 seg, u64 off);
 *              fds: one per segment whose kind carries one (MEMFD,
 *              VMM_FD, EMU_FD), in segment order
 *     reply    u32 mem_id
 *   REGISTER_ROWS  as REGISTER with u64 head_stride after token_stride:
 *              host memory whose chunks are kept in rows
 *              (kvt_cache_attach_rows()); a client sends it only for such
 *              memory, REGISTER otherwise
 *   UNREGISTER u32 mem_id                              reply: (none)
 *   HASH       u32 ntokens, u32 tokens[ntokens]
 *     reply    u32 nkeys, nkeys * (u64 lo, u64 hi)
 *   LOOKUP     u32 flags, u32 nkeys, nkeys * (u64 lo, u64 hi)
 *     reply    u64 pages, u32 ntiers, u64 tier_pages[ntiers], u64 inflight
 *              and, with flag KVTD_LOOKUP_RUNS, u32 nruns (<= 8),
 *              nruns * (u32 tier, u32 pages) (kvt_cache_lookup_runs())
 *   LOAD,      u32 mem_id, u32 slot, u32 nkeys, u32 first, u32 event_id
 *   STORE      (0: none), nkeys * (u64 lo, u64 hi), u32 blocks[nkeys -
 *              first]
 *     reply    (none): accepted; progress goes to job slot @slot
 *   LOAD_EACH, as LOAD / STORE, every key a one-page prefix of its own
 *   STORE_EACH (KVT_CACHE_IO_EACH); first must be 0
 *   CANCEL     u32 slot                                reply: (none)
 *   RELEASE    u32 slot (a job that is done; frees the slot)
 *     reply    i32 result, u64 pages, copied, skipped, failed, verified,
 *              bytes, u32 ntiers, u64 from[ntiers], f64 wait_s, layer0_s,
 *              total_s, u64 busy, absent (version 3), u32 nfailed,
 *              u32 failed_blocks[nfailed]
 *   STATS      (empty)                       reply: u32 len, JSON[len]
 *   QUIESCE    (empty): returns once background demotion has settled
 *              (kvt_cache_quiesce(); tests, benchmarks)    reply: (none)
 *   EVENT      i32 device, u32 kind, u8 uuid[16], u8 handle[64];
 *              fd: with EMU_FD events, the event's memfd
 *     reply    u32 event_id: jobs naming it have their device copies
 *              wait for the engine's last record of it before the job
 *   RATES      (empty)
 *     reply    u32 ntiers, ntiers * ntiers * (f64 gbps, f64 bytes,
 *              f64 busy_s, u64 jobs, f64 total_bytes), source-major
 *              (kvt_cache_rates())
 *   WAITS      u32 nwords (= max_jobs); fd: the client's wait-word memfd
 *              (WAIT WORDS below), before the connection's first job
 *     reply    (none): from now on the daemon writes each slot's stream
 *              value into word[slot] too
 *   FPRINT     u32 scheme (1..255: which engine's hashes), u8 fp[32]: a
 *              fingerprint of what determines the engine's page hashes
 *              (its hash seed, algorithm, page size, model; never the
 *              seed itself), kept per tenant (fprint.c)
 *     reply    u32 others: distinct fingerprints of @scheme this tenant
 *              published before that differ from @fp (0: all agree;
 *              at most KVTI_FP_KEEP), u64 conflicts: the tenant's
 *              fingerprint conflicts so far
 *
 * JOB SLOTS (the HELLO memfd; written by the daemon only)
 *
 *   off size
 *     0    4  word    futex word: bits 0-23 layers ready, bit 30 every
 *                     block failed, bit 31 done; FUTEX_WAKE on change
 *     4    4  result  i32, valid once done
 *     8    4  failed  i32: the error when bit 30 is set
 *    12    4  gen     bumped by the daemon when a job takes the slot
 *    16    4  stream  (gen & 0xfff) << 20 | layers ready (< 0xfffff), or
 *                     (gen & 0xfff) << 20 | 0xfffff once the job is done
 *                     or every block failed: the word an engine's stream
 *                     waits on (cuStreamWaitValue32 GEQ, a cyclic
 *                     comparison: a later job's word satisfies an
 *                     earlier job's wait at once)
 *    20    4  (zero)
 *    24    8  stamp   u64: kvt_now_ns() (CLOCK_MONOTONIC) when the daemon
 *                     last advanced word, written before it: a client that
 *                     sees layer l ready in word reads an instant at or
 *                     after the one layer l landed (kvt_client_job_layer_ns;
 *                     0 from a daemon before it, which left it zero)
 *
 * WAIT WORDS (the WAITS memfd; made by the client, written by both)
 *
 *   KVTD_WAITS_BYTES(max_jobs) bytes (nwords * 4 rounded up to 4096):
 *   word[s] (u32 at 4 * s) carries slot s's stream value, as above. The
 *   client makes it (memfd, sealed F_SEAL_SHRINK | F_SEAL_GROW |
 *   F_SEAL_SEAL: the daemon refuses it otherwise, or of any other size,
 *   so it can never shrink under the daemon's mapping), and its engine's
 *   streams wait on it. Unlike the slot page the client may write it: when
 *   the connection is lost (the daemon died) the client sets each pending
 *   job's word to its end value, so no stream waits for ever. Both sides
 *   only ever advance a word (kvtd_stream_advance(): a cyclic "greater
 *   than", a bounded number of tries); the daemon never reads anything
 *   else from it, so a client that scribbles on it stalls only its own
 *   streams.
 *
 * Every decoder here is total: any byte string gives a decoded message or
 * KVT_EPROTO with a reason, never a read out of bounds (fuzzed by
 * tests/fuzz/fuzz_proto.c).
 */
#ifndef KVT_SERVER_PROTO_H
#define KVT_SERVER_PROTO_H

#include <kvtier.h>
#include <kvtier/index.h>
#include <kvtier/tier.h>

#include <stddef.h>
#include <stdint.h>

#define KVTD_MAGIC 0x4454564bu /* "KVTD" */
#define KVTD_VERSION 3
#define KVTD_HDR 16
#define KVTD_MAX_PAYLOAD (4u << 20)
#define KVTD_REPLY 0x8000u
#define KVTD_NS_MAX 63
#define KVTD_MAX_LAYERS 1024
#define KVTD_SLOT_BYTES 32
#define KVTD_MAX_FDS 8
#define KVTD_MAX_SEGS 8
#define KVTD_HANDLE_BYTES 64
#define KVTD_UUID_BYTES 16
#define KVTD_SEG_BYTES (4 + 8 + KVTD_HANDLE_BYTES)
#define KVTD_WAITS_BYTES(nwords) \
	((((size_t)(nwords) * 4) + 4095) & ~(size_t)4095)

#define KVTD_SLOT_DONE (1u << 31)
#define KVTD_SLOT_FAILED (1u << 30)
#define KVTD_SLOT_LAYERS 0x00ffffffu
#define KVTD_SLOT_STREAM_OFF 16
#define KVTD_SLOT_STAMP_OFF 24
#define KVTD_STREAM_END 0xfffffu
#define KVTD_STREAM_WORD(gen, layers) \
	((((uint32_t)(gen) & 0xfffu) << 20) | ((uint32_t)(layers) & 0xfffffu))

/* REGISTER segment kinds */
enum kvtd_seg_kind {
	KVTD_SEG_MEMFD = 1,    /* host memory: a memfd sealed F_SEAL_SHRINK */
	KVTD_SEG_CUDA_IPC = 2, /* a cudaIpcMemHandle_t in handle[] */
	KVTD_SEG_VMM_FD = 3,   /* a cuMemCreate allocation's POSIX fd */
	KVTD_SEG_EMU_FD = 4,   /* emulated device memory: its memfd */
};
/* EVENT kinds */
enum kvtd_event_kind {
	KVTD_EV_CUDA_IPC = 1,  /* a cudaIpcEventHandle_t in handle[] */
	KVTD_EV_EMU_FD = 2,    /* an emulated IPC event: its memfd */
};
static inline int kvtd_seg_has_fd(uint32_t kind)
{
	return kind == KVTD_SEG_MEMFD || kind == KVTD_SEG_VMM_FD ||
	       kind == KVTD_SEG_EMU_FD;
}

enum kvtd_msg {
	KVTD_MSG_HELLO = 1,
	KVTD_MSG_REGISTER = 2,
	KVTD_MSG_UNREGISTER = 3,
	KVTD_MSG_HASH = 4,
	KVTD_MSG_LOOKUP = 5,
	KVTD_MSG_LOAD = 6,
	KVTD_MSG_STORE = 7,
	KVTD_MSG_CANCEL = 8,
	KVTD_MSG_RELEASE = 9,
	KVTD_MSG_STATS = 10,
	KVTD_MSG_QUIESCE = 11,
	KVTD_MSG_LOAD_EACH = 12,
	KVTD_MSG_STORE_EACH = 13,
	KVTD_MSG_EVENT = 14,
	KVTD_MSG_RATES = 15,
	KVTD_MSG_REGISTER_ROWS = 16,
	KVTD_MSG_WAITS = 17,
	KVTD_MSG_FPRINT = 18,
	KVTD_MSG_MAX = 18,
};

/* FPRINT: a fingerprint of what determines an engine's page hashes */
#define KVTD_FP_BYTES 32
#define KVTD_FP_SCHEMES 255    /* schemes 1..255 */

/* LOOKUP flag on the wire only: the reply carries the tier runs too */
#define KVTD_LOOKUP_RUNS (1u << 16)

typedef struct kvtd_hdr {
	uint32_t magic;
	uint16_t version, op;
	uint32_t len, seq;
} kvtd_hdr;

/* A decoded request. Arrays point into the message (unaligned: read them
 * with kvtd_key_at() / kvtd_u32_at()). */
typedef struct kvtd_req {
	kvtd_hdr h;
	union {
		struct {
			uint32_t tenant, tp_rank, tp_size, page_tokens;
			uint32_t layers, kv_heads_total, kv_heads, head_dim;
			uint32_t dtype_bytes, mla;
			char ns[KVTD_NS_MAX + 1];
		} hello;
		struct {
			int32_t device;
			uint32_t nlayers, nseg, nfds;
			uint64_t nblocks, block_stride, kv_stride, token_stride;
			uint64_t head_stride;     /* REGISTER: 0 (D*s: packed) */
			const uint8_t *uuid;      /* 16 bytes */
			const uint8_t *segs;      /* nseg * KVTD_SEG_BYTES */
			const uint8_t *layers;    /* nlayers * (u32 seg, u64 off) */
		} reg;
		struct {
			int32_t device;
			uint32_t kind;
			const uint8_t *uuid, *handle;
		} event;
		struct {
			uint32_t ntokens;
			const uint8_t *tokens;
		} hash;
		struct {
			uint32_t flags, nkeys;
			const uint8_t *keys;
		} lookup;
		struct {
			uint32_t mem_id, slot, nkeys, first, event_id;
			const uint8_t *keys;
			const uint8_t *blocks; /* nkeys - first u32 */
		} job;
		struct {
			uint32_t scheme;
			const uint8_t *fp;     /* KVTD_FP_BYTES */
		} fprint;
		uint32_t id; /* UNREGISTER mem_id; CANCEL, RELEASE slot;
				WAITS nwords */
	} u;
} kvtd_req;

/* The most fds a request of @op may carry (REGISTER, EVENT: the decoded
 * request says how many exactly: kvtd_req_fds()). */
int kvtd_msg_fds(uint16_t op);
/* The fds a decoded request must carry. */
int kvtd_req_fds(const kvtd_req *q);
/* REGISTER segment @i: kind, bytes, handle; layer @l: segment, offset. */
static inline uint32_t kvtd_seg_kind(const kvtd_req *q, uint32_t i);
static inline uint64_t kvtd_seg_size(const kvtd_req *q, uint32_t i);
static inline const uint8_t *kvtd_seg_handle(const kvtd_req *q, uint32_t i);
static inline uint32_t kvtd_layer_seg(const kvtd_req *q, uint32_t l);
static inline uint64_t kvtd_layer_off(const kvtd_req *q, uint32_t l);
const char *kvtd_msg_name(uint16_t op);

/* The header of @buf (>= KVTD_HDR bytes): 0, or KVT_EPROTO for a bad
 * magic, version, op or length (kvt_errdetail() says which). @reply: a
 * reply is expected (the client) rather than a request (the daemon). */
int kvtd_hdr_decode(const uint8_t *buf, kvtd_hdr *h, int reply);

/* A whole request (header + h.len payload bytes): 0 or KVT_EPROTO. */
int kvtd_req_decode(const uint8_t *buf, size_t len, kvtd_req *r);

static inline uint32_t kvtd_u32_at(const uint8_t *p, size_t i)
{
	p += 4 * i;
	return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 |
	       (uint32_t)p[3] << 24;
}

static inline uint64_t kvtd_u64_at(const uint8_t *p, size_t i)
{
	return (uint64_t)kvtd_u32_at(p, 2 * i) |
	       (uint64_t)kvtd_u32_at(p, 2 * i + 1) << 32;
}

static inline kvt_page_key kvtd_key_at(const uint8_t *p, size_t i)
{
	kvt_page_key k = { kvtd_u64_at(p, 2 * i), kvtd_u64_at(p, 2 * i + 1) };
	return k;
}

static inline uint32_t kvtd_seg_kind(const kvtd_req *q, uint32_t i)
{
	return kvtd_u32_at(q->u.reg.segs + (size_t)i * KVTD_SEG_BYTES, 0);
}

static inline uint64_t kvtd_seg_size(const kvtd_req *q, uint32_t i)
{
	const uint8_t *p = q->u.reg.segs + (size_t)i * KVTD_SEG_BYTES + 4;

	return kvtd_u32_at(p, 0) | (uint64_t)kvtd_u32_at(p, 1) << 32;
}

static inline const uint8_t *kvtd_seg_handle(const kvtd_req *q, uint32_t i)
{
	return q->u.reg.segs + (size_t)i * KVTD_SEG_BYTES + 12;
}

static inline uint32_t kvtd_layer_seg(const kvtd_req *q, uint32_t l)
{
	return kvtd_u32_at(q->u.reg.layers + (size_t)l * 12, 0);
}

static inline uint64_t kvtd_layer_off(const kvtd_req *q, uint32_t l)
{
	const uint8_t *p = q->u.reg.layers + (size_t)l * 12 + 4;

	return kvtd_u32_at(p, 0) | (uint64_t)kvtd_u32_at(p, 1) << 32;
}

/*
 * kvtd_stream_advance() - set the stream word @w to @v unless it already is
 * at or past @v (cyclically: (int32_t)(cur - v) >= 0), by compare-and-swap,
 * giving up after a few lost races: the word may be shared with a process
 * that writes it too (WAIT WORDS), and one that keeps scribbling on it
 * must not stall the caller. 1 if @w holds a value at or past @v after.
 */
static inline int kvtd_stream_advance(uint32_t *w, uint32_t v)
{
	uint32_t cur = __atomic_load_n(w, __ATOMIC_RELAXED);

	for (int tries = 0; tries < 8; tries++) {
		if ((int32_t)(cur - v) >= 0)
			return 1;
		if (__atomic_compare_exchange_n(w, &cur, v, 0, __ATOMIC_RELEASE,
						__ATOMIC_RELAXED))
			return 1;
	}
	return 0;
}

/* ---- building messages --------------------------------------------------- */

/* A growing buffer; put_* record -ENOMEM in @err and keep going. */
typedef struct kvtd_buf {
	uint8_t *p;
	size_t len, cap;
	int err;
} kvtd_buf;

void kvtd_buf_free(kvtd_buf *b);
void kvtd_put_u16(kvtd_buf *b, uint16_t v);
void kvtd_put_u32(kvtd_buf *b, uint32_t v);
void kvtd_put_u64(kvtd_buf *b, uint64_t v);
void kvtd_put_f64(kvtd_buf *b, double v);
void kvtd_put_bytes(kvtd_buf *b, const void *p, size_t n);
void kvtd_put_keys(kvtd_buf *b, const kvt_page_key *k, size_t n);
/* Start a message (header with len 0); kvtd_end() fills the length.
 * kvtd_end(): 0, -ENOMEM, or KVT_EPROTO for a payload over the limit. */
void kvtd_begin(kvtd_buf *b, uint16_t op, uint32_t seq);
int kvtd_end(kvtd_buf *b);

/* A reply's status and detail; *@body / *@blen the rest. Returns 0 (and
 * *@status) or KVT_EPROTO for a malformed reply payload. */
int kvtd_reply_decode(const uint8_t *payload, size_t len, int32_t *status,
		      char *detail, size_t dmax, const uint8_t **body,
		      size_t *blen);

/* A bounds-checked reader over a reply body. */
typedef struct kvtd_rd {
	const uint8_t *p;
	size_t len, off;
	int err; /* KVT_EPROTO once a read went past the end */
} kvtd_rd;

uint32_t kvtd_get_u32(kvtd_rd *r);
uint64_t kvtd_get_u64(kvtd_rd *r);
double kvtd_get_f64(kvtd_rd *r);
const uint8_t *kvtd_get_bytes(kvtd_rd *r, size_t n);

#endif /* KVT_SERVER_PROTO_H */
