/* fuzz_session — whole sessions against a live daemon (issue 21): where
 * fuzz_proto feeds one message to the decoder, this one runs kvtierd
 * itself (kvtd_open + kvtd_run in a thread of this process, so its code is
 * covered and sanitized) and lets the input script what up to four
 * clients do on real sockets, in any order:
 *
 *   op byte % 12   0 connect        1 HELLO (right, or a field changed)
 *                  2 REGISTER a real sealed memfd (sizes from the input)
 *                  3 LOAD / STORE / _EACH (slot, mem, keys, blocks)
 *                  4 CANCEL         5 RELEASE       6 LOOKUP
 *                  7 HASH           8 STATS         9 disconnect
 *                  10 raw bytes (any header, any payload)
 *                  11 a header split over two sends with descriptors
 *
 * Every reply must decode; after every input the daemon must still serve
 * a fresh client (HELLO, REGISTER, a store and a load of the same page,
 * bytes back right). Crashes, leaks and UB are ASan's and UBSan's. */
#include "fuzz.h"
#include "../raw_util.h"
#include "server/daemon_impl.h"

#include <pthread.h>

#define NCONN 4

static kvtd *dmn;
static pthread_t th;

static void *run(void *arg)
{
	(void)arg;
	kvtd_run(dmn);
	return NULL;
}

/* The daemon, once (fuzz.h's LLVMFuzzerInitialize quiets the log). */
static void setup(void)
{
	kvtd_config cfg = { 0 };

	if (dmn)
		return;
	snprintf(sock, sizeof(sock), "/tmp/kvtd-fuzz-%d.sock", (int)getpid());
	model = srv_model();
	cfg.socket = sock;
	cfg.tiers = "dram:4M";
	cfg.model = model;
	cfg.page_tokens = SRV_P;
	cfg.hello_ms = 500;
	cfg.lease_ms = 2000;
	if (kvtd_open(&dmn, &cfg) || pthread_create(&th, NULL, run, NULL)) {
		fprintf(stderr, "fuzz_session: daemon: %s\n", kvt_errdetail());
		abort();
	}
}

struct in {
	const uint8_t *p;
	size_t n, off;
};

static uint32_t take(struct in *in, int bytes)
{
	uint32_t v = 0;

	for (int i = 0; i < bytes; i++)
		v |= (uint32_t)(in->off < in->n ? in->p[in->off++] : 0) << 8 * i;
	return v;
}

/* Read one reply if one comes within 30 ms (the daemon answers in well
 * under one; a message it is still waiting the rest of gets none); it
 * must decode. */
static void reply(int fd)
{
	struct pollfd p = { .fd = fd, .events = POLLIN };
	kvtd_buf b = { 0 };
	int fds[KVTD_MAX_FDS], nfds = 0, err;
	const uint8_t *body;
	size_t blen;
	int32_t st;
	kvtd_hdr h;

	if (poll(&p, 1, 30) != 1)
		return;
	err = kvtd_recv(fd, &b, &h, fds, &nfds, 1,
			kvt_now_ns() + 2000000000ull);
	for (int i = 0; i < nfds; i++)
		close(fds[i]);
	if (!err)
		FUZZ_ASSERT(kvtd_reply_decode(b.p + KVTD_HDR, h.len, &st, NULL,
					      0, &body, &blen) == 0);
	kvtd_buf_free(&b);
}

static void job(int fd, struct in *in)
{
	static const uint16_t ops[] = { KVTD_MSG_LOAD, KVTD_MSG_STORE,
					KVTD_MSG_LOAD_EACH,
					KVTD_MSG_STORE_EACH };
	uint16_t op = ops[take(in, 1) % 4];
	uint32_t mem = take(in, 1) % 3, slot = take(in, 2) % 1100;
	uint32_t n = take(in, 1) % 9, first = take(in, 1) % (n + 2);
	kvtd_buf b = { 0 };

	kvtd_begin(&b, op, 1);
	kvtd_put_u32(&b, mem);
	kvtd_put_u32(&b, slot);
	kvtd_put_u32(&b, n);
	kvtd_put_u32(&b, first);
	kvtd_put_u32(&b, 0); /* event */
	for (uint32_t i = 0; i < n; i++) {
		kvt_page_key k = { take(in, 1), 7 };

		kvtd_put_keys(&b, &k, 1);
	}
	for (uint32_t i = first; i < n; i++)
		kvtd_put_u32(&b, take(in, 1) % 20);
	if (!raw_send(fd, &b, NULL, 0))
		reply(fd);
	kvtd_buf_free(&b);
}

static void id_op(int fd, uint16_t op, struct in *in)
{
	kvtd_buf b = { 0 };

	kvtd_begin(&b, op, 2);
	kvtd_put_u32(&b, take(in, 2) % 1100);
	if (!raw_send(fd, &b, NULL, 0))
		reply(fd);
	kvtd_buf_free(&b);
}

/* FPRINT: a scheme (0 and 256+ refused) and a fingerprint of few bits, so
 * sessions both repeat and conflict */
static void fprint(int fd, struct in *in)
{
	kvtd_buf b = { 0 };
	uint8_t fp[KVTD_FP_BYTES];

	memset(fp, (int)(take(in, 1) & 3), sizeof(fp));
	kvtd_begin(&b, KVTD_MSG_FPRINT, 4);
	kvtd_put_u32(&b, take(in, 2) % 260);
	kvtd_put_bytes(&b, fp, sizeof(fp));
	if (!raw_send(fd, &b, NULL, 0))
		reply(fd);
	kvtd_buf_free(&b);
}

static void keys_op(int fd, uint16_t op, struct in *in)
{
	uint32_t n = take(in, 1) % 16;
	kvtd_buf b = { 0 };

	kvtd_begin(&b, op, 3);
	if (op == KVTD_MSG_LOOKUP)
		kvtd_put_u32(&b, take(in, 1) & 3);
	kvtd_put_u32(&b, n);
	for (uint32_t i = 0; i < n; i++) {
		if (op == KVTD_MSG_LOOKUP) {
			kvt_page_key k = { take(in, 1), 7 };

			kvtd_put_keys(&b, &k, 1);
		} else {
			kvtd_put_u32(&b, take(in, 2));
		}
	}
	if (!raw_send(fd, &b, NULL, 0))
		reply(fd);
	kvtd_buf_free(&b);
}

static void hello(int fd, struct in *in)
{
	kvtd_buf b = { 0 };
	uint32_t mut = take(in, 1);

	hello_payload(&b, 4, SRV_L);
	if (mut & 1) /* one field changed */
		b.p[KVTD_HDR + (take(in, 1) % 40)] ^= (uint8_t)(mut | 1);
	if (!raw_send(fd, &b, NULL, 0))
		reply(fd);
	kvtd_buf_free(&b);
}

static void raw_bytes(int fd, struct in *in, int split)
{
	uint8_t m[KVTD_HDR + 64];
	uint32_t len = take(in, 1) % 64;
	int pf[2];

	put_hdr(m, KVTD_MAGIC, (uint16_t)take(in, 1) % 3,
		(uint16_t)(take(in, 1) % 16), len);
	for (uint32_t i = 0; i < len; i++)
		m[KVTD_HDR + i] = (uint8_t)take(in, 1);
	if (split && !pipe(pf)) {
		int fds[2] = { pf[0], pf[1] };

		kvtd_send(fd, m, 8, fds, 2);
		kvtd_send(fd, m + 8, KVTD_HDR - 8 + len, fds, 1);
		close(pf[0]);
		close(pf[1]);
	} else {
		kvtd_send(fd, m, KVTD_HDR + len, NULL, 0);
	}
	reply(fd);
}

/* Connections the daemon holds. */
static int nconns(void)
{
	int n;

	pthread_mutex_lock(&dmn->mu);
	n = dmn->nconns;
	pthread_mutex_unlock(&dmn->mu);
	return n;
}

/*
 * Every connection this input made is accepted and has ended. A
 * connection the input closed may still sit in the listen queue, unseen by
 * nconns; the queue is first in, first out, so once one made after them
 * all has been answered (STATS before HELLO: refused, or refused at
 * accept), the daemon has taken every earlier one. Then each must end
 * within 10 s: one that does not is the daemon's bug (a job that never
 * ends, a lost wake-up).
 */
static void drained(void)
{
	int fd = raw_connect();
	uint64_t end;
	kvtd_buf b = { 0 };

	FUZZ_ASSERT(fd >= 0);
	kvtd_begin(&b, KVTD_MSG_STATS, 9);
	if (!raw_send(fd, &b, NULL, 0)) {
		int fds[KVTD_MAX_FDS], nfds = 0;
		kvtd_hdr h;

		/* the answer, or the end of the stream: either means taken */
		kvtd_recv(fd, &b, &h, fds, &nfds, 1,
			  kvt_now_ns() + 5000000000ull);
		for (int i = 0; i < nfds; i++)
			close(fds[i]);
	}
	kvtd_buf_free(&b);
	close(fd);
	end = kvt_now_ns() + 10000000000ull;
	while (nconns() && kvt_now_ns() < end)
		usleep(1000);
	if (nconns()) {
		fprintf(stderr, "fuzz_session: %d connections still open 10 s "
			"after their clients closed\n", nconns());
		FUZZ_ASSERT(!"closed connections end");
	}
}

/* A fresh client is served right: a page stored, loaded back. */
static void still_right(void)
{
	kvt_client *cl = NULL;
	kvt_client_job *j = NULL;
	kvt_page_key k = { 0xabc, 0xdef };
	uint32_t b0 = 0, b1 = 1;
	srv_mem sm;

	if (srv_connect(&cl, sock, model, 0, 1, 0)) {
		/* say why: a refusal names its limit */
		fprintf(stderr, "fuzz_session: a fresh client: %s (%d "
			"connections open)\n", kvt_errdetail(), nconns());
		FUZZ_ASSERT(!"a fresh client is served");
	}
	FUZZ_ASSERT(srv_mem_alloc(cl, &sm, 2) == 0);
	srv_fill(&sm, 0, k);
	FUZZ_ASSERT(kvt_client_store(cl, sm.m, &k, 1, 0, &b0, &j) == 0);
	FUZZ_ASSERT(srv_job_end(j, NULL) == 0);
	FUZZ_ASSERT(kvt_client_load(cl, sm.m, &k, 1, 0, &b1, &j) == 0);
	FUZZ_ASSERT(srv_job_end(j, NULL) == 0);
	FUZZ_ASSERT(srv_holds(&sm, 1, k));
	kvt_client_close(cl);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct in in = { data, size, 0 };
	int fd[NCONN];
	static unsigned runs;

	if (size > 2048)
		return 0;
	setup();
	for (int i = 0; i < NCONN; i++)
		fd[i] = -1;
	while (in.off < in.n) {
		uint32_t op = take(&in, 1) % 13, c = take(&in, 1) % NCONN;

		if (op == 0) {
			if (fd[c] < 0)
				fd[c] = raw_connect();
			continue;
		}
		if (fd[c] < 0)
			continue;
		switch (op) {
		case 1: hello(fd[c], &in); break;
		case 2: {
			uint64_t nb = 1 + take(&in, 1) % 24;

			if (take(&in, 1) & 1)
				raw_register_new(fd[c], nb);
			else /* a memfd smaller than its layout says */
				raw_register(fd[c], -1, nb, raw_layer_bytes(nb),
					     SRV_L);
			reply(fd[c]);
			break;
		}
		case 3: job(fd[c], &in); break;
		case 4: id_op(fd[c], KVTD_MSG_CANCEL, &in); break;
		case 5: id_op(fd[c], KVTD_MSG_RELEASE, &in); break;
		case 6: keys_op(fd[c], KVTD_MSG_LOOKUP, &in); break;
		case 7: keys_op(fd[c], KVTD_MSG_HASH, &in); break;
		case 8: {
			kvtd_buf b = { 0 };

			kvtd_begin(&b, KVTD_MSG_STATS, 5);
			if (!raw_send(fd[c], &b, NULL, 0))
				reply(fd[c]);
			kvtd_buf_free(&b);
			break;
		}
		case 9: close(fd[c]); fd[c] = -1; break;
		case 10: raw_bytes(fd[c], &in, 0); break;
		case 11: raw_bytes(fd[c], &in, 1); break;
		case 12: fprint(fd[c], &in); break;
		}
	}
	for (int i = 0; i < NCONN; i++)
		if (fd[i] >= 0)
			close(fd[i]);
	/* the connection threads have freed everything before the next input
	 * (libFuzzer counts this input's allocations; and a uid's connections
	 * still waiting to say HELLO are capped, so ones left over would make
	 * the next fresh client a refusal) */
	drained();
	/* every input leaves a daemon that serves right (checked each 16th
	 * input and the first: each check costs a few milliseconds) */
	if (!(runs++ % 16))
		still_right();
	return 0;
}
