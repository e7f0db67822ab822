/*
 * io.c — moving whole protocol messages over a Unix stream socket, with
 * file descriptors (SCM_RIGHTS) riding on the header's first byte. Both
 * sides use blocking sockets: the daemon has a thread per connection, the
 * client one request at a time. Timeouts are the socket's SO_RCVTIMEO /
 * SO_SNDTIMEO, or a deadline for a whole message (kvtd_recv()'s: a peer
 * that drips a byte at a time cannot stretch it), and come back as
 * -ETIMEDOUT.
 */
#include "server/io.h"
#include "core/core.h"

#include <errno.h>
#include <limits.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

int kvtd_set_timeout(int fd, uint32_t ms)
{
	struct timeval tv = { .tv_sec = ms / 1000,
			      .tv_usec = (ms % 1000) * 1000 };

	if (setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv)) ||
	    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv)))
		return kvti_fail(-errno, "socket timeout: %s", strerror(errno));
	return 0;
}

int kvtd_send(int fd, const void *buf, size_t len, const int *fds, int nfds)
{
	const uint8_t *p = buf;
	size_t off = 0;

	while (off < len) {
		union {
			struct cmsghdr h;
			char b[CMSG_SPACE(sizeof(int) * KVTD_MAX_FDS)];
		} u;
		struct iovec iov = { (void *)(p + off), len - off };
		struct msghdr mh = { .msg_iov = &iov, .msg_iovlen = 1 };
		ssize_t n;

		if (off == 0 && nfds > 0) {
			memset(&u, 0, sizeof(u));
			mh.msg_control = u.b;
			mh.msg_controllen = CMSG_SPACE(sizeof(int) * nfds);
			u.h.cmsg_level = SOL_SOCKET;
			u.h.cmsg_type = SCM_RIGHTS;
			u.h.cmsg_len = CMSG_LEN(sizeof(int) * nfds);
			memcpy(CMSG_DATA(&u.h), fds, sizeof(int) * nfds);
		}
		n = sendmsg(fd, &mh, MSG_NOSIGNAL);
		if (n < 0) {
			if (errno == EINTR)
				continue;
			if (errno == EAGAIN || errno == EWOULDBLOCK)
				return kvti_fail(-ETIMEDOUT, "send: timed out");
			return kvti_fail(-errno, "send: %s", strerror(errno));
		}
		off += (size_t)n;
	}
	return 0;
}

/* Wait until @fd is readable or @deadline (kvt_now_ns(); 0: no deadline,
 * the socket's own timeout applies): 0 or -ETIMEDOUT. */
static int wait_readable(int fd, uint64_t deadline)
{
	for (;;) {
		struct pollfd p = { .fd = fd, .events = POLLIN };
		uint64_t now = kvt_now_ns();
		int ms, n;

		if (!deadline)
			return 0;
		if (now >= deadline)
			return -ETIMEDOUT;
		ms = (int)KVT_MIN((deadline - now + 999999) / 1000000,
				  (uint64_t)INT_MAX);
		n = poll(&p, 1, ms);
		if (n > 0)
			return 0;
		if (n < 0 && errno != EINTR)
			return -errno;
	}
}

/* Read exactly @len bytes (the first read may bring fds) by @deadline. 0;
 * 1 for a clean end of stream before any byte (when @eof_ok); -ECONNRESET
 * for an end in the middle; -ETIMEDOUT; -errno. */
static int recv_all(int fd, uint8_t *p, size_t len, int *fds, int *nfds,
		    int eof_ok, uint64_t deadline)
{
	size_t off = 0;

	while (off < len) {
		union {
			struct cmsghdr h;
			char b[CMSG_SPACE(sizeof(int) * (KVTD_MAX_FDS + 2))];
		} u;
		struct iovec iov = { p + off, len - off };
		struct msghdr mh = { .msg_iov = &iov, .msg_iovlen = 1 };
		ssize_t n;
		int err;

		if (fds) {
			mh.msg_control = u.b;
			mh.msg_controllen = sizeof(u.b);
		}
		if ((err = wait_readable(fd, deadline)))
			return err;
		n = recvmsg(fd, &mh, MSG_CMSG_CLOEXEC);
		if (n < 0) {
			if (errno == EINTR)
				continue;
			if (errno == EAGAIN || errno == EWOULDBLOCK)
				return -ETIMEDOUT;
			return -errno;
		}
		if (fds) {
			for (struct cmsghdr *c = CMSG_FIRSTHDR(&mh); c;
			     c = CMSG_NXTHDR(&mh, c)) {
				size_t k;

				if (c->cmsg_level != SOL_SOCKET ||
				    c->cmsg_type != SCM_RIGHTS)
					continue;
				k = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
				for (size_t i = 0; i < k; i++) {
					int f;

					memcpy(&f, CMSG_DATA(c) + i * sizeof(int),
					       sizeof(int));
					/* more than any op, or the message is
					 * already refused: not ours to keep */
					if (*nfds >= 0 && *nfds < KVTD_MAX_FDS)
						fds[(*nfds)++] = f;
					else
						close(f);
				}
			}
			if ((mh.msg_flags & MSG_CTRUNC) && *nfds >= 0) {
				/* fds were lost: refuse the message, keep none
				 * of what it brought (nor what a later read of
				 * it brings: *nfds stays -1) */
				for (int i = 0; i < *nfds; i++)
					close(fds[i]);
				*nfds = -1;
			}
		}
		if (n == 0)
			return off == 0 && eof_ok ? 1 : -ECONNRESET;
		off += (size_t)n;
	}
	return 0;
}

int kvtd_recv(int fd, kvtd_buf *b, kvtd_hdr *h, int *fds, int *nfds,
	      int reply, uint64_t deadline)
{
	uint8_t hdr[KVTD_HDR];
	int err, n = 0;

	if (nfds)
		*nfds = 0;
	err = recv_all(fd, hdr, KVTD_HDR, fds, nfds ? nfds : &n, 1, deadline);
	if (err == 1)
		return 1;
	if (err == -ECONNRESET)
		return kvti_fail(err, "connection closed in a message header");
	if (err)
		return kvti_fail(err, "receive: %s", strerror(-err));
	if ((err = kvtd_hdr_decode(hdr, h, reply)))
		return err;
	b->len = 0;
	b->err = 0;
	kvtd_put_bytes(b, hdr, KVTD_HDR);
	if (b->err)
		return b->err;
	if (h->len) {
		/* grow, then read the payload in place */
		size_t need = KVTD_HDR + (size_t)h->len;

		if (b->cap < need) {
			uint8_t *q = realloc(b->p, need);
			if (!q)
				return -ENOMEM;
			b->p = q;
			b->cap = need;
		}
		err = recv_all(fd, b->p + KVTD_HDR, h->len, NULL, NULL, 0,
			       deadline);
		if (err == -ECONNRESET)
			return kvti_fail(err, "connection closed in a %s "
					 "message", kvtd_msg_name(h->op));
		if (err)
			return kvti_fail(err, "receive: %s", strerror(-err));
		b->len = need;
	}
	return 0;
}
