/*
 * cluster.c — the node side of the remote tier: hash slots (CRC16 as the
 * Redis Cluster specification defines it), the node table, connections
 * with back-off, the slot map (CLUSTER SLOTS) and redirect replies.
 *
 *   key name --CRC16(name or {tag}) % 16384--> slot --slots[]--> node
 *                                                      ^
 *              CLUSTER SLOTS (open, after errors) -----+--- MOVED (one slot)
 *
 * Nodes are never removed from the table (a dead master may come back as
 * a replica); only the slot map decides where a page goes.
 */
#include "remote/remote_impl.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>

/* ---- hash slots ------------------------------------------------------- */

/* CRC16-CCITT (XMODEM): poly 0x1021, init 0, no reflection, no final xor:
 * the variant the Redis Cluster spec names, check value 0x31C3. */
uint16_t kvt_remote_crc16(const void *buf, size_t len)
{
	const uint8_t *p = buf;
	uint16_t crc = 0;

	for (size_t i = 0; i < len; i++) {
		crc ^= (uint16_t)(p[i] << 8);
		for (int b = 0; b < 8; b++)
			crc = (crc & 0x8000) ? (uint16_t)((crc << 1) ^ 0x1021) :
					       (uint16_t)(crc << 1);
	}
	return crc;
}

uint16_t kvt_remote_slot(const char *key, size_t len)
{
	const char *open = memchr(key, '{', len);

	if (open) {
		size_t rest = len - (size_t)(open - key) - 1;
		const char *close = memchr(open + 1, '}', rest);

		if (close && close > open + 1)
			return kvt_remote_crc16(open + 1,
						(size_t)(close - open - 1)) &
			       (KVTI_RSLOTS - 1);
	}
	return kvt_remote_crc16(key, len) & (KVTI_RSLOTS - 1);
}

/* ---- redirects ---------------------------------------------------------- */

int kvti_remote_redirect(const char *err, size_t len, int *slot, char *host,
			 size_t hlen, int *port)
{
	char buf[512], *sp, *colon, *end;
	int kind;
	long s, p;

	if (len >= sizeof(buf))
		return 0;
	memcpy(buf, err, len);
	buf[len] = 0;
	if (!strncmp(buf, "MOVED ", 6))
		kind = 1;
	else if (!strncmp(buf, "ASK ", 4))
		kind = 2;
	else
		return 0;
	sp = strchr(buf, ' ') + 1;
	errno = 0;
	s = strtol(sp, &end, 10);
	if (end == sp || *end != ' ' || s < 0 || s >= KVTI_RSLOTS)
		return 0;
	sp = end + 1;
	colon = strrchr(sp, ':');
	if (!colon || colon == sp || (size_t)(colon - sp) >= hlen)
		return 0;
	p = strtol(colon + 1, &end, 10);
	if (end == colon + 1 || *end || p < 1 || p > 65535)
		return 0;
	memcpy(host, sp, (size_t)(colon - sp));
	host[colon - sp] = 0;
	*slot = (int)s;
	*port = (int)p;
	return kind;
}

/* ---- nodes ------------------------------------------------------------ */

/* @host must not point into r->nodes (the table may move). */
int kvti_remote_node(kvt_remote *r, const char *host, size_t hlen, int port)
{
	struct kvti_rnode *n;

	if (hlen >= KVTI_RHOST_MAX)
		return -EINVAL;
	for (size_t i = 0; i < r->nnodes; i++)
		if (r->nodes[i].a.port == port &&
		    strlen(r->nodes[i].a.host) == hlen &&
		    !memcmp(r->nodes[i].a.host, host, hlen))
			return (int)i;
	if (r->nnodes >= KVTI_RNODES_MAX)
		return -ENOMEM;
	if (kvti_grow((void **)&r->nodes, &r->capnodes, r->nnodes + 1,
		      sizeof(*r->nodes), 8))
		return -ENOMEM;
	n = &r->nodes[r->nnodes];
	memset(n, 0, sizeof(*n));
	memcpy(n->a.host, host, hlen);
	n->a.host[hlen] = 0;
	n->a.port = port;
	return (int)r->nnodes++;
}

void kvti_remote_drop(kvt_remote *r, size_t i, const char *why)
{
	struct kvti_rnode *n = &r->nodes[i];

	if (strstr(why, "temporarily unavailable"))
		why = "no answer within the timeout";
	if (!n->warned)
		kvti_warn("remote: %s:%d: %s", n->a.host, n->a.port, why);
	n->warned = 1;
	if (n->c)
		redisFree(n->c);
	n->c = NULL;
	n->retry_ns = kvt_now_ns() + KVTI_RBACKOFF_NS;
	r->st.node_errors++;
	r->refresh = 1;
}

/* One command, one reply (for AUTH, SELECT, CLUSTER SLOTS): the reply or
 * NULL after dropping the connection. */
static redisReply *node_cmd(kvt_remote *r, size_t i, int argc,
			    const char **argv)
{
	redisReply *rep;

	if (redisAppendCommandArgv(r->nodes[i].c, argc, argv, NULL) != REDIS_OK ||
	    redisGetReply(r->nodes[i].c, (void **)&rep) != REDIS_OK || !rep) {
		kvti_remote_drop(r, i, r->nodes[i].c->errstr[0] ?
				 r->nodes[i].c->errstr : "no reply");
		return NULL;
	}
	return rep;
}

int kvti_remote_connect(kvt_remote *r, size_t i)
{
	struct kvti_rnode *n = &r->nodes[i];
	struct timeval tv = { .tv_sec = r->spec.timeout_ms / 1000,
			      .tv_usec = (r->spec.timeout_ms % 1000) * 1000 };
	redisReply *rep;
	char db[16];

	if (n->c)
		return 0;
	if (kvt_now_ns() < n->retry_ns)
		return -EIO;
	n->c = redisConnectWithTimeout(n->a.host, n->a.port, tv);
	if (!n->c || n->c->err) {
		char why[160];

		snprintf(why, sizeof(why), "cannot connect: %s",
			 n->c ? n->c->errstr : "out of memory");
		r->st.connect_failures++;
		kvti_remote_drop(r, i, why);
		return -EIO;
	}
	redisSetTimeout(n->c, tv);
	n->c->reader->maxbuf = 0; /* keep the read buffer: pages are large */
	if (r->spec.auth) {
		const char *av[3] = { "AUTH", r->spec.user, r->spec.pass };
		int ac = r->spec.user[0] ? 3 : 2;

		if (ac == 2)
			av[1] = r->spec.pass;
		if (!(rep = node_cmd(r, i, ac, av)))
			return -EIO;
		if (rep->type == REDIS_REPLY_ERROR) {
			char why[200];

			snprintf(why, sizeof(why), "AUTH refused: %.150s",
				 rep->str);
			freeReplyObject(rep);
			kvti_remote_drop(r, i, why);
			return -EIO;
		}
		freeReplyObject(rep);
	}
	if (!r->spec.cluster && r->spec.db) {
		const char *av[2] = { "SELECT", db };

		snprintf(db, sizeof(db), "%d", r->spec.db);
		if (!(rep = node_cmd(r, i, 2, av)))
			return -EIO;
		if (rep->type == REDIS_REPLY_ERROR) {
			freeReplyObject(rep);
			kvti_remote_drop(r, i, "SELECT refused");
			return -EIO;
		}
		freeReplyObject(rep);
	}
	if (n->warned)
		kvti_info("remote: %s:%d: connected again", n->a.host,
			  n->a.port);
	n->warned = 0;
	r->st.connects++;
	return 0;
}

/* ---- the slot map ------------------------------------------------------- */

/* Read one CLUSTER SLOTS reply into @map; 0 or -EPROTO. */
static int parse_slots(kvt_remote *r, size_t from, const redisReply *rep,
		       int16_t *map)
{
	if (rep->type != REDIS_REPLY_ARRAY)
		return -EPROTO;
	for (size_t e = 0; e < rep->elements; e++) {
		const redisReply *en = rep->element[e], *m;
		char host[KVTI_RHOST_MAX];
		size_t hlen;
		int node;

		if (en->type != REDIS_REPLY_ARRAY || en->elements < 3 ||
		    en->element[0]->type != REDIS_REPLY_INTEGER ||
		    en->element[1]->type != REDIS_REPLY_INTEGER)
			return -EPROTO;
		m = en->element[2];
		if (m->type != REDIS_REPLY_ARRAY || m->elements < 2 ||
		    m->element[0]->type != REDIS_REPLY_STRING ||
		    m->element[1]->type != REDIS_REPLY_INTEGER ||
		    m->element[1]->integer < 1 || m->element[1]->integer > 65535)
			return -EPROTO;
		long long lo = en->element[0]->integer,
			  hi = en->element[1]->integer;
		if (lo < 0 || hi >= KVTI_RSLOTS || lo > hi)
			return -EPROTO;
		/* copied: growing the node table may move r->nodes */
		hlen = m->element[0]->len;
		if (hlen >= sizeof(host))
			return -EPROTO;
		memcpy(host, m->element[0]->str, hlen);
		host[hlen] = 0;
		if (!hlen || !strcmp(host, "?")) {
			/* the node answering does not know its own address */
			hlen = strlen(r->nodes[from].a.host);
			memcpy(host, r->nodes[from].a.host, hlen + 1);
		}
		node = kvti_remote_node(r, host, hlen,
					(int)m->element[1]->integer);
		if (node < 0)
			return node;
		for (long long s = lo; s <= hi; s++)
			map[s] = (int16_t)node;
	}
	return 0;
}

int kvti_remote_refresh(kvt_remote *r)
{
	static const char *av[2] = { "CLUSTER", "SLOTS" };
	int16_t *map = kvt_malloc(KVTI_RSLOTS * sizeof(*map));

	if (!map)
		return -ENOMEM;
	r->refresh_ns = kvt_now_ns();
	/* nodes that own slots first (they are the likeliest to answer),
	 * then every other node (seeds, replicas seen in redirects) */
	for (int pass = 0; pass < 2; pass++) {
		for (size_t i = 0; i < r->nnodes; i++) {
			int owner = 0;
			redisReply *rep;
			int err;

			for (int s = 0; s < KVTI_RSLOTS && !owner; s += 1)
				owner = r->slots[s] == (int16_t)i;
			if (owner != (pass == 0))
				continue;
			if (kvti_remote_connect(r, i))
				continue;
			if (!(rep = node_cmd(r, i, 2, av)))
				continue;
			for (int s = 0; s < KVTI_RSLOTS; s++)
				map[s] = -1;
			err = rep->type == REDIS_REPLY_ERROR ? -EPROTO :
				parse_slots(r, i, rep, map);
			freeReplyObject(rep);
			if (err) {
				kvti_remote_drop(r, i, "bad CLUSTER SLOTS reply "
						 "(not a cluster node?)");
				continue;
			}
			memcpy(r->slots, map, KVTI_RSLOTS * sizeof(*map));
			kvt_free(map);
			r->refresh = 0;
			r->st.slot_refreshes++;
			return 0;
		}
	}
	kvt_free(map);
	return -EIO;
}
