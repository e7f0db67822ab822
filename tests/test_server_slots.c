/*
 * test_server_slots — the job-slot page a tenant gets at HELLO cannot be
 * turned against the daemon (issue 21, finding 3). The page is a memfd
 * the daemon writes through its own mapping; a client that could shrink it
 * would make the daemon's next write to it a SIGBUS (every tenant's cache
 * down), one that could write it would forge its own jobs' progress.
 *
 *   as root (in this process): the fd is sealed against shrinking,
 *     growing, further seals and future writes (F_SEAL_FUTURE_WRITE): a
 *     read-write reopen through /proc/self/fd (root may open it) cannot
 *     ftruncate, write or map it writable;
 *   as another uid (a child that drops to an unused uid; skipped with 77
 *     when not run as root): the reopen itself is refused;
 *   after each attempt the daemon writes that client's slots (a STORE
 *     job) and still serves.
 */
#include "raw_util.h"

#include <grp.h>
#include <sys/stat.h>

#define OTHER_UID 61021
#define OTHER_GID 61021

static pid_t dpid;

/* Try every way to change the page behind slot fd @sfd; the number that
 * worked (0 is right). */
static int attack(int sfd, int *reopened)
{
	char path[64];
	int rw, won = 0;
	void *p;

	snprintf(path, sizeof(path), "/proc/self/fd/%d", sfd);
	rw = open(path, O_RDWR | O_CLOEXEC);
	*reopened = rw >= 0;
	if (rw < 0)
		rw = sfd;
	if (ftruncate(rw, 1 << 20) == 0) {
		fprintf(stderr, "uid %u: growing the slot page worked\n",
			(unsigned)getuid());
		won++;
	}
	if (pwrite(rw, "x", 1, 0) == 1) {
		fprintf(stderr, "uid %u: write() to the slot page worked\n",
			(unsigned)getuid());
		won++;
	}
	p = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, rw, 0);
	if (p != MAP_FAILED) {
		fprintf(stderr, "uid %u: a writable shared map worked\n",
			(unsigned)getuid());
		munmap(p, 4096);
		won++;
	}
	/* last: a page of 0 bytes would crash the daemon's next write */
	if (ftruncate(rw, 0) == 0) {
		fprintf(stderr, "uid %u: ftruncate(0) of the slot page worked\n",
			(unsigned)getuid());
		won++;
	}
	if (rw != sfd)
		close(rw);
	return won;
}

/* HELLO, attack the slot page, then make the daemon write it (a STORE in
 * slot 0 and one in the last slot). 0 if every attack failed and the
 * connection still works. */
static int round_trip(int *reopened)
{
	int fds[2] = { -1, -1 }, fd = raw_hello_fds(fds), won, seals, bad = 0;

	if (fd < 0)
		return 1;
	seals = fcntl(fds[0], F_GET_SEALS);
	if (seals < 0 || (seals & (F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL |
				   F_SEAL_FUTURE_WRITE)) !=
			     (F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL |
			      F_SEAL_FUTURE_WRITE)) {
		fprintf(stderr, "uid %u: slot page seals %#x\n",
			(unsigned)getuid(), (unsigned)seals);
		bad++;
	}
	if ((fcntl(fds[0], F_GETFL) & O_ACCMODE) != O_RDONLY) {
		fprintf(stderr, "the slot fd is not read-only\n");
		bad++;
	}
	won = attack(fds[0], reopened);
	if (raw_register_new(fd, 4) != 0 ||
	    raw_job(fd, KVTD_MSG_STORE, 0, 1, (kvt_page_key){ 7, 8 }, 0) ||
	    raw_job(fd, KVTD_MSG_STORE, 1023, 1, (kvt_page_key){ 9, 8 }, 1)) {
		fprintf(stderr, "uid %u: jobs after the attack failed\n",
			(unsigned)getuid());
		bad++;
	}
	close(fds[0]);
	close(fds[1]);
	close(fd);
	return won + bad;
}

static int daemon_alive(void)
{
	int st;

	usleep(100000);
	return waitpid(dpid, &st, WNOHANG) == 0;
}

static void test_root(void)
{
	int reopened = 0;

	CHECK_EQ(round_trip(&reopened), 0);
	CHECK(daemon_alive());
	still_serving();
}

static void test_other_uid(void)
{
	pid_t pid;
	int st = 0;

	if (getuid() != 0) {
		fprintf(stderr, "not root: no other uid to try\n");
		return;
	}
	pid = fork();
	if (pid == 0) {
		int reopened = 0, bad;

		if (setgroups(0, NULL) || setresgid(OTHER_GID, OTHER_GID,
						    OTHER_GID) ||
		    setresuid(OTHER_UID, OTHER_UID, OTHER_UID))
			_exit(3);
		bad = round_trip(&reopened);
		if (reopened) {
			fprintf(stderr, "uid %u reopened the slot page "
				"read-write\n", (unsigned)getuid());
			bad++;
		}
		_exit(bad ? 1 : 0);
	}
	CHECK(pid > 0);
	CHECK(waitpid(pid, &st, 0) == pid);
	CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0);
	CHECK(daemon_alive());
	still_serving();
}

int main(void)
{
	kvtd_config cfg = { 0 };
	char tenants[64];

	snprintf(sock, sizeof(sock), "/tmp/kvtd-slots-%d.sock", (int)getpid());
	model = srv_model();
	snprintf(tenants, sizeof(tenants), "default:0,uid=%u,uid=%u",
		 (unsigned)geteuid(), OTHER_UID);
	cfg.socket = sock;
	cfg.socket_mode = 0666; /* the other uid connects too */
	cfg.tiers = "dram:2M";
	cfg.model = model;
	cfg.page_tokens = SRV_P;
	cfg.tenants = tenants;
	dpid = srv_start(&cfg);
	CHECK(dpid > 0);
	if (dpid > 0) {
		test_root();
		test_other_uid();
		CHECK_EQ(srv_stop(dpid), 0);
	}
	unlink(model);
	if (getuid() != 0 && !kvt_test_failures)
		SKIP("the other-uid half needs root");
	TEST_DONE();
}
