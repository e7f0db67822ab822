/*
 * test_server_slowloris — connections that would hold the daemon's
 * max_clients slots without being engines (issue 21, finding 4):
 *
 *   - a HELLO dripped a byte every 40 ms: hello_ms (400 here) is a
 *     deadline for the whole HELLO, not for each read, so the daemon
 *     closes the connection long before the last byte;
 *   - a HELLO that fails (wrong geometry): answered with the error, then
 *     closed (it was left open for more tries);
 *   - as another uid (a child that drops to an unused uid the tenant
 *     allows; skipped when not run as root): 16 monitor HELLOs and 12
 *     connections that say nothing, against max_clients 16. At most 2
 *     monitors a uid are served, the others are refused with an error
 *     reply (KVT_EBUSY), not a bare close; a uid holds at most 8 silent
 *     connections and 3/4 of max_clients; and root still connects an
 *     engine client and a monitor while the attacker holds what it got.
 */
#include "raw_util.h"

#include <grp.h>

#define OTHER_UID 61022

static void monitor_payload(kvtd_buf *b)
{
	kvtd_begin(b, KVTD_MSG_HELLO, 1);
	for (int i = 0; i < 10; i++)
		kvtd_put_u32(b, 0);
	kvtd_put_u16(b, 7);
	kvtd_put_bytes(b, "default", 7);
}

static void test_drip(void)
{
	kvtd_buf b = { 0 };
	int fd = raw_connect(), cut = 0, st;

	CHECK(fd >= 0);
	if (fd < 0)
		return;
	hello_payload(&b, 1, SRV_L);
	CHECK_OK(kvtd_end(&b));
	for (size_t i = 0; i < b.len && !cut; i++) {
		if (send(fd, b.p + i, 1, MSG_NOSIGNAL) != 1)
			cut = 1;
		usleep(40000);
	}
	/* all of it sent (it took ~2.5 s): the reply must not be a welcome */
	st = cut ? 1 : raw_reply(fd, NULL);
	if (st == 0) {
		fprintf(stderr, "a HELLO dripped over %zu ms was served "
			"(hello_ms 400)\n", b.len * 40);
		kvt_test_failures++;
	}
	kvtd_buf_free(&b);
	close(fd);
}

static void test_failing_hello(void)
{
	kvtd_buf b = { 0 };
	int fd = raw_connect();

	CHECK(fd >= 0);
	if (fd < 0)
		return;
	hello_payload(&b, 1, SRV_L + 1);
	CHECK_OK(raw_send(fd, &b, NULL, 0));
	CHECK_EQ(raw_reply(fd, NULL), KVT_EGEOM);
	if (!closed(fd)) {
		fprintf(stderr, "a failed HELLO left the connection open\n");
		kvt_test_failures++;
	}
	kvtd_buf_free(&b);
	close(fd);
}

/* The attacker: as OTHER_UID, take what it can; report how many monitors
 * were served and how many refused with an error reply, hold them until
 * @go is readable. */
static void attacker(int ready, int go)
{
	int fds[32], n = 0, served = 0, busy = 0, other = 0;
	kvtd_buf b = { 0 };
	char c;

	if (setgroups(0, NULL) || setresgid(OTHER_UID, OTHER_UID, OTHER_UID) ||
	    setresuid(OTHER_UID, OTHER_UID, OTHER_UID))
		_exit(3);
	monitor_payload(&b);
	if (kvtd_end(&b))
		_exit(6);
	for (int i = 0; i < 16; i++) {
		int fd = raw_connect(), st;

		if (fd < 0) {
			other++;
			continue;
		}
		kvtd_send(fd, b.p, b.len, NULL, 0); /* may fail: refused */
		st = raw_reply(fd, NULL);
		if (st == 0) {
			served++;
			fds[n++] = fd;
			continue;
		}
		if (st == KVT_EBUSY)
			busy++;
		else
			other++;
		close(fd);
	}
	for (int i = 0; i < 12; i++) { /* silent ones */
		int fd = raw_connect();

		if (fd >= 0)
			fds[n++] = fd;
	}
	{
		int rep[3] = { served, busy, other };

		if (write(ready, rep, sizeof(rep)) != sizeof(rep))
			_exit(4);
	}
	if (read(go, &c, 1) < 0)
		_exit(5);
	for (int i = 0; i < n; i++)
		close(fds[i]);
	kvtd_buf_free(&b);
	_exit(0);
}

static void test_other_uid(void)
{
	int ready[2], go[2], rep[3] = { -1, -1, -1 }, st;
	kvt_client *cl = NULL, *mon = NULL;
	kvt_client_config mc = KVT_CLIENT_CONFIG_INIT;
	pid_t pid;

	if (getuid() != 0) {
		fprintf(stderr, "not root: no other uid to attack with\n");
		return;
	}
	CHECK(pipe(ready) == 0 && pipe(go) == 0);
	pid = fork();
	if (pid == 0)
		attacker(ready[1], go[0]);
	CHECK(pid > 0);
	CHECK(read(ready[0], rep, sizeof(rep)) == sizeof(rep));
	fprintf(stderr, "attacker: %d monitors served, %d refused busy, %d "
		"other\n", rep[0], rep[1], rep[2]);
	CHECK(rep[0] >= 1 && rep[0] <= 2);
	CHECK_EQ(rep[1], 16 - rep[0]);
	/* the attacker holds its connections: root is still served, as an
	 * engine and as a monitor */
	CHECK_OK(srv_connect(&cl, sock, model, 0, 1, 0));
	mc.socket = sock;
	CHECK_OK(kvt_client_connect(&mon, &mc));
	if (mon) {
		char *js = NULL;

		CHECK_OK(kvt_client_stats(mon, &js));
		free(js);
	}
	kvt_client_close(mon);
	kvt_client_close(cl);
	CHECK(write(go[1], "x", 1) == 1);
	CHECK(waitpid(pid, &st, 0) == pid);
	CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0);
	close(ready[0]);
	close(ready[1]);
	close(go[0]);
	close(go[1]);
}

int main(void)
{
	kvtd_config cfg = { 0 };
	char tenants[64];
	pid_t d;

	snprintf(sock, sizeof(sock), "/tmp/kvtd-slow-%d.sock", (int)getpid());
	model = srv_model();
	snprintf(tenants, sizeof(tenants), "default:0,uid=%u,uid=%u",
		 (unsigned)geteuid(), OTHER_UID);
	cfg.socket = sock;
	cfg.socket_mode = 0666;
	cfg.tiers = "dram:2M";
	cfg.model = model;
	cfg.page_tokens = SRV_P;
	cfg.tenants = tenants;
	cfg.hello_ms = 400;
	cfg.max_clients = 16;
	d = srv_start(&cfg);
	CHECK(d > 0);
	if (d > 0) {
		test_drip();
		test_failing_hello();
		test_other_uid();
		still_serving();
		CHECK_EQ(srv_stop(d), 0);
	}
	unlink(model);
	TEST_DONE();
}
