/*
 * bench_server_proc.c — the child processes of `kvtier bench server`: a
 * daemon (kvtierd in a fork, stopped by SIGTERM) and the client
 * processes, each with two pipes to this one.
 *
 *   parent --go pipe: 'g' per command--> child (kvti_bs_child_fn)
 *   parent <--back pipe: its results----  (a double per command, or the
 *                                          body's own records)
 *
 * Invariants: a child closes the parent's ends of the children of its own
 * array started before it, so closing a child's go pipe in the parent is
 * an EOF that child sees (teardown relies on it); a daemon is returned
 * only once its socket answers, and one that dies at start is -1, not a
 * pid.
 *
 * Locking: none; all of this runs before the bench starts a thread (see
 * bench_server.h, THE ORDER).
 */
#include "bench_server.h"

#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <sys/wait.h>
#include <unistd.h>

static kvtd *g_d;

static void on_term(int sig)
{
	(void)sig;
	kvtd_stop(g_d);
}

pid_t kvti_bs_daemon_start(const kvtd_config *cfg)
{
	pid_t pid = fork();

	if (pid == 0) {
		struct sigaction sa = { .sa_handler = on_term };

		if (kvtd_open(&g_d, cfg)) {
			fprintf(stderr, "kvtier bench server: daemon: %s\n",
				kvt_errdetail());
			_exit(3);
		}
		sigaction(SIGTERM, &sa, NULL);
		kvtd_run(g_d);
		kvtd_close(g_d);
		_exit(0);
	}
	for (int i = 0; pid > 0 && i < 300; i++) {
		int st;

		if (!kvt_client_wait_daemon(cfg->socket, 100))
			return pid;
		if (waitpid(pid, &st, WNOHANG) == pid)
			return -1;
	}
	return -1;
}

/* Process @id running @fn; ch[0..id) are the ones started before (their
 * pipe ends are closed in the new child, or they would never see EOF). */
int kvti_bs_child_start(struct child *ch, const struct sopt *o,
			const char *sock, uint64_t id, kvti_bs_child_fn *fn)
{
	struct child *me = &ch[id];
	int a[2], b[2];

	if (pipe(a) || pipe(b))
		return -errno;
	me->pid = fork();
	if (me->pid == 0) {
		for (uint64_t k = 0; k < id; k++) {
			close(ch[k].go);
			close(ch[k].back);
		}
		close(a[1]);
		close(b[0]);
		_exit(fn(o, sock, id, a[0], b[1]));
	}
	close(a[0]);
	close(b[1]);
	me->go = a[1];
	me->back = b[0];
	return me->pid < 0 ? -errno : 0;
}

int kvti_bs_child_read(struct child *ch, double *s)
{
	return read(ch->back, s, sizeof(*s)) == sizeof(*s) && *s >= 0 ? 0 : -1;
}

int kvti_bs_read_all(int fd, void *p, size_t n)
{
	for (size_t got = 0; got < n;) {
		ssize_t r = read(fd, (char *)p + got, n - got);

		if (r <= 0)
			return -1;
		got += (size_t)r;
	}
	return 0;
}

void kvti_bs_children_close(struct child *ch, int n)
{
	for (int i = 0; i < n; i++) {
		if (ch[i].go >= 0)
			close(ch[i].go);
		if (ch[i].back >= 0)
			close(ch[i].back);
		ch[i].go = ch[i].back = -1;
	}
}

void kvti_bs_children_reap(struct child *ch, int n)
{
	kvti_bs_children_close(ch, n);
	for (int i = 0; i < n; i++)
		waitpid(ch[i].pid, NULL, 0);
}
