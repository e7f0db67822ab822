/* fuzz_remote — the remote tier's two parsers of outside bytes. The first
 * input byte picks one:
 *   0  kvti_remote_spec_parse() of the rest (a --url, a config value): an
 *      accepted spec has 1..64 seeds with ports in range and a prefix
 *   1  the rest as a value read from Redis: the header check and the
 *      layer-by-layer take never read past it and never crash
 *   2  a valid value with bytes flipped as the rest says (pairs: position,
 *      xor): whatever passes both checks is the original, byte for byte
 *   3  the same with a MAC (key=): whatever passes the header check, the
 *      MAC and the sums is the original */
#include "fuzz.h"
#include "remote/remote_impl.h"
#include "xfer/xxh.h"

static kvt_geom g;
static struct kvti_rfmt f, fk;

static void setup(void)
{
	if (g.layers)
		return;
	snprintf(g.name, sizeof(g.name), "fuzz");
	g.layers = 2;
	g.kv_heads_total = 1;
	g.head_dim = 8;
	g.dtype_bytes = 2;
	g.page_tokens = 2; /* chunk 32 B, page 128 B */
	g.tp_size = 1;
	g.q_heads = 1;
	g.hidden = 8;
	g.params = g.active_params = 1;
	FUZZ_ASSERT(kvt_geom_finish(&g) == 0);
	kvti_remote_fmt(&f, &g, "fuzz");
	fk = f;
	kvti_remote_fmt_key(&fk, "0123456789abcdef0123456789abcdef", 32,
			    "fuzz");
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	kvt_page_key key = { 0x1234, 0x5678 };
	uint8_t v[512], orig[512], page[128];
	uint64_t sums[2];

	if (size < 1 || size > 4096)
		return 0;
	setup();
	switch (data[0] % 4) {
	case 0: {
		struct kvti_rspec s;
		char *text = fuzz_str(data + 1, size - 1);

		if (kvti_remote_spec_parse(text, &s) == 0) {
			FUZZ_ASSERT(s.nseeds >= 1 && s.nseeds <= KVTI_RSEEDS_MAX);
			for (size_t i = 0; i < s.nseeds; i++)
				FUZZ_ASSERT(s.seeds[i].port >= 1 &&
					    s.seeds[i].port <= 65535 &&
					    s.seeds[i].host[0]);
			FUZZ_ASSERT(s.prefix[0] && s.timeout_ms >= 1);
			FUZZ_ASSERT(!s.cluster || !s.db);
		}
		free(text);
		break;
	}
	case 1: {
		/* a copy of exactly the input's size: ASan sees any overread */
		uint8_t *in = malloc(size - 1 ? size - 1 : 1);

		memcpy(in, data + 1, size - 1);
		if (kvti_remote_head_check(&f, &key, in, size - 1, NULL) == 0)
			kvti_remote_value_take(&f, in, page, sums);
		free(in);
		break;
	}
	case 2:
	case 3: {
		/* a valid value (with a MAC for 3), bytes flipped: whatever
		 * passes every check is the original */
		const struct kvti_rfmt *vf = data[0] % 4 == 3 ? &fk : &f;
		size_t n = kvti_remote_value_len(vf);

		FUZZ_ASSERT(n <= sizeof(v));
		for (size_t i = 0; i < vf->page_bytes; i++)
			page[i] = (uint8_t)(i * 37 + 11);
		for (uint32_t l = 0; l < vf->nsums; l++)
			sums[l] = XXH3_64bits(page + l * vf->layer_bytes,
					      vf->layer_bytes);
		kvti_remote_head_write(vf, &key, sums, v);
		memcpy(v + kvti_remote_head_bytes(vf), page, vf->page_bytes);
		if (vf->mac) {
			kvti_remote_mac_write(vf, v);
			FUZZ_ASSERT(kvti_remote_mac_check(vf, v) == 0);
		}
		memcpy(orig, v, n);
		for (size_t i = 1; i + 1 < size; i += 2)
			v[data[i] * 7u % n] ^= data[i + 1];
		if (kvti_remote_head_check(vf, &key, v, n, NULL) == 0 &&
		    (!vf->mac || kvti_remote_mac_check(vf, v) == 0) &&
		    kvti_remote_value_take(vf, v, page, sums) == 0)
			FUZZ_ASSERT(!memcmp(v, orig, n));
		break;
	}
	}
	return 0;
}
