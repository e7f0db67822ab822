/*
 * raw_util.h — a client that speaks the daemon's protocol byte by byte
 * (for the tests that send what the C client never would): connect, send
 * a message with descriptors, read one reply, a HELLO with the test
 * geometry (server_util.h), whether the daemon closed the connection,
 * whether a well-behaved client is still served. The including test sets
 * @sock (the daemon's socket) and @model (srv_model()).
 */
#ifndef KVT_TEST_RAW_UTIL_H
#define KVT_TEST_RAW_UTIL_H

#include "server_util.h"
#include "server/io.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/mman.h>

static char sock[108];
static const char *model;

static inline int raw_connect(void)
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
 * descriptors that came with it go to @fds (KVTD_MAX_FDS, *@nfds of them)
 * when @fds is given, else are closed. */
static inline int raw_reply_fds(int fd, uint16_t *op, int *fds, int *nfds)
{
	kvtd_buf b = { 0 };
	kvtd_hdr h;
	const uint8_t *body;
	size_t blen;
	int32_t st = 0;
	int got[KVTD_MAX_FDS], ngot = 0;
	int err = kvtd_recv(fd, &b, &h, got, &ngot, 1, 0);

	for (int i = 0; i < ngot; i++)
		if (fds)
			fds[i] = got[i];
		else
			close(got[i]);
	if (nfds)
		*nfds = ngot;
	if (!err)
		err = kvtd_reply_decode(b.p + KVTD_HDR, h.len, &st, NULL, 0,
					&body, &blen);
	if (!err && op)
		*op = h.op;
	kvtd_buf_free(&b);
	return err ? err : st;
}

static inline int raw_reply(int fd, uint16_t *op)
{
	return raw_reply_fds(fd, op, NULL, NULL);
}

/* 1 if the daemon closed the connection (EOF within 3 s). */
static inline int closed(int fd)
{
	struct pollfd p = { .fd = fd, .events = POLLIN };
	char c;

	if (poll(&p, 1, 3000) != 1)
		return 0;
	return recv(fd, &c, 1, 0) == 0;
}

static inline void hello_payload(kvtd_buf *b, uint32_t seq, uint32_t layers)
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
static inline int raw_send(int fd, kvtd_buf *b, const int *fds, int nfds)
{
	int err = kvtd_end(b);
	return err ? err : kvtd_send(fd, b->p, b->len, fds, nfds);
}

/* A connection that said HELLO; @fds (2, may be NULL) gets the reply's
 * descriptors (the job-slot memfd, the eventfd), else they are closed. */
static inline int raw_hello_fds(int *fds)
{
	kvtd_buf b = { 0 };
	int fd = raw_connect(), st, n = 0;

	if (fd < 0)
		return -1;
	hello_payload(&b, 1, SRV_L);
	CHECK_OK(raw_send(fd, &b, NULL, 0));
	st = raw_reply_fds(fd, NULL, fds, &n);
	CHECK_EQ(st, 0);
	if (fds)
		CHECK_EQ(n, 2);
	kvtd_buf_free(&b);
	return fd;
}

static inline int raw_hello(void)
{
	return raw_hello_fds(NULL);
}

/* A good client still gets answers. */
static inline void still_serving(void)
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
static inline void put_hdr(uint8_t *h, uint32_t magic, uint16_t ver, uint16_t op,
		    uint32_t len)
{
	memcpy(h, &magic, 4);
	memcpy(h + 4, &ver, 2);
	memcpy(h + 6, &op, 2);
	memcpy(h + 8, &len, 4);
	memset(h + 12, 0, 4);
}

/* Open descriptors of process @pid, or -1. */
static inline int raw_nfds(pid_t pid)
{
	char path[64];

	snprintf(path, sizeof(path), "/proc/%d/fd", (int)pid);
	return test_count_entries(path);
}

/* Wait (at most 3 s) until @pid holds at most @max descriptors: its
 * count then. */
static inline int raw_nfds_settle(pid_t pid, int max)
{
	int n = raw_nfds(pid);

	for (int i = 0; i < 300 && n > max; i++) {
		usleep(10000);
		n = raw_nfds(pid);
	}
	return n;
}

/* REGISTER (protocol 2) of one segment of @kind (@mfd sent when >= 0)
 * on @device for @nblocks blocks of the test geometry, layer l at l *
 * @off1 of segment @lseg: the reply's status (mem ids count from 1 on each
 * connection). */
static inline int raw_register_kind(int fd, int32_t device, uint32_t kind,
				    int mfd, uint64_t nblocks, uint64_t off1,
				    uint32_t nlayers, uint32_t lseg)
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

/* REGISTER memfd @mfd (-1: none sent) as host memory. */
static inline int raw_register(int fd, int mfd, uint64_t nblocks,
			       uint64_t off1, uint32_t nlayers)
{
	return raw_register_kind(fd, -1, KVTD_SEG_MEMFD, mfd, nblocks, off1,
				 nlayers, 0);
}

/* Bytes of one layer of @nb blocks of the test geometry (K then V). */
static inline uint64_t raw_layer_bytes(uint64_t nb)
{
	return 2 * nb * (SRV_P * 2 * 64 * 2);
}

/* A memfd of @nb blocks of every layer, sealed as the daemon wants, and
 * registered on @fd: the status (mem id 1 when it is the first). */
static inline int raw_register_new(int fd, uint64_t nb)
{
	uint64_t layer = raw_layer_bytes(nb);
	int mfd = memfd_create("t", MFD_CLOEXEC | MFD_ALLOW_SEALING), st;

	if (mfd < 0 || ftruncate(mfd, (off_t)(layer * SRV_L)) ||
	    fcntl(mfd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW)) {
		if (mfd >= 0)
			close(mfd);
		return -errno;
	}
	st = raw_register(fd, mfd, nb, layer, SRV_L);
	close(mfd);
	return st;
}

/* A job of @op (KVTD_MSG_LOAD, _STORE, ...) in @slot on memory @mem: one
 * page @key into / out of @block. The reply's status. */
static inline int raw_job(int fd, uint16_t op, uint32_t slot, uint32_t mem,
			  kvt_page_key key, uint32_t block)
{
	kvtd_buf b = { 0 };
	int st;

	kvtd_begin(&b, op, 30);
	kvtd_put_u32(&b, mem);
	kvtd_put_u32(&b, slot);
	kvtd_put_u32(&b, 1);
	kvtd_put_u32(&b, 0);
	kvtd_put_u32(&b, 0); /* no event */
	kvtd_put_keys(&b, &key, 1);
	kvtd_put_u32(&b, block);
	CHECK_OK(raw_send(fd, &b, NULL, 0));
	st = raw_reply(fd, NULL);
	kvtd_buf_free(&b);
	return st;
}

#endif /* KVT_TEST_RAW_UTIL_H */
