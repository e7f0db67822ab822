/*
 * io.h — whole protocol messages over a blocking Unix stream socket
 * (io.c). Internal to libkvtier.
 */
#ifndef KVT_SERVER_IO_H
#define KVT_SERVER_IO_H

#include "server/proto.h"

/* SO_RCVTIMEO and SO_SNDTIMEO of @fd (0: none). */
int kvtd_set_timeout(int fd, uint32_t ms);

/* Send @len bytes, @nfds (<= KVTD_MAX_FDS) descriptors with the first
 * byte. 0, -ETIMEDOUT, -EPIPE / -ECONNRESET (the peer is gone), -errno. */
int kvtd_send(int fd, const void *buf, size_t len, const int *fds, int nfds);

/*
 * Receive one message into @b (header and payload; b->len = both) and its
 * header into @h. @fds (room for KVTD_MAX_FDS, may be NULL) gets the
 * descriptors that came with it, *@nfds how many (-1: some were lost to a
 * truncated control message, and every one the message brought is closed
 * already: the caller holds none and refuses the message). Returns 0; 1
 * at a clean end of stream between messages; KVT_EPROTO for a bad header
 * (kvtd_hdr_decode(); the payload is not read); -ECONNRESET for an end in
 * the middle of a message; -ETIMEDOUT; -ENOMEM; -errno. @deadline
 * (kvt_now_ns(), 0: none) bounds the whole message, however it trickles
 * in; the socket's SO_RCVTIMEO still bounds each read.
 */
int kvtd_recv(int fd, kvtd_buf *b, kvtd_hdr *h, int *fds, int *nfds,
	      int reply, uint64_t deadline);

#endif /* KVT_SERVER_IO_H */
