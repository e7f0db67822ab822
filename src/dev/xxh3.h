/*
 * xxh3.h — XXH3-64, written once for the CPU and the device: every
 * function here compiles as C11 and as CUDA (__host__ __device__), so the
 * checksum kernel (src/dev/cuda_kern.cu), the emulated device's "kernel"
 * (src/dev/emu.c) and the CPU paths all compute one function, bit for bit
 * the value of libxxhash's XXH3_64bits() / _withSeed() (tests/
 * test_dev_xxh3.c checks it over many sizes, seeds, splits, alignments and
 * segmentations). The CPU lanes keep using libxxhash itself (its AVX2
 * dispatch is several times faster than this portable code); the values
 * are the same.
 *
 * Every page copy carries one XXH3-64 per layer, over that layer's K then V
 * chunks in page-first byte order (include/kvtier/cache.h); on the device
 * those chunks are two separate runs of bytes in the engine's layer-first
 * memory. So the input here is a *source*: nseg segments of seg_len bytes
 * each, hashed as their concatenation (kvt_xxh3_src).
 *
 * THE LONG HASH (inputs over 240 bytes), as this file evaluates it
 *
 *   input  = stripes of 64 bytes; a block = 16 stripes = 1 KiB
 *   acc[8] = initial constants
 *   for each full block b (there are (len-1)/1024):
 *       acc += S(b)          S(b)[i] = sum over the block's 128 words w
 *                            (stripe s = w/8, lane i = w%8) of
 *                              mul32x32(word ^ secret[8s+8i])  into acc[i]
 *                              word                            into acc[i^1]
 *       acc  = scramble(acc) lane-wise: (a ^ a>>47 ^ secret[128+8i]) * P32_1
 *   acc += S(partial block: the remaining whole stripes but the last byte)
 *   acc += stripe(last 64 bytes of the input, secret at 121)
 *   hash = merge(acc, secret at 11, len * P64_1)
 *
 * Within a block every update is an addition (mod 2^64), so S(b) does not
 * depend on acc: the 128 words of a block may be summed in any order, by
 * any number of threads, and reduced. Only "add S(b), scramble" is
 * sequential, and it is 8 independent lanes. The device kernel uses
 * exactly that: a warp per (page, layer), lane t summing the words
 * t, t+32, t+64, t+96 of a block (kvt_xxh3_lane()), a shuffle reduction,
 * lanes 0-7 holding acc[0..7] for the chain. kvt_xxh3_src_lanes() is the
 * same evaluation on the CPU (32 lanes in a loop), checked against
 * libxxhash, so the kernel's arithmetic is tested without a GPU; only the
 * shuffles are the kernel's own.
 *
 * Short inputs (0-240 bytes) take XXH3's short paths on one thread.
 *
 * Little-endian hosts and devices only (x86-64, arm64, every CUDA GPU).
 */
#ifndef KVT_DEV_XXH3_H
#define KVT_DEV_XXH3_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "kvtier's XXH3 assumes a little-endian machine"
#endif

#if defined(__CUDACC__)
#define KVT_XXH_FN static inline __host__ __device__
#else
#define KVT_XXH_FN static inline
#endif

#define KVT_XXH3_SECRET_BYTES 192
#define KVT_XXH3_MIDSIZE_MAX 240
#define KVT_XXH3_STRIPE 64
#define KVT_XXH3_BLOCK 1024   /* 16 stripes: (192 - 64) / 8 */
#define KVT_XXH3_BLOCK_STRIPES 16

#define KVT_P32_1 0x9E3779B1u
#define KVT_P32_2 0x85EBCA77u
#define KVT_P32_3 0xC2B2AE3Du
#define KVT_P64_1 0x9E3779B185EBCA87ull
#define KVT_P64_2 0xC2B2AE3D27D4EB4Full
#define KVT_P64_3 0x165667B19E3779F9ull
#define KVT_P64_4 0x85EBCA77C2B2AE63ull
#define KVT_P64_5 0x27D4EB2F165667C5ull

/* XXH3's default secret (the "kSecret" of the specification; data, not
 * code). One copy for the host, one in constant memory for the device. */
#define KVT_XXH3_KSECRET_BYTES                                               \
	0xb8, 0xfe, 0x6c, 0x39, 0x23, 0xa4, 0x4b, 0xbe, 0x7c, 0x01, 0x81,    \
	0x2c, 0xf7, 0x21, 0xad, 0x1c, 0xde, 0xd4, 0x6d, 0xe9, 0x83, 0x90,    \
	0x97, 0xdb, 0x72, 0x40, 0xa4, 0xa4, 0xb7, 0xb3, 0x67, 0x1f, 0xcb,    \
	0x79, 0xe6, 0x4e, 0xcc, 0xc0, 0xe5, 0x78, 0x82, 0x5a, 0xd0, 0x7d,    \
	0xcc, 0xff, 0x72, 0x21, 0xb8, 0x08, 0x46, 0x74, 0xf7, 0x43, 0x24,    \
	0x8e, 0xe0, 0x35, 0x90, 0xe6, 0x81, 0x3a, 0x26, 0x4c, 0x3c, 0x28,    \
	0x52, 0xbb, 0x91, 0xc3, 0x00, 0xcb, 0x88, 0xd0, 0x65, 0x8b, 0x1b,    \
	0x53, 0x2e, 0xa3, 0x71, 0x64, 0x48, 0x97, 0xa2, 0x0d, 0xf9, 0x4e,    \
	0x38, 0x19, 0xef, 0x46, 0xa9, 0xde, 0xac, 0xd8, 0xa8, 0xfa, 0x76,    \
	0x3f, 0xe3, 0x9c, 0x34, 0x3f, 0xf9, 0xdc, 0xbb, 0xc7, 0xc7, 0x0b,    \
	0x4f, 0x1d, 0x8a, 0x51, 0xe0, 0x4b, 0xcd, 0xb4, 0x59, 0x31, 0xc8,    \
	0x9f, 0x7e, 0xc9, 0xd9, 0x78, 0x73, 0x64, 0xea, 0xc5, 0xac, 0x83,    \
	0x34, 0xd3, 0xeb, 0xc3, 0xc5, 0x81, 0xa0, 0xff, 0xfa, 0x13, 0x63,    \
	0xeb, 0x17, 0x0d, 0xdd, 0x51, 0xb7, 0xf0, 0xda, 0x49, 0xd3, 0x16,    \
	0x55, 0x26, 0x29, 0xd4, 0x68, 0x9e, 0x2b, 0x16, 0xbe, 0x58, 0x7d,    \
	0x47, 0xa1, 0xfc, 0x8f, 0xf8, 0xb8, 0xd1, 0x7a, 0xd0, 0x31, 0xce,    \
	0x45, 0xcb, 0x3a, 0x8f, 0x95, 0x16, 0x04, 0x28, 0xaf, 0xd7, 0xfb,    \
	0xca, 0xbb, 0x4b, 0x40, 0x7e

static const uint8_t kvt_xxh3_ksecret_h[KVT_XXH3_SECRET_BYTES] = {
	KVT_XXH3_KSECRET_BYTES
};
#if defined(__CUDACC__)
static __constant__ uint8_t kvt_xxh3_ksecret_d[KVT_XXH3_SECRET_BYTES] = {
	KVT_XXH3_KSECRET_BYTES
};
#endif
#if defined(__CUDA_ARCH__)
#define KVT_XXH3_KSECRET kvt_xxh3_ksecret_d
#else
#define KVT_XXH3_KSECRET kvt_xxh3_ksecret_h
#endif

/* ---- arithmetic --------------------------------------------------------- */

KVT_XXH_FN uint64_t kvt_xxh_rd64(const void *p)
{
	uint64_t v;

	memcpy(&v, p, sizeof(v));
	return v;
}

KVT_XXH_FN uint32_t kvt_xxh_rd32(const void *p)
{
	uint32_t v;

	memcpy(&v, p, sizeof(v));
	return v;
}

KVT_XXH_FN uint64_t kvt_xxh_rotl64(uint64_t x, int r)
{
	return (x << r) | (x >> (64 - r));
}

KVT_XXH_FN uint32_t kvt_xxh_swap32(uint32_t x)
{
	return (x << 24) | ((x << 8) & 0x00ff0000u) | ((x >> 8) & 0x0000ff00u) |
	       (x >> 24);
}

KVT_XXH_FN uint64_t kvt_xxh_swap64(uint64_t x)
{
	return ((uint64_t)kvt_xxh_swap32((uint32_t)x) << 32) |
	       kvt_xxh_swap32((uint32_t)(x >> 32));
}

/* The low and high halves of a 64x64 -> 128 product, folded by xor. */
KVT_XXH_FN uint64_t kvt_xxh_mulfold(uint64_t a, uint64_t b)
{
#if defined(__CUDA_ARCH__)
	return (a * b) ^ __umul64hi(a, b);
#elif defined(__SIZEOF_INT128__)
	__extension__ typedef unsigned __int128 u128;
	u128 p = (u128)a * b;

	return (uint64_t)p ^ (uint64_t)(p >> 64);
#else
	uint64_t lo_lo = (a & 0xffffffffu) * (b & 0xffffffffu);
	uint64_t hi_lo = (a >> 32) * (b & 0xffffffffu);
	uint64_t lo_hi = (a & 0xffffffffu) * (b >> 32);
	uint64_t hi_hi = (a >> 32) * (b >> 32);
	uint64_t cross = (lo_lo >> 32) + (hi_lo & 0xffffffffu) + lo_hi;
	uint64_t upper = (hi_lo >> 32) + (cross >> 32) + hi_hi;
	uint64_t lower = (cross << 32) | (lo_lo & 0xffffffffu);

	return lower ^ upper;
#endif
}

KVT_XXH_FN uint64_t kvt_xxh64_avalanche(uint64_t h)
{
	h ^= h >> 33;
	h *= KVT_P64_2;
	h ^= h >> 29;
	h *= KVT_P64_3;
	h ^= h >> 32;
	return h;
}

KVT_XXH_FN uint64_t kvt_xxh3_avalanche(uint64_t h)
{
	h ^= h >> 37;
	h *= 0x165667919E3779F9ull;
	h ^= h >> 32;
	return h;
}

KVT_XXH_FN uint64_t kvt_xxh3_rrmxmx(uint64_t h, uint64_t len)
{
	h ^= kvt_xxh_rotl64(h, 49) ^ kvt_xxh_rotl64(h, 24);
	h *= 0x9FB21C651E98DF25ull;
	h ^= (h >> 35) + len;
	h *= 0x9FB21C651E98DF25ull;
	return h ^ (h >> 28);
}

KVT_XXH_FN uint64_t kvt_xxh3_mix16(const uint8_t *p, const uint8_t *sec,
				   uint64_t seed)
{
	return kvt_xxh_mulfold(kvt_xxh_rd64(p) ^ (kvt_xxh_rd64(sec) + seed),
			       kvt_xxh_rd64(p + 8) ^ (kvt_xxh_rd64(sec + 8) - seed));
}

/* ---- short inputs (0..240 bytes, contiguous) ---------------------------- */

/* XXH3-64 of @n <= 240 bytes at @p with @seed; @sec is the default secret
 * (short inputs always use it, seeded or not). */
KVT_XXH_FN uint64_t kvt_xxh3_short(const uint8_t *p, size_t n, uint64_t seed,
				   const uint8_t *sec)
{
	uint64_t acc;

	if (n == 0)
		return kvt_xxh64_avalanche(seed ^ (kvt_xxh_rd64(sec + 56) ^
						   kvt_xxh_rd64(sec + 64)));
	if (n <= 3) {
		uint32_t c = ((uint32_t)p[0] << 16) | ((uint32_t)p[n >> 1] << 24) |
			     (uint32_t)p[n - 1] | ((uint32_t)n << 8);
		uint64_t flip = (kvt_xxh_rd32(sec) ^ kvt_xxh_rd32(sec + 4)) + seed;

		return kvt_xxh64_avalanche((uint64_t)c ^ flip);
	}
	if (n <= 8) {
		uint64_t s = seed ^ ((uint64_t)kvt_xxh_swap32((uint32_t)seed) << 32);
		uint64_t flip = (kvt_xxh_rd64(sec + 8) ^ kvt_xxh_rd64(sec + 16)) - s;
		uint64_t in = kvt_xxh_rd32(p + n - 4) +
			      ((uint64_t)kvt_xxh_rd32(p) << 32);

		return kvt_xxh3_rrmxmx(in ^ flip, n);
	}
	if (n <= 16) {
		uint64_t f1 = (kvt_xxh_rd64(sec + 24) ^ kvt_xxh_rd64(sec + 32)) + seed;
		uint64_t f2 = (kvt_xxh_rd64(sec + 40) ^ kvt_xxh_rd64(sec + 48)) - seed;
		uint64_t lo = kvt_xxh_rd64(p) ^ f1;
		uint64_t hi = kvt_xxh_rd64(p + n - 8) ^ f2;

		return kvt_xxh3_avalanche(n + kvt_xxh_swap64(lo) + hi +
					  kvt_xxh_mulfold(lo, hi));
	}
	acc = n * KVT_P64_1;
	if (n <= 128) {
		if (n > 32) {
			if (n > 64) {
				if (n > 96) {
					acc += kvt_xxh3_mix16(p + 48, sec + 96, seed);
					acc += kvt_xxh3_mix16(p + n - 64, sec + 112,
							      seed);
				}
				acc += kvt_xxh3_mix16(p + 32, sec + 64, seed);
				acc += kvt_xxh3_mix16(p + n - 48, sec + 80, seed);
			}
			acc += kvt_xxh3_mix16(p + 16, sec + 32, seed);
			acc += kvt_xxh3_mix16(p + n - 32, sec + 48, seed);
		}
		acc += kvt_xxh3_mix16(p, sec, seed);
		acc += kvt_xxh3_mix16(p + n - 16, sec + 16, seed);
		return kvt_xxh3_avalanche(acc);
	}
	for (unsigned i = 0; i < 8; i++)
		acc += kvt_xxh3_mix16(p + 16 * i, sec + 16 * i, seed);
	acc = kvt_xxh3_avalanche(acc);
	for (unsigned i = 8; i < n / 16; i++)
		acc += kvt_xxh3_mix16(p + 16 * i, sec + 16 * (i - 8) + 3, seed);
	acc += kvt_xxh3_mix16(p + n - 16, sec + 136 - 17, seed);
	return kvt_xxh3_avalanche(acc);
}

/* ---- the long hash's pieces ---------------------------------------------- */

KVT_XXH_FN uint64_t kvt_xxh3_init_acc(unsigned i)
{
	switch (i & 7) {
	case 0: return KVT_P32_3;
	case 1: return KVT_P64_1;
	case 2: return KVT_P64_2;
	case 3: return KVT_P64_3;
	case 4: return KVT_P64_4;
	case 5: return KVT_P32_2;
	case 6: return KVT_P64_5;
	default: return KVT_P32_1;
	}
}

/* Word @v at lane @i of a stripe whose secret starts at @sec: what it adds
 * to acc[i] (*@self) and to acc[i ^ 1] (*@swap). */
KVT_XXH_FN void kvt_xxh3_word(uint64_t v, const uint8_t *sec, unsigned i,
			      uint64_t *self, uint64_t *swap)
{
	uint64_t k = v ^ kvt_xxh_rd64(sec + 8 * i);

	*self += (k & 0xffffffffu) * (k >> 32);
	*swap += v;
}

/* One whole stripe at @p into @acc (the sequential form). */
KVT_XXH_FN void kvt_xxh3_stripe(uint64_t *acc, const uint8_t *p,
				const uint8_t *sec)
{
	for (unsigned i = 0; i < 8; i++) {
		uint64_t v = kvt_xxh_rd64(p + 8 * i);
		uint64_t k = v ^ kvt_xxh_rd64(sec + 8 * i);

		acc[i ^ 1] += v;
		acc[i] += (k & 0xffffffffu) * (k >> 32);
	}
}

/* Lane @i of the scramble after a full block. */
KVT_XXH_FN uint64_t kvt_xxh3_scramble1(uint64_t a, unsigned i,
				       const uint8_t *sec)
{
	a ^= a >> 47;
	a ^= kvt_xxh_rd64(sec + KVT_XXH3_SECRET_BYTES - KVT_XXH3_STRIPE + 8 * i);
	return a * KVT_P32_1;
}

/* The final merge of the accumulators into the hash of @len bytes. */
KVT_XXH_FN uint64_t kvt_xxh3_merge(const uint64_t *acc, uint64_t len,
				   const uint8_t *sec)
{
	uint64_t r = len * KVT_P64_1;

	for (unsigned i = 0; i < 4; i++)
		r += kvt_xxh_mulfold(acc[2 * i] ^ kvt_xxh_rd64(sec + 11 + 16 * i),
				     acc[2 * i + 1] ^
					     kvt_xxh_rd64(sec + 11 + 16 * i + 8));
	return kvt_xxh3_avalanche(r);
}

/* The secret of the last stripe. */
#define KVT_XXH3_LAST_SECRET (KVT_XXH3_SECRET_BYTES - KVT_XXH3_STRIPE - 7)

/* The secret a seed derives for long inputs (seed 0: the default). */
KVT_XXH_FN void kvt_xxh3_seed_secret(uint8_t *out, uint64_t seed)
{
	for (unsigned i = 0; i < KVT_XXH3_SECRET_BYTES / 16; i++) {
		uint64_t lo = kvt_xxh_rd64(KVT_XXH3_KSECRET + 16 * i) + seed;
		uint64_t hi = kvt_xxh_rd64(KVT_XXH3_KSECRET + 16 * i + 8) - seed;

		memcpy(out + 16 * i, &lo, 8);
		memcpy(out + 16 * i + 8, &hi, 8);
	}
}

/* ---- a source: segments hashed as one input ----------------------------- */

#define KVT_XXH3_MAXSEG 4096

typedef struct kvt_xxh3_src {
	const uint8_t *const *seg;   /* nseg pointers */
	uint64_t seg_len;            /* bytes of each, > 0 */
	uint32_t nseg;
} kvt_xxh3_src;

KVT_XXH_FN uint64_t kvt_xxh3_src_len(const kvt_xxh3_src *s)
{
	return (uint64_t)s->nseg * s->seg_len;
}

/* @n bytes at logical offset @off into @out (may cross segments). */
KVT_XXH_FN void kvt_xxh3_src_copy(const kvt_xxh3_src *s, uint64_t off,
				  uint8_t *out, size_t n)
{
	while (n) {
		uint64_t k = off / s->seg_len, o = off % s->seg_len;
		size_t m = (size_t)(s->seg_len - o);

		if (m > n)
			m = n;
		memcpy(out, s->seg[k] + o, m);
		out += m;
		off += m;
		n -= m;
	}
}

/* The little-endian word at logical offset @off. */
KVT_XXH_FN uint64_t kvt_xxh3_src_rd64(const kvt_xxh3_src *s, uint64_t off)
{
	uint64_t k = off / s->seg_len, o = off % s->seg_len;
	uint8_t b[8];

	if (o + 8 <= s->seg_len)
		return kvt_xxh_rd64(s->seg[k] + o);
	kvt_xxh3_src_copy(s, off, b, 8);
	return kvt_xxh_rd64(b);
}

/* Stripe at logical offset @off into @acc. */
KVT_XXH_FN void kvt_xxh3_src_stripe(uint64_t *acc, const kvt_xxh3_src *s,
				    uint64_t off, const uint8_t *sec)
{
	uint64_t k = off / s->seg_len, o = off % s->seg_len;

	if (o + KVT_XXH3_STRIPE <= s->seg_len) {
		kvt_xxh3_stripe(acc, s->seg[k] + o, sec);
	} else {
		uint8_t b[KVT_XXH3_STRIPE];

		kvt_xxh3_src_copy(s, off, b, sizeof(b));
		kvt_xxh3_stripe(acc, b, sec);
	}
}

/*
 * kvt_xxh3_src_64() - XXH3-64 of a source's bytes with the default secret
 * (@seed 0), or with @seed (its derived secret given in @seed_sec; NULL
 * for seed 0). The sequential evaluation: the emulated device's checksum
 * kernel and the CPU reference.
 */
KVT_XXH_FN uint64_t kvt_xxh3_src_64(const kvt_xxh3_src *s, uint64_t seed,
				    const uint8_t *seed_sec)
{
	const uint8_t *sec = seed_sec ? seed_sec : KVT_XXH3_KSECRET;
	uint64_t len = kvt_xxh3_src_len(s), acc[8], n, nb;

	if (len <= KVT_XXH3_MIDSIZE_MAX) {
		uint8_t b[KVT_XXH3_MIDSIZE_MAX];

		kvt_xxh3_src_copy(s, 0, b, (size_t)len);
		return kvt_xxh3_short(b, (size_t)len, seed, KVT_XXH3_KSECRET);
	}
	for (unsigned i = 0; i < 8; i++)
		acc[i] = kvt_xxh3_init_acc(i);
	n = (len - 1) / KVT_XXH3_STRIPE; /* whole stripes before the last */
	nb = n / KVT_XXH3_BLOCK_STRIPES;
	for (uint64_t b = 0; b < nb; b++) {
		for (unsigned st = 0; st < KVT_XXH3_BLOCK_STRIPES; st++)
			kvt_xxh3_src_stripe(acc, s, b * KVT_XXH3_BLOCK +
					    st * KVT_XXH3_STRIPE, sec + 8 * st);
		for (unsigned i = 0; i < 8; i++)
			acc[i] = kvt_xxh3_scramble1(acc[i], i, sec);
	}
	for (uint64_t st = 0; st < n - nb * KVT_XXH3_BLOCK_STRIPES; st++)
		kvt_xxh3_src_stripe(acc, s, nb * KVT_XXH3_BLOCK +
				    st * KVT_XXH3_STRIPE, sec + 8 * st);
	kvt_xxh3_src_stripe(acc, s, len - KVT_XXH3_STRIPE,
			    sec + KVT_XXH3_LAST_SECRET);
	return kvt_xxh3_merge(acc, len, sec);
}

/* ---- the block-parallel form (the device kernel's) ---------------------- */

/*
 * kvt_xxh3_lane() - lane @t (0..31) of a warp summing block @b of a
 * source whose hash has @n whole stripes before the last: the words
 * t, t+32, t+64, t+96 of the block (those inside its stripes). *@m gets
 * what they add to acc[t % 8], *@d what they add to acc[(t % 8) ^ 1].
 */
KVT_XXH_FN void kvt_xxh3_lane(const kvt_xxh3_src *s, uint64_t b, uint64_t n,
			      unsigned t, const uint8_t *sec, uint64_t *m,
			      uint64_t *d)
{
	uint64_t first = b * KVT_XXH3_BLOCK_STRIPES;
	uint64_t ns = n - first < KVT_XXH3_BLOCK_STRIPES ? n - first :
			KVT_XXH3_BLOCK_STRIPES;

	*m = 0;
	*d = 0;
	for (unsigned w = t; w < 8 * ns; w += 32) {
		unsigned st = w >> 3, i = w & 7;
		uint64_t v = kvt_xxh3_src_rd64(s, b * KVT_XXH3_BLOCK + 8ull * w);

		kvt_xxh3_word(v, sec + 8 * st, i, m, d);
	}
}

/* S(b)[i] from the 32 lanes' (m, d): the reduction a warp does with
 * shuffles, as a loop. */
KVT_XXH_FN void kvt_xxh3_reduce(const uint64_t *m, const uint64_t *d,
				uint64_t *sum)
{
	uint64_t M[8] = { 0 }, D[8] = { 0 };

	for (unsigned t = 0; t < 32; t++) {
		M[t & 7] += m[t];
		D[t & 7] += d[t];
	}
	for (unsigned i = 0; i < 8; i++)
		sum[i] = M[i] + D[i ^ 1];
}

/* XXH3-64 (seed 0) of a source by the block-parallel evaluation, 32
 * lanes in a loop: equal to kvt_xxh3_src_64(). */
KVT_XXH_FN uint64_t kvt_xxh3_src_lanes(const kvt_xxh3_src *s)
{
	const uint8_t *sec = KVT_XXH3_KSECRET;
	uint64_t len = kvt_xxh3_src_len(s), acc[8], n, nb, last[8];
	uint64_t m[32], d[32], sum[8];

	if (len <= KVT_XXH3_MIDSIZE_MAX)
		return kvt_xxh3_src_64(s, 0, NULL);
	n = (len - 1) / KVT_XXH3_STRIPE;
	nb = (n + KVT_XXH3_BLOCK_STRIPES - 1) / KVT_XXH3_BLOCK_STRIPES;
	for (unsigned i = 0; i < 8; i++)
		acc[i] = kvt_xxh3_init_acc(i);
	for (uint64_t b = 0; b < nb; b++) {
		for (unsigned t = 0; t < 32; t++)
			kvt_xxh3_lane(s, b, n, 31 - t, sec, &m[31 - t], &d[31 - t]);
		kvt_xxh3_reduce(m, d, sum);
		for (unsigned i = 0; i < 8; i++) {
			acc[i] += sum[i];
			/* a full block is scrambled; the partial last is not */
			if ((b + 1) * KVT_XXH3_BLOCK_STRIPES <= n)
				acc[i] = kvt_xxh3_scramble1(acc[i], i, sec);
		}
	}
	/* the last stripe: lane i adds its word to acc[i] and acc[i ^ 1] */
	for (unsigned i = 0; i < 8; i++)
		last[i] = 0;
	for (unsigned i = 0; i < 8; i++) {
		uint64_t v = kvt_xxh3_src_rd64(s, len - KVT_XXH3_STRIPE + 8 * i);
		uint64_t self = 0, swap = 0;

		kvt_xxh3_word(v, sec + KVT_XXH3_LAST_SECRET, i, &self, &swap);
		last[i] += self;
		last[i ^ 1] += swap;
	}
	for (unsigned i = 0; i < 8; i++)
		acc[i] += last[i];
	return kvt_xxh3_merge(acc, len, sec);
}

/* ---- streaming (any split of the input) ---------------------------------- */

/*
 * kvt_xxh3 - a streaming state: reset, update with any pieces, digest;
 * the value is the one-shot hash of the concatenation. Bytes stay in
 * @buf until more arrive (the last stripe and the short paths need the
 * input's tail); @tail keeps the 64 bytes folded last.
 */
typedef struct kvt_xxh3 {
	uint64_t acc[8];
	uint64_t total;       /* bytes seen */
	uint64_t seed;
	uint32_t nbuf;        /* bytes in buf, not folded yet */
	uint32_t nstripes;    /* stripes of the current block folded */
	uint8_t buf[256];
	uint8_t tail[KVT_XXH3_STRIPE];
	uint8_t sec[KVT_XXH3_SECRET_BYTES]; /* the long-input secret */
} kvt_xxh3;

KVT_XXH_FN void kvt_xxh3_reset(kvt_xxh3 *h, uint64_t seed)
{
	for (unsigned i = 0; i < 8; i++)
		h->acc[i] = kvt_xxh3_init_acc(i);
	h->total = 0;
	h->seed = seed;
	h->nbuf = 0;
	h->nstripes = 0;
	kvt_xxh3_seed_secret(h->sec, seed);
}

/* Fold @k whole stripes at @p into the state's accumulators. */
KVT_XXH_FN void kvt_xxh3_fold(kvt_xxh3 *h, const uint8_t *p, uint64_t k)
{
	for (uint64_t i = 0; i < k; i++) {
		kvt_xxh3_stripe(h->acc, p + i * KVT_XXH3_STRIPE,
				h->sec + 8 * h->nstripes);
		if (++h->nstripes == KVT_XXH3_BLOCK_STRIPES) {
			for (unsigned j = 0; j < 8; j++)
				h->acc[j] = kvt_xxh3_scramble1(h->acc[j], j, h->sec);
			h->nstripes = 0;
		}
	}
	if (k)
		memcpy(h->tail, p + (k - 1) * KVT_XXH3_STRIPE, KVT_XXH3_STRIPE);
}

KVT_XXH_FN void kvt_xxh3_update(kvt_xxh3 *h, const void *in, size_t n)
{
	const uint8_t *p = (const uint8_t *)in;

	h->total += n;
	while (n) {
		size_t m;

		/* a full buffer with more input after it: fold it */
		if (h->nbuf == sizeof(h->buf)) {
			kvt_xxh3_fold(h, h->buf, sizeof(h->buf) / KVT_XXH3_STRIPE);
			h->nbuf = 0;
		}
		/* nothing buffered and plenty coming: fold straight from
		 * the input, keeping its last 1..64 bytes */
		if (!h->nbuf && n > sizeof(h->buf)) {
			uint64_t k = (n - 1) / KVT_XXH3_STRIPE;

			kvt_xxh3_fold(h, p, k);
			p += k * KVT_XXH3_STRIPE;
			n -= (size_t)k * KVT_XXH3_STRIPE;
			continue;
		}
		m = sizeof(h->buf) - h->nbuf;
		if (m > n)
			m = n;
		memcpy(h->buf + h->nbuf, p, m);
		h->nbuf += (uint32_t)m;
		p += m;
		n -= m;
	}
}

KVT_XXH_FN uint64_t kvt_xxh3_digest(const kvt_xxh3 *h)
{
	uint64_t acc[8];
	unsigned ns = h->nstripes;
	uint8_t last[KVT_XXH3_STRIPE];

	if (h->total <= KVT_XXH3_MIDSIZE_MAX)
		return kvt_xxh3_short(h->buf, (size_t)h->total, h->seed,
				      KVT_XXH3_KSECRET);
	memcpy(acc, h->acc, sizeof(acc));
	if (h->nbuf >= KVT_XXH3_STRIPE) {
		uint32_t k = (h->nbuf - 1) / KVT_XXH3_STRIPE;

		for (uint32_t i = 0; i < k; i++) {
			kvt_xxh3_stripe(acc, h->buf + i * KVT_XXH3_STRIPE,
					h->sec + 8 * ns);
			if (++ns == KVT_XXH3_BLOCK_STRIPES) {
				for (unsigned j = 0; j < 8; j++)
					acc[j] = kvt_xxh3_scramble1(acc[j], j,
								    h->sec);
				ns = 0;
			}
		}
		memcpy(last, h->buf + h->nbuf - KVT_XXH3_STRIPE, sizeof(last));
	} else {
		uint32_t c = KVT_XXH3_STRIPE - h->nbuf;

		memcpy(last, h->tail + h->nbuf, c);
		memcpy(last + c, h->buf, h->nbuf);
	}
	kvt_xxh3_stripe(acc, last, h->sec + KVT_XXH3_LAST_SECRET);
	return kvt_xxh3_merge(acc, h->total, h->sec);
}

/* One-shot XXH3-64 of @n contiguous bytes with @seed. */
KVT_XXH_FN uint64_t kvt_xxh3_64(const void *p, size_t n, uint64_t seed)
{
	kvt_xxh3 h;

	kvt_xxh3_reset(&h, seed);
	kvt_xxh3_update(&h, p, n);
	return kvt_xxh3_digest(&h);
}

#endif /* KVT_DEV_XXH3_H */
