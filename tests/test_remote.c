/*
 * test_remote.c — the remote tier without a server: CRC16 and hash slots
 * against the Redis Cluster spec's values, spec strings (good and bad),
 * the value header (every field tampered with is caught), redirect
 * parsing, and a handle whose server is down (misses counted, no error).
 */
#include "remote/remote_impl.h"
#include "remote_util.h"
#include "xfer/xxh.h"

static void test_crc16(void)
{
	/* the Redis Cluster specification's reference value */
	CHECK_EQ(kvt_remote_crc16("123456789", 9), 0x31C3);
	CHECK_EQ(kvt_remote_crc16("", 0), 0);
	/* CLUSTER KEYSLOT answers of a real server */
	CHECK_EQ(kvt_remote_slot("foo", 3), 12182);
	CHECK_EQ(kvt_remote_slot("bar", 3), 5061);
	/* hash tags: the first {...} with something inside */
	CHECK_EQ(kvt_remote_slot("{user1000}.following", 20),
		 kvt_remote_slot("{user1000}.followers", 20));
	CHECK_EQ(kvt_remote_slot("{user1000}.following", 20),
		 kvt_remote_slot("user1000", 8));
	CHECK_EQ(kvt_remote_slot("foo{}{bar}", 10),
		 kvt_remote_crc16("foo{}{bar}", 10) & 16383);
	CHECK_EQ(kvt_remote_slot("foo{{bar}}zap", 13),
		 kvt_remote_slot("{bar", 4));
	CHECK_EQ(kvt_remote_slot("foo{bar}{zap}", 13),
		 kvt_remote_slot("bar", 3));
	CHECK_EQ(kvt_remote_slot("foo{bar", 7),
		 kvt_remote_crc16("foo{bar", 7) & 16383);
}

static void test_spec(void)
{
	struct kvti_rspec s;
	static const char *bad[] = {
		"", "redis://", "http://127.0.0.1:6379", "redis://localhost",
		"redis://127.0.0.1:0", "redis://127.0.0.1:65536",
		"redis://127.0.0.1:63x", "redis://h:1,h:2",
		"redis://[::1]:6379", "redis://h:1,prefix=", "redis://h:1,prefix=a b",
		"redis://h:1,prefix=a{b}", "redis://h:1,ttl=-1",
		"redis://h:1,ttl=5y", "redis://h:1,timeout=0",
		"redis://h:1,db=1024", "redis-cluster://h:1,db=1",
		"redis://h:1,tag=slot", "redis://h:1,colour=red",
		"redis://h:1,auth=", "redis://h:1,auth=:pw",
		"redis://h!:1", "redis-cluster://prefix=x",
	};

	CHECK_OK(kvti_remote_spec_parse("remote:redis://127.0.0.1:6379", &s));
	CHECK_EQ(s.cluster, 0);
	CHECK_EQ(s.nseeds, 1);
	CHECK(!strcmp(s.seeds[0].host, "127.0.0.1"));
	CHECK_EQ(s.seeds[0].port, 6379);
	CHECK(!strcmp(s.prefix, "kvt:"));
	CHECK_EQ(s.ttl_ms, 0);
	CHECK_EQ(s.timeout_ms, 2000);
	CHECK_OK(kvti_remote_spec_parse("redis://cache-1.local:7000,prefix=a:b:,"
					"ttl=2h,auth=bob:s3cr:et,timeout=250,"
					"db=3,tag=ns,ns=llama", &s));
	CHECK(!strcmp(s.seeds[0].host, "cache-1.local"));
	CHECK(!strcmp(s.prefix, "a:b:"));
	CHECK_EQ(s.ttl_ms, 7200000);
	CHECK(s.auth && !strcmp(s.user, "bob") && !strcmp(s.pass, "s3cr:et"));
	CHECK_EQ(s.timeout_ms, 250);
	CHECK_EQ(s.db, 3);
	CHECK_EQ(s.tag_ns, 1);
	CHECK(!strcmp(s.ns, "llama"));
	CHECK_OK(kvti_remote_spec_parse("remote:redis-cluster://10.0.0.1:7000,"
					"10.0.0.2:7001,10.0.0.3:7002,ttl=90s",
					&s));
	CHECK_EQ(s.cluster, 1);
	CHECK_EQ(s.nseeds, 3);
	CHECK_EQ(s.seeds[2].port, 7002);
	CHECK_EQ(s.ttl_ms, 90000);
	CHECK_OK(kvti_remote_spec_parse("valkey://h:1,auth=pw,ttl=500ms", &s));
	CHECK(s.auth && !s.user[0] && !strcmp(s.pass, "pw"));
	CHECK_EQ(s.ttl_ms, 500);
	for (size_t i = 0; i < KVT_ARRAY_SIZE(bad); i++) {
		int err = kvti_remote_spec_parse(bad[i], &s);

		if (err != KVT_ESPEC)
			fprintf(stderr, "spec '%s' -> %d\n", bad[i], err);
		CHECK_EQ(err, KVT_ESPEC);
		CHECK(kvt_errdetail()[0]);
	}
	CHECK_ERR(kvti_remote_spec_parse("rediss://h:1", &s), KVT_ENOTBUILT);
	CHECK_ERR(kvti_remote_spec_parse("redis://h:1,tls=yes", &s),
		  KVT_ENOTBUILT);
	/* a password is never echoed in the message */
	CHECK_ERR(kvti_remote_spec_parse("redis://h:1,auth=:hunter2", &s),
		  KVT_ESPEC);
	CHECK(!strstr(kvt_errdetail(), "hunter2"));
}

static void test_value(void)
{
	kvt_geom g, g2;
	struct kvti_rfmt f, f2;
	kvt_page_key k = { 7, 9 }, k2 = { 7, 10 };
	uint64_t sums[4], got[4];
	uint8_t *v, *page, *out;
	size_t head, len;
	const char *why;

	rt_geom(&g, "test-model");
	g2 = g;
	g2.page_tokens = 16;
	CHECK_OK(kvt_geom_finish(&g2));
	kvti_remote_fmt(&f, &g, "test-model");
	kvti_remote_fmt(&f2, &g2, "test-model");
	CHECK(f.geom_hash != f2.geom_hash);
	head = kvti_remote_head_bytes(&f);
	CHECK_EQ(head, 64 + 4 * 8);
	len = head + f.page_bytes;
	v = malloc(len);
	out = malloc(f.page_bytes);
	page = v + head;
	rt_fill(page, f.page_bytes, &k);
	for (int l = 0; l < 4; l++)
		sums[l] = XXH3_64bits(page + l * f.layer_bytes, f.layer_bytes);
	kvti_remote_head_write(&f, &k, sums, v);
	CHECK(!memcmp(v, "KVTR", 4));
	CHECK_OK(kvti_remote_head_check(&f, &k, v, len, &why));
	CHECK_OK(kvti_remote_value_take(&f, v, out, got));
	CHECK(!memcmp(out, page, f.page_bytes));
	CHECK(!memcmp(got, sums, sizeof(sums)));
	/* another key, geometry, namespace, length */
	CHECK_ERR(kvti_remote_head_check(&f, &k2, v, len, &why), KVT_ECORRUPT);
	CHECK(!strcmp(why, "page key"));
	CHECK_ERR(kvti_remote_head_check(&f2, &k, v, len, &why), KVT_ECORRUPT);
	CHECK(!strcmp(why, "geometry"));
	kvti_remote_fmt(&f2, &g, "other-model");
	CHECK_ERR(kvti_remote_head_check(&f2, &k, v, len, &why), KVT_ECORRUPT);
	CHECK(!strcmp(why, "namespace"));
	CHECK_ERR(kvti_remote_head_check(&f, &k, v, len - 1, &why),
		  KVT_ECORRUPT);
	CHECK_ERR(kvti_remote_head_check(&f, &k, v, 10, &why), KVT_ECORRUPT);
	/* every header byte flipped in turn is caught by the header check */
	for (size_t i = 0; i < head; i++) {
		v[i] ^= 0x40;
		CHECK_ERR(kvti_remote_head_check(&f, &k, v, len, &why),
			  KVT_ECORRUPT);
		v[i] ^= 0x40;
	}
	/* a byte of any layer: the header passes, the layer's sum does not */
	for (int l = 0; l < 4; l++) {
		size_t at = head + l * f.layer_bytes + 77;

		v[at] ^= 1;
		CHECK_OK(kvti_remote_head_check(&f, &k, v, len, &why));
		CHECK_ERR(kvti_remote_value_take(&f, v, out, NULL),
			  KVT_ECORRUPT);
		v[at] ^= 1;
	}
	free(v);
	free(out);
}

static void test_redirect(void)
{
	char host[64];
	int slot, port;

	CHECK_EQ(kvti_remote_redirect("MOVED 3999 127.0.0.1:6381", 25, &slot,
				      host, sizeof(host), &port), 1);
	CHECK_EQ(slot, 3999);
	CHECK(!strcmp(host, "127.0.0.1"));
	CHECK_EQ(port, 6381);
	CHECK_EQ(kvti_remote_redirect("ASK 16383 h:1", 13, &slot, host,
				      sizeof(host), &port), 2);
	CHECK_EQ(slot, 16383);
	CHECK_EQ(kvti_remote_redirect("MOVED 16384 h:1", 15, &slot, host,
				      sizeof(host), &port), 0);
	CHECK_EQ(kvti_remote_redirect("MOVED 1 h:0", 11, &slot, host,
				      sizeof(host), &port), 0);
	CHECK_EQ(kvti_remote_redirect("MOVED 1 :5", 10, &slot, host,
				      sizeof(host), &port), 0);
	CHECK_EQ(kvti_remote_redirect("OOM command not allowed", 23, &slot,
				      host, sizeof(host), &port), 0);
}

/* Nothing listens: open works, every call misses and counts. */
static void test_down(void)
{
	kvt_geom g;
	kvt_remote *r = NULL;
	kvt_remote_stat st;
	kvt_page_key k[3];
	uint8_t page[16384], ok[3];
	void *bufs[3] = { page, page, page };
	const void *cbufs[3] = { page, page, page };
	char spec[96];
	size_t lead = 9;

	rt_geom(&g, "test-model");
	rt_keys(k, 3, 1);
	snprintf(spec, sizeof(spec), "remote:redis://127.0.0.1:%d,timeout=200",
		 rt_free_port(0));
	CHECK_OK(kvt_remote_open(&r, spec, &g));
	if (!r)
		return;
	CHECK_EQ(kvt_remote_value_bytes(r), 64 + 32 + 16384);
	CHECK_OK(kvt_remote_exists(r, k, 3, &lead, NULL));
	CHECK_EQ(lead, 0);
	CHECK_EQ(kvt_remote_get(r, k, 3, bufs, ok, NULL), 0);
	CHECK(!ok[0] && !ok[1] && !ok[2]);
	CHECK_EQ(kvt_remote_set(r, k, 3, cbufs, NULL, ok), 0);
	CHECK_OK(kvt_remote_stat_get(r, &st));
	CHECK_EQ(st.calls, 3);
	CHECK_EQ(st.misses, 3);
	CHECK_EQ(st.read_failures, 6);
	CHECK_EQ(st.write_failures, 3);
	CHECK_EQ(st.nodes, 1);
	CHECK_EQ(st.nodes_up, 0);
	CHECK(st.connect_failures >= 1);
	/* bad arguments are the only errors */
	CHECK_ERR(kvt_remote_get(r, k, 3, NULL, ok, NULL), -EINVAL);
	CHECK_ERR(kvt_remote_exists(r, k, 3, NULL, NULL), -EINVAL);
	bufs[1] = NULL;
	CHECK_ERR(kvt_remote_get(r, k, 3, bufs, ok, NULL), -EINVAL);
	kvt_remote_close(r);
	/* tag=ns: every page of the namespace in one slot */
	{
		char a[160], b[160];
		int la, lb;

		CHECK_OK(kvt_remote_open(&r, "redis-cluster://127.0.0.1:1,"
					 "tag=ns,timeout=100", &g));
		if (r) {
			la = kvt_remote_key_name(r, &k[0], a, sizeof(a));
			lb = kvt_remote_key_name(r, &k[2], b, sizeof(b));
			CHECK(la > 0 && lb > 0 && strchr(a, '{'));
			CHECK_EQ(kvt_remote_slot(a, (size_t)la),
				 kvt_remote_slot(b, (size_t)lb));
			CHECK_ERR(kvt_remote_key_name(r, &k[0], a, 20), -ERANGE);
			kvt_remote_close(r);
		}
		CHECK_OK(kvt_remote_open(&r, "redis-cluster://127.0.0.1:1,"
					 "timeout=100", &g));
		if (r) {
			la = kvt_remote_key_name(r, &k[0], a, sizeof(a));
			CHECK(la > 0 && !strchr(a, '{'));
			CHECK(!strncmp(a, "kvt:", 4));
			kvt_remote_close(r);
		}
	}
	CHECK_ERR(kvt_remote_open(&r, "redis://h:1,bogus=1", &g), KVT_ESPEC);
	g.layers = 0;
	CHECK_ERR(kvt_remote_open(&r, "redis://h:1", &g), KVT_EGEOM);
	kvt_remote_close(NULL);
}

int main(void)
{
	test_crc16();
	test_spec();
	test_value();
	test_redirect();
	test_down();
	TEST_DONE();
}
