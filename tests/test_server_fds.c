/*
 * test_server_fds — descriptors as an attack before HELLO (issue 21,
 * findings 1 and 2). SCM_RIGHTS lets a peer push descriptors into the
 * daemon with any message; the daemon takes at most KVTD_MAX_FDS and the
 * kernel truncates the rest (MSG_CTRUNC). Here, without a HELLO:
 *
 *   - a header split over two sends, the first part carrying 5 fds (the
 *     kernel truncates), the second 1: once wrote fds[-1] on the
 *     connection thread's stack (the count was -1 after the truncation)
 *     and closed past the array;
 *   - whole headers with 5 fds each, on 100 connections before HELLO and
 *     200 on one after it: once leaked every fd a truncated message
 *     brought (4 a message, for good), until the daemon ran out and good
 *     clients got EOF at HELLO;
 *   - fds on payload bytes (the daemon takes fds on the header only).
 *
 * After each the daemon refuses the message with an error, holds no more
 * descriptors than before once the connections are gone, and serves a
 * good client.
 */
#include "raw_util.h"

static pid_t dpid;

/* Send @len bytes of @p with @nfds copies of @fd. */
static int send_fds(int sfd, const void *p, size_t len, int fd, int nfds)
{
	int fds[8];

	for (int i = 0; i < nfds; i++)
		fds[i] = fd;
	{
		union {
			struct cmsghdr h;
			char b[CMSG_SPACE(sizeof(fds))];
		} u;
		struct iovec iov = { (void *)p, len };
		struct msghdr mh = { .msg_iov = &iov, .msg_iovlen = 1 };

		memset(&u, 0, sizeof(u));
		if (nfds) {
			mh.msg_control = u.b;
			mh.msg_controllen = CMSG_SPACE(sizeof(int) * nfds);
			u.h.cmsg_level = SOL_SOCKET;
			u.h.cmsg_type = SCM_RIGHTS;
			u.h.cmsg_len = CMSG_LEN(sizeof(int) * nfds);
			memcpy(CMSG_DATA(&u.h), fds, sizeof(int) * nfds);
		}
		return sendmsg(sfd, &mh, MSG_NOSIGNAL) == (ssize_t)len ? 0 : -1;
	}
}

/* A LOOKUP header (no HELLO yet: refused, the connection goes on). */
static void lookup_hdr(uint8_t *h, uint32_t len)
{
	put_hdr(h, KVTD_MAGIC, KVTD_VERSION, KVTD_MSG_LOOKUP, len);
}

static void test_split_header(int pf)
{
	for (int i = 0; i < 20; i++) {
		uint8_t h[KVTD_HDR];
		int fd = raw_connect(), st;

		CHECK(fd >= 0);
		if (fd < 0)
			return;
		lookup_hdr(h, 0);
		CHECK(send_fds(fd, h, 8, pf, 5) == 0);
		usleep(2000); /* two reads on the daemon's side */
		CHECK(send_fds(fd, h + 8, 8, pf, 1) == 0);
		st = raw_reply(fd, NULL);
		if (st != KVT_EPROTO) {
			fprintf(stderr, "split header %d: reply %d, want "
				"KVT_EPROTO\n", i, st);
			kvt_test_failures++;
		}
		close(fd);
	}
}

static void test_flood(int pf)
{
	uint8_t h[KVTD_HDR];
	int fd;

	lookup_hdr(h, 0);
	/* before HELLO each refusal closes: a connection a message */
	for (int c = 0; c < 100; c++) {
		fd = raw_connect();
		CHECK(fd >= 0);
		if (fd < 0)
			return;
		CHECK(send_fds(fd, h, sizeof(h), pf, 5) == 0);
		CHECK_EQ(raw_reply(fd, NULL), KVT_EPROTO);
		CHECK(closed(fd));
		close(fd);
	}
	/* after HELLO a refusal lets the connection go on */
	fd = raw_hello();
	CHECK(fd >= 0);
	if (fd < 0)
		return;
	for (int i = 0; i < 200; i++) {
		CHECK(send_fds(fd, h, sizeof(h), pf, 5) == 0);
		CHECK_EQ(raw_reply(fd, NULL), KVT_EPROTO);
	}
	close(fd);
}

/* Fds on payload bytes: dropped (the kernel closes what no one takes). */
static void test_payload_fds(int pf)
{
	uint8_t m[KVTD_HDR + 8] = { 0 };
	int fd = raw_connect();

	CHECK(fd >= 0);
	if (fd < 0)
		return;
	lookup_hdr(m, 8);
	CHECK(send_fds(fd, m, KVTD_HDR, pf, 0) == 0);
	usleep(2000);
	CHECK(send_fds(fd, m + KVTD_HDR, 8, pf, 3) == 0);
	CHECK_EQ(raw_reply(fd, NULL), KVT_EPROTO);
	close(fd);
}

int main(void)
{
	kvtd_config cfg = { 0 };
	int pf[2], base, n;

	snprintf(sock, sizeof(sock), "/tmp/kvtd-fds-%d.sock", (int)getpid());
	model = srv_model();
	cfg.socket = sock;
	cfg.tiers = "dram:2M";
	cfg.model = model;
	cfg.page_tokens = SRV_P;
	cfg.hello_ms = 2000;
	CHECK(pipe(pf) == 0);
	dpid = srv_start(&cfg);
	CHECK(dpid > 0);
	if (dpid > 0) {
		base = raw_nfds(dpid);
		CHECK(base > 0);
		test_split_header(pf[0]);
		n = raw_nfds_settle(dpid, base);
		if (n > base) {
			fprintf(stderr, "split headers: the daemon holds %d fds, "
				"%d before\n", n, base);
			kvt_test_failures++;
		}
		still_serving();
		test_flood(pf[0]);
		n = raw_nfds_settle(dpid, base);
		if (n > base) {
			fprintf(stderr, "fd flood: the daemon holds %d fds, %d "
				"before (leaked)\n", n, base);
			kvt_test_failures++;
		}
		still_serving();
		test_payload_fds(pf[0]);
		CHECK(raw_nfds_settle(dpid, base) <= base);
		still_serving();
		CHECK_EQ(srv_stop(dpid), 0);
	}
	close(pf[0]);
	close(pf[1]);
	unlink(model);
	TEST_DONE();
}
