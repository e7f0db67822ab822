/*
 * remote.c — the remote tier (include/kvtier/remote.h): pages as values in
 * Redis / Valkey, standalone or cluster, over hiredis' blocking API with
 * pipelining.
 *
 * One call = one batch of pages, run in rounds:
 *
 *   pending pages --route (slot map / redirect target)--> per-node queues
 *        ^                                                    |
 *        |        append every queued command (ASKING first   v
 *        |        where asked), flush every node, then read every reply
 *        |                                                    |
 *        +--- MOVED / ASK (at most KVTI_RHOPS_MAX per page) --+--> done:
 *                                                 hit / miss / failure
 *
 * A node that fails (connect, write, read, timeout, an error reply other
 * than a redirect) fails its pages of the round, is dropped (reconnect
 * backed off) and the slot map is reloaded before the next call's first
 * round. Per node a window of window_bytes (spec option window=, default
 * 16 MiB) of values is in flight: a GET or SET is sent as soon as an
 * earlier one's reply is read, so neither side ever buffers a whole batch
 * of large pages (see docs/REMOTE.md for why that matters).
 */
#include "remote/remote_impl.h"
#include "xfer/xxh.h"

#include <ctype.h>
#include <errno.h>
#include <sodium.h>
#include <sys/stat.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- the spec --------------------------------------------------------- */

/* Copy @text into @out with every auth= value hidden. */
static void redact(char *out, size_t len, const char *text)
{
	const char *start = text;
	size_t n = 0;

	out[0] = 0;
	while (*text && n + 9 < len) {
		if (!strncmp(text, "auth=", 5) &&
		    (text == start || text[-1] == ',')) {
			memcpy(out + n, "auth=***", 8);
			n += 8;
			text += strcspn(text, ",");
		} else {
			out[n++] = *text++;
		}
		out[n] = 0;
	}
}

static int spec_fail(const char *text, const char *fmt, const char *part)
{
	char r[160], t[160], p[96];

	redact(r, sizeof(r), text);
	kvti_printable(t, sizeof(t), r, strlen(r));
	kvti_printable(p, sizeof(p), part, strlen(part));
	return kvti_fail(KVT_ESPEC, "remote spec '%s': %s '%s'", t, fmt, p);
}

static int parse_addr(const char *text, const char *tok, struct kvti_raddr *a)
{
	const char *colon = strrchr(tok, ':');
	char *end;
	long p;

	if (tok[0] == '[')
		return spec_fail(text, "IPv6 addresses are not supported:", tok);
	if (!colon || colon == tok)
		return spec_fail(text, "expected HOST:PORT, got", tok);
	if ((size_t)(colon - tok) >= sizeof(a->host))
		return spec_fail(text, "host name too long:", tok);
	for (const char *c = tok; c < colon; c++)
		if (!isalnum((unsigned char)*c) && *c != '.' && *c != '-' &&
		    *c != '_')
			return spec_fail(text, "bad host name in", tok);
	errno = 0;
	p = strtol(colon + 1, &end, 10);
	if (end == colon + 1 || *end || errno || p < 1 || p > 65535)
		return spec_fail(text, "bad port (1..65535) in", tok);
	memcpy(a->host, tok, (size_t)(colon - tok));
	a->host[colon - tok] = 0;
	a->port = (int)p;
	return 0;
}

/* A value of printable ASCII without blanks, commas, braces or quotes. */
static int word_ok(const char *v, size_t max)
{
	size_t n = strlen(v);

	if (!n || n > max)
		return 0;
	for (; *v; v++)
		if (*v <= ' ' || *v > '~' || strchr(",{}=\"'", *v))
			return 0;
	return 1;
}

static int parse_ms(const char *v, uint64_t unit_ms, uint64_t max_ms,
		    uint64_t *out)
{
	char *end;
	unsigned long long x;
	uint64_t mul = unit_ms;

	if (!isdigit((unsigned char)*v))
		return -1;
	errno = 0;
	x = strtoull(v, &end, 10);
	if (errno)
		return -1;
	if (!strcmp(end, "ms"))
		mul = 1;
	else if (!strcmp(end, "s"))
		mul = 1000;
	else if (!strcmp(end, "m"))
		mul = 60000;
	else if (!strcmp(end, "h"))
		mul = 3600000;
	else if (!strcmp(end, "d"))
		mul = 86400000;
	else if (*end)
		return -1;
	if (x > max_ms / mul)
		return -1;
	*out = x * mul;
	return 0;
}

static int spec_option(const char *text, struct kvti_rspec *s, char *tok)
{
	char *eq = strchr(tok, '=');
	const char *k = tok, *v;
	uint64_t x;

	*eq = 0;
	v = eq + 1;
	if (!strcmp(k, "prefix")) {
		if (!word_ok(v, 64))
			return spec_fail(text, "prefix must be 1..64 printable "
					 "characters without blanks, commas, "
					 "braces or '=':", v);
		kvti_strlcpy(s->prefix, v, sizeof(s->prefix));
	} else if (!strcmp(k, "ns")) {
		if (!word_ok(v, 128))
			return spec_fail(text, "ns must be 1..128 printable "
					 "characters without blanks, commas, "
					 "braces or '=':", v);
		kvti_strlcpy(s->ns, v, sizeof(s->ns));
	} else if (!strcmp(k, "ttl")) {
		if (parse_ms(v, 1000, 10ull * 365 * 86400000, &s->ttl_ms))
			return spec_fail(text, "ttl must be a duration such as "
					 "3600, 90s, 30m, 12h, 7d (at most "
					 "10 years), got", v);
	} else if (!strcmp(k, "timeout")) {
		if (parse_ms(v, 1, 600000, &x) || !x)
			return spec_fail(text, "timeout must be 1..600000 ms "
					 "(or 2s, 1m), got", v);
		s->timeout_ms = (uint32_t)x;
	} else if (!strcmp(k, "auth")) {
		const char *colon = strchr(v, ':');

		if (!*v || strlen(v) >= sizeof(s->pass) ||
		    (colon && (colon == v || (size_t)(colon - v) >=
						     sizeof(s->user))))
			return spec_fail(text, "auth must be PASS or USER:PASS, "
					 "got", "(hidden)");
		s->auth = 1;
		if (colon) {
			memcpy(s->user, v, (size_t)(colon - v));
			s->user[colon - v] = 0;
			kvti_strlcpy(s->pass, colon + 1, sizeof(s->pass));
		} else {
			kvti_strlcpy(s->pass, v, sizeof(s->pass));
		}
	} else if (!strcmp(k, "db")) {
		if (parse_ms(v, 1, 1023, &x) || strchr(v, 's') ||
		    strchr(v, 'm') || strchr(v, 'h') || strchr(v, 'd'))
			return spec_fail(text, "db must be 0..1023, got", v);
		if (s->cluster && x)
			return spec_fail(text, "a cluster has only db 0:", v);
		s->db = (int)x;
	} else if (!strcmp(k, "window")) {
		if (kvt_size_parse(v, &x) || x > (1ull << 40))
			return spec_fail(text, "window must be a size such as "
					 "16M (0: a whole batch at once), got",
					 v);
		s->window = x;
	} else if (!strcmp(k, "tag")) {
		if (!strcmp(v, "ns"))
			s->tag_ns = 1;
		else if (!strcmp(v, "none"))
			s->tag_ns = 0;
		else
			return spec_fail(text, "tag must be none or ns, got", v);
	} else if (!strcmp(k, "key")) {
		if (!*v || strlen(v) >= sizeof(s->keyfile))
			return spec_fail(text, "key must be the path of a key "
					 "file (1..255 bytes), got", v);
		kvti_strlcpy(s->keyfile, v, sizeof(s->keyfile));
	} else if (!strcmp(k, "tls")) {
		return kvti_fail(KVT_ENOTBUILT, "remote spec: TLS is not built "
				 "(Debian's hiredis 0.14 has no TLS)");
	} else {
		*eq = '=';
		return spec_fail(text, "unknown option (prefix, ns, ttl, auth, "
				 "timeout, db, tag, window, key):", tok);
	}
	return 0;
}

int kvti_remote_spec_parse(const char *text, struct kvti_rspec *s)
{
	static const struct {
		const char *scheme;
		int cluster;
	} schemes[] = {
		{ "redis://", 0 },         { "valkey://", 0 },
		{ "redis-cluster://", 1 }, { "valkey-cluster://", 1 },
	};
	const char *p = text;
	char *copy, *tok, *save = NULL;
	int err = 0, found = -1;

	kvti_errclear();
	memset(s, 0, sizeof(*s));
	kvti_strlcpy(s->prefix, "kvt:", sizeof(s->prefix));
	s->timeout_ms = 2000;
	s->window = KVTI_RWINDOW_BYTES;
	if (!text || !*text)
		return kvti_fail(KVT_ESPEC, "remote spec: empty (e.g. "
				 "remote:redis://127.0.0.1:6379)");
	if (!strncmp(p, "remote:", 7))
		p += 7;
	if (!strncmp(p, "rediss://", 9) || !strncmp(p, "valkeys://", 10))
		return kvti_fail(KVT_ENOTBUILT, "remote spec: TLS is not built "
				 "(Debian's hiredis 0.14 has no TLS)");
	for (size_t i = 0; i < KVT_ARRAY_SIZE(schemes); i++)
		if (!strncmp(p, schemes[i].scheme, strlen(schemes[i].scheme))) {
			found = (int)i;
			p += strlen(schemes[i].scheme);
			break;
		}
	if (found < 0)
		return spec_fail(text, "expected redis://HOST:PORT or "
				 "redis-cluster://HOST:PORT,..., got", text);
	s->cluster = schemes[found].cluster;
	if (!(copy = kvt_strdup(p)))
		return -ENOMEM;
	for (tok = strtok_r(copy, ",", &save); tok && !err;
	     tok = strtok_r(NULL, ",", &save)) {
		if (strchr(tok, '=')) {
			err = spec_option(text, s, tok);
		} else if (s->nseeds && !s->cluster) {
			err = spec_fail(text, "redis:// takes one HOST:PORT "
					"(a cluster is redis-cluster://), got a "
					"second", tok);
		} else if (s->nseeds == KVTI_RSEEDS_MAX) {
			err = spec_fail(text, "too many seed nodes (64) at", tok);
		} else {
			err = parse_addr(text, tok, &s->seeds[s->nseeds]);
			s->nseeds += !err;
		}
	}
	kvt_free(copy);
	if (!err && !s->nseeds)
		err = spec_fail(text, "no HOST:PORT in", text);
	return err;
}

/* ---- the value format ------------------------------------------------- */

static void put64(uint8_t *p, uint64_t v)
{
	for (int i = 0; i < 8; i++)
		p[i] = (uint8_t)(v >> (8 * i));
}

static uint64_t get64(const uint8_t *p)
{
	uint64_t v = 0;

	for (int i = 7; i >= 0; i--)
		v = v << 8 | p[i];
	return v;
}

static void put32(uint8_t *p, uint32_t v)
{
	for (int i = 0; i < 4; i++)
		p[i] = (uint8_t)(v >> (8 * i));
}

static uint32_t get32(const uint8_t *p)
{
	return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 |
	       (uint32_t)p[3] << 24;
}

void kvti_remote_fmt(struct kvti_rfmt *f, const kvt_geom *g, const char *ns)
{
	uint32_t v[9] = { g->layers,      g->kv_heads_total, g->kv_heads,
			  g->head_dim,    g->dtype_bytes,    g->page_tokens,
			  g->tp_size,     g->tp_rank,        g->mla };
	uint8_t b[36];

	for (int i = 0; i < 9; i++)
		put32(b + 4 * i, v[i]);
	f->geom_hash = XXH3_64bits(b, sizeof(b));
	f->ns_hash = XXH3_64bits(ns, strlen(ns));
	f->page_bytes = kvt_geom_page_bytes(g);
	f->nsums = g->layers;
	f->layer_bytes = f->page_bytes / g->layers;
	f->mac = 0;
}

static uint64_t head_sum(const struct kvti_rfmt *f, const uint8_t *h)
{
	XXH3_state_t st;

	XXH3_64bits_reset(&st);
	XXH3_64bits_update(&st, h, 56);
	XXH3_64bits_update(&st, h + KVT_REMOTE_HDR, 8ull * f->nsums);
	return XXH3_64bits_digest(&st);
}

void kvti_remote_head_write(const struct kvti_rfmt *f, const kvt_page_key *key,
			    const uint64_t *sums, uint8_t *out)
{
	memcpy(out, "KVTR", 4);
	out[4] = KVT_REMOTE_VERSION;
	out[5] = 0;
	out[6] = KVT_REMOTE_HDR;
	out[7] = 0;
	put64(out + 8, f->geom_hash);
	put64(out + 16, f->ns_hash);
	put64(out + 24, key->lo);
	put64(out + 32, key->hi);
	put64(out + 40, f->page_bytes);
	put32(out + 48, f->nsums);
	put32(out + 52, f->mac ? KVT_REMOTE_F_MAC : 0);
	for (uint32_t l = 0; l < f->nsums; l++)
		put64(out + KVT_REMOTE_HDR + 8 * l, sums[l]);
	put64(out + 56, head_sum(f, out));
}

int kvti_remote_head_check(const struct kvti_rfmt *f, const kvt_page_key *key,
			   const void *v, size_t len, const char **why)
{
	const uint8_t *h = v;
	const char *w = NULL;

	if (len < KVT_REMOTE_HDR)
		w = "shorter than a header";
	else if (memcmp(h, "KVTR", 4))
		w = "magic";
	else if (h[4] != KVT_REMOTE_VERSION || h[5])
		w = "version";
	else if (h[6] != KVT_REMOTE_HDR || h[7])
		w = "header size";
	else if (get64(h + 8) != f->geom_hash)
		w = "geometry";
	else if (get64(h + 16) != f->ns_hash)
		w = "namespace";
	else if (get64(h + 24) != key->lo || get64(h + 32) != key->hi)
		w = "page key";
	else if (get64(h + 40) != f->page_bytes || get32(h + 48) != f->nsums)
		w = "page size";
	else if (get32(h + 52) != (f->mac ? KVT_REMOTE_F_MAC : 0))
		w = f->mac ? "not authenticated (this node has a key)" :
			     "authenticated (this node has no key)";
	else if (len != kvti_remote_value_len(f))
		w = "value length";
	else if (get64(h + 56) != head_sum(f, h))
		w = "header checksum";
	if (why)
		*why = w;
	return w ? KVT_ECORRUPT : 0;
}

int kvti_remote_value_take(const struct kvti_rfmt *f, const void *v,
			   void *dst, uint64_t *sums)
{
	const uint8_t *h = v, *page = h + kvti_remote_head_bytes(f);

	for (uint32_t l = 0; l < f->nsums; l++) {
		uint8_t *d = (uint8_t *)dst + l * f->layer_bytes;
		uint64_t s;

		memcpy(d, page + l * f->layer_bytes, f->layer_bytes);
		s = XXH3_64bits(d, f->layer_bytes);
		if (s != get64(h + KVT_REMOTE_HDR + 8 * l))
			return KVT_ECORRUPT;
		if (sums)
			sums[l] = s;
	}
	return 0;
}

/* ---- open and close ----------------------------------------------------- */

int kvt_remote_open(kvt_remote **out, const char *spec, const kvt_geom *g)
{
	kvt_remote *r;
	int err;

	kvti_errclear();
	if (!out || !g)
		return kvti_fail(-EINVAL, "kvt_remote_open: NULL argument");
	if (!(r = kvt_calloc(1, sizeof(*r))))
		return -ENOMEM;
	if ((err = kvti_remote_spec_parse(spec, &r->spec)))
		goto err_free;
	r->g = *g;
	if ((err = kvt_geom_finish(&r->g)))
		goto err_free;
	if (!r->spec.ns[0])
		kvti_strlcpy(r->spec.ns, r->g.name[0] ? r->g.name : "default",
			     sizeof(r->spec.ns));
	kvti_remote_fmt(&r->fmt, &r->g, r->spec.ns);
	if ((err = kvti_remote_load_key(r)))
		goto err_free;
	r->value_bytes = kvti_remote_value_len(&r->fmt);
	r->window_bytes = r->spec.window;
	if ((err = pthread_mutex_init(&r->mu, NULL))) {
		err = -err;
		goto err_free;
	}
	err = -ENOMEM;
	/* room for a MAC: a tenant's own key may add one (mac.c) */
	if (!(r->scratch = kvt_malloc(r->value_bytes +
				      (r->fmt.mac ? 0 : KVTI_RMAC_BYTES))) ||
	    !(r->lsums = kvt_malloc(8ull * r->fmt.nsums)))
		goto err_mutex;
	if (r->spec.cluster) {
		if (!(r->slots = kvt_malloc(KVTI_RSLOTS * sizeof(*r->slots))))
			goto err_mutex;
		for (int s = 0; s < KVTI_RSLOTS; s++)
			r->slots[s] = -1;
	}
	for (size_t i = 0; i < r->spec.nseeds; i++)
		if (kvti_remote_node(r, r->spec.seeds[i].host,
				     strlen(r->spec.seeds[i].host),
				     r->spec.seeds[i].port) < 0)
			goto err_mutex;
	/* a server down now is no error: calls count misses until it is up */
	if (r->spec.cluster)
		kvti_remote_refresh(r);
	else
		kvti_remote_connect(r, 0);
	*out = r;
	return 0;
err_mutex:
	pthread_mutex_destroy(&r->mu);
	kvt_free(r->slots);
	kvt_free(r->scratch);
	kvt_free(r->lsums);
	kvt_free(r->nodes);
	kvti_fail(err, "kvt_remote_open: out of memory");
err_free:
	kvt_free(r);
	return err;
}

void kvt_remote_close(kvt_remote *r)
{
	if (!r)
		return;
	for (size_t i = 0; i < r->nnodes; i++) {
		if (r->nodes[i].c)
			redisFree(r->nodes[i].c);
		kvt_free(r->nodes[i].q);
	}
	pthread_mutex_destroy(&r->mu);
	kvt_free(r->nodes);
	kvt_free(r->slots);
	kvt_free(r->scratch);
	kvt_free(r->lsums);
	kvti_remote_tkeys_free(r);
	kvt_free(r);
}

uint64_t kvt_remote_value_bytes(const kvt_remote *r)
{
	return r->value_bytes;
}

int kvt_remote_key_name(const kvt_remote *r, const kvt_page_key *key,
			char *buf, size_t len)
{
	int n = snprintf(buf, len, r->spec.tag_ns ? "%s{%016llx}:%016llx%016llx" :
			 "%s%016llx:%016llx%016llx", r->spec.prefix,
			 (unsigned long long)r->fmt.ns_hash,
			 (unsigned long long)key->lo,
			 (unsigned long long)key->hi);

	return n < 0 || (size_t)n >= len ? -ERANGE : n;
}

/* ---- the batch engine ------------------------------------------------- */

enum { OP_EXISTS, OP_GET, OP_SET };

/* One call's pages and their outcomes. */
struct batch {
	int op;
	size_t n;
	uint32_t tenant;           /* whose MAC key (get, set) */
	struct kvti_rfmt f;        /* its values' format (run(), under mu) */
	const kvt_page_key *keys;
	void *const *dst;          /* get */
	const void *const *src;    /* set */
	const uint64_t *in_sums;   /* set, optional */
	uint64_t *out_sums;        /* get, optional */
	uint8_t *res;              /* 1 done well, 0 not (yet) */
	uint8_t *state;            /* 0 pending, 1 finished */
	int *target;               /* node after a redirect, -1: the slot map */
	uint8_t *asking;           /* send ASKING first */
	uint8_t *hops;
	char (*names)[KVTI_RKEY_MAX];
	size_t *namelen;
};

static int route(kvt_remote *r, struct batch *b, size_t i)
{
	if (b->target[i] >= 0)
		return b->target[i];
	if (!r->spec.cluster)
		return 0;
	return r->slots[kvt_remote_slot(b->names[i], b->namelen[i])];
}

static void page_fail(kvt_remote *r, struct batch *b, size_t i)
{
	b->state[i] = 1;
	b->res[i] = 0;
	if (b->op == OP_SET)
		r->st.write_failures++;
	else
		r->st.read_failures++;
}

/* Queue one page's command(s) on node @nd. */
static int append(kvt_remote *r, struct batch *b, size_t i, int nd)
{
	redisContext *c = r->nodes[nd].c;
	const char *av[5];
	size_t al[5];
	char px[24];
	int ac = 2;

	if (b->asking[i] &&
	    redisAppendCommand(c, "ASKING") != REDIS_OK)
		return -EIO;
	av[1] = b->names[i];
	al[1] = b->namelen[i];
	if (b->op == OP_EXISTS) {
		av[0] = "EXISTS", al[0] = 6;
	} else if (b->op == OP_GET) {
		av[0] = "GET", al[0] = 3;
	} else {
		const uint8_t *page = b->src[i];
		const uint64_t *sums = b->in_sums ?
			b->in_sums + i * b->f.nsums : r->lsums;

		if (!b->in_sums)
			for (uint32_t l = 0; l < b->f.nsums; l++)
				r->lsums[l] = XXH3_64bits(page + l *
							   b->f.layer_bytes,
							   b->f.layer_bytes);
		kvti_remote_head_write(&b->f, &b->keys[i], sums, r->scratch);
		memcpy(r->scratch + kvti_remote_head_bytes(&b->f), page,
		       b->f.page_bytes);
		if (b->f.mac)
			kvti_remote_mac_write(&b->f, r->scratch);
		av[0] = "SET", al[0] = 3;
		av[2] = (const char *)r->scratch, al[2] = kvti_remote_value_len(&b->f);
		ac = 3;
		if (r->spec.ttl_ms) {
			snprintf(px, sizeof(px), "%llu",
				 (unsigned long long)r->spec.ttl_ms);
			av[3] = "PX", al[3] = 2;
			av[4] = px, al[4] = strlen(px);
			ac = 5;
		}
	}
	if (redisAppendCommandArgv(c, ac, av, al) != REDIS_OK)
		return -EIO;
	if (b->op == OP_SET)
		r->st.bytes_written += kvti_remote_value_len(&b->f);
	return 0;
}

/* Handle the reply to page @i from node @nd. */
static void take_reply(kvt_remote *r, struct batch *b, size_t i, int nd,
		       redisReply *rep)
{
	char host[KVTI_RHOST_MAX];
	const char *why;
	int slot, port, kind, to;

	b->asking[i] = 0;
	if (rep->type == REDIS_REPLY_ERROR) {
		kind = r->spec.cluster ?
			kvti_remote_redirect(rep->str, rep->len, &slot, host,
					     sizeof(host), &port) : 0;
		if (kind && b->hops[i] < KVTI_RHOPS_MAX &&
		    (to = kvti_remote_node(r, host, strlen(host), port)) >= 0) {
			b->hops[i]++;
			if (kind == 1) {
				r->slots[slot] = (int16_t)to;
				b->target[i] = -1;
				r->st.moved++;
				r->refresh = 1; /* more slots likely moved */
			} else {
				b->target[i] = to;
				b->asking[i] = 1;
				r->st.asked++;
			}
			return; /* still pending: the next round sends it */
		}
		if (b->op == OP_SET && !strncmp(rep->str, "OOM", 3)) {
			r->st.oom_errors++;
		} else {
			struct kvti_rnode *n = &r->nodes[nd];

			if (!n->warned)
				kvti_warn("remote: %s:%d: %.200s", n->a.host,
					  n->a.port, rep->str);
			n->warned = 1;
			r->st.node_errors++;
			r->refresh = r->spec.cluster;
		}
		page_fail(r, b, i);
		return;
	}
	b->state[i] = 1;
	b->target[i] = -1;
	switch (b->op) {
	case OP_EXISTS:
		b->res[i] = rep->type == REDIS_REPLY_INTEGER && rep->integer > 0;
		break;
	case OP_SET:
		b->res[i] = rep->type == REDIS_REPLY_STATUS &&
			    !strcmp(rep->str, "OK");
		if (!b->res[i])
			r->st.write_failures++;
		break;
	case OP_GET:
		b->res[i] = 0;
		if (rep->type == REDIS_REPLY_NIL)
			break;
		if (rep->type != REDIS_REPLY_STRING) {
			r->st.read_failures++;
			break;
		}
		r->st.bytes_read += rep->len;
		if (kvti_remote_head_check(&b->f, &b->keys[i], rep->str,
					   rep->len, &why) ||
		    (why = "MAC", b->f.mac &&
		     kvti_remote_mac_check(&b->f, rep->str)) ||
		    (why = "page checksum",
		     kvti_remote_value_take(&b->f, rep->str, b->dst[i],
					    b->out_sums ? b->out_sums + i *
					    b->f.nsums : NULL))) {
			char name[KVTI_RKEY_MAX];

			kvti_printable(name, sizeof(name), b->names[i],
				       b->namelen[i]);
			kvti_debug("remote: %s: bad value (%s): dropped", name,
				   why);
			r->st.bad_values++;
			break;
		}
		b->res[i] = 1;
		break;
	}
}

/* Fail every page queued on node @nd from position @from on; the node is
 * done for this round. */
static void fail_queue(kvt_remote *r, struct batch *b, int nd, size_t from)
{
	struct kvti_rnode *n = &r->nodes[nd];

	for (size_t k = from; k < n->nq; k++)
		page_fail(r, b, n->q[k]);
	n->nq = n->got = n->sent = 0;
}

/* Queue up to @more further commands on node @k and write them all out;
 * 0, or -EIO after failing the node's unanswered pages. */
static int send_more(kvt_remote *r, struct batch *b, size_t k, size_t more)
{
	struct kvti_rnode *n = &r->nodes[k];
	int done = 0;

	for (; more && n->sent < n->nq; more--, n->sent++)
		if (append(r, b, n->q[n->sent], (int)k)) {
			kvti_remote_drop(r, k, "cannot queue a command");
			fail_queue(r, b, (int)k, n->got);
			return -EIO;
		}
	while (!done)
		if (redisBufferWrite(n->c, &done) != REDIS_OK) {
			kvti_remote_drop(r, k, n->c->errstr);
			fail_queue(r, b, (int)k, n->got);
			return -EIO;
		}
	return 0;
}

/* Read the reply to node @k's next page; 0, or -EIO after failing the
 * node's unanswered pages. */
static int read_one(kvt_remote *r, struct batch *b, size_t k, size_t *left)
{
	struct kvti_rnode *n = &r->nodes[k];
	size_t i = n->q[n->got];
	redisReply *rep = NULL;

	for (int a = 0; a <= b->asking[i]; a++) {
		if (rep)
			freeReplyObject(rep);
		rep = NULL;
		if (redisGetReply(n->c, (void **)&rep) != REDIS_OK || !rep) {
			kvti_remote_drop(r, k, n->c->errstr[0] ? n->c->errstr :
					 "no reply");
			fail_queue(r, b, (int)k, n->got);
			return -EIO;
		}
	}
	take_reply(r, b, i, (int)k, rep); /* may grow r->nodes: n is stale */
	freeReplyObject(rep);
	*left += !b->state[i];
	r->nodes[k].got++;
	return 0;
}

/* One round: route every pending page to its node, then keep a window of
 * r->window_bytes of values in flight per node (every EXISTS at once):
 * the first window goes out to every node, then each reply read lets one
 * more request go. Returns the number of pages still pending (redirected
 * to another node). */
static size_t round_once(kvt_remote *r, struct batch *b)
{
	size_t win = b->op == OP_EXISTS || !r->window_bytes ? b->n :
		KVT_MAX(1, r->window_bytes / r->value_bytes);
	size_t left = 0;
	int active;

	for (size_t k = 0; k < r->nnodes; k++)
		r->nodes[k].nq = r->nodes[k].got = r->nodes[k].sent = 0;
	for (size_t i = 0; i < b->n; i++) {
		struct kvti_rnode *n;
		int nd;

		if (b->state[i])
			continue;
		if ((nd = route(r, b, i)) < 0) { /* slot without owner */
			r->refresh = 1;
			page_fail(r, b, i);
			continue;
		}
		n = &r->nodes[nd];
		if (kvti_grow((void **)&n->q, &n->capq, n->nq + 1,
			      sizeof(*n->q), 64)) {
			page_fail(r, b, i);
			continue;
		}
		n->q[n->nq++] = i;
	}
	/* the first window to every node before reading any reply */
	for (size_t k = 0; k < r->nnodes; k++) {
		if (!r->nodes[k].nq)
			continue;
		if (kvti_remote_connect(r, k))
			fail_queue(r, b, (int)k, 0);
		else
			send_more(r, b, k, win);
	}
	/* then one reply from each node in turn, refilling its window */
	do {
		active = 0;
		for (size_t k = 0; k < r->nnodes; k++) {
			struct kvti_rnode *n = &r->nodes[k];

			if (n->got >= n->nq)
				continue;
			if (read_one(r, b, k, &left))
				continue;
			n = &r->nodes[k]; /* a redirect may have grown the table */
			if (n->sent < n->nq && send_more(r, b, k, 1))
				continue;
			active |= n->got < n->nq;
		}
	} while (active);
	return left;
}

static int run(kvt_remote *r, struct batch *b)
{
	size_t nbytes = b->n * (sizeof(*b->names) + sizeof(size_t) +
				sizeof(int) + 3);
	uint64_t t0 = kvt_now_ns(), dt;
	uint8_t *mem;
	int done = 0;

	if (!(mem = kvt_malloc(nbytes ? nbytes : 1)))
		return -ENOMEM;
	b->names = (void *)mem;
	b->namelen = (size_t *)(mem + b->n * sizeof(*b->names));
	b->target = (int *)(b->namelen + b->n);
	b->state = (uint8_t *)(b->target + b->n);
	b->asking = b->state + b->n;
	b->hops = b->asking + b->n;
	for (size_t i = 0; i < b->n; i++) {
		b->namelen[i] = (size_t)kvt_remote_key_name(r, &b->keys[i],
							    b->names[i],
							    KVTI_RKEY_MAX);
		b->target[i] = -1;
		b->state[i] = b->asking[i] = b->hops[i] = 0;
		b->res[i] = 0;
	}
	pthread_mutex_lock(&r->mu);
	kvti_remote_fmt_for(r, b->tenant, &b->f);
	if (r->spec.cluster && r->refresh &&
	    t0 - r->refresh_ns >= KVTI_RREFRESH_NS)
		kvti_remote_refresh(r);
	while (round_once(r, b))
		;
	r->st.calls++;
	for (size_t i = 0; i < b->n; i++)
		done += b->res[i];
	switch (b->op) {
	case OP_EXISTS:
		r->st.exists_pages += b->n;
		r->st.exists_found += (uint64_t)done;
		break;
	case OP_GET:
		r->st.get_pages += b->n;
		r->st.hits += (uint64_t)done;
		r->st.misses += b->n - (uint64_t)done;
		break;
	case OP_SET:
		r->st.set_pages += b->n;
		r->st.stored += (uint64_t)done;
		break;
	}
	dt = kvt_now_ns() - t0;
	r->st.lat_ns_total += dt;
	r->st.lat_ns_max = KVT_MAX(r->st.lat_ns_max, dt);
	pthread_mutex_unlock(&r->mu);
	kvt_free(mem);
	return done;
}

/* NULL arguments and sizes; @bufs (optional): no NULL page pointer. */
static int check_args(kvt_remote *r, const kvt_page_key *keys, size_t n,
		      const void *a, const void *const *bufs,
		      const char *what)
{
	kvti_errclear();
	if (!r || (n && (!keys || !a)))
		return kvti_fail(-EINVAL, "kvt_remote_%s: NULL argument", what);
	if (n > (1u << 24))
		return kvti_fail(-EINVAL, "kvt_remote_%s: %zu pages in one "
				 "call (at most 16M)", what, n);
	for (size_t i = 0; bufs && i < n; i++)
		if (!bufs[i])
			return kvti_fail(-EINVAL, "kvt_remote_%s: bufs[%zu] is "
					 "NULL", what, i);
	return 0;
}

int kvt_remote_exists(kvt_remote *r, const kvt_page_key *keys, size_t n,
		      size_t *leading, uint8_t *present)
{
	struct batch b = { .op = OP_EXISTS, .n = n,
			   .tenant = KVT_REMOTE_ANY_TENANT, .keys = keys };
	uint8_t *res = present;
	int err;

	if ((err = check_args(r, keys, n, leading, NULL, "exists")))
		return err;
	*leading = 0;
	if (!n)
		return 0;
	if (!res && !(res = kvt_malloc(n)))
		return -ENOMEM;
	b.res = res;
	err = run(r, &b);
	if (err >= 0)
		while (*leading < n && res[*leading])
			(*leading)++;
	if (res != present)
		kvt_free(res);
	return err < 0 ? err : 0;
}

int kvt_remote_get(kvt_remote *r, const kvt_page_key *keys, size_t n,
		   void *const *bufs, uint8_t *ok, uint64_t *sums)
{
	return kvt_remote_get_as(r, KVT_REMOTE_ANY_TENANT, keys, n, bufs, ok,
				 sums);
}

int kvt_remote_get_as(kvt_remote *r, uint32_t tenant,
		      const kvt_page_key *keys, size_t n, void *const *bufs,
		      uint8_t *ok, uint64_t *sums)
{
	struct batch b = { .op = OP_GET, .n = n, .tenant = tenant,
			   .keys = keys, .dst = bufs, .res = ok,
			   .out_sums = sums };
	int err;

	if ((err = check_args(r, keys, n, ok, (const void *const *)bufs,
			      "get")))
		return err;
	if (n && !bufs)
		return kvti_fail(-EINVAL, "kvt_remote_get: NULL argument");
	return n ? run(r, &b) : 0;
}

int kvt_remote_set(kvt_remote *r, const kvt_page_key *keys, size_t n,
		   const void *const *bufs, const uint64_t *sums, uint8_t *ok)
{
	return kvt_remote_set_as(r, KVT_REMOTE_ANY_TENANT, keys, n, bufs, sums,
				 ok);
}

int kvt_remote_set_as(kvt_remote *r, uint32_t tenant,
		      const kvt_page_key *keys, size_t n,
		      const void *const *bufs, const uint64_t *sums,
		      uint8_t *ok)
{
	struct batch b = { .op = OP_SET, .n = n, .tenant = tenant,
			   .keys = keys, .src = bufs, .in_sums = sums,
			   .res = ok };
	int err;

	if ((err = check_args(r, keys, n, bufs, bufs, "set")))
		return err;
	if (!n)
		return 0;
	if (!ok && !(b.res = kvt_malloc(n)))
		return -ENOMEM;
	err = run(r, &b);
	if (!ok)
		kvt_free(b.res);
	return err;
}

int kvt_remote_stat_get(kvt_remote *r, kvt_remote_stat *st)
{
	uint32_t up = 0, known = 0;

	pthread_mutex_lock(&r->mu);
	*st = r->st;
	for (size_t i = 0; i < r->nnodes; i++) {
		int owner = !r->spec.cluster;

		for (int s = 0; s < KVTI_RSLOTS && !owner && r->slots; s++)
			owner = r->slots[s] == (int16_t)i;
		if (!owner)
			continue;
		known++;
		up += r->nodes[i].c != NULL;
	}
	st->nodes = known;
	st->nodes_up = up;
	pthread_mutex_unlock(&r->mu);
	return 0;
}
