/*
 * test_metrics_slowloris_threads — the metrics endpoint against slow
 * clients (issue 21, finding 10: 20 idle connections and a drip blocked
 * every scrape; MHD's idle timeout restarts at each byte). A dripper
 * thread sends one byte of a never-ending header every 200 ms on each
 * slow connection; meanwhile a scraper must get GET /metrics:
 *
 *   other address  40 slow connections from 127.0.0.2 (the per-address
 *                  limit keeps 8): a scrape from 127.0.0.1 answers at once
 *                  (before: 16 connections in all, held for ever).
 *   same address   8 slow connections from the scraper's own address
 *                  fill its share: the request deadline shuts them down
 *                  and a scrape retried meanwhile answers within the
 *                  deadline and 2 s.
 *
 * Bounded: every wait has a limit; alarm() ends a hung run.
 */
#include "harness.h"
#include "server/metrics.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

enum { MAXS = 64 };

static int slow[MAXS], nslow;
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static atomic_int stop;

static uint64_t now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

static int render(void *arg, char **body, size_t *len)
{
	(void)arg;
	if (!(*body = kvt_malloc(3)))
		return -ENOMEM;
	memcpy(*body, "ok\n", 3);
	*len = 3;
	return 0;
}

/* A connection from @src (127.0.0.x) to the endpoint, or -1. */
static int dial(const char *src, unsigned port)
{
	struct sockaddr_in a = { .sin_family = AF_INET };
	struct sockaddr_in to = { .sin_family = AF_INET,
				  .sin_port = htons((uint16_t)port) };
	int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);

	inet_pton(AF_INET, src, &a.sin_addr);
	inet_pton(AF_INET, "127.0.0.1", &to.sin_addr);
	if (fd < 0)
		return -1;
	if (bind(fd, (struct sockaddr *)&a, sizeof(a)) ||
	    connect(fd, (struct sockaddr *)&to, sizeof(to))) {
		close(fd);
		return -1;
	}
	return fd;
}

static void *dripper(void *arg)
{
	(void)arg;
	while (!atomic_load(&stop)) {
		pthread_mutex_lock(&mu);
		for (int i = 0; i < nslow; i++)
			if (slow[i] >= 0 &&
			    send(slow[i], "a", 1, MSG_NOSIGNAL | MSG_DONTWAIT) < 0 &&
			    errno != EAGAIN) {
				close(slow[i]);
				slow[i] = -1;
			}
		pthread_mutex_unlock(&mu);
		usleep(200000);
	}
	return NULL;
}

/* Open @n slow connections from @src: a request header that never ends. */
static void open_slow(const char *src, unsigned port, int n)
{
	static const char head[] = "GET /metrics HTTP/1.1\r\nHost: x\r\nX-a: ";

	pthread_mutex_lock(&mu);
	for (int i = 0; i < n && nslow < MAXS; i++) {
		int fd = dial(src, port);

		if (fd >= 0 &&
		    send(fd, head, sizeof(head) - 1, MSG_NOSIGNAL) < 0) {
			close(fd);
			fd = -1;
		}
		slow[nslow++] = fd;
	}
	pthread_mutex_unlock(&mu);
}

static void close_slow(void)
{
	pthread_mutex_lock(&mu);
	for (int i = 0; i < nslow; i++)
		if (slow[i] >= 0)
			close(slow[i]);
	nslow = 0;
	pthread_mutex_unlock(&mu);
}

/* Slow connections the endpoint still holds (not ended from its side). */
static int held(void)
{
	int n = 0;
	char b[64];

	pthread_mutex_lock(&mu);
	for (int i = 0; i < nslow; i++) {
		ssize_t r;

		if (slow[i] < 0)
			continue;
		r = recv(slow[i], b, sizeof(b), MSG_DONTWAIT);
		if (r < 0 && errno == EAGAIN)
			n++;
		else {
			close(slow[i]);
			slow[i] = -1;
		}
	}
	pthread_mutex_unlock(&mu);
	return n;
}

/* One scrape from 127.0.0.1 within @ms: 1 on a 200 with the body. */
static int scrape_once(unsigned port, int ms)
{
	static const char req[] = "GET /metrics HTTP/1.1\r\nHost: x\r\n"
				  "Connection: close\r\n\r\n";
	uint64_t end = now_ms() + (uint64_t)ms;
	char buf[1024];
	size_t got = 0;
	int fd = dial("127.0.0.1", port), ok;

	if (fd < 0)
		return 0;
	if (send(fd, req, sizeof(req) - 1, MSG_NOSIGNAL) < 0) {
		close(fd);
		return 0;
	}
	while (got < sizeof(buf) - 1) {
		struct pollfd p = { .fd = fd, .events = POLLIN };
		uint64_t t = now_ms();
		ssize_t r;

		if (t >= end || poll(&p, 1, (int)(end - t)) <= 0)
			break;
		r = recv(fd, buf + got, sizeof(buf) - 1 - got, 0);
		if (r <= 0)
			break;
		got += (size_t)r;
	}
	close(fd);
	buf[got] = 0;
	ok = !strncmp(buf, "HTTP/1.1 200", 12) && strstr(buf, "\r\n\r\nok\n");
	return ok;
}

/* Scrapes retried until one answers or @bound_ms pass: the time it took,
 * or -1. */
static long scrape(unsigned port, int bound_ms)
{
	uint64_t t0 = now_ms();

	while (now_ms() - t0 < (uint64_t)bound_ms) {
		if (scrape_once(port, 500))
			return (long)(now_ms() - t0);
		usleep(50000);
	}
	return -1;
}

int main(void)
{
	kvtd_http *h = NULL;
	pthread_t th;
	unsigned port;
	long ms;
	int st;

	alarm(60);
	st = kvtd_http_start(&h, "127.0.0.1:0", render, NULL);
	if (st == KVT_ENOTBUILT)
		SKIP("built without libmicrohttpd");
	CHECK_OK(st);
	if (!h)
		TEST_DONE();
	port = kvtd_http_port(h);
	CHECK(scrape(port, 2000) >= 0);
	pthread_create(&th, NULL, dripper, NULL);

	/* another address: the per-address limit, scrapes unhindered */
	open_slow("127.0.0.2", port, 40);
	usleep(300000);
	st = held();
	ms = scrape(port, 2000);
	fprintf(stderr, "other address: 40 slow connections, %d held; a "
		"scrape answered in %ld ms\n", st, ms);
	CHECK(st <= 8);
	CHECK(ms >= 0 && ms < 1000);
	close_slow();

	/* the scraper's own address: its share filled, the deadline frees
	 * it */
	usleep(200000);
	open_slow("127.0.0.1", port, 8);
	usleep(300000);
	st = held();
	ms = scrape(port, 3000 + 2000);
	fprintf(stderr, "same address: 8 slow connections, %d held; a "
		"scrape answered in %ld ms (deadline 3 s)\n", st, ms);
	CHECK(ms >= 0);
	usleep(500000);
	CHECK_EQ(held(), 0); /* all shut down at the deadline */

	atomic_store(&stop, 1);
	pthread_join(th, NULL);
	close_slow();
	kvtd_http_stop(h);
	TEST_DONE();
}
