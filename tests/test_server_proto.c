/*
 * test_server_proto — bad input on the daemon's socket, byte by byte: bad
 * magic, version, op or length (an error reply, then the connection is
 * closed: the stream cannot be resynchronized); truncated or overlong
 * payloads, ops out of order, descriptors where none belong or missing,
 * memory that is not a sealed memfd or too small, slots, memories and
 * blocks that are not the client's (an error reply, the connection goes
 * on); a client that connects and says nothing (closed after hello_ms);
 * one that vanishes mid-message. After each, a well-behaved client is
 * still served, and the daemon counts what it refused.
 */
#include "server_util.h"
#include "server/io.h"

#include <cjson/cJSON.h>
#include <fcntl.h>
#include <poll.h>
#include <sys/mman.h>

static char sock[108];
static const char *model;

static int raw_connect(void)
{
	struct sockaddr_un a = { .sun_family = AF_UNIX };
	int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);

	snprintf(a.sun_path, sizeof(a.sun_path), "%s", sock);
	if (connect(fd, (struct sockaddr *)&a, sizeof(a))) {
		close(fd);
		return -1;
	}
	kvtd_set_timeout(fd, 5000);
	return fd;
}

/* One reply: its status (or a negative transport error, 1 at EOF); the
 * descriptors that came with it are closed. */
static int raw_reply(int fd, uint16_t *op)
{
	kvtd_buf b = { 0 };
	kvtd_hdr h;
	const uint8_t *body;
	size_t blen;
	int32_t st = 0;
	int fds[KVTD_MAX_FDS], nfds = 0;
	int err = kvtd_recv(fd, &b, &h, fds, &nfds, 1);

	for (int i = 0; i < nfds; i++)
		close(fds[i]);
	if (!err)
		err = kvtd_reply_decode(b.p + KVTD_HDR, h.len, &st, NULL, 0,
					&body, &blen);
	if (!err && op)
		*op = h.op;
	kvtd_buf_free(&b);
	return err ? err : st;
}

/* 1 if the daemon closed the connection (EOF within 3 s). */
static int closed(int fd)
{
	struct pollfd p = { .fd = fd, .events = POLLIN };
	char c;

	if (poll(&p, 1, 3000) != 1)
		return 0;
	return recv(fd, &c, 1, 0) == 0;
}

static void hello_payload(kvtd_buf *b, uint32_t seq, uint32_t layers)
{
	kvtd_begin(b, KVTD_MSG_HELLO, seq);
	kvtd_put_u32(b, 0);      /* tenant */
	kvtd_put_u32(b, 0);      /* rank */
	kvtd_put_u32(b, 1);      /* tp */
	kvtd_put_u32(b, SRV_P);
	kvtd_put_u32(b, layers);
	kvtd_put_u32(b, 2);      /* kv heads total */
	kvtd_put_u32(b, 2);
	kvtd_put_u32(b, 64);
	kvtd_put_u32(b, 2);
	kvtd_put_u32(b, 0);      /* mla */
	kvtd_put_u16(b, 7);
	kvtd_put_bytes(b, "default", 7);
}

/* Send @b (ended here) with @fds; 0 or an error. */
static int raw_send(int fd, kvtd_buf *b, const int *fds, int nfds)
{
	int err = kvtd_end(b);
	return err ? err : kvtd_send(fd, b->p, b->len, fds, nfds);
}

/* A connection that said HELLO. */
static int raw_hello(void)
{
	kvtd_buf b = { 0 };
	int fd = raw_connect(), st;

	if (fd < 0)
		return -1;
	hello_payload(&b, 1, SRV_L);
	CHECK_OK(raw_send(fd, &b, NULL, 0));
	st = raw_reply(fd, NULL);
	CHECK_EQ(st, 0);
	kvtd_buf_free(&b);
	return fd;
}

/* A good client still gets answers. */
static void still_serving(void)
{
	kvt_client *cl = NULL;
	kvt_cache_lookup_result r;
	kvt_page_key k = { 1, 2 };

	CHECK_OK(srv_connect(&cl, sock, model, 0, 1, 0));
	if (cl)
		CHECK_OK(kvt_client_lookup(cl, &k, 1, 0, &r));
	kvt_client_close(cl);
}

/* Raw header bytes. */
static void put_hdr(uint8_t *h, uint32_t magic, uint16_t ver, uint16_t op,
		    uint32_t len)
{
	memcpy(h, &magic, 4);
	memcpy(h + 4, &ver, 2);
	memcpy(h + 6, &op, 2);
	memcpy(h + 8, &len, 4);
	memset(h + 12, 0, 4);
}

static void test_headers(void)
{
	struct { uint32_t magic; uint16_t ver, op; uint32_t len; } bad[] = {
		{ 0xdeadbeef, KVTD_VERSION, KVTD_MSG_HELLO, 0 },
		{ KVTD_MAGIC, KVTD_VERSION + 1, KVTD_MSG_HELLO, 0 },
		{ KVTD_MAGIC, KVTD_VERSION, 99, 0 },
		{ KVTD_MAGIC, KVTD_VERSION, 0, 0 },
		{ KVTD_MAGIC, KVTD_VERSION, KVTD_MSG_HELLO | KVTD_REPLY, 0 },
		{ KVTD_MAGIC, KVTD_VERSION, KVTD_MSG_LOOKUP,
		  KVTD_MAX_PAYLOAD + 1 },
		{ KVTD_MAGIC, KVTD_VERSION, KVTD_MSG_LOOKUP, 0xffffffffu },
	};

	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		uint8_t h[KVTD_HDR];
		int fd = raw_connect();

		CHECK(fd >= 0);
		if (fd < 0)
			continue;
		put_hdr(h, bad[i].magic, bad[i].ver, bad[i].op, bad[i].len);
		CHECK_OK(kvtd_send(fd, h, sizeof(h), NULL, 0));
		CHECK_EQ(raw_reply(fd, NULL), KVT_EPROTO);
		if (!closed(fd)) {
			fprintf(stderr, "bad header %zu: not closed\n", i);
			kvt_test_failures++;
		}
		close(fd);
	}
	still_serving();
}

static void test_payloads(void)
{
	kvtd_buf b = { 0 };
	uint16_t op = 0;
	int fd;

	/* before HELLO: refused, the connection goes on */
	fd = raw_connect();
	kvtd_begin(&b, KVTD_MSG_LOOKUP, 1);
	kvtd_put_u32(&b, 0);
	kvtd_put_u32(&b, 0);
	CHECK_OK(raw_send(fd, &b, NULL, 0));
	CHECK_EQ(raw_reply(fd, &op), KVT_EPROTO);
	CHECK_EQ(op, KVTD_MSG_LOOKUP | KVTD_REPLY);
	/* HELLO cut short, HELLO with bytes past its end */
	hello_payload(&b, 2, SRV_L);
	b.len -= 3;
	CHECK_OK(raw_send(fd, &b, NULL, 0));
	CHECK_EQ(raw_reply(fd, NULL), KVT_EPROTO);
	hello_payload(&b, 3, SRV_L);
	kvtd_put_u32(&b, 42);
	CHECK_OK(raw_send(fd, &b, NULL, 0));
	CHECK_EQ(raw_reply(fd, NULL), KVT_EPROTO);
	/* a namespace of 64 bytes; one holding a NUL */
	hello_payload(&b, 4, SRV_L);
	b.len -= 9;
	kvtd_put_u16(&b, 64);
	for (int i = 0; i < 64; i++)
		kvtd_put_bytes(&b, "n", 1);
	CHECK_OK(raw_send(fd, &b, NULL, 0));
	CHECK_EQ(raw_reply(fd, NULL), KVT_EPROTO);
	hello_payload(&b, 5, SRV_L);
	b.p[b.len - 3] = 0;
	CHECK_OK(raw_send(fd, &b, NULL, 0));
	CHECK_EQ(raw_reply(fd, NULL), KVT_EPROTO);
	/* wrong geometry */
	hello_payload(&b, 6, SRV_L + 1);
	CHECK_OK(raw_send(fd, &b, NULL, 0));
	CHECK_EQ(raw_reply(fd, NULL), KVT_EGEOM);
	/* an fd where none belongs: refused, closed here */
	{
		int pf[2];

		CHECK(pipe(pf) == 0);
		hello_payload(&b, 7, SRV_L);
		CHECK_OK(raw_send(fd, &b, pf, 1));
		CHECK_EQ(raw_reply(fd, NULL), KVT_EPROTO);
		close(pf[0]);
		close(pf[1]);
	}
	/* now a good HELLO on the same connection, then HELLO again */
	hello_payload(&b, 8, SRV_L);
	CHECK_OK(raw_send(fd, &b, NULL, 0));
	CHECK_EQ(raw_reply(fd, NULL), 0);
	hello_payload(&b, 9, SRV_L);
	CHECK_OK(raw_send(fd, &b, NULL, 0));
	CHECK_EQ(raw_reply(fd, NULL), KVT_EPROTO);
	/* counts that do not fit the payload */
	kvtd_begin(&b, KVTD_MSG_LOOKUP, 10);
	kvtd_put_u32(&b, 0);
	kvtd_put_u32(&b, 1000000);
	kvtd_put_keys(&b, &(kvt_page_key){ 1, 2 }, 1);
	CHECK_OK(raw_send(fd, &b, NULL, 0));
	CHECK_EQ(raw_reply(fd, NULL), KVT_EPROTO);
	kvtd_begin(&b, KVTD_MSG_HASH, 11);
	kvtd_put_u32(&b, 0xffffffffu);
	CHECK_OK(raw_send(fd, &b, NULL, 0));
	CHECK_EQ(raw_reply(fd, NULL), KVT_EPROTO);
	kvtd_begin(&b, KVTD_MSG_LOAD, 12);
	kvtd_put_u32(&b, 1);
	kvtd_put_u32(&b, 0);
	kvtd_put_u32(&b, 2);
	kvtd_put_u32(&b, 3); /* first > nkeys */
	kvtd_put_u32(&b, 0);
	CHECK_OK(raw_send(fd, &b, NULL, 0));
	CHECK_EQ(raw_reply(fd, NULL), KVT_EPROTO);
	/* things that are not this client's */
	{
		kvt_page_key k = { 1, 2 };
		uint32_t id_ops[] = { KVTD_MSG_UNREGISTER, KVTD_MSG_CANCEL,
				      KVTD_MSG_RELEASE };

		kvtd_begin(&b, KVTD_MSG_LOAD, 13);
		kvtd_put_u32(&b, 77); /* no such memory */
		kvtd_put_u32(&b, 0);
		kvtd_put_u32(&b, 1);
		kvtd_put_u32(&b, 0);
		kvtd_put_u32(&b, 0);
		kvtd_put_keys(&b, &k, 1);
		kvtd_put_u32(&b, 0);
		CHECK_OK(raw_send(fd, &b, NULL, 0));
		CHECK_EQ(raw_reply(fd, NULL), KVT_ENOTFOUND);
		for (size_t i = 0; i < 3; i++) {
			kvtd_begin(&b, (uint16_t)id_ops[i], 14);
			kvtd_put_u32(&b, 5);
			CHECK_OK(raw_send(fd, &b, NULL, 0));
			CHECK_EQ(raw_reply(fd, NULL), KVT_ENOTFOUND);
		}
	}
	kvtd_buf_free(&b);
	close(fd);
	still_serving();
}

/* REGISTER (one segment of @kind, layer l at l * @off1 in it): what the
 * daemon accepts as memory. */
static int reg_kind(int fd, int32_t device, uint32_t kind, int mfd,
		    uint64_t nblocks, uint64_t off1, uint32_t nlayers,
		    uint32_t lseg)
{
	static const uint8_t zero[KVTD_HANDLE_BYTES];
	kvtd_buf b = { 0 };
	uint64_t chunk = SRV_P * 2 * 64 * 2;
	int st;

	kvtd_begin(&b, KVTD_MSG_REGISTER, 20);
	kvtd_put_u32(&b, (uint32_t)device);
	kvtd_put_u32(&b, nlayers);
	kvtd_put_u64(&b, nblocks);
	kvtd_put_u64(&b, chunk);
	kvtd_put_u64(&b, nblocks * chunk);
	kvtd_put_u64(&b, 2 * 64 * 2);
	kvtd_put_bytes(&b, zero, KVTD_UUID_BYTES);
	kvtd_put_u32(&b, 1);
	kvtd_put_u32(&b, kind);
	kvtd_put_u64(&b, kind == KVTD_SEG_MEMFD ? 0 : nlayers * off1);
	kvtd_put_bytes(&b, zero, KVTD_HANDLE_BYTES);
	for (uint32_t l = 0; l < nlayers; l++) {
		kvtd_put_u32(&b, lseg);
		kvtd_put_u64(&b, l * off1);
	}
	CHECK_OK(raw_send(fd, &b, mfd >= 0 ? &mfd : NULL, mfd >= 0));
	st = raw_reply(fd, NULL);
	kvtd_buf_free(&b);
	return st;
}

static int reg(int fd, int mfd, uint64_t nblocks, uint64_t off1,
	       uint32_t nlayers)
{
	return reg_kind(fd, -1, KVTD_SEG_MEMFD, mfd, nblocks, off1, nlayers, 0);
}

static void test_register(void)
{
	uint64_t chunk = SRV_P * 2 * 64 * 2, nb = 8, layer = 2 * nb * chunk;
	int fd = raw_hello(), mfd, sealed;

	if (fd < 0)
		return;
	/* no fd */
	CHECK_EQ(reg(fd, -1, nb, layer, SRV_L), KVT_EPROTO);
	/* a memfd not sealed against shrinking */
	mfd = memfd_create("t", MFD_CLOEXEC | MFD_ALLOW_SEALING);
	CHECK(ftruncate(mfd, (off_t)(layer * SRV_L)) == 0);
	CHECK_EQ(reg(fd, mfd, nb, layer, SRV_L), -EINVAL);
	/* a pipe */
	{
		int pf[2];

		CHECK(pipe(pf) == 0);
		CHECK_EQ(reg(fd, pf[0], nb, layer, SRV_L), -EINVAL);
		close(pf[0]);
		close(pf[1]);
	}
	CHECK(fcntl(mfd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW) == 0);
	/* too small for its layout; layers the geometry does not have;
	 * blocks that do not fit the strides */
	CHECK_EQ(reg(fd, mfd, nb * 2, layer, SRV_L), -EINVAL);
	CHECK_EQ(reg(fd, mfd, nb, layer, SRV_L - 1), KVT_EGEOM);
	CHECK_EQ(reg(fd, mfd, nb, (uint64_t)1 << 62, SRV_L), -EINVAL);
	CHECK_EQ(reg(fd, mfd, 0, layer, SRV_L), -EINVAL);
	/* version 2's segments: a layer in a segment that is not there, a
	 * memfd said to be device memory, device memory said to be host, a
	 * device that is not one, an emulated handle without its fd */
	CHECK_EQ(reg_kind(fd, -1, KVTD_SEG_MEMFD, mfd, nb, layer, SRV_L, 1),
		 KVT_EPROTO);
	CHECK_EQ(reg_kind(fd, KVT_DEVICE_EMU, KVTD_SEG_MEMFD, mfd, nb, layer,
			  SRV_L, 0), -EINVAL);
	CHECK_EQ(reg_kind(fd, -1, KVTD_SEG_EMU_FD, mfd, nb, layer, SRV_L, 0),
		 -EINVAL);
	CHECK_EQ(reg_kind(fd, KVT_DEVICE_EMU + 99, KVTD_SEG_EMU_FD, mfd, nb,
			  layer, SRV_L, 0), -EINVAL);
	CHECK_EQ(reg_kind(fd, KVT_DEVICE_EMU, KVTD_SEG_EMU_FD, -1, nb, layer,
			  SRV_L, 0), KVT_EPROTO);
	CHECK_EQ(reg_kind(fd, -1, 9, mfd, nb, layer, SRV_L, 0), KVT_EPROTO);
	/* an emulated device's memory must be sealed too (this one is, as
	 * a memfd, so it imports: device memory on emu:0) */
	CHECK_EQ(reg_kind(fd, KVT_DEVICE_EMU, KVTD_SEG_EMU_FD, mfd, nb, layer,
			  SRV_L, 0), 0);
	/* and right */
	sealed = reg(fd, mfd, nb, layer, SRV_L);
	CHECK_EQ(sealed, 0);
	close(mfd);
	/* a block out of range, a slot out of range, a slot in use */
	{
		kvtd_buf b = { 0 };
		kvt_page_key k = { 1, 2 };
		uint32_t slot_blk[][2] = { { 0, 99 }, { 5000, 0 } };

		for (int i = 0; i < 2; i++) {
			kvtd_begin(&b, KVTD_MSG_STORE, 30);
			kvtd_put_u32(&b, 1);
			kvtd_put_u32(&b, slot_blk[i][0]);
			kvtd_put_u32(&b, 1);
			kvtd_put_u32(&b, 0);
			kvtd_put_u32(&b, 0);
			kvtd_put_keys(&b, &k, 1);
			kvtd_put_u32(&b, slot_blk[i][1]);
			CHECK_OK(raw_send(fd, &b, NULL, 0));
			CHECK_EQ(raw_reply(fd, NULL), -EINVAL);
		}
		for (int i = 0; i < 2; i++) {
			kvtd_begin(&b, KVTD_MSG_STORE, 31);
			kvtd_put_u32(&b, 1);
			kvtd_put_u32(&b, 3);
			kvtd_put_u32(&b, 1);
			kvtd_put_u32(&b, 0);
			kvtd_put_u32(&b, 0);
			kvtd_put_keys(&b, &k, 1);
			kvtd_put_u32(&b, 0);
			CHECK_OK(raw_send(fd, &b, NULL, 0));
			/* the second finds slot 3 taken (done or not) */
			CHECK_EQ(raw_reply(fd, NULL), i ? KVT_EBUSY : 0);
		}
		kvtd_buf_free(&b);
	}
	/* vanish with the memory registered and a job in its slot */
	close(fd);
	still_serving();
}

static void test_idle_and_vanish(void)
{
	uint8_t h[KVTD_HDR];
	int fd = raw_connect();

	/* connects, says nothing: closed after hello_ms (300 ms here) */
	CHECK(fd >= 0);
	CHECK(closed(fd));
	close(fd);
	/* half a header, then gone */
	fd = raw_connect();
	put_hdr(h, KVTD_MAGIC, KVTD_VERSION, KVTD_MSG_LOOKUP, 100);
	CHECK_OK(kvtd_send(fd, h, 7, NULL, 0));
	close(fd);
	/* a header that promises 100 bytes, 10 of them, then gone */
	fd = raw_connect();
	CHECK_OK(kvtd_send(fd, h, sizeof(h), NULL, 0));
	CHECK_OK(kvtd_send(fd, h, 10, NULL, 0));
	close(fd);
	still_serving();
}

/* The daemon counted refusals: protocol_errors in STATS, any tenant. */
static void test_counted(void)
{
	kvt_client *cl = NULL;
	char *js = NULL;
	double total = 0;
	cJSON *root, *t;

	CHECK_OK(srv_connect(&cl, sock, model, 0, 1, 0));
	if (!cl)
		return;
	CHECK_OK(kvt_client_stats(cl, &js));
	root = cJSON_Parse(js ? js : "");
	CHECK(root != NULL);
	cJSON_ArrayForEach(t, cJSON_GetObjectItem(root, "tenants")) {
		cJSON *pe = cJSON_GetObjectItem(t, "protocol_errors"), *x;

		cJSON_ArrayForEach(x, pe)
			if (cJSON_IsNumber(x))
				total += x->valuedouble;
	}
	CHECK(total >= 20);
	cJSON_Delete(root);
	free(js);
	kvt_client_close(cl);
}

int main(void)
{
	kvtd_config cfg = { 0 };
	pid_t d;

	snprintf(sock, sizeof(sock), "/tmp/kvtd-proto-%d.sock", (int)getpid());
	model = srv_model();
	cfg.socket = sock;
	cfg.tiers = "dram:2M";
	cfg.model = model;
	cfg.page_tokens = SRV_P;
	cfg.hello_ms = 300;
	d = srv_start(&cfg);
	CHECK(d > 0);
	if (d > 0) {
		test_headers();
		test_payloads();
		test_register();
		test_idle_and_vanish();
		test_counted();
		CHECK_EQ(srv_stop(d), 0);
	}
	unlink(model);
	TEST_DONE();
}
