/*
 * test_remote_cluster.c — the remote tier against a real Redis Cluster on
 * loopback: three masters and three replicas (redis-server
 * --cluster-enabled yes, made with redis-cli --cluster create), node
 * timeout 1000 ms. Skipped without redis-server. About 10-20 s.
 *
 *   spread     a handle given two seeds learns all three masters; one
 *              batch stores pages on every master; all come back exact
 *   ASK        a key migrated mid-slot-move: ASKING + GET on the target
 *   MOVED      the slot handed over: the old owner redirects, the handle
 *              follows and learns
 *   failover   a master killed mid-run: its pages fail (counted), the
 *              others are served, nothing crashes; once its replica is
 *              promoted the same handle serves every page again and
 *              stores again
 */
#include "remote_util.h"

#define NN 6
#define NPG 96

static kvt_geom g;
static size_t pb;
static struct rt_server srv[NN];
static int ports[NN];

static char *info(int port, const char *section)
{
	redisReply *r = rt_cmd(port, "INFO", section);
	char *s = NULL;

	if (r && r->type == REDIS_REPLY_STRING)
		s = strdup(r->str);
	if (r)
		freeReplyObject(r);
	return s;
}

static int is_master(int i)
{
	char *s = srv[i].pid > 0 ? info(ports[i], "replication") : NULL;
	int m = s && strstr(s, "role:master");

	free(s);
	return m;
}

static int cluster_ok(int port)
{
	redisReply *r = rt_cmd(port, "CLUSTER", "INFO");
	int ok = r && r->type == REDIS_REPLY_STRING &&
		 strstr(r->str, "cluster_state:ok");

	if (r)
		freeReplyObject(r);
	return ok;
}

/* Every replica of master @i has its whole replication stream. */
static int synced(int i)
{
	char *s = info(ports[i], "replication"), *o, *p;
	long long mo;
	int ok = 0;

	if (!s || !(o = strstr(s, "master_repl_offset:")))
		goto out;
	mo = atoll(o + 19);
	p = strstr(s, "slave0:");
	if (!p)
		goto out;
	p = strstr(p, "offset=");
	ok = p && atoll(p + 7) == mo;
out:
	free(s);
	return ok;
}

static int get_all(kvt_remote *r, const kvt_page_key *k, uint8_t *pages,
		   uint8_t *ok)
{
	void *bufs[NPG];
	uint8_t *want = malloc(pb);
	int hits;

	for (int i = 0; i < NPG; i++)
		bufs[i] = pages + (size_t)i * pb;
	memset(pages, 0, NPG * pb);
	hits = kvt_remote_get(r, k, NPG, bufs, ok, NULL);
	for (int i = 0; i < NPG; i++)
		if (ok[i]) {
			rt_fill(want, pb, &k[i]);
			CHECK(!memcmp(want, bufs[i], pb));
		}
	free(want);
	return hits;
}

static char *myid(int port)
{
	redisReply *r = rt_cmd(port, "CLUSTER", "MYID");
	char *s = r && r->type == REDIS_REPLY_STRING ? strdup(r->str) : NULL;

	if (r)
		freeReplyObject(r);
	return s;
}

/* The master (index) that serves @slot now: asks CLUSTER SLOTS. */
static int owner_of(int slot)
{
	for (int i = 0; i < NN; i++) {
		redisReply *r;
		int found = -1;

		if (srv[i].pid <= 0)
			continue;
		r = rt_cmd(ports[i], "CLUSTER", "SLOTS");
		for (size_t e = 0; r && r->type == REDIS_REPLY_ARRAY &&
				   e < r->elements; e++) {
			redisReply *en = r->element[e];

			if (slot >= en->element[0]->integer &&
			    slot <= en->element[1]->integer)
				for (int j = 0; j < NN; j++)
					if (ports[j] ==
					    en->element[2]->element[1]->integer)
						found = j;
		}
		if (r)
			freeReplyObject(r);
		return found;
	}
	return -1;
}

int main(void)
{
	static const char *copt[] = { "--cluster-enabled", "yes",
				      "--cluster-config-file", "nodes.conf",
				      "--cluster-node-timeout", "1000", NULL };
	char cmd[2048], spec[256], name[160];
	const char *dir;
	kvt_remote *r;
	kvt_remote_stat st, st0;
	kvt_page_key k[NPG];
	uint8_t *pages, ok[NPG];
	const void *cbufs[NPG];
	int n, masters = 0, hits, t;
	uint64_t t0;

	rt_need_redis();
	dir = test_dir("remote_cluster");
	rt_geom(&g, "test-model");
	pb = kvt_geom_page_bytes(&g);
	pages = malloc(NPG * pb);
	for (int i = 0; i < NN; i++) {
		ports[i] = rt_free_port(1);
		for (int j = 0; j < i; j++)
			if (ports[j] == ports[i] ||
			    abs(ports[j] - ports[i]) == 10000)
				ports[i] = rt_free_port(1), j = -1;
		if (rt_start(&srv[i], dir, ports[i], copt))
			return 1;
	}
	n = snprintf(cmd, sizeof(cmd), "timeout 60 redis-cli --cluster create");
	for (int i = 0; i < NN; i++)
		n += snprintf(cmd + n, sizeof(cmd) - n, " 127.0.0.1:%d",
			      ports[i]);
	snprintf(cmd + n, sizeof(cmd) - n, " --cluster-replicas 1 "
		 "--cluster-yes > '%s/create.log' 2>&1", dir);
	if (system(cmd) != 0) {
		fprintf(stderr, "redis-cli --cluster create failed: see "
			"%s/create.log\n", dir);
		return 1;
	}
	for (t = 0; t < 200; t++) {
		int all = 1;

		for (int i = 0; i < NN; i++)
			all &= cluster_ok(ports[i]);
		if (all)
			break;
		rt_sleep_ms(100);
	}
	CHECK(t < 200);

	/* spread: two seeds, three masters learnt */
	snprintf(spec, sizeof(spec), "remote:redis-cluster://127.0.0.1:%d,"
		 "127.0.0.1:%d,timeout=1000", ports[0], ports[1]);
	CHECK_OK(kvt_remote_open(&r, spec, &g));
	if (!r)
		return 1;
	CHECK_OK(kvt_remote_stat_get(r, &st));
	CHECK_EQ(st.nodes, 3);
	CHECK_EQ(st.slot_refreshes, 1);
	rt_keys(k, NPG, 7);
	for (int i = 0; i < NPG; i++) {
		rt_fill(pages + (size_t)i * pb, pb, &k[i]);
		cbufs[i] = pages + (size_t)i * pb;
	}
	CHECK_EQ(kvt_remote_set(r, k, NPG, cbufs, NULL, NULL), NPG);
	{
		long long total = 0;

		for (int i = 0; i < NN; i++) {
			redisReply *d;

			if (!is_master(i))
				continue;
			masters++;
			d = rt_cmd(ports[i], "DBSIZE");
			CHECK(d && d->type == REDIS_REPLY_INTEGER &&
			      d->integer > 0);
			if (d && d->type == REDIS_REPLY_INTEGER)
				total += d->integer;
			if (d)
				freeReplyObject(d);
		}
		CHECK_EQ(masters, 3);
		CHECK_EQ(total, NPG);
	}
	CHECK_EQ(get_all(r, k, pages, ok), NPG);
	{
		size_t lead;

		CHECK_OK(kvt_remote_exists(r, k, NPG, &lead, NULL));
		CHECK_EQ(lead, NPG);
	}

	/* ASK then MOVED: move the slot of page 0 to another master */
	{
		int slot, from, to = -1, len;
		char *idf, *idt, slots[16], tport[16];
		redisReply *rep;

		len = kvt_remote_key_name(r, &k[0], name, sizeof(name));
		slot = kvt_remote_slot(name, (size_t)len);
		from = owner_of(slot);
		for (int i = 0; i < NN && to < 0; i++)
			if (i != from && is_master(i))
				to = i;
		CHECK(from >= 0 && to >= 0);
		idf = myid(ports[from]);
		idt = myid(ports[to]);
		snprintf(slots, sizeof(slots), "%d", slot);
		snprintf(tport, sizeof(tport), "%d", ports[to]);
		CHECK(rt_reply_is(rt_cmd(ports[to], "CLUSTER", "SETSLOT", slots,
					 "IMPORTING", idf), "OK"));
		CHECK(rt_reply_is(rt_cmd(ports[from], "CLUSTER", "SETSLOT",
					 slots, "MIGRATING", idt), "OK"));
		rep = rt_cmd(ports[from], "MIGRATE", "127.0.0.1", tport, "", "0",
			     "5000", "KEYS", name);
		CHECK(rep && rep->type == REDIS_REPLY_STATUS);
		if (rep)
			freeReplyObject(rep);
		CHECK_OK(kvt_remote_stat_get(r, &st0));
		CHECK_EQ(get_all(r, k, pages, ok), NPG);
		CHECK_OK(kvt_remote_stat_get(r, &st));
		CHECK(st.asked > st0.asked);
		for (int i = 0; i < NN; i++)
			if (is_master(i))
				CHECK(rt_reply_is(rt_cmd(ports[i], "CLUSTER",
							 "SETSLOT", slots,
							 "NODE", idt), "OK"));
		CHECK_EQ(get_all(r, k, pages, ok), NPG);
		CHECK_OK(kvt_remote_stat_get(r, &st0));
		CHECK(st0.moved > st.moved);
		CHECK_EQ(st0.read_failures, 0);
		free(idf);
		free(idt);
	}

	/* failover: kill the master serving page 5 */
	{
		int len = kvt_remote_key_name(r, &k[5], name, sizeof(name));
		int victim = owner_of(kvt_remote_slot(name, (size_t)len));

		CHECK(victim >= 0);
		/* replicas catch up: up to 20 s (5 s was short on a loaded
		 * 2-core machine) */
		for (t = 0; t < 400; t++) {
			int all = 1;

			for (int i = 0; i < NN; i++)
				if (is_master(i))
					all &= synced(i);
			if (all)
				break;
			rt_sleep_ms(50);
		}
		CHECK(t < 400);
		if (victim < 0)
			return 1;
		CHECK_OK(kvt_remote_stat_get(r, &st0));
		rt_stop(&srv[victim], SIGKILL);
		hits = get_all(r, k, pages, ok);
		CHECK(hits > 0 && hits < NPG);
		CHECK(!ok[5]);
		CHECK_OK(kvt_remote_stat_get(r, &st));
		CHECK_EQ(st.read_failures - st0.read_failures,
			 (uint64_t)(NPG - hits));
		CHECK_EQ(st.bad_values, 0);
		t0 = kvt_now_ns();
		while (hits < NPG && kvt_now_ns() - t0 < 30000000000ull) {
			rt_sleep_ms(200);
			hits = get_all(r, k, pages, ok);
		}
		CHECK_EQ(hits, NPG);
		fprintf(stderr, "failover: all pages served again after %.1f s\n",
			(kvt_now_ns() - t0) / 1e9);
		CHECK_OK(kvt_remote_stat_get(r, &st));
		CHECK(st.slot_refreshes > st0.slot_refreshes);
		CHECK_EQ(st.nodes, 3);
		CHECK_EQ(st.nodes_up, 3);
		/* stores work again too */
		rt_keys(k, NPG, 8);
		for (int i = 0; i < NPG; i++)
			rt_fill(pages + (size_t)i * pb, pb, &k[i]);
		CHECK_EQ(kvt_remote_set(r, k, NPG, cbufs, NULL, NULL), NPG);
		CHECK_EQ(get_all(r, k, pages, ok), NPG);
	}
	kvt_remote_close(r);
	for (int i = 0; i < NN; i++)
		rt_stop(&srv[i], SIGKILL);
	free(pages);
	TEST_DONE();
}
