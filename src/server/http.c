/*
 * http.c — the metrics endpoint: GET /metrics over HTTP/1.1 with
 * libmicrohttpd, on an address the operator asked for (metrics.h).
 *
 * We bind the listening socket ourselves (so a bad or busy address is a
 * precise -errno, not MHD's NULL) and hand it to MHD, which serves it from
 * one internal thread with poll(): at most 16 connections, 10 s idle
 * timeout. MHD closes that socket in MHD_stop_daemon(). MHD's own messages
 * go to kvtier's log (warn level).
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

struct kvtd_http {
	struct MHD_Daemon *d;
	kvtd_render_fn render;
	void *arg;
	unsigned port;
};

static const char text_type[] = "text/plain; version=0.0.4; charset=utf-8";

static void mhd_log(void *cls, const char *fmt, va_list ap)
{
	char msg[256];
	size_t n;

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

static enum MHD_Result reply(struct MHD_Connection *c, unsigned status,
			     const char *msg, int allow)
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
		return reply(c, MHD_HTTP_METHOD_NOT_ALLOWED,
			     "method not allowed: GET /metrics\n", 1);
	if (strcmp(url, "/metrics"))
		return reply(c, MHD_HTTP_NOT_FOUND,
			     "not found: kvtier serves GET /metrics\n", 0);
	err = h->render(h->arg, &body, &len);
	if (err) {
		kvti_warn("metrics http: render failed: %s", kvt_strerror(err));
		return reply(c, MHD_HTTP_INTERNAL_SERVER_ERROR,
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
		MHD_OPTION_CONNECTION_LIMIT, (unsigned)16,
		MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)10, MHD_OPTION_END);
	if (!h->d) {
		err = kvti_fail(-EIO, "metrics address '%s': libmicrohttpd "
				"could not start (see the log)", addr);
		goto err_close;
	}
	if (!is_loopback(sa))
		kvti_warn("metrics served on %s, not a loopback address: "
			  "anyone who can reach it reads them", addr);
	kvti_info("metrics: http://%s/metrics (port %u)", addr, h->port);
	*out = h;
	return 0;
err_close:
	close(fd);
err_free:
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
	MHD_stop_daemon(h->d); /* joins its thread, closes the socket */
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
