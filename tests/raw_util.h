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

#include <poll.h>

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
 * descriptors that came with it are closed. */
static inline int raw_reply(int fd, uint16_t *op)
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

/* A connection that said HELLO. */
static inline int raw_hello(void)
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

/* Open descriptors of process @pid (its /proc/PID/fd), or -1. */
static inline int raw_nfds(pid_t pid)
{
	char path[64];
	struct dirent *e;
	DIR *dir;
	int n = 0;

	snprintf(path, sizeof(path), "/proc/%d/fd", (int)pid);
	if (!(dir = opendir(path)))
		return -1;
	while ((e = readdir(dir)))
		n += e->d_name[0] != '.';
	closedir(dir);
	return n;
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

#endif /* KVT_TEST_RAW_UTIL_H */
