/*
 * test_remote_redis.c — the remote tier against a real redis-server on a
 * free loopback port (skipped without one). About 3 s.
 *
 *   down at start   a handle opened before the server runs misses, then
 *                   works once it does (no reopen)
 *   two processes   A stores a prompt's pages and exits; B, with its own
 *                   handle, finds the leading run and gets byte-identical
 *                   pages and their layer sums
 *   namespaces      another ns= never sees them
 *   corruption      SETRANGE inside a page, garbage, a value of another
 *                   geometry, a truncated value: misses, counted, and the
 *                   other pages of the batch still served
 *   ttl             values carry the expiry asked for
 *   timeout         a stopped server (SIGSTOP): the call returns after the
 *                   timeout with failures counted; SIGCONT: served again
 *   full            maxmemory + noeviction: OOM refusals counted; with
 *                   allkeys-lru: evicted pages miss, none is corrupt
 *   killed          server killed mid-run: failures counted, no crash; a
 *                   new server on the port: the same handle stores again
 *   auth            requirepass: NOAUTH counted without auth=, fine with
 */
#include "remote_util.h"
#include "xfer/xxh.h"

#define NP 32     /* pages of the prompt */
#define NSTORED 24
#define KVTI_NAME 160

static kvt_geom g;
static char spec[256];
static size_t pb;

static int store_prompt(const char *sp, uint64_t prompt, size_t n)
{
	kvt_page_key k[NP];
	uint8_t *pages = malloc(n * pb), ok[NP];
	const void *bufs[NP];
	kvt_remote *r;
	int got;

	rt_keys(k, n, prompt);
	for (size_t i = 0; i < n; i++) {
		rt_fill(pages + i * pb, pb, &k[i]);
		bufs[i] = pages + i * pb;
	}
	if (kvt_remote_open(&r, sp, &g)) {
		free(pages);
		return -1;
	}
	got = kvt_remote_set(r, k, n, bufs, NULL, ok);
	kvt_remote_close(r);
	free(pages);
	return got;
}

/* Get @n pages of @prompt; returns hits; every hit must be exact. */
static int get_check(kvt_remote *r, uint64_t prompt, size_t n, uint8_t *ok)
{
	kvt_page_key k[512];
	uint8_t *pages = malloc(n * pb), *want = malloc(pb);
	void **bufs = malloc(n * sizeof(void *));
	uint64_t *sums = malloc(n * g.layers * sizeof(uint64_t));
	int hits;

	rt_keys(k, n, prompt);
	for (size_t i = 0; i < n; i++)
		bufs[i] = pages + i * pb;
	hits = kvt_remote_get(r, k, n, bufs, ok, sums);
	for (size_t i = 0; i < n; i++) {
		if (!ok[i])
			continue;
		rt_fill(want, pb, &k[i]);
		CHECK(!memcmp(want, bufs[i], pb));
		for (uint32_t l = 0; l < g.layers; l++)
			CHECK_EQ(sums[i * g.layers + l],
				 XXH3_64bits(want + l * (pb / g.layers),
					     pb / g.layers));
	}
	free(pages);
	free(want);
	free(bufs);
	free(sums);
	return hits;
}

static void key_name(kvt_remote *r, uint64_t prompt, size_t i, char *name)
{
	kvt_page_key k[NP];

	rt_keys(k, i + 1, prompt);
	CHECK(kvt_remote_key_name(r, &k[i], name, KVTI_NAME) > 0);
}
int main(void)
{
	struct rt_server srv;
	const char *dir;
	kvt_remote *r0, *r, *rns;
	kvt_remote_stat st;
	kvt_page_key k[NP];
	uint8_t ok[512], present[NP];
	size_t lead;
	int port, status;
	pid_t a;

	rt_need_redis();
	dir = test_dir("remote_redis");
	rt_geom(&g, "test-model");
	pb = kvt_geom_page_bytes(&g);
	port = rt_free_port(0);
	snprintf(spec, sizeof(spec), "remote:redis://127.0.0.1:%d,timeout=500",
		 port);

	/* down at start: open works, calls miss */
	CHECK_OK(kvt_remote_open(&r0, spec, &g));
	rt_keys(k, NP, 1);
	CHECK_OK(kvt_remote_exists(r0, k, NP, &lead, NULL));
	CHECK_EQ(lead, 0);
	if (rt_start(&srv, dir, port, NULL))
		return 1;

	/* process A stores, process B finds and loads */
	a = fork();
	if (a == 0)
		_exit(store_prompt(spec, 1, NSTORED) == NSTORED ? 0 : 1);
	CHECK(waitpid(a, &status, 0) == a && WIFEXITED(status) &&
	      WEXITSTATUS(status) == 0);
	CHECK_OK(kvt_remote_open(&r, spec, &g));
	CHECK_OK(kvt_remote_exists(r, k, NP, &lead, present));
	CHECK_EQ(lead, NSTORED);
	CHECK(present[NSTORED - 1] && !present[NSTORED]);
	CHECK_EQ(get_check(r, 1, NP, ok), NSTORED);
	for (int i = 0; i < NP; i++)
		CHECK_EQ(ok[i], i < NSTORED);
	CHECK_OK(kvt_remote_stat_get(r, &st));
	CHECK_EQ(st.hits, NSTORED);
	CHECK_EQ(st.misses, NP - NSTORED);
	CHECK_EQ(st.bad_values, 0);
	CHECK_EQ(st.read_failures, 0);
	CHECK_EQ(st.bytes_read, NSTORED * kvt_remote_value_bytes(r));
	CHECK_EQ(st.nodes_up, 1);
	CHECK(st.lat_ns_total > 0 && st.lat_ns_max > 0);

	/* the handle opened while the server was down works now */
	rt_sleep_ms(150);
	CHECK_OK(kvt_remote_exists(r0, k, NP, &lead, NULL));
	CHECK_EQ(lead, NSTORED);
	kvt_remote_close(r0);

	/* a hole ends the leading run */
	{
		kvt_page_key h[6];
		uint8_t *p = malloc(6 * pb);
		const void *b[6];

		rt_keys(h, 6, 2);
		for (int i = 0; i < 6; i++)
			rt_fill(p + i * pb, pb, &h[i]), b[i] = p + i * pb;
		b[4] = b[5];
		CHECK_EQ(kvt_remote_set(r, h, 4, b, NULL, NULL), 4);
		CHECK_EQ(kvt_remote_set(r, h + 5, 1, b + 5, NULL, NULL), 1);
		CHECK_OK(kvt_remote_exists(r, h, 6, &lead, present));
		CHECK_EQ(lead, 4);
		CHECK(present[5] && !present[4]);
		free(p);
	}

	/* another namespace sees nothing */
	{
		char s2[300];

		snprintf(s2, sizeof(s2), "%s,ns=another-model", spec);
		CHECK_OK(kvt_remote_open(&rns, s2, &g));
		CHECK_OK(kvt_remote_exists(rns, k, NP, &lead, NULL));
		CHECK_EQ(lead, 0);
		kvt_remote_close(rns);
	}

	/* corruption by hand: each a miss, counted; the rest still served */
	{
		char name[KVTI_NAME], s2[300];
		kvt_geom g2 = g;
		kvt_remote *r2;
		redisReply *rep;
		uint64_t before;
		size_t off = kvt_remote_value_bytes(r) - pb + 100;
		char offs[32];

		snprintf(offs, sizeof(offs), "%zu", off);
		key_name(r, 1, 3, name);
		rep = rt_cmd(port, "SETRANGE", name, offs, "X");
		CHECK(rep && rep->type == REDIS_REPLY_INTEGER &&
		      (uint64_t)rep->integer == kvt_remote_value_bytes(r));
		if (rep)
			freeReplyObject(rep);
		key_name(r, 1, 5, name);
		rep = rt_cmd(port, "SET", name, "garbage");
		CHECK(rep && rep->type == REDIS_REPLY_STATUS);
		freeReplyObject(rep);
		key_name(r, 1, 7, name);
		rep = rt_cmd(port, "GETRANGE", name, "0", "63");
		CHECK(rep && rep->type == REDIS_REPLY_STRING && rep->len == 64);
		if (rep && rep->type == REDIS_REPLY_STRING) {
			const char *av[3] = { "SET", name, rep->str };
			size_t al[3] = { 3, strlen(name), rep->len };
			redisReply *r3 = rt_cmdv(port, 3, av, al);

			CHECK(r3 && r3->type == REDIS_REPLY_STATUS);
			if (r3)
				freeReplyObject(r3);
		}
		if (rep)
			freeReplyObject(rep);
		/* page 9 written by a model with 16-token pages, same ns */
		g2.page_tokens = 16;
		CHECK_OK(kvt_geom_finish(&g2));
		snprintf(s2, sizeof(s2), "%s,ns=test-model", spec);
		CHECK_OK(kvt_remote_open(&r2, s2, &g2));
		{
			uint8_t *p = calloc(1, kvt_geom_page_bytes(&g2));
			const void *b[1] = { p };

			CHECK_EQ(kvt_remote_set(r2, &k[9], 1, b, NULL, NULL), 1);
			free(p);
		}
		kvt_remote_close(r2);

		CHECK_OK(kvt_remote_stat_get(r, &st));
		before = st.bad_values;
		CHECK_EQ(get_check(r, 1, NSTORED, ok), NSTORED - 4);
		CHECK(!ok[3] && !ok[5] && !ok[7] && !ok[9] && ok[4] && ok[8]);
		CHECK_OK(kvt_remote_stat_get(r, &st));
		CHECK_EQ(st.bad_values - before, 4);
		/* exists still finds them: existing is not being valid */
		CHECK_OK(kvt_remote_exists(r, k, NP, &lead, NULL));
		CHECK_EQ(lead, NSTORED);
		/* a good store over a bad value heals it */
		CHECK_EQ(store_prompt(spec, 1, NSTORED), NSTORED);
		CHECK_EQ(get_check(r, 1, NSTORED, ok), NSTORED);
	}

	/* ttl */
	{
		char s2[300], name[KVTI_NAME];
		kvt_remote *rt;
		redisReply *rep;

		snprintf(s2, sizeof(s2), "%s,ttl=60s", spec);
		CHECK_EQ(store_prompt(s2, 3, 2), 2);
		CHECK_OK(kvt_remote_open(&rt, s2, &g));
		key_name(rt, 3, 1, name);
		rep = rt_cmd(port, "PTTL", name);
		CHECK(rep && rep->type == REDIS_REPLY_INTEGER &&
		      rep->integer > 50000 && rep->integer <= 60000);
		if (rep)
			freeReplyObject(rep);
		key_name(rt, 1, 1, name);
		rep = rt_cmd(port, "PTTL", name);
		CHECK(rep && rep->type == REDIS_REPLY_INTEGER &&
		      rep->integer == -1);
		if (rep)
			freeReplyObject(rep);
		kvt_remote_close(rt);
	}

	/* timeout: a server that does not answer */
	{
		uint64_t t0, before;

		CHECK_OK(kvt_remote_stat_get(r, &st));
		before = st.read_failures;
		kill(srv.pid, SIGSTOP);
		t0 = kvt_now_ns();
		CHECK_EQ(get_check(r, 1, 4, ok), 0);
		CHECK((kvt_now_ns() - t0) / 1000000 < 3000);
		CHECK_OK(kvt_remote_stat_get(r, &st));
		CHECK_EQ(st.read_failures - before, 4);
		kill(srv.pid, SIGCONT);
		rt_sleep_ms(150);
		CHECK_EQ(get_check(r, 1, 4, ok), 4);
	}

	/* full: noeviction refuses with OOM, allkeys-lru evicts */
	{
		uint64_t bad;

		CHECK(rt_reply_is(rt_cmd(port, "CONFIG", "SET",
					 "maxmemory-policy", "noeviction"), "OK"));
		CHECK(rt_reply_is(rt_cmd(port, "CONFIG", "SET", "maxmemory",
					 "3mb"), "OK"));
		CHECK_OK(kvt_remote_stat_get(r, &st));
		bad = st.bad_values;
		{
			int got = store_prompt(spec, 4, NP);
			int more = 0;

			/* several batches: the server fills up */
			for (uint64_t p = 5; p < 20; p++)
				more += store_prompt(spec, p, NP);
			CHECK(got >= 0 && got + more < 16 * NP);
		}
		CHECK_EQ(get_check(r, 1, NSTORED, ok), NSTORED);
		{
			char s2[300];
			kvt_remote *rf;
			kvt_page_key kk[NP];
			uint8_t *p = malloc(NP * pb);
			const void *b[NP];

			snprintf(s2, sizeof(s2), "%s", spec);
			CHECK_OK(kvt_remote_open(&rf, s2, &g));
			rt_keys(kk, NP, 40);
			for (int i = 0; i < NP; i++)
				rt_fill(p + i * pb, pb, &kk[i]),
					b[i] = p + i * pb;
			CHECK(kvt_remote_set(rf, kk, NP, b, NULL, ok) < NP);
			CHECK_OK(kvt_remote_stat_get(rf, &st));
			CHECK(st.oom_errors > 0);
			CHECK(st.write_failures >= st.oom_errors);
			kvt_remote_close(rf);
			free(p);
		}
		CHECK(rt_reply_is(rt_cmd(port, "CONFIG", "SET",
					 "maxmemory-policy", "allkeys-lru"),
				  "OK"));
		for (uint64_t p = 50; p < 60; p++)
			CHECK_EQ(store_prompt(spec, p, NP), NP);
		{
			int hits = 0;

			for (uint64_t p = 50; p < 60; p++)
				hits += get_check(r, p, NP, ok);
			CHECK(hits > 0 && hits < 10 * NP); /* some evicted */
		}
		CHECK_OK(kvt_remote_stat_get(r, &st));
		CHECK_EQ(st.bad_values, bad);
		CHECK(rt_reply_is(rt_cmd(port, "CONFIG", "SET", "maxmemory",
					 "0"), "OK"));
	}

	/* killed mid-run; a new server on the same port */
	{
		uint64_t rf, wf;

		CHECK_OK(kvt_remote_stat_get(r, &st));
		rf = st.read_failures, wf = st.write_failures;
		rt_stop(&srv, SIGKILL);
		CHECK_EQ(get_check(r, 1, 8, ok), 0);
		CHECK_OK(kvt_remote_exists(r, k, 8, &lead, NULL));
		CHECK_EQ(lead, 0);
		CHECK_EQ(store_prompt(spec, 1, 8), 0);
		CHECK_OK(kvt_remote_stat_get(r, &st));
		CHECK_EQ(st.read_failures - rf, 16);
		CHECK_EQ(st.nodes_up, 0);
		CHECK_EQ(wf, st.write_failures); /* the store was another handle */
		if (rt_start(&srv, dir, port, NULL))
			return 1;
		rt_sleep_ms(150);
		{
			uint8_t *p = malloc(8 * pb);
			const void *b[8];

			for (int i = 0; i < 8; i++)
				rt_fill(p + i * pb, pb, &k[i]), b[i] = p + i * pb;
			CHECK_EQ(kvt_remote_set(r, k, 8, b, NULL, NULL), 8);
			free(p);
		}
		CHECK_EQ(get_check(r, 1, 8, ok), 8);
		CHECK_OK(kvt_remote_stat_get(r, &st));
		CHECK_EQ(st.nodes_up, 1);
		CHECK(st.connects >= 2);
	}

	/* auth */
	{
		char s2[300];
		kvt_remote *ra;
		uint64_t nerr;

		CHECK(rt_reply_is(rt_cmd(port, "CONFIG", "SET", "requirepass",
					 "s3cret"), "OK"));
		/* a connection made before keeps its login: a new handle */
		CHECK_OK(kvt_remote_open(&ra, spec, &g));
		CHECK_OK(kvt_remote_stat_get(ra, &st));
		nerr = st.node_errors;
		CHECK_EQ(get_check(ra, 1, 8, ok), 0);
		CHECK_OK(kvt_remote_stat_get(ra, &st));
		CHECK(st.node_errors > nerr);
		CHECK_EQ(st.read_failures, 8);
		kvt_remote_close(ra);
		snprintf(s2, sizeof(s2), "%s,auth=s3cret", spec);
		CHECK_OK(kvt_remote_open(&ra, s2, &g));
		CHECK_EQ(get_check(ra, 1, 8, ok), 8);
		kvt_remote_close(ra);
		snprintf(s2, sizeof(s2), "%s,auth=wrong", spec);
		CHECK_OK(kvt_remote_open(&ra, s2, &g));
		CHECK_EQ(get_check(ra, 1, 8, ok), 0);
		CHECK_OK(kvt_remote_stat_get(ra, &st));
		CHECK_EQ(st.read_failures, 8);
		kvt_remote_close(ra);
	}
	kvt_remote_close(r);
	rt_stop(&srv, SIGTERM);
	TEST_DONE();
}
