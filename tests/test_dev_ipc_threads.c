/*
 * test_dev_ipc_threads — the device interface across two processes, the
 * way the daemon and an engine use it, on the emulated device (and on
 * every CUDA GPU when there is one). The parent plays the daemon, a child
 * (this program re-executed: CUDA does not survive fork) the engine:
 *   1. memory: the engine allocates device memory and sends its handle
 *      (the memfd by SCM_RIGHTS; a CUDA IPC handle as bytes); the daemon
 *      imports it and gathers pages from its registered host memory into
 *      it; the engine reads exactly those bytes;
 *   2. ordering: the engine starts a slow copy into its memory, records an
 *      IPC event after it and sends the event; the daemon's stream waits
 *      on it, then copies the memory out: it reads the new bytes. Without
 *      the wait (emulated device: copies spend their time before their
 *      bytes land) it reads the old ones — the missing synchronisation
 *      that corrupts stored KV;
 *   3. readiness: the daemon writes a 32-bit word in a page it shares with
 *      the engine (the job slot); the engine's stream waits on the value
 *      before a copy: the copy happens only once the daemon has written.
 */
#include "harness.h"
#include "dev/dev.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#define N (4u << 20)

struct msg {
	int op;
	int err;
	uint64_t off, a, b;
	kvti_dev_handle h;
};

static int send_msg(int s, struct msg *m, int fd)
{
	struct iovec io = { .iov_base = m, .iov_len = sizeof(*m) };
	char cbuf[CMSG_SPACE(sizeof(int))];
	struct msghdr mh = { .msg_iov = &io, .msg_iovlen = 1 };

	if (fd >= 0) {
		struct cmsghdr *c;

		memset(cbuf, 0, sizeof(cbuf));
		mh.msg_control = cbuf;
		mh.msg_controllen = sizeof(cbuf);
		c = CMSG_FIRSTHDR(&mh);
		c->cmsg_level = SOL_SOCKET;
		c->cmsg_type = SCM_RIGHTS;
		c->cmsg_len = CMSG_LEN(sizeof(int));
		memcpy(CMSG_DATA(c), &fd, sizeof(int));
	}
	return sendmsg(s, &mh, 0) == (ssize_t)sizeof(*m) ? 0 : -1;
}

static int recv_msg(int s, struct msg *m, int *fd)
{
	struct iovec io = { .iov_base = m, .iov_len = sizeof(*m) };
	char cbuf[CMSG_SPACE(sizeof(int))];
	struct msghdr mh = { .msg_iov = &io, .msg_iovlen = 1,
			     .msg_control = cbuf, .msg_controllen = sizeof(cbuf) };
	struct cmsghdr *c;

	if (fd)
		*fd = -1;
	if (recvmsg(s, &mh, MSG_WAITALL) != (ssize_t)sizeof(*m))
		return -1;
	c = CMSG_FIRSTHDR(&mh);
	if (c && c->cmsg_type == SCM_RIGHTS && fd)
		memcpy(fd, CMSG_DATA(c), sizeof(int));
	if (fd && *fd >= 0)
		m->h.fd = *fd;
	return 0;
}

static void pattern(uint8_t *p, size_t n, unsigned seed)
{
	for (size_t i = 0; i < n; i++)
		p[i] = (uint8_t)(i * 31 + seed * 7 + (i >> 11));
}

enum { M_MEM = 1, M_CHECK, M_EVENT, M_GO, M_WORD, M_DONE };

/* ---- the engine (child) --------------------------------------------------- */

static int child(int s, int id)
{
	kvti_dev *d;
	kvti_dev_stream *st;
	kvti_dev_event *ev;
	uint8_t *host = malloc(N), *want = malloc(N);
	void *mem = NULL, *x = NULL;
	struct msg m = { 0 };
	uint64_t off;
	int fd, bad = 0;

	if (kvti_dev_get(id, &d) || d->ops->stream_create(d, 1, &st) ||
	    d->ops->alloc(d, 2 * N, &mem))
		return 2;
	/* 1. memory: zeroed, then the daemon gathers into it */
	memset(host, 0, N);
	if (kvti_dev_copy_sync(d, mem, host, N) ||
	    kvti_dev_export_mem(d, (uint8_t *)mem + 4096, &m.h, &off))
		return 3;
	m.op = M_MEM;
	m.off = off;
	send_msg(s, &m, m.h.kind == KVTI_DEV_H_EMU_FD ? m.h.fd : -1);
	if (recv_msg(s, &m, NULL) || m.op != M_CHECK)
		return 4;
	kvti_dev_copy_sync(d, host, mem, N);
	pattern(want, N, 1);
	/* page i of the daemon's buffer went to page i*5 % n (a
	 * permutation) after byte 4096 */
	{
		size_t pg = 65536, np = (N - 8192) / pg;

		for (size_t i = 0; i < np && !bad; i++)
			bad = memcmp(host + 4096 + ((i * 5) % np) * pg,
				     want + i * pg, pg) != 0;
		if (bad)
			fprintf(stderr, "engine: the daemon's gather did not "
				"land as placed (byte 4096: %u, want %u)\n",
				host[4096], want[0]);

	}
	/* 2. ordering: x = mem + N holds pattern 2, then a slow copy of
	 * pattern 3 over it, an IPC event after that */
	x = (uint8_t *)mem + N;
	pattern(host, N, 2);
	kvti_dev_copy_sync(d, x, host, N);
	for (int round = 0; round < 2; round++) {
		void *src;

		if (d->ops->event_create(d, KVTI_DEV_EV_IPC, &ev))
			return 5;
		if (d->ops->alloc(d, N, &src))
			return 5;
		pattern(host, N, 3 + round);
		kvti_dev_copy_sync(d, src, host, N);
		if (d->caps & KVTI_DEV_CAP_EMULATED)
			kvti_dev_emu_set_delay(d, 100u * 1000 * 1000);
		for (int k = 0; k < 2; k++) /* a long write */
			d->ops->copy(st, x, src, N);
		d->ops->event_record(ev, st);
		memset(&m, 0, sizeof(m));
		m.op = M_EVENT;
		m.a = round;
		if (kvti_dev_event_export(d, ev, &m.h))
			return 6;
		send_msg(s, &m, m.h.kind == KVTI_DEV_H_EVENT_EMU ? m.h.fd : -1);
		if (recv_msg(s, &m, NULL) || m.op != M_GO)
			return 7;
		d->ops->stream_sync(st);
		kvti_dev_emu_set_delay(d, 0);
		d->ops->event_destroy(ev);
		d->ops->free(d, src);
	}
	/* 3. readiness: map the daemon's page read-only, wait on its word */
	if (recv_msg(s, &m, &fd) || m.op != M_WORD || fd < 0)
		return 8;
	{
		uint32_t *page = mmap(NULL, 4096, PROT_READ, MAP_SHARED, fd, 0);
		kvti_dev_event *done;
		uint8_t *back;

		if (page == MAP_FAILED ||
		    d->ops->host_register(d, page, 4096, KVTI_DEV_HOST_READONLY) ||
		    d->ops->event_create(d, 0, &done))
			return 9;
		pattern(host, N, 9);
		kvti_dev_copy_sync(d, x, host, N);
		memset(host, 0, N);
		kvti_dev_copy_sync(d, mem, host, N);
		if (kvti_dev_stream_wait_value(d, st, page + 4, (7u << 20) | 5) ||
		    d->ops->copy(st, mem, x, N) ||
		    d->ops->event_record(done, st))
			return 10;
		m.op = M_WORD;
		m.a = d->ops->event_query(done); /* 0: still waiting */
		send_msg(s, &m, -1);
		if (recv_msg(s, &m, NULL) || m.op != M_DONE)
			return 11;
		if (d->ops->event_sync(done, 10ll * 1000 * 1000 * 1000))
			return 12;
		back = malloc(N);
		kvti_dev_copy_sync(d, back, mem, N);
		pattern(host, N, 9);
		if (memcmp(back, host, N)) {
			fprintf(stderr, "engine: the copy behind the value wait "
				"did not land\n");
			bad = 1;
		}
		free(back);
		d->ops->event_destroy(done);
		d->ops->host_unregister(d, page);
		munmap(page, 4096);
	}
	d->ops->free(d, mem);
	d->ops->stream_destroy(st);
	kvti_dev_put(d);
	free(host);
	free(want);
	return bad ? 1 : 0;
}

/* ---- the daemon (parent) ------------------------------------------------- */

static void parent(int s, int id, pid_t pid)
{
	kvti_dev *d;
	kvti_dev_stream *st;
	uint8_t *reg = NULL, *back = malloc(N), *want = malloc(N);
	void **dst = NULL, **src = NULL, *base = NULL, *hdev;
	void *mine = NULL;
	struct msg m;
	int fd, status = 0;

	CHECK_OK(kvti_dev_get(id, &d));
	CHECK_OK(d->ops->stream_create(d, 1, &st));
	CHECK_OK(d->ops->host_alloc(d, N, (void **)&reg));
	CHECK_OK(d->ops->host_alloc(d, 64 * sizeof(void *), (void **)&dst));
	CHECK_OK(d->ops->host_alloc(d, 64 * sizeof(void *), (void **)&src));
	CHECK_OK(d->ops->alloc(d, N, &mine));
	/* 1 */
	CHECK(!recv_msg(s, &m, &fd) && m.op == M_MEM);
	CHECK_OK(kvti_dev_import(d, &m.h, &base));
	if (fd >= 0)
		close(fd); /* the import keeps its own mapping */
	if (base && reg && dst && src) {
		size_t pg = 65536, np = (N - 8192) / pg;
		uint8_t *eng = (uint8_t *)base + m.off;

		pattern(reg, N, 1);
		CHECK_OK(kvti_dev_host_devptr(d, reg, &hdev));
		for (size_t i = 0; i < np; i++) {
			src[i] = (uint8_t *)hdev + i * pg;
			dst[i] = eng + ((i * 5) % np) * pg;
		}
		kvti_dev_gather g = { .dst = dst, .src = (const void *const *)src,
				      .n = np, .bytes = pg, .blocks = 2 };
		CHECK_OK(d->ops->gather(st, &g));
		CHECK_OK(d->ops->stream_sync(st));
	}
	m.op = M_CHECK;
	send_msg(s, &m, -1);
	/* 2: round 0 waits on the engine's event, round 1 does not */
	for (int round = 0; round < 2; round++) {
		kvti_dev_event *ev = NULL;
		int emu = d->caps & KVTI_DEV_CAP_EMULATED;

		CHECK(!recv_msg(s, &m, &fd) && m.op == M_EVENT);
		CHECK_OK(kvti_dev_event_import(d, &m.h, &ev));
		if (fd >= 0)
			close(fd);
		if (round == 0 && ev)
			CHECK_OK(d->ops->stream_wait_event(st, ev));
		if (round == 1 && !emu) { /* a GPU cannot be slowed down */
			m.op = M_GO;
			send_msg(s, &m, -1);
			d->ops->event_destroy(ev);
			continue;
		}
		CHECK_OK(d->ops->copy(st, mine, (uint8_t *)base + N, N));
		CHECK_OK(d->ops->stream_sync(st));
		CHECK_OK(kvti_dev_copy_sync(d, back, mine, N));
		pattern(want, N, 3 + round);
		if (round == 0)
			CHECK(!memcmp(back, want, N)); /* ordered: new bytes */
		else
			CHECK(memcmp(back, want, N)); /* not ordered: old */
		m.op = M_GO;
		send_msg(s, &m, -1);
		d->ops->event_destroy(ev);
	}
	/* 3: a shared page; the engine waits on word 4 */
	{
		int pfd = memfd_create("slot", MFD_CLOEXEC);
		uint32_t *page;

		CHECK(pfd >= 0 && !ftruncate(pfd, 4096));
		page = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, pfd, 0);
		CHECK(page != MAP_FAILED);
		__atomic_store_n(&page[4], (7u << 20) | 4, __ATOMIC_RELEASE);
		m.op = M_WORD;
		send_msg(s, &m, pfd);
		CHECK(!recv_msg(s, &m, NULL) && m.op == M_WORD);
		CHECK_EQ(m.a, 0); /* blocked on the word */
		usleep(100 * 1000);
		__atomic_store_n(&page[4], (7u << 20) | 5, __ATOMIC_RELEASE);
		m.op = M_DONE;
		send_msg(s, &m, -1);
		waitpid(pid, &status, 0);
		munmap(page, 4096);
		close(pfd);
	}
	CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
	if (!WIFEXITED(status) || WEXITSTATUS(status))
		fprintf(stderr, "%s: the engine process exited %d\n", d->name,
			WIFEXITED(status) ? WEXITSTATUS(status) : -1);
	kvti_dev_unimport(d, base);
	d->ops->free(d, mine);
	d->ops->host_free(d, reg);
	d->ops->host_free(d, dst);
	d->ops->host_free(d, src);
	d->ops->stream_destroy(st);
	kvti_dev_put(d);
	free(back);
	free(want);
}

static void run(const char *self, int id)
{
	int sp[2];
	pid_t pid;

	if (socketpair(AF_UNIX, SOCK_STREAM, 0, sp))
		SKIP("socketpair");
	pid = fork();
	if (pid == 0) {
		char fds[16], ids[16];

		close(sp[0]);
		snprintf(fds, sizeof(fds), "%d", sp[1]);
		snprintf(ids, sizeof(ids), "%d", id);
		execl(self, self, "--child", fds, ids, (char *)NULL);
		_exit(127);
	}
	close(sp[1]);
	parent(sp[0], id, pid);
	close(sp[0]);
}

int main(int argc, char **argv)
{
	kvti_dev *d;

	if (argc == 4 && !strcmp(argv[1], "--child"))
		return child(atoi(argv[2]), atoi(argv[3]));
	run("/proc/self/exe", KVT_DEVICE_EMU);
	if (!kvti_dev_get(0, &d)) {
		kvti_dev_put(d);
		run("/proc/self/exe", 0);
	} else {
		fprintf(stderr, "cuda: %s: the CUDA half skipped\n",
			kvt_errdetail());
	}
	TEST_DONE();
}
