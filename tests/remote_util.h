/*
 * remote_util.h — real Redis servers for the remote tier's tests: started
 * by the test on free loopback ports in its scratch directory, killed when
 * the test ends (or dies: PR_SET_PDEATHSIG), every wait bounded.
 *
 *   rt_need_redis()            exit 77 unless redis-server and redis-cli run
 *   rt_free_port(bus)          a free loopback port (and port+10000 if @bus)
 *   rt_start(s, dir, port, …)  redis-server --port … in @dir, wait for PING
 *   rt_stop(s, sig)            kill and reap
 *   rt_cmd(port, argv…)        one command on a fresh connection
 *   rt_geom(g)                 a small geometry (16 KiB pages) for tests
 *   rt_fill(buf, n, key)       page bytes that depend on the key
 *   rt_write_key(path, s, m)   a key file holding @s, mode @m
 *   rt_open(port, key, g)      a handle on loopback @port (key=@key or none)
 */
#ifndef KVT_TEST_REMOTE_UTIL_H
#define KVT_TEST_REMOTE_UTIL_H

#include "harness.h"

#include <kvtier/remote.h>

#include <arpa/inet.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <hiredis/hiredis.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

struct rt_server {
	pid_t pid;
	int port;
	char dir[512];
};

static inline void rt_sleep_ms(int ms)
{
	struct timespec ts = { ms / 1000, (long)(ms % 1000) * 1000000L };

	nanosleep(&ts, NULL);
}

static inline void rt_need_redis(void)
{
	if (system("redis-server --version >/dev/null 2>&1") != 0 ||
	    system("redis-cli --version >/dev/null 2>&1") != 0)
		SKIP("redis-server / redis-cli not installed "
		     "(scripts/bootstrap installs them)");
}

static inline int rt_port_free(int port)
{
	struct sockaddr_in a = { .sin_family = AF_INET,
				 .sin_port = htons((uint16_t)port) };
	int fd = socket(AF_INET, SOCK_STREAM, 0), ok;

	a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	ok = fd >= 0 && bind(fd, (struct sockaddr *)&a, sizeof(a)) == 0;
	if (fd >= 0)
		close(fd);
	return ok;
}

/* A free port in 20000..54999 (so port+10000, the cluster bus, fits). */
static inline int rt_free_port(int bus)
{
	static uint64_t seed;

	if (!seed)
		seed = (uint64_t)getpid() * 0x9E3779B97F4A7C15ull ^
		       kvt_now_ns();
	for (int t = 0; t < 1000; t++) {
		int p = 20000 + (int)(test_rand(&seed) % 35000);

		if (rt_port_free(p) && (!bus || rt_port_free(p + 10000)))
			return p;
	}
	fprintf(stderr, "no free loopback port\n");
	exit(1);
}

/* One command on a fresh connection: the reply (free it) or NULL. */
static inline redisReply *rt_cmdv(int port, int argc, const char **argv,
				  const size_t *len)
{
	struct timeval tv = { 2, 0 };
	redisContext *c = redisConnectWithTimeout("127.0.0.1", port, tv);
	redisReply *r = NULL;

	if (c && !c->err) {
		redisSetTimeout(c, tv);
		r = redisCommandArgv(c, argc, argv, len);
	}
	if (c)
		redisFree(c);
	return r;
}

#define rt_cmd(port, ...)                                                   \
	rt_cmdv(port, sizeof((const char *[]){ __VA_ARGS__ }) /             \
		sizeof(const char *), (const char *[]){ __VA_ARGS__ }, NULL)

/* 1 if a command's reply is a status or string equal to @want. */
static inline int rt_reply_is(redisReply *r, const char *want)
{
	int ok = r && (r->type == REDIS_REPLY_STATUS ||
		       r->type == REDIS_REPLY_STRING) && !strcmp(r->str, want);

	if (r)
		freeReplyObject(r);
	return ok;
}

/* Start redis-server on @port in @dir with extra "--name value" arguments
 * (NULL-terminated list); wait up to 10 s for it to answer PING. */
static inline int rt_start(struct rt_server *s, const char *dir, int port,
			   const char *const *extra)
{
	char portstr[16], logf[600];
	const char *argv[64];
	int n = 0;

	snprintf(s->dir, sizeof(s->dir), "%s/%d", dir, port);
	snprintf(logf, sizeof(logf), "mkdir -p '%s'", s->dir);
	if (system(logf) != 0)
		return -1;
	snprintf(portstr, sizeof(portstr), "%d", port);
	snprintf(logf, sizeof(logf), "%s/redis.log", s->dir);
	argv[n++] = "redis-server";
	argv[n++] = "--port";
	argv[n++] = portstr;
	argv[n++] = "--bind";
	argv[n++] = "127.0.0.1";
	argv[n++] = "--save";
	argv[n++] = "";
	argv[n++] = "--appendonly";
	argv[n++] = "no";
	argv[n++] = "--dir";
	argv[n++] = s->dir;
	argv[n++] = "--logfile";
	argv[n++] = logf;
	argv[n++] = "--daemonize";
	argv[n++] = "no";
	for (int i = 0; extra && extra[i] && n < 62; i++)
		argv[n++] = extra[i];
	argv[n] = NULL;
	s->port = port;
	s->pid = fork();
	if (s->pid < 0)
		return -1;
	if (s->pid == 0) {
		prctl(PR_SET_PDEATHSIG, SIGKILL);
		execvp("redis-server", (char *const *)argv);
		_exit(127);
	}
	for (int t = 0; t < 200; t++) {
		if (rt_reply_is(rt_cmd(port, "PING"), "PONG"))
			return 0;
		if (waitpid(s->pid, NULL, WNOHANG) == s->pid) {
			s->pid = 0;
			fprintf(stderr, "redis-server on %d exited (see %s)\n",
				port, logf);
			return -1;
		}
		rt_sleep_ms(50);
	}
	fprintf(stderr, "redis-server on %d did not answer (see %s)\n", port,
		logf);
	return -1;
}

static inline void rt_stop(struct rt_server *s, int sig)
{
	if (s->pid > 0) {
		kill(s->pid, sig);
		waitpid(s->pid, NULL, 0);
	}
	s->pid = 0;
}

/* A small geometry: 4 layers, 2 heads of 64, bf16, 8-token pages: 16 KiB. */
static inline void rt_geom(kvt_geom *g, const char *name)
{
	memset(g, 0, sizeof(*g));
	snprintf(g->name, sizeof(g->name), "%s", name);
	g->layers = 4;
	g->kv_heads_total = 2;
	g->head_dim = 64;
	g->dtype_bytes = 2;
	g->page_tokens = 8;
	g->tp_size = 1;
	g->q_heads = 8;
	g->hidden = 512;
	g->params = 1000000;
	g->active_params = 1000000;
	if (kvt_geom_finish(g)) {
		fprintf(stderr, "rt_geom: %s\n", kvt_errdetail());
		exit(1);
	}
}

/* Bytes of a page that depend on its key and position. */
static inline void rt_fill(uint8_t *buf, size_t n, const kvt_page_key *k)
{
	uint64_t s = k->lo * 0x9E3779B97F4A7C15ull ^ k->hi ^ 0x1234567;

	for (size_t i = 0; i < n; i += 8) {
		uint64_t v = test_rand(&s);

		memcpy(buf + i, &v, n - i < 8 ? n - i : 8);
	}
}

/* Chained keys of a prompt: key i = (prompt id, i) mixed. */
static inline void rt_keys(kvt_page_key *k, size_t n, uint64_t prompt)
{
	for (size_t i = 0; i < n; i++) {
		uint64_t s = prompt * 1000003 + i + 1;

		k[i].lo = test_rand(&s);
		k[i].hi = test_rand(&s);
	}
}

static inline void rt_write_key(const char *path, const char *secret,
				mode_t mode)
{
	int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0600);

	CHECK(fd >= 0 && write(fd, secret, strlen(secret)) ==
			 (ssize_t)strlen(secret));
	close(fd);
	chmod(path, mode);
}

/* A handle on 127.0.0.1:@port, with key=@keyfile unless NULL; exits the
 * test if it will not open. */
static inline kvt_remote *rt_open(int port, const char *keyfile,
				  const kvt_geom *g)
{
	char spec[700];
	kvt_remote *r = NULL;

	if (keyfile)
		snprintf(spec, sizeof(spec), "redis://127.0.0.1:%d,key=%s",
			 port, keyfile);
	else
		snprintf(spec, sizeof(spec), "redis://127.0.0.1:%d", port);
	CHECK_OK(kvt_remote_open(&r, spec, g));
	if (!r)
		exit(1);
	return r;
}

#endif
