/*
 * metrics_util.h — helpers for the metrics tests: a checker for Prometheus
 * text exposition 0.0.4 as kvtier writes it, a sample lookup, and a tiny
 * blocking HTTP/1.1 client over a loopback socket.
 *
 * expo_check() accepts a document only if:
 *   - every line is "# HELP name text", "# TYPE name type" or a sample
 *     "name{label="value",...} value" (labels optional), ending in '\n';
 *   - each family has HELP then TYPE, once, before its samples, and its
 *     samples are contiguous (no family comes back after another began);
 *   - names are [a-zA-Z_:][a-zA-Z0-9_:]*, start with "kvtier_"; counters end
 *     in _total; histograms end in a unit (_seconds) and their samples are
 *     _bucket (with le), _sum and _count; gauges do not end in _total;
 *   - label names are [a-zA-Z_][a-zA-Z0-9_]*, not "__"-prefixed, no label
 *     twice; values use only the \\ \" \n escapes;
 *   - values parse as numbers (or +Inf/-Inf/NaN);
 *   - no series appears twice; histogram buckets of one series have
 *     increasing le, non-decreasing counts, end with le="+Inf", and _count
 *     equals the +Inf bucket.
 */
#ifndef KVT_TEST_METRICS_UTIL_H
#define KVT_TEST_METRICS_UTIL_H

#include "harness.h"

#include <arpa/inet.h>
#include <ctype.h>
#include <math.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#define EXPO_MAXLINE 1024

static int expo_name_ok(const char *s, size_t n, int label)
{
	if (!n)
		return 0;
	for (size_t i = 0; i < n; i++) {
		int c = (unsigned char)s[i];

		if (!(isalpha(c) || c == '_' || (!label && c == ':') ||
		      (i && isdigit(c))))
			return 0;
	}
	return !(label && n >= 2 && s[0] == '_' && s[1] == '_');
}

static int expo_ends(const char *s, const char *suf)
{
	size_t a = strlen(s), b = strlen(suf);

	return a >= b && !strcmp(s + a - b, suf);
}

/* Parse the labels at @p (just after '{'); writes the label set without
 * any le="..." into @key and le's value into @le (or ""). Returns the
 * character after '}' or NULL. */
static const char *expo_labels(const char *p, char *key, size_t keylen,
			       char *le, size_t lelen, char *why, size_t wn)
{
	char names[16][64];
	int nn = 0;
	size_t kl = 0;

	*le = 0;
	key[0] = 0;
	while (*p != '}') {
		const char *n0 = p;
		char val[EXPO_MAXLINE];
		size_t vl = 0;

		while (isalnum((unsigned char)*p) || *p == '_')
			p++;
		if (!expo_name_ok(n0, (size_t)(p - n0), 1) || p - n0 >= 64) {
			snprintf(why, wn, "bad label name at '%.20s'", n0);
			return NULL;
		}
		for (int i = 0; i < nn; i++)
			if (strlen(names[i]) == (size_t)(p - n0) &&
			    !strncmp(names[i], n0, (size_t)(p - n0))) {
				snprintf(why, wn, "label twice at '%.20s'", n0);
				return NULL;
			}
		if (nn == 16) {
			snprintf(why, wn, "too many labels");
			return NULL;
		}
		snprintf(names[nn++], 64, "%.*s", (int)(p - n0), n0);
		if (p[0] != '=' || p[1] != '"') {
			snprintf(why, wn, "want =\" at '%.20s'", p);
			return NULL;
		}
		p += 2;
		while (*p != '"') {
			if (!*p || *p == '\n') {
				snprintf(why, wn, "unterminated label value");
				return NULL;
			}
			if (*p == '\\') {
				if (p[1] != '\\' && p[1] != '"' && p[1] != 'n') {
					snprintf(why, wn, "bad escape \\%c", p[1]);
					return NULL;
				}
				val[vl++] = p[1] == 'n' ? '\n' : p[1];
				p += 2;
			} else {
				val[vl++] = *p++;
			}
			if (vl >= sizeof(val) - 1) {
				snprintf(why, wn, "label value too long");
				return NULL;
			}
		}
		val[vl] = 0;
		p++;
		if (!strcmp(names[nn - 1], "le")) {
			snprintf(le, lelen, "%s", val);
		} else {
			int w = snprintf(key + kl, keylen - kl, "%s=%s;",
					 names[nn - 1], val);
			if (w < 0 || (size_t)w >= keylen - kl) {
				snprintf(why, wn, "labels too long");
				return NULL;
			}
			kl += (size_t)w;
		}
		if (*p == ',')
			p++;
		else if (*p != '}') {
			snprintf(why, wn, "want , or } at '%.20s'", p);
			return NULL;
		}
	}
	return p + 1;
}

static int expo_value_ok(const char *s, double *v)
{
	char *end;

	if (!strcmp(s, "+Inf")) {
		*v = INFINITY;
		return 1;
	}
	if (!strcmp(s, "-Inf")) {
		*v = -INFINITY;
		return 1;
	}
	if (!strcmp(s, "NaN")) {
		*v = NAN;
		return 1;
	}
	*v = strtod(s, &end);
	return *s && !*end && !isspace((unsigned char)*s);
}

struct expo_fam {
	char name[128];
	char type[16];
	int help, samples;
};

/* Returns the number of samples, or -1 with @why set. */
static int expo_check(const char *text, char *why, size_t wn)
{
	struct expo_fam fam[128];
	int nf = 0, cur = -1, nsamples = 0;
	char (*seen)[256] = calloc(8192, 256);
	int nseen = 0;
	/* histogram state for the current series */
	char hkey[256] = "";
	double hle = -INFINITY, hcount = -1, hinf = -1;
	int lineno = 0, rc = -1;
	const char *p = text;

	if (!seen) {
		snprintf(why, wn, "out of memory");
		return -1;
	}
	while (*p) {
		char line[EXPO_MAXLINE];
		const char *nl = strchr(p, '\n');
		size_t len;

		lineno++;
		if (!nl) {
			snprintf(why, wn, "line %d: no final newline", lineno);
			goto out;
		}
		len = (size_t)(nl - p);
		if (len >= sizeof(line)) {
			snprintf(why, wn, "line %d: too long", lineno);
			goto out;
		}
		memcpy(line, p, len);
		line[len] = 0;
		p = nl + 1;
		if (!strncmp(line, "# HELP ", 7) || !strncmp(line, "# TYPE ", 7)) {
			int help = line[2] == 'H';
			char *name = line + 7, *sp = strchr(name, ' ');
			int f;

			if (!sp || !expo_name_ok(name, (size_t)(sp - name), 0)) {
				snprintf(why, wn, "line %d: bad %s", lineno, line);
				goto out;
			}
			*sp = 0;
			for (f = 0; f < nf; f++)
				if (!strcmp(fam[f].name, name))
					break;
			if (f == nf) {
				if (!help || nf == 128) {
					snprintf(why, wn, "line %d: TYPE before "
						 "HELP for %s", lineno, name);
					goto out;
				}
				snprintf(fam[nf].name, sizeof(fam[nf].name), "%s",
					 name);
				fam[nf].type[0] = 0;
				fam[nf].help = 1;
				fam[nf].samples = 0;
				nf++;
				cur = f;
				if (strncmp(name, "kvtier_", 7)) {
					snprintf(why, wn, "line %d: %s lacks the "
						 "kvtier_ prefix", lineno, name);
					goto out;
				}
				continue;
			}
			if (help || f != cur || fam[f].type[0] || fam[f].samples) {
				snprintf(why, wn, "line %d: %s for %s out of "
					 "place", lineno, help ? "HELP" : "TYPE",
					 name);
				goto out;
			}
			if (strcmp(sp + 1, "counter") && strcmp(sp + 1, "gauge") &&
			    strcmp(sp + 1, "histogram")) {
				snprintf(why, wn, "line %d: type '%s'", lineno,
					 sp + 1);
				goto out;
			}
			snprintf(fam[f].type, sizeof(fam[f].type), "%s", sp + 1);
			if ((strcmp(fam[f].type, "counter") == 0) !=
			    expo_ends(name, "_total")) {
				snprintf(why, wn, "line %d: %s: only counters "
					 "end in _total", lineno, name);
				goto out;
			}
			if (!strcmp(fam[f].type, "histogram") &&
			    !expo_ends(name, "_seconds")) {
				snprintf(why, wn, "line %d: histogram %s has no "
					 "unit", lineno, name);
				goto out;
			}
			continue;
		}
		if (line[0] == '#' || !line[0]) {
			snprintf(why, wn, "line %d: unexpected '%s'", lineno, line);
			goto out;
		}
		{
			char *q = line, key[256], le[64], series[256];
			const char *after;
			size_t nlen;
			double v;
			struct expo_fam *F;

			while (isalnum((unsigned char)*q) || *q == '_' || *q == ':')
				q++;
			nlen = (size_t)(q - line);
			if (!expo_name_ok(line, nlen, 0) || cur < 0) {
				snprintf(why, wn, "line %d: bad sample '%s'", lineno,
					 line);
				goto out;
			}
			F = &fam[cur];
			if (!F->type[0]) {
				snprintf(why, wn, "line %d: sample before TYPE",
					 lineno);
				goto out;
			}
			{
				char nm[128];
				int ok;

				snprintf(nm, sizeof(nm), "%.*s", (int)nlen, line);
				if (!strcmp(F->type, "histogram"))
					ok = !strncmp(nm, F->name, strlen(F->name)) &&
					     (!strcmp(nm + strlen(F->name), "_bucket") ||
					      !strcmp(nm + strlen(F->name), "_sum") ||
					      !strcmp(nm + strlen(F->name), "_count"));
				else
					ok = !strcmp(nm, F->name);
				if (!ok) {
					snprintf(why, wn, "line %d: sample %s in "
						 "family %s", lineno, nm, F->name);
					goto out;
				}
			}
			key[0] = le[0] = 0;
			after = q;
			if (*q == '{') {
				after = expo_labels(q + 1, key, sizeof(key), le,
						    sizeof(le), why, wn);
				if (!after)
					goto out;
			}
			if (*after != ' ' || !expo_value_ok(after + 1, &v)) {
				snprintf(why, wn, "line %d: bad value in '%s'",
					 lineno, line);
				goto out;
			}
			snprintf(series, sizeof(series), "%.*s|%s|%s", (int)nlen,
				 line, key, le);
			for (int i = 0; i < nseen; i++)
				if (!strcmp(seen[i], series)) {
					snprintf(why, wn, "line %d: series twice: "
						 "%s", lineno, series);
					goto out;
				}
			if (nseen < 8192)
				snprintf(seen[nseen++], 256, "%s", series);
			F->samples++;
			nsamples++;
			if (!strcmp(F->type, "histogram")) {
				const char *suf = line + strlen(F->name);

				char hk[256];

				snprintf(hk, sizeof(hk), "%s|%s", F->name, key);
				if (!strncmp(suf, "_bucket", 7)) {
					double lev;

					if (!le[0] || !expo_value_ok(le, &lev)) {
						snprintf(why, wn, "line %d: bucket "
							 "without le", lineno);
						goto out;
					}
					if (strcmp(hkey, hk)) {
						if (hinf < 0 && hkey[0]) {
							snprintf(why, wn, "line %d: "
								 "no +Inf", lineno);
							goto out;
						}
						snprintf(hkey, sizeof(hkey), "%s",
							 hk);
						hle = -INFINITY;
						hcount = -1;
						hinf = -1;
					}
					if (!(lev > hle) || v < hcount) {
						snprintf(why, wn, "line %d: buckets "
							 "not cumulative", lineno);
						goto out;
					}
					hle = lev;
					hcount = v;
					if (isinf(lev))
						hinf = v;
				} else if (le[0]) {
					snprintf(why, wn, "line %d: le outside "
						 "_bucket", lineno);
					goto out;
				} else if (!strncmp(suf, "_count", 6)) {
					if (strcmp(hkey, hk) || hinf != v) {
						snprintf(why, wn, "line %d: _count "
							 "!= +Inf bucket", lineno);
						goto out;
					}
				}
			} else if (le[0]) {
				snprintf(why, wn, "line %d: le on a %s", lineno,
					 F->type);
				goto out;
			}
		}
	}
	rc = nsamples;
out:
	free(seen);
	return rc;
}

/* The value of the sample written exactly as @series (name and labels as
 * rendered), or NAN if absent. */
static double expo_value(const char *text, const char *series)
{
	size_t n = strlen(series);
	const char *p = text;

	while (p && *p) {
		if (!strncmp(p, series, n) && p[n] == ' ')
			return strtod(p + n + 1, NULL);
		p = strchr(p, '\n');
		if (p)
			p++;
	}
	return NAN;
}

/* One HTTP/1.1 request to 127.0.0.1:@port; the whole response (headers and
 * body, NUL-terminated, malloc'ed) into *@resp; returns the status code or
 * -1. Bounded by a 5 s receive timeout. */
static int http_request(unsigned port, const char *method, const char *path,
			char **resp)
{
	struct sockaddr_in sa = { .sin_family = AF_INET };
	struct timeval tv = { .tv_sec = 5 };
	char req[512];
	size_t len = 0, cap = 65536;
	char *buf = malloc(cap);
	int fd, status = -1;
	ssize_t r;

	*resp = NULL;
	if (!buf)
		return -1;
	sa.sin_port = htons((uint16_t)port);
	sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (fd < 0)
		goto out;
	setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
	if (connect(fd, (struct sockaddr *)&sa, sizeof(sa))) {
		fprintf(stderr, "http_request: connect to port %u: %s\n", port,
			strerror(errno));
		goto out;
	}
	snprintf(req, sizeof(req), "%s %s HTTP/1.1\r\nHost: 127.0.0.1\r\n"
		 "Connection: close\r\nContent-Length: 0\r\n\r\n", method, path);
	if (send(fd, req, strlen(req), MSG_NOSIGNAL) != (ssize_t)strlen(req))
		goto out;
	/* EINTR: a signal from elsewhere in the process (io_uring task work
	 * shows as one) ends a recv with a timeout early; carry on */
	while ((r = recv(fd, buf + len, cap - len - 1, 0)) > 0 ||
	       (r < 0 && errno == EINTR)) {
		if (r < 0)
			continue;
		len += (size_t)r;
		if (len == cap - 1) {
			char *nb = realloc(buf, cap * 2);

			if (!nb)
				goto out;
			buf = nb;
			cap *= 2;
		}
	}
	buf[len] = 0;
	if (r < 0)
		fprintf(stderr, "http_request: recv: %s\n", strerror(errno));
	if (sscanf(buf, "HTTP/1.%*d %d", &status) != 1) {
		fprintf(stderr, "http_request: no status line in '%.80s'\n",
			buf);
		status = -1;
	}
	*resp = buf;
	buf = NULL;
out:
	if (fd >= 0)
		close(fd);
	free(buf);
	return status;
}

/* The body of an HTTP response (after the blank line), or "". */
static const char *http_body(const char *resp)
{
	const char *b = resp ? strstr(resp, "\r\n\r\n") : NULL;

	return b ? b + 4 : "";
}

#endif
