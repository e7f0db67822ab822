/*
 * test_dev_xxh3 — the portable XXH3-64 (src/dev/xxh3.h: one source for the
 * CPU, the emulated device and the CUDA checksum kernel) against
 * libxxhash's XXH3_64bits_withSeed(), bit for bit:
 *   - one-shot, every length 0..2200 and lengths around every size class
 *     and block boundary up to 1 MiB + 7, seeds 0, 1 and random, start
 *     addresses at every alignment 0..15;
 *   - streaming, the same inputs cut into random pieces (1-byte pieces,
 *     pieces around the 256-byte buffer and the 1 KiB block included);
 *   - sources: the input as nseg equal segments (the K and V chunks of a
 *     layer; every chunk of a page), hashed sequentially and by the
 *     block-parallel evaluation the device kernel uses (32 lanes, then the
 *     reduction), over segment lengths that straddle words and stripes;
 *   - the block sums taken in reverse order (the kernel's warps finish in
 *     any order) give the same hash.
 */
#include "harness.h"
#include "dev/xxh3.h"

#include <xxhash.h>

static uint64_t rng = 0x9e3779b97f4a7c15ull;

static uint64_t next(void)
{
	rng ^= rng << 13;
	rng ^= rng >> 7;
	rng ^= rng << 17;
	return rng;
}

static void fill(uint8_t *p, size_t n)
{
	for (size_t i = 0; i < n; i++)
		p[i] = (uint8_t)next();
}

static int bad;

static void check_one(const uint8_t *p, size_t n, uint64_t seed)
{
	uint64_t want = XXH3_64bits_withSeed(p, n, seed);
	uint64_t got = kvt_xxh3_64(p, n, seed);

	if (got != want && bad++ < 10)
		fprintf(stderr, "one-shot: len %zu seed %llx: %016llx, libxxhash "
			"%016llx\n", n, (unsigned long long)seed,
			(unsigned long long)got, (unsigned long long)want);
	CHECK(got == want);
}

static void check_stream(const uint8_t *p, size_t n, uint64_t seed, int mode)
{
	uint64_t want = XXH3_64bits_withSeed(p, n, seed);
	kvt_xxh3 h;
	size_t o = 0;

	kvt_xxh3_reset(&h, seed);
	while (o < n) {
		size_t k;

		switch (mode) {
		case 0: k = 1; break;
		case 1: k = 1 + next() % 300; break;
		case 2: k = 255 + next() % 3; break;
		case 3: k = 1023 + next() % 3; break;
		default: k = 1 + next() % 5000; break;
		}
		if (k > n - o)
			k = n - o;
		kvt_xxh3_update(&h, p + o, k);
		o += k;
		if (next() % 7 == 0)
			kvt_xxh3_update(&h, p, 0);
	}
	if (kvt_xxh3_digest(&h) != want && bad++ < 10)
		fprintf(stderr, "stream mode %d: len %zu seed %llx differs\n",
			mode, n, (unsigned long long)seed);
	CHECK(kvt_xxh3_digest(&h) == want);
}

/* @p as @nseg segments of @len bytes, copied apart to odd addresses. */
static void check_src(const uint8_t *p, uint32_t nseg, uint64_t len)
{
	uint64_t want = XXH3_64bits(p, (size_t)(nseg * len));
	const uint8_t *seg[64];
	uint8_t *store = malloc((size_t)(nseg * (len + 24)) + 1);
	kvt_xxh3_src s = { .seg = seg, .seg_len = len, .nseg = nseg };
	uint64_t a, b;

	if (!store) {
		CHECK(store);
		return;
	}
	for (uint32_t k = 0; k < nseg; k++) {
		uint8_t *q = store + k * (len + 24) + (k * 5) % 16;

		memcpy(q, p + k * len, (size_t)len);
		seg[k] = q;
	}
	a = kvt_xxh3_src_64(&s, 0, NULL);
	b = kvt_xxh3_src_lanes(&s);
	if ((a != want || b != want) && bad++ < 10)
		fprintf(stderr, "source %u x %llu: sequential %016llx lanes "
			"%016llx libxxhash %016llx\n", nseg,
			(unsigned long long)len, (unsigned long long)a,
			(unsigned long long)b, (unsigned long long)want);
	CHECK(a == want);
	CHECK(b == want);
	free(store);
}

/* The kernel's evaluation with the blocks' sums taken last to first. */
static void check_reverse(const uint8_t *p, size_t len)
{
	const uint8_t *seg[1] = { p };
	kvt_xxh3_src s = { .seg = seg, .seg_len = len, .nseg = 1 };
	const uint8_t *sec = KVT_XXH3_KSECRET;
	uint64_t n = (len - 1) / KVT_XXH3_STRIPE;
	uint64_t nb = (n + 15) / 16, acc[8], m[32], d[32], *sum;

	sum = calloc(nb ? nb : 1, 8 * sizeof(uint64_t));
	if (!sum) {
		CHECK(sum);
		return;
	}
	for (uint64_t b = nb; b-- > 0;) {
		for (unsigned t = 0; t < 32; t++)
			kvt_xxh3_lane(&s, b, n, t, sec, &m[t], &d[t]);
		kvt_xxh3_reduce(m, d, sum + 8 * b);
	}
	for (unsigned i = 0; i < 8; i++)
		acc[i] = kvt_xxh3_init_acc(i);
	for (uint64_t b = 0; b < nb; b++)
		for (unsigned i = 0; i < 8; i++) {
			acc[i] += sum[8 * b + i];
			if ((b + 1) * 16 <= n)
				acc[i] = kvt_xxh3_scramble1(acc[i], i, sec);
		}
	for (unsigned i = 0; i < 8; i++) {
		uint64_t self = 0, swap = 0;

		kvt_xxh3_word(kvt_xxh_rd64(p + len - 64 + 8 * i),
			      sec + KVT_XXH3_LAST_SECRET, i, &self, &swap);
		acc[i] += self;
		acc[i ^ 1] += swap;
	}
	CHECK(kvt_xxh3_merge(acc, len, sec) == XXH3_64bits(p, len));
	free(sum);
}

int main(void)
{
	const size_t big = (1u << 20) + 64;
	static const size_t edges[] = { 239, 240, 241, 255, 256, 257, 1023,
					1024, 1025, 1087, 1088, 1089, 2048, 2049,
					4095, 4096, 4097, 16384 + 1, 65536,
					65536 + 63, 131072, 262144 + 3,
					(1u << 20) + 7 };
	uint64_t seeds[3] = { 0, 1, 0 };
	uint8_t *buf = malloc(big + 32);

	if (!buf)
		SKIP("no memory");
	fill(buf, big + 32);
	seeds[2] = next();
	/* every short and mid length, every class boundary, three seeds */
	for (size_t n = 0; n <= 2200; n++)
		for (int s = 0; s < 3; s++)
			check_one(buf + (n % 16), n, seeds[s]);
	for (size_t i = 0; i < sizeof(edges) / sizeof(edges[0]); i++)
		for (int s = 0; s < 3; s++)
			for (size_t a = 0; a < 16; a += 5)
				check_one(buf + a, edges[i], seeds[s]);
	/* streaming: every split shape over lengths around the buffer and
	 * block boundaries */
	for (int mode = 0; mode < 5; mode++)
		for (size_t i = 0; i < sizeof(edges) / sizeof(edges[0]); i++) {
			if (mode == 0 && edges[i] > 70000)
				continue;
			for (int s = 0; s < 3; s++)
				check_stream(buf + 3, edges[i], seeds[s], mode);
		}
	for (int k = 0; k < 400; k++)
		check_stream(buf + k % 16, next() % 9000, seeds[k % 3],
			     1 + k % 4);
	/* sources: K and V chunks (2 segments), a whole page (many), MLA
	 * (1), lengths that split words and stripes */
	static const uint64_t lens[] = { 1, 3, 7, 8, 9, 60, 64, 65, 100, 120,
					 121, 128, 200, 256, 513, 1000, 1024,
					 1030, 4096, 8192 + 2, 32768 };
	static const uint32_t nsegs[] = { 1, 2, 3, 8, 64 };
	for (size_t i = 0; i < sizeof(lens) / sizeof(lens[0]); i++)
		for (size_t k = 0; k < sizeof(nsegs) / sizeof(nsegs[0]); k++)
			if (lens[i] * nsegs[k] <= big)
				check_src(buf + 1, nsegs[k], lens[i]);
	for (size_t i = 0; i < sizeof(edges) / sizeof(edges[0]); i++)
		if (edges[i] > 240)
			check_reverse(buf + 7, edges[i]);
	free(buf);
	TEST_DONE();
}
