/*
 * test_server_proto — bad input on the daemon's socket, byte by byte: bad
 * magic, version, op or length (an error reply, then the connection is
 * closed: the stream cannot be resynchronized); truncated or overlong
 * payloads, ops out of order, descriptors where none belong or missing,
 * memory that is not a sealed memfd or too small, slots, memories and
 * blocks that are not the client's, wait words (WAITS) that are not a
 * memfd, not sealed against shrinking and growing, of the wrong size or
 * sent twice (an error reply, the connection goes on); a client that connects and says nothing (closed after hello_ms);
 * one that vanishes mid-message. After each, a well-behaved client is
 * still served, and the daemon counts what it refused.
 */
#include "raw_util.h"

#include <cjson/cJSON.h>
#include <fcntl.h>
#include <sys/mman.h>

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

/* Send @b on a new connection before any HELLO: the reply's status (and
 * op), and the connection must then be closed by the daemon. */
static int pre_hello(kvtd_buf *b, const int *fds, int nfds, uint16_t *op)
{
	int fd = raw_connect(), st;

	if (fd < 0)
		return -ENOTCONN;
	CHECK_OK(raw_send(fd, b, fds, nfds));
	st = raw_reply(fd, op);
	if (!closed(fd)) {
		fprintf(stderr, "refused before HELLO (%d): not closed\n", st);
		kvt_test_failures++;
	}
	close(fd);
	return st;
}

static void test_payloads(void)
{
	kvtd_buf b = { 0 };
	uint16_t op = 0;
	int fd;

	/* before HELLO: refused with a reply, then closed (a refusal before
	 * HELLO ends the connection: no one probes a slot for long) */
	kvtd_begin(&b, KVTD_MSG_LOOKUP, 1);
	kvtd_put_u32(&b, 0);
	kvtd_put_u32(&b, 0);
	CHECK_EQ(pre_hello(&b, NULL, 0, &op), KVT_EPROTO);
	CHECK_EQ(op, KVTD_MSG_LOOKUP | KVTD_REPLY);
	/* HELLO cut short, HELLO with bytes past its end */
	hello_payload(&b, 2, SRV_L);
	b.len -= 3;
	CHECK_EQ(pre_hello(&b, NULL, 0, NULL), KVT_EPROTO);
	hello_payload(&b, 3, SRV_L);
	kvtd_put_u32(&b, 42);
	CHECK_EQ(pre_hello(&b, NULL, 0, NULL), KVT_EPROTO);
	/* a namespace of 64 bytes; one holding a NUL */
	hello_payload(&b, 4, SRV_L);
	b.len -= 9;
	kvtd_put_u16(&b, 64);
	for (int i = 0; i < 64; i++)
		kvtd_put_bytes(&b, "n", 1);
	CHECK_EQ(pre_hello(&b, NULL, 0, NULL), KVT_EPROTO);
	hello_payload(&b, 5, SRV_L);
	b.p[b.len - 3] = 0;
	CHECK_EQ(pre_hello(&b, NULL, 0, NULL), KVT_EPROTO);
	/* wrong geometry, an unknown namespace */
	hello_payload(&b, 6, SRV_L + 1);
	CHECK_EQ(pre_hello(&b, NULL, 0, NULL), KVT_EGEOM);
	hello_payload(&b, 6, SRV_L);
	memcpy(b.p + b.len - 7, "nothere", 7);
	CHECK_EQ(pre_hello(&b, NULL, 0, NULL), KVT_ENOTFOUND);
	/* an fd where none belongs */
	{
		int pf[2];

		CHECK(pipe(pf) == 0);
		hello_payload(&b, 7, SRV_L);
		CHECK_EQ(pre_hello(&b, pf, 1, NULL), KVT_EPROTO);
		close(pf[0]);
		close(pf[1]);
	}
	fd = raw_connect();
	/* a good HELLO, then HELLO again (refused, the connection goes on) */
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

/* A one-page job of memory 1 (@op, slot @slot, block @blk): the status. */
static int raw_job1(int fd, uint16_t op, uint32_t seq, uint32_t slot,
		    uint32_t blk)
{
	kvtd_buf b = { 0 };
	kvt_page_key k = { 1, 2 };
	int err;

	kvtd_begin(&b, op, seq);
	kvtd_put_u32(&b, 1);
	kvtd_put_u32(&b, slot);
	kvtd_put_u32(&b, 1);
	kvtd_put_u32(&b, 0);
	kvtd_put_u32(&b, 0);
	kvtd_put_keys(&b, &k, 1);
	kvtd_put_u32(&b, blk);
	err = raw_send(fd, &b, NULL, 0);
	kvtd_buf_free(&b);
	return err ? err : raw_reply(fd, NULL);
}

static void test_register(void)
{
	uint64_t chunk = SRV_P * 2 * 64 * 2, nb = 8, layer = 2 * nb * chunk;
	int fd = raw_hello(), mfd, sealed;

	if (fd < 0)
		return;
	/* no fd */
	CHECK_EQ(raw_register(fd, -1, nb, layer, SRV_L), KVT_EPROTO);
	/* a memfd not sealed against shrinking */
	mfd = memfd_create("t", MFD_CLOEXEC | MFD_ALLOW_SEALING);
	CHECK(ftruncate(mfd, (off_t)(layer * SRV_L)) == 0);
	CHECK_EQ(raw_register(fd, mfd, nb, layer, SRV_L), -EINVAL);
	/* a pipe */
	{
		int pf[2];

		CHECK(pipe(pf) == 0);
		CHECK_EQ(raw_register(fd, pf[0], nb, layer, SRV_L), -EINVAL);
		close(pf[0]);
		close(pf[1]);
	}
	CHECK(fcntl(mfd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW) == 0);
	/* too small for its layout; layers the geometry does not have;
	 * blocks that do not fit the strides */
	CHECK_EQ(raw_register(fd, mfd, nb * 2, layer, SRV_L), -EINVAL);
	CHECK_EQ(raw_register(fd, mfd, nb, layer, SRV_L - 1), KVT_EGEOM);
	CHECK_EQ(raw_register(fd, mfd, nb, (uint64_t)1 << 62, SRV_L), -EINVAL);
	CHECK_EQ(raw_register(fd, mfd, 0, layer, SRV_L), -EINVAL);
	/* version 2's segments: a layer in a segment that is not there, a
	 * memfd said to be device memory, device memory said to be host, a
	 * device that is not one, an emulated handle without its fd, a kind
	 * that is not one */
	CHECK_EQ(raw_register_kind(fd, -1, KVTD_SEG_MEMFD, mfd, nb, layer,
				   SRV_L, 1), KVT_EPROTO);
	CHECK_EQ(raw_register_kind(fd, KVT_DEVICE_EMU, KVTD_SEG_MEMFD, mfd, nb,
				   layer, SRV_L, 0), -EINVAL);
	CHECK_EQ(raw_register_kind(fd, -1, KVTD_SEG_EMU_FD, mfd, nb, layer,
				   SRV_L, 0), -EINVAL);
	CHECK_EQ(raw_register_kind(fd, KVT_DEVICE_EMU + 99, KVTD_SEG_EMU_FD,
				   mfd, nb, layer, SRV_L, 0), -EINVAL);
	CHECK_EQ(raw_register_kind(fd, KVT_DEVICE_EMU, KVTD_SEG_EMU_FD, -1, nb,
				   layer, SRV_L, 0), KVT_EPROTO);
	CHECK_EQ(raw_register_kind(fd, -1, 9, mfd, nb, layer, SRV_L, 0),
		 KVT_EPROTO);
	/* a sealed memfd imports as emulated device memory (emu:0) */
	CHECK_EQ(raw_register_kind(fd, KVT_DEVICE_EMU, KVTD_SEG_EMU_FD, mfd, nb,
				   layer, SRV_L, 0), 0);
	/* and right */
	sealed = raw_register(fd, mfd, nb, layer, SRV_L);
	CHECK_EQ(sealed, 0);
	close(mfd);
	/* a block out of range, a slot out of range, a slot in use */
	{
		uint32_t slot_blk[][2] = { { 0, 99 }, { 5000, 0 } };

		for (int i = 0; i < 2; i++)
			CHECK_EQ(raw_job1(fd, KVTD_MSG_STORE, 30, slot_blk[i][0],
					  slot_blk[i][1]), -EINVAL);
		/* the second finds slot 3 taken (done or not) */
		CHECK_EQ(raw_job1(fd, KVTD_MSG_STORE, 31, 3, 0), 0);
		CHECK_EQ(raw_job1(fd, KVTD_MSG_STORE, 31, 3, 0), KVT_EBUSY);
	}
	/* vanish with the memory registered and a job in its slot */
	close(fd);
	still_serving();
}

/* WAITS of @nwords words with memfd @mfd (-1: none sent): the status */
static int raw_waits(int fd, int mfd, uint32_t nwords)
{
	kvtd_buf b = { 0 };
	int err;

	kvtd_begin(&b, KVTD_MSG_WAITS, 40);
	kvtd_put_u32(&b, nwords);
	err = raw_send(fd, &b, mfd >= 0 ? &mfd : NULL, mfd >= 0);
	kvtd_buf_free(&b);
	return err ? err : raw_reply(fd, NULL);
}

static int words_memfd(size_t len, unsigned seals)
{
	int mfd = memfd_create("w", MFD_CLOEXEC | MFD_ALLOW_SEALING);

	CHECK(mfd >= 0 && ftruncate(mfd, (off_t)len) == 0);
	if (seals)
		CHECK(fcntl(mfd, F_ADD_SEALS, seals) == 0);
	return mfd;
}

static void test_waits(void)
{
	const unsigned all = F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL;
	size_t len = KVTD_WAITS_BYTES(1024);
	int fd = raw_hello(), mfd, pf[2];

	if (fd < 0)
		return;
	CHECK_EQ(raw_waits(fd, -1, 1024), KVT_EPROTO);   /* no fd */
	CHECK_EQ(raw_waits(fd, -1, 0), KVT_EPROTO);      /* no words */
	CHECK(pipe(pf) == 0);
	CHECK_EQ(raw_waits(fd, pf[0], 1024), -EINVAL);   /* not a memfd */
	close(pf[0]);
	close(pf[1]);
	/* not sealed; shrinkable; growable; seals still open */
	int bad[] = { 0, F_SEAL_GROW | F_SEAL_SEAL, F_SEAL_SHRINK | F_SEAL_SEAL,
		      F_SEAL_SHRINK | F_SEAL_GROW };
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		mfd = words_memfd(len, (unsigned)bad[i]);
		CHECK_EQ(raw_waits(fd, mfd, 1024), -EINVAL);
		close(mfd);
	}
	/* too small, too large, words the daemon's slots are not */
	mfd = words_memfd(len / 2, all);
	CHECK_EQ(raw_waits(fd, mfd, 1024), -EINVAL);
	close(mfd);
	mfd = words_memfd(2 * len, all);
	CHECK_EQ(raw_waits(fd, mfd, 1024), -EINVAL);
	close(mfd);
	mfd = words_memfd(len, all);
	CHECK_EQ(raw_waits(fd, mfd, 512), -EINVAL);
	/* sealed against writes: the daemon cannot map it to write */
	{
		int ro = words_memfd(len, F_SEAL_SHRINK | F_SEAL_GROW |
				     F_SEAL_WRITE | F_SEAL_SEAL);
		CHECK_EQ(raw_waits(fd, ro, 1024), -EPERM);
		close(ro);
	}
	/* right, once */
	CHECK_EQ(raw_waits(fd, mfd, 1024), 0);
	CHECK_EQ(raw_waits(fd, mfd, 1024), -EEXIST);
	/* scribbled on by the client: the daemon writes on regardless */
	{
		uint32_t *w = mmap(NULL, len, PROT_READ | PROT_WRITE,
				   MAP_SHARED, mfd, 0);

		CHECK(w != MAP_FAILED);
		if (w != MAP_FAILED) {
			memset(w, 0xa5, len);
			munmap(w, len);
		}
	}
	close(mfd);
	close(fd);
	/* a connection that already runs a job may not send it */
	fd = raw_hello();
	if (fd >= 0) {
		uint64_t chunk = SRV_P * 2 * 64 * 2, nb = 2;
		uint64_t layer = 2 * nb * chunk;

		mfd = words_memfd(layer * SRV_L, F_SEAL_SHRINK | F_SEAL_GROW);
		CHECK_EQ(raw_register(fd, mfd, nb, layer, SRV_L), 0);
		close(mfd);
		CHECK_EQ(raw_job1(fd, KVTD_MSG_LOAD, 41, 0, 0), 0);
		mfd = words_memfd(len, all);
		CHECK_EQ(raw_waits(fd, mfd, 1024), KVT_EBUSY);
		close(mfd);
		close(fd);
	}
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
		test_waits();
		test_idle_and_vanish();
		test_counted();
		CHECK_EQ(srv_stop(d), 0);
	}
	unlink(model);
	TEST_DONE();
}
