/*
 * test_xfer_copyhash — the copy that hashes what it writes
 * (kvti_copy_xxh3(), src/xfer/copy.c) against its plain reference: for
 * segment counts 1-3 and segment sizes from the smallest it takes (241+
 * bytes in all, whole 64-byte stripes) through every block boundary of
 * XXH3's long hash (1 KiB blocks, a scramble after each) to 64 KiB, over
 * random bytes and unaligned sources, the destination must equal the
 * sources and the hash must equal libxxhash's XXH3_64bits() of their
 * concatenation; what it refuses (a total of 240 bytes or less, sizes
 * that are not whole stripes, unaligned destinations) it refuses with -1
 * and writes nothing.
 */
#include "harness.h"
#include "xfer/xfer_impl.h"

#include <xxhash.h>

#define MAXN (64u << 10)

int main(void)
{
	unsigned char *src = kvti_aligned_alloc(64, 3 * MAXN + 64);
	unsigned char *dst = kvti_aligned_alloc(64, 3 * (MAXN + 64) + 128);
	unsigned char *cat = malloc(3 * MAXN);
	const char *isa;
	uint64_t r = 7, checked = 0;
	size_t sizes[] = { 64, 128, 192, 256, 960, 1024, 1088, 2048, 4032,
			   4096, 16384, 32768, 32832, 65472, 65536 };

	CHECK(src && dst && cat);
	if (!src || !dst || !cat)
		TEST_DONE();
	kvti_copy_nt_pick(&isa); /* picks the vector code */
	for (size_t i = 0; i < 3 * MAXN + 64; i++)
		src[i] = (unsigned char)test_rand(&r);
	for (int nseg = 1; nseg <= 3; nseg++)
		for (size_t z = 0; z < sizeof(sizes) / sizeof(*sizes); z++)
			for (int off = 0; off < 3; off++) {
				size_t n = sizes[z], len = nseg * n;
				char *d[3];
				const char *s[3];
				uint64_t h = 0;
				int rc;

				memset(dst, 0xEE, 3 * (MAXN + 64) + 128);
				for (int k = 0; k < nseg; k++) {
					/* sources anywhere, dests 32-aligned */
					s[k] = (const char *)src + k * n + off * 8;
					d[k] = (char *)dst + 64 + k * (n + 64);
					memcpy(cat + k * n, s[k], n);
				}
				rc = kvti_copy_xxh3(d, s, nseg, n, &h);
				kvti_copy_fence();
				if (len <= 240) {
					CHECK_EQ(rc, -1);
					continue;
				}
				if (strcmp(isa, "avx2")) {
					CHECK_EQ(rc, -1); /* no fused path */
					continue;
				}
				CHECK_EQ(rc, 0);
				CHECK_EQ(h, XXH3_64bits(cat, len));
				for (int k = 0; k < nseg; k++) {
					CHECK(!memcmp(d[k], s[k], n));
					/* nothing past the segment */
					CHECK_EQ((unsigned char)d[k][n], 0xEE);
				}
				CHECK_EQ(dst[63], 0xEE);
				checked++;
			}
	{
		char *d[1] = { (char *)dst + 64 }, *du[1] = { (char *)dst + 65 };
		const char *s[1] = { (const char *)src };
		uint64_t h;

		CHECK_EQ(kvti_copy_xxh3(d, s, 1, 1000, &h), -1);   /* not stripes */
		CHECK_EQ(kvti_copy_xxh3(du, s, 1, 4096, &h), -1);  /* unaligned */
	}
	fprintf(stderr, "%s: %llu copies hashed and checked\n", isa,
		(unsigned long long)checked);
	kvt_free(src);
	kvt_free(dst);
	free(cat);
	TEST_DONE();
}
