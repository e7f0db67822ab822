/*
 * util.c — sizes, clocks, logging, the spinlock's slow path, small file and
 * string helpers. Nothing here allocates except kvti_read_file().
 */
#include "core/core.h"

#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

/* ---- sizes --------------------------------------------------------------- */

int kvt_size_parse(const char *s, uint64_t *out)
{
	static const char units[] = "KMGTP";
	const char *p, *u;
	char *end;
	double v, mul = 1;

	if (!s)
		return -EINVAL;
	while (isspace((unsigned char)*s))
		s++;
	if (!isdigit((unsigned char)*s) && *s != '.')
		return -EINVAL; /* also rejects '-' and '+' */
	errno = 0;
	v = strtod(s, &end);
	if (end == s || errno || !isfinite(v) || v < 0)
		return -EINVAL;
	p = end;
	if (*p) {
		u = strchr(units, toupper((unsigned char)*p));
		if (!u || !*u)
			return -EINVAL;
		mul = ldexp(1.0, 10 * (int)(u - units + 1));
		p++;
		if (*p == 'i' || *p == 'I')
			p++;
		if (*p == 'b' || *p == 'B')
			p++;
	} else if (end > s && (strchr(s, '.') || strchr(s, 'e') ||
			       strchr(s, 'E'))) {
		return -EINVAL; /* plain byte counts are integers */
	}
	while (isspace((unsigned char)*p))
		p++;
	if (*p)
		return -EINVAL;
	v *= mul;
	if (v >= 9.2e18)
		return -ERANGE;
	*out = (uint64_t)llround(v);
	return 0;
}

char *kvt_size_format(uint64_t bytes, char *buf, size_t len)
{
	static const char *units[] = { "B", "KiB", "MiB", "GiB", "TiB", "PiB" };
	double v = (double)bytes;
	size_t u = 0;

	while (v >= 1024 && u + 1 < KVT_ARRAY_SIZE(units)) {
		v /= 1024;
		u++;
	}
	if (u == 0)
		snprintf(buf, len, "%llu B", (unsigned long long)bytes);
	else
		snprintf(buf, len, "%.2f %s", v, units[u]);
	return buf;
}

/* ---- clocks ------------------------------------------------------------- */

uint64_t kvt_now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

void kvti_thread_nice(int nice)
{
	static _Atomic int warned;
	id_t tid;

	if (nice <= 0)
		return;
	tid = (id_t)syscall(SYS_gettid);
	if (setpriority(PRIO_PROCESS, tid, nice) && !atomic_exchange(&warned, 1))
		kvti_warn("thread priority: setpriority(nice %d): %s", nice,
			  strerror(errno));
}

int kvti_cond_init_mono(pthread_cond_t *cv)
{
	pthread_condattr_t a;
	int e;

	pthread_condattr_init(&a);
	pthread_condattr_setclock(&a, CLOCK_MONOTONIC);
	e = pthread_cond_init(cv, &a);
	pthread_condattr_destroy(&a);
	return -e;
}

void kvti_deadline(struct timespec *ts, int64_t ns)
{
	clock_gettime(CLOCK_MONOTONIC, ts);
	ts->tv_sec += ns / 1000000000;
	ts->tv_nsec += ns % 1000000000;
	if (ts->tv_nsec >= 1000000000) {
		ts->tv_sec++;
		ts->tv_nsec -= 1000000000;
	}
}

/* ---- logging ------------------------------------------------------------ */

static atomic_int log_level = -1; /* -1: not read from KVT_LOG yet */

static int log_level_from_env(void)
{
	static const char *names[] = { "error", "warn", "info", "debug" };
	const char *e = getenv("KVT_LOG");

	if (e)
		for (int i = 0; i < 4; i++)
			if (kvti_streq_ci(e, names[i]))
				return i;
	return KVT_LOG_WARN;
}

void kvt_log_set_level(int level)
{
	atomic_store(&log_level, level);
}

int kvt_log_get_level(void)
{
	int l = atomic_load(&log_level);

	if (l < 0) {
		l = log_level_from_env();
		atomic_store(&log_level, l);
	}
	return l;
}

void kvti_log(int level, const char *fmt, ...)
{
	static const char *tags[] = { "error", "warning", "info", "debug" };
	char line[1024];
	va_list ap;
	int n;

	if (level > kvt_log_get_level())
		return;
	n = snprintf(line, sizeof(line), "kvtier: %s: ", tags[level & 3]);
	va_start(ap, fmt);
	vsnprintf(line + n, sizeof(line) - (size_t)n, fmt, ap);
	va_end(ap);
	fprintf(stderr, "%s\n", line); /* one write per line */
}

/* ---- spinlock ----------------------------------------------------------- */

void kvti_spin_lock_slow(kvti_spin *l)
{
	for (unsigned spins = 0;; spins++) {
		if (!atomic_load_explicit(&l->v, memory_order_relaxed) &&
		    !atomic_exchange_explicit(&l->v, 1, memory_order_acquire))
			return;
		if (spins > 64)
			sched_yield();
		else
			__builtin_ia32_pause();
	}
}

/* ---- files and strings -------------------------------------------------- */

char *kvti_printable(char *dst, size_t len, const char *src, size_t srclen)
{
	size_t i;

	for (i = 0; i + 1 < len && i < srclen && src[i]; i++)
		dst[i] = src[i] >= 0x20 && src[i] < 0x7f ? src[i] : '?';
	if (len)
		dst[i] = '\0';
	return dst;
}

const char *kvti_file_strerror(int err)
{
	if (err == -ENODEV)
		return "a device, not a file";
	if (err == -EFBIG)
		return "too large";
	return kvt_strerror(err);
}

int kvti_read_file(const char *path, size_t max, char **out, size_t *len)
{
	struct stat st;
	char *buf;
	size_t cap, n = 0;
	ssize_t r;
	int fd, err;

	fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return -errno;
	if (fstat(fd, &st) < 0) {
		err = -errno;
		goto err_close;
	}
	if (S_ISDIR(st.st_mode)) {
		err = -EISDIR;
		goto err_close;
	}
	if (S_ISCHR(st.st_mode) || S_ISBLK(st.st_mode) ||
	    S_ISSOCK(st.st_mode)) {
		err = -ENODEV; /* /dev/zero would fill @max bytes first */
		goto err_close;
	}
	cap = st.st_size > 0 ? (size_t)st.st_size + 1 : 4096;
	if (cap > max + 1) {
		err = -EFBIG;
		goto err_close;
	}
	buf = kvt_malloc(cap);
	if (!buf) {
		err = -ENOMEM;
		goto err_close;
	}
	for (;;) {
		if (n + 1 >= cap) {
			char *nb;

			if (cap > max) {
				err = -EFBIG;
				goto err_free;
			}
			nb = kvt_realloc(buf, cap * 2);
			if (!nb) {
				err = -ENOMEM;
				goto err_free;
			}
			buf = nb;
			cap *= 2;
		}
		r = read(fd, buf + n, cap - 1 - n);
		if (r < 0) {
			if (errno == EINTR)
				continue;
			err = -errno;
			goto err_free;
		}
		if (r == 0)
			break;
		n += (size_t)r;
	}
	close(fd);
	buf[n] = '\0';
	*out = buf;
	if (len)
		*len = n;
	return 0;

err_free:
	kvt_free(buf);
err_close:
	close(fd);
	return err;
}

int kvti_read_u64(const char *path, uint64_t *out)
{
	char buf[64];
	ssize_t r;
	char *end;
	int fd;

	fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return -errno;
	r = read(fd, buf, sizeof(buf) - 1);
	close(fd);
	if (r <= 0)
		return r < 0 ? -errno : -EINVAL;
	buf[r] = '\0';
	errno = 0;
	*out = strtoull(buf, &end, 0);
	if (errno || end == buf)
		return -EINVAL;
	return 0;
}

int kvti_strlcpy(char *dst, const char *src, size_t n)
{
	size_t l = strlen(src);

	if (n == 0)
		return 1;
	if (l >= n) {
		memcpy(dst, src, n - 1);
		dst[n - 1] = '\0';
		return 1;
	}
	memcpy(dst, src, l + 1);
	return 0;
}

char *kvti_trim(char *s)
{
	char *e;

	while (isspace((unsigned char)*s))
		s++;
	e = s + strlen(s);
	while (e > s && isspace((unsigned char)e[-1]))
		*--e = '\0';
	return s;
}

bool kvti_streq_ci(const char *a, const char *b)
{
	return strcasecmp(a, b) == 0;
}
