/*
 * http.c — the metrics endpoint: GET /metrics over HTTP/1.1 with
 * libmicrohttpd, on an address the operator asked for (metrics.h).
 *
 * We bind the listening socket ourselves (so a bad or busy address is a
 * precise -errno, not MHD's NULL) and hand it to MHD, which serves it from
 * one internal thread with poll(). MHD closes that socket in
 * MHD_stop_daemon(). MHD's own messages go to kvtier's log (warn level).
 *
 * SLOW CLIENTS (issue 21, finding 10: 20 idle connections and a drip
 * blocked every scrape): at most HTTP_CONNS connections, HTTP_PER_IP from
 * one address, HTTP_IDLE_S idle; and a deadline MHD has not: a request
 * must arrive whole within HTTP_DEADLINE_S of the accept or of the last
 * reply on the connection, or the connection is shut down (a byte a second
 * resets MHD's idle timer, not this). A watcher thread keeps the table of
 * open connections (MHD's connection notifications add and remove them,
 * under h->mu; a reply restarts its clock) and shut()s down the late ones:
 * MHD then sees the end and closes them. An entry leaves the table (under
 * h->mu) before MHD closes its fd, so no reused fd is ever shut down.
 */
#include "server/metrics.h"

#include "core/core.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

int kvtd_http_parse_addr(const char *addr, struct sockaddr *sa,
			 unsigned *salen)
{
	struct sockaddr_in *v4 = (struct sockaddr_in *)sa;
	struct sockaddr_in6 *v6 = (struct sockaddr_in6 *)sa;
	char host[64], shown[80];
	const char *colon, *port;
	unsigned long p;
	char *end;
	size_t hl;

	if (!addr || !*addr)
		return kvti_fail(KVT_ECONFIG, "metrics address: empty (want "
				 "HOST:PORT, e.g. %s)", KVTD_METRICS_ADDR_DEFAULT);
	kvti_printable(shown, sizeof(shown), addr, strlen(addr));
	if (addr[0] == '[') {
		const char *rb = strchr(addr, ']');

		if (!rb || rb[1] != ':')
			return kvti_fail(KVT_ECONFIG, "metrics address '%s': "
					 "want [IPv6]:PORT", shown);
		hl = (size_t)(rb - addr - 1);
		if (hl >= sizeof(host))
			return kvti_fail(KVT_ECONFIG, "metrics address '%s': "
					 "host too long", shown);
		memcpy(host, addr + 1, hl);
		host[hl] = 0;
		port = rb + 2;
	} else if ((colon = strrchr(addr, ':'))) {
		hl = (size_t)(colon - addr);
		if (hl >= sizeof(host))
			return kvti_fail(KVT_ECONFIG, "metrics address '%s': "
					 "host too long", shown);
		if (memchr(addr, ':', hl))
			return kvti_fail(KVT_ECONFIG, "metrics address '%s': "
					 "write an IPv6 host in brackets, "
					 "[::1]:PORT", shown);
		memcpy(host, addr, hl);
		host[hl] = 0;
		port = colon + 1;
	} else {
		snprintf(host, sizeof(host), "127.0.0.1");
		port = addr;
	}
	errno = 0;
	p = strtoul(port, &end, 10);
	if (!*port || *end || *port == '-' || *port == '+' || errno ||
	    p > 65535)
		return kvti_fail(KVT_ECONFIG, "metrics address '%s': port "
				 "'%s' is not a number in 0..65535", shown,
				 kvti_printable(host, sizeof(host), port,
						strlen(port)));
	if (!*host)
		return kvti_fail(KVT_ECONFIG, "metrics address '%s': no host "
				 "(loopback is 127.0.0.1:%lu)", shown, p);
	memset(sa, 0, sizeof(struct sockaddr_in6));
	if (!strcmp(host, "localhost"))
		snprintf(host, sizeof(host), "127.0.0.1");
	if (addr[0] == '[') {
		if (inet_pton(AF_INET6, host, &v6->sin6_addr) != 1)
			return kvti_fail(KVT_ECONFIG, "metrics address '%s': "
					 "'%s' is not an IPv6 address", shown,
					 host);
		v6->sin6_family = AF_INET6;
		v6->sin6_port = htons((uint16_t)p);
		*salen = sizeof(*v6);
		return 0;
	}
	if (inet_pton(AF_INET, host, &v4->sin_addr) != 1)
		return kvti_fail(KVT_ECONFIG, "metrics address '%s': '%s' is "
				 "not an IPv4 address, [IPv6] or localhost "
				 "(no name lookup)", shown, host);
	v4->sin_family = AF_INET;
	v4->sin_port = htons((uint16_t)p);
	*salen = sizeof(*v4);
	return 0;
}

#ifdef KVT_HAVE_MHD

#include <microhttpd.h>
#include <pthread.h>

enum {
	HTTP_CONNS = 64,      /* connections at once */
	HTTP_PER_IP = 8,      /* from one address */
	HTTP_IDLE_S = 5,      /* MHD's idle timeout */
	HTTP_DEADLINE_S = 3,  /* a whole request, from accept or last reply */
};

/* An open connection: its fd, when its current request began. */
struct http_conn {
	int fd;         /* -1: free */
	int shut;       /* shut down at the deadline (MHD closes it next) */
	uint64_t t0;
};

struct kvtd_http {
	struct MHD_Daemon *d;
	kvtd_render_fn render;
	void *arg;
	unsigned port;
	pthread_mutex_t mu;   /* conns, stop */
	pthread_cond_t cv;
	pthread_t watcher;
	int stop, have_watcher;
	uint64_t late;        /* connections shut down at the deadline */
	struct http_conn conns[HTTP_CONNS];
};

/* MHD_OPTION_NOTIFY_CONNECTION: a connection opened (an entry with its
 * fd, *@ctx pointing at it) or closed (the entry freed, before MHD closes
 * the fd). */
static void conn_notify(void *cls, struct MHD_Connection *c, void **ctx,
			enum MHD_ConnectionNotificationCode code)
{
	kvtd_http *h = cls;
	struct http_conn *e = *ctx;

	pthread_mutex_lock(&h->mu);
	if (code == MHD_CONNECTION_NOTIFY_STARTED) {
		const union MHD_ConnectionInfo *ci = MHD_get_connection_info(
			c, MHD_CONNECTION_INFO_CONNECTION_FD);

		*ctx = NULL;
		for (int i = 0; ci && i < HTTP_CONNS; i++)
			if (h->conns[i].fd < 0) {
				h->conns[i].fd = ci->connect_fd;
				h->conns[i].shut = 0;
				h->conns[i].t0 = kvt_now_ns();
				*ctx = &h->conns[i];
				break;
			}
	} else if (e) {
		e->fd = -1;
		*ctx = NULL;
	}
	pthread_mutex_unlock(&h->mu);
}

/* A reply queued on @c: its next request's clock starts now. */
static void conn_replied(kvtd_http *h, struct MHD_Connection *c)
{
	const union MHD_ConnectionInfo *ci = MHD_get_connection_info(
		c, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
	struct http_conn *e = ci ? ci->socket_context : NULL;

	if (!e)
		return;
	pthread_mutex_lock(&h->mu);
	e->t0 = kvt_now_ns();
	pthread_mutex_unlock(&h->mu);
}

/* Shut down connections past the deadline, every 100 ms; say so at most
 * once a second (a scraper that slow is an attack or a broken client). */
static void *watcher_main(void *arg)
{
	kvtd_http *h = arg;
	const uint64_t dl = (uint64_t)HTTP_DEADLINE_S * 1000000000ull;
	uint64_t told = 0, told_at = 0;

	pthread_mutex_lock(&h->mu);
	while (!h->stop) {
		struct timespec ts;
		uint64_t now = kvt_now_ns();

		for (int i = 0; i < HTTP_CONNS; i++) {
			struct http_conn *e = &h->conns[i];

			if (e->fd < 0 || e->shut || now - e->t0 < dl)
				continue;
			shutdown(e->fd, SHUT_RDWR);
			e->shut = 1;
			h->late++;
		}
		if (h->late != told && now - told_at >= 1000000000ull) {
			kvti_warn("metrics http: %llu connections shut down so "
				  "far for not sending a whole request within "
				  "%d s", (unsigned long long)h->late,
				  HTTP_DEADLINE_S);
			told = h->late;
			told_at = now;
		}
		kvti_deadline(&ts, 100000000ll);
		pthread_cond_timedwait(&h->cv, &h->mu, &ts);
	}
	pthread_mutex_unlock(&h->mu);
	return NULL;
}

static const char text_type[] = "text/plain; version=0.0.4; charset=utf-8";

/* MHD's messages, at most one a second (every endpoint together): a
 * flood of refused connections must not flood the log. */
static void mhd_log(void *cls, const char *fmt, va_list ap)
{
	static atomic_uint_fast64_t last, skipped;
	uint64_t now = kvt_now_ns(), t = atomic_load(&last), n_skipped;
	char msg[256];
	size_t n;

	(void)cls;
	if ((t && now - t < 1000000000ull) ||
	    !atomic_compare_exchange_strong(&last, &t, now)) {
		atomic_fetch_add(&skipped, 1);
		return;
	}
	if ((n_skipped = atomic_exchange(&skipped, 0)))
		kvti_warn("metrics http: (%llu messages not shown)",
			  (unsigned long long)n_skipped);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	n = strlen(msg);
	while (n && msg[n - 1] == '\n')
		msg[--n] = 0;
	kvti_warn("metrics http: %s", msg);
}

static void body_free(void *p)
{
	kvt_free(p);
}

static enum MHD_Result reply(kvtd_http *h, struct MHD_Connection *c,
			     unsigned status, const char *msg, int allow)
{
	struct MHD_Response *r;
	enum MHD_Result ret;

	r = MHD_create_response_from_buffer(strlen(msg), (void *)msg,
					    MHD_RESPMEM_PERSISTENT);
	if (!r)
		return MHD_NO;
	MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE,
				"text/plain; charset=utf-8");
	if (allow)
		MHD_add_response_header(r, MHD_HTTP_HEADER_ALLOW, "GET, HEAD");
	ret = MHD_queue_response(c, status, r);
	MHD_destroy_response(r);
	conn_replied(h, c);
	return ret;
}

static enum MHD_Result handle(void *cls, struct MHD_Connection *c,
			      const char *url, const char *method,
			      const char *version, const char *upload,
			      size_t *upload_size, void **con_cls)
{
	kvtd_http *h = cls;
	struct MHD_Response *r;
	enum MHD_Result ret;
	char *body = NULL;
	size_t len = 0;
	int err;

	if (strcmp(method, MHD_HTTP_METHOD_GET) &&
	    strcmp(method, MHD_HTTP_METHOD_HEAD))
		return reply(h, c, MHD_HTTP_METHOD_NOT_ALLOWED,
			     "method not allowed: GET /metrics\n", 1);
	if (strcmp(url, "/metrics"))
		return reply(h, c, MHD_HTTP_NOT_FOUND,
			     "not found: kvtier serves GET /metrics\n", 0);
	err = h->render(h->arg, &body, &len);
	if (err) {
		kvti_warn("metrics http: render failed: %s", kvt_strerror(err));
		return reply(h, c, MHD_HTTP_INTERNAL_SERVER_ERROR,
			     "metrics could not be rendered\n", 0);
	}
	r = MHD_create_response_from_buffer_with_free_callback(len, body,
							       body_free);
	if (!r) {
		kvt_free(body);
		return MHD_NO;
	}
	MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, text_type);
	ret = MHD_queue_response(c, MHD_HTTP_OK, r);
	MHD_destroy_response(r);
	conn_replied(h, c);
	return ret;
}

static int is_loopback(const struct sockaddr *sa)
{
	if (sa->sa_family == AF_INET)
		return (ntohl(((const struct sockaddr_in *)sa)->sin_addr.s_addr) >>
			24) == 127;
	return IN6_IS_ADDR_LOOPBACK(&((const struct sockaddr_in6 *)sa)->sin6_addr);
}

int kvtd_http_start(kvtd_http **out, const char *addr, kvtd_render_fn render,
		    void *arg)
{
	struct sockaddr_in6 ss;
	struct sockaddr *sa = (struct sockaddr *)&ss;
	unsigned salen;
	socklen_t bl;
	kvtd_http *h;
	int fd, err, one = 1;

	*out = NULL;
	err = kvtd_http_parse_addr(addr, sa, &salen);
	if (err)
		return err;
	h = kvt_calloc(1, sizeof(*h));
	if (!h)
		return -ENOMEM;
	h->render = render;
	h->arg = arg;
	for (int i = 0; i < HTTP_CONNS; i++)
		h->conns[i].fd = -1;
	pthread_mutex_init(&h->mu, NULL);
	kvti_cond_init_mono(&h->cv);
	fd = socket(sa->sa_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (fd < 0) {
		err = kvti_fail(-errno, "metrics address '%s': socket: %s",
				addr, strerror(errno));
		goto err_free;
	}
	setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
	if (bind(fd, sa, salen) || listen(fd, 16)) {
		err = kvti_fail(-errno, "metrics address '%s': %s", addr,
				strerror(errno));
		goto err_close;
	}
	bl = sizeof(ss);
	if (getsockname(fd, sa, &bl)) {
		err = kvti_fail(-errno, "metrics address '%s': getsockname: "
				"%s", addr, strerror(errno));
		goto err_close;
	}
	h->port = ntohs(sa->sa_family == AF_INET ?
				((struct sockaddr_in *)sa)->sin_port :
				ss.sin6_port);
	h->d = MHD_start_daemon(
		MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_POLL |
			MHD_USE_ERROR_LOG,
		0, NULL, NULL, handle, h, MHD_OPTION_EXTERNAL_LOGGER, mhd_log,
		NULL, MHD_OPTION_LISTEN_SOCKET, fd,
		MHD_OPTION_CONNECTION_LIMIT, (unsigned)HTTP_CONNS,
		MHD_OPTION_PER_IP_CONNECTION_LIMIT, (unsigned)HTTP_PER_IP,
		MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)HTTP_IDLE_S,
		MHD_OPTION_NOTIFY_CONNECTION, conn_notify, h, MHD_OPTION_END);
	if (!h->d) {
		err = kvti_fail(-EIO, "metrics address '%s': libmicrohttpd "
				"could not start (see the log)", addr);
		goto err_close;
	}
	if ((err = -pthread_create(&h->watcher, NULL, watcher_main, h))) {
		MHD_stop_daemon(h->d); /* closes fd */
		err = kvti_fail(err, "metrics: thread: %s", strerror(-err));
		goto err_free;
	}
	h->have_watcher = 1;
	if (!is_loopback(sa))
		kvti_warn("metrics served on %s, not a loopback address: "
			  "anyone who can reach it reads them", addr);
	kvti_info("metrics: http://%s/metrics (port %u)", addr, h->port);
	*out = h;
	return 0;
err_close:
	close(fd);
err_free:
	pthread_mutex_destroy(&h->mu);
	pthread_cond_destroy(&h->cv);
	kvt_free(h);
	return err;
}

unsigned kvtd_http_port(const kvtd_http *h)
{
	return h ? h->port : 0;
}

void kvtd_http_stop(kvtd_http *h)
{
	if (!h)
		return;
	pthread_mutex_lock(&h->mu);
	h->stop = 1;
	pthread_cond_broadcast(&h->cv);
	pthread_mutex_unlock(&h->mu);
	if (h->have_watcher)
		pthread_join(h->watcher, NULL);
	MHD_stop_daemon(h->d); /* joins its thread, closes the socket */
	pthread_mutex_destroy(&h->mu);
	pthread_cond_destroy(&h->cv);
	kvt_free(h);
}

#else /* !KVT_HAVE_MHD */

struct kvtd_http {
	unsigned port;
};

int kvtd_http_start(kvtd_http **out, const char *addr, kvtd_render_fn render,
		    void *arg)
{
	struct sockaddr_in6 ss;
	unsigned salen;
	int err;

	*out = NULL;
	err = kvtd_http_parse_addr(addr, (struct sockaddr *)&ss, &salen);
	if (err)
		return err;
	return kvti_fail(KVT_ENOTBUILT, "metrics endpoint: this kvtier was "
			 "built without libmicrohttpd (scripts/bootstrap "
			 "installs libmicrohttpd-dev)");
}

unsigned kvtd_http_port(const kvtd_http *h)
{
	return h ? h->port : 0;
}

void kvtd_http_stop(kvtd_http *h)
{
	kvt_free(h);
}

#endif
