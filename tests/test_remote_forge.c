/*
 * test_remote_forge — pages forged in a shared Redis are refused (issue 21,
 * finding 6: the values' checks were unkeyed XXH3 over a documented
 * layout, so a local user who could reach Redis rewrote every value with
 * recomputed sums and a fresh daemon served every page as verified). A
 * real redis-server on loopback (skipped without one):
 *
 *   node W (key=FILE) writes 16 pages; a reader R with the same key gets
 *   them all, byte for byte;
 *   an attacker without the key rewrites every value: other page bytes,
 *   the layer sums and the header check recomputed, as a handle without
 *   key= writes them (no MAC) — R refuses all 16 (bad_values), serves
 *   none;
 *   an attacker who guessed a key: the values carry a MAC flag and a tag
 *   of the wrong key — refused;
 *   a valid value with one page byte flipped, and one moved under another
 *   page's name — refused;
 *   key files: readable by others, shorter than 32 bytes, missing — open
 *   refuses (KVT_ECONFIG); a handle without key= is allowed, with a
 *   warning, and refuses MAC'd values (its own kind only).
 */
#include "remote_util.h"
#include "remote/remote_impl.h"
#include "xfer/xxh.h"

#include <fcntl.h>
#include <sys/stat.h>

#define N 16

static kvt_geom g;
static int port;
static const char *dir;

/* Read every page with @r: how many came back right (the bytes of
 * rt_fill), and check none came back wrong. */
static int read_all(kvt_remote *r, const kvt_page_key *keys, uint8_t **bufs,
		    int *wrong)
{
	uint64_t pb = kvt_geom_page_bytes(&g);
	uint8_t ok[N], *want = malloc(pb);
	int right = 0;

	*wrong = 0;
	CHECK(kvt_remote_get(r, keys, N, (void *const *)bufs, ok, NULL) >= 0);
	for (int i = 0; i < N; i++) {
		if (!ok[i])
			continue;
		rt_fill(want, pb, &keys[i]);
		if (memcmp(bufs[i], want, pb))
			(*wrong)++;
		else
			right++;
	}
	free(want);
	return right;
}

/* SET @key's value to @v (@len bytes) behind the library's back. */
static void raw_set(kvt_remote *r, const kvt_page_key *key, const void *v,
		    size_t len)
{
	char name[KVTI_RKEY_MAX];
	const char *av[3] = { "SET", name, v };
	size_t al[3] = { 3, 0, len };

	al[1] = (size_t)kvt_remote_key_name(r, key, name, sizeof(name));
	CHECK(rt_reply_is(rt_cmdv(port, 3, av, al), "OK"));
}

int main(void)
{
	char kf[600], bad[600];
	kvt_page_key keys[N];
	uint8_t *bufs[N], *forged[N];
	kvt_remote_stat st;
	kvt_remote *w, *rd, *plain, *x;
	struct rt_server srv;
	uint64_t pb;
	int right, wrong;

	rt_need_redis();
	rt_geom(&g, "forge");
	pb = kvt_geom_page_bytes(&g);
	dir = test_dir("remote_forge");
	port = rt_free_port(0);
	if (rt_start(&srv, dir, port, NULL))
		SKIP("redis-server would not start here");
	snprintf(kf, sizeof(kf), "%s/ns.key", dir);
	rt_write_key(kf, "a secret of more than thirty-two bytes, for the test",
		  0600);
	rt_keys(keys, N, 1);
	for (int i = 0; i < N; i++) {
		bufs[i] = malloc(pb);
		forged[i] = malloc(pb);
		rt_fill(bufs[i], pb, &keys[i]);
		memset(forged[i], 0x5a ^ i, pb); /* the attacker's bytes */
	}
	w = rt_open(port, kf, &g);
	rd = rt_open(port, kf, &g);
	plain = rt_open(port, NULL, &g); /* warns: values not authenticated */
	if (!w || !rd || !plain)
		return 1;
	CHECK_EQ(kvt_remote_set(w, keys, N, (const void *const *)bufs, NULL,
				NULL), N);
	CHECK_EQ(read_all(rd, keys, bufs, &wrong), N);
	CHECK_EQ(wrong, 0);
	/* a handle without the key takes none of them */
	CHECK_EQ(read_all(plain, keys, bufs, &wrong), 0);

	/* no key: forged bytes with the sums recomputed */
	CHECK_EQ(kvt_remote_set(plain, keys, N, (const void *const *)forged,
				NULL, NULL), N);
	right = read_all(rd, keys, bufs, &wrong);
	CHECK_EQ(right, 0);
	if (wrong) {
		fprintf(stderr, "%d forged pages served as verified\n", wrong);
		kvt_test_failures++;
	}
	CHECK_OK(kvt_remote_stat_get(rd, &st));
	CHECK(st.bad_values >= N);

	/* a guessed key: flagged, tagged, wrong */
	{
		struct kvti_rfmt f;
		uint8_t *v = malloc(kvti_remote_value_len(&rd->fmt));
		uint64_t sums[8];

		kvti_remote_fmt(&f, &g, "forge");
		kvti_remote_fmt_key(&f, "not the secret, but as long as one "
				    "would be", 40, "forge");
		for (int i = 0; i < N; i++) {
			for (uint32_t l = 0; l < f.nsums; l++)
				sums[l] = XXH3_64bits(forged[i] + l *
						      f.layer_bytes,
						      f.layer_bytes);
			kvti_remote_head_write(&f, &keys[i], sums, v);
			memcpy(v + kvti_remote_head_bytes(&f), forged[i], pb);
			kvti_remote_mac_write(&f, v);
			raw_set(rd, &keys[i], v, kvti_remote_value_len(&f));
		}
		CHECK_EQ(read_all(rd, keys, bufs, &wrong), 0);
		CHECK_EQ(wrong, 0);
		free(v);
	}

	/* a true value, one byte flipped; a true value under another name */
	CHECK_EQ(kvt_remote_set(w, keys, N, (const void *const *)bufs, NULL,
				NULL), N);
	{
		char name[KVTI_RKEY_MAX];
		redisReply *rep;

		kvt_remote_key_name(rd, &keys[0], name, sizeof(name));
		rep = rt_cmd(port, "GET", name);
		CHECK(rep && rep->type == REDIS_REPLY_STRING &&
		      (uint64_t)rep->len == kvti_remote_value_len(&rd->fmt));
		if (rep && rep->type == REDIS_REPLY_STRING) {
			raw_set(rd, &keys[1], rep->str, rep->len);
			rep->str[kvti_remote_head_bytes(&rd->fmt) + 5] ^= 1;
			raw_set(rd, &keys[0], rep->str, rep->len);
		}
		if (rep)
			freeReplyObject(rep);
		CHECK_EQ(read_all(rd, keys, bufs, &wrong), N - 2);
		CHECK_EQ(wrong, 0);
	}

	/* key files the daemon must refuse */
	snprintf(bad, sizeof(bad), "%s/open.key", dir);
	rt_write_key(bad, "a secret of more than thirty-two bytes, for the test",
		  0644);
	{
		char spec[700];

		snprintf(spec, sizeof(spec), "redis://127.0.0.1:%d,key=%s",
			 port, bad);
		CHECK_ERR(kvt_remote_open(&x, spec, &g), KVT_ECONFIG);
		rt_write_key(bad, "too short", 0600);
		CHECK_ERR(kvt_remote_open(&x, spec, &g), KVT_ECONFIG);
		snprintf(spec, sizeof(spec), "redis://127.0.0.1:%d,key=%s/none",
			 port, dir);
		CHECK_ERR(kvt_remote_open(&x, spec, &g), KVT_ECONFIG);
	}

	kvt_remote_close(w);
	kvt_remote_close(rd);
	kvt_remote_close(plain);
	for (int i = 0; i < N; i++) {
		free(bufs[i]);
		free(forged[i]);
	}
	rt_stop(&srv, SIGTERM);
	TEST_DONE();
}
