/*
 * xfer_util.h — helpers shared by the transfer engine tests: open a tier
 * from a spec, fill it with bytes, compute what a job must leave behind
 * with the reference conversion, compare.
 */
#ifndef KVT_TEST_XFER_UTIL_H
#define KVT_TEST_XFER_UTIL_H

#include "harness.h"

#define TMIN(a, b) ((a) < (b) ? (a) : (b))
#define TMAX(a, b) ((a) > (b) ? (a) : (b))

#define XXH_STATIC_LINKING_ONLY
#include <xxhash.h>

static inline kvt_tier *tier_open(const char *spec, const kvt_geom *g)
{
	kvt_tier_spec s[1];
	kvt_tier *t = NULL;
	size_t n;
	int err;

	if ((err = kvt_tier_spec_parse(spec, s, 1, &n)) ||
	    (err = kvt_tier_open(&t, s, g))) {
		fprintf(stderr, "tier '%s': %s (%s)\n", spec, kvt_strerror(err),
			kvt_errdetail());
		kvt_test_failures++;
		return NULL;
	}
	return t;
}

/* Whole backing region of a memory tier (buffers are carved back to back). */
static inline unsigned char *tier_mem(kvt_tier *t, uint64_t *len)
{
	*len = kvt_layout_region_bytes(kvt_tier_layout(t));
	return kvt_tier_bufs(t)[0];
}

static inline void fill_rand(void *p, uint64_t n, uint64_t seed)
{
	uint64_t s = seed * 0x9e3779b97f4a7c15ull + 1, *q = p;
	unsigned char *c = p;

	for (uint64_t i = 0; i < n / 8; i++)
		q[i] = test_rand(&s);
	for (uint64_t i = n / 8 * 8; i < n; i++)
		c[i] = (unsigned char)test_rand(&s);
}

/* Fill every slot of a tier with random bytes (ssd: through the plain
 * write path). */
static inline void tier_fill(kvt_tier *t, uint64_t seed)
{
	const kvt_layout *l = kvt_tier_layout(t);

	if (kvt_tier_bufs(t)) {
		uint64_t len;
		unsigned char *m = tier_mem(t, &len);
		fill_rand(m, len, seed);
		return;
	}
	unsigned char *page = malloc(l->page_bytes);
	for (uint64_t s = 0; s < l->slots; s++) {
		fill_rand(page, l->page_bytes, seed + s);
		CHECK_OK(kvt_tier_write(t, (uint32_t)s, page));
	}
	free(page);
}

/* The page-first bytes of every slot of @t (any tier), in one array. */
static inline unsigned char *tier_pages(kvt_tier *t)
{
	const kvt_layout *l = kvt_tier_layout(t);
	unsigned char *all = malloc(l->slots * l->page_bytes);

	for (uint64_t s = 0; s < l->slots; s++)
		CHECK_OK(kvt_tier_read(t, (uint32_t)s, all + s * l->page_bytes));
	return all;
}

/* What @dst must hold after moving pages src_slots -> dst_slots from
 * @src: dst's pages before, with the moved pages replaced; computed with
 * kvt_layout_convert_ref() between page-first images. */
static inline unsigned char *expect_pages(kvt_tier *src, kvt_tier *dst,
					  const uint32_t *ss,
					  const uint32_t *ds, size_t n)
{
	const kvt_layout *sl = kvt_tier_layout(src), *dl = kvt_tier_layout(dst);
	kvt_layout a, b;
	unsigned char *from = tier_pages(src), *to = tier_pages(dst);
	uint64_t *s64 = malloc((n + 1) * 8), *d64 = malloc((n + 1) * 8);
	void *fb[1] = { from }, *tb[1] = { to };

	CHECK_OK(kvt_layout_init(&a, KVT_LAYOUT_PAGE_FIRST, &sl->geom, sl->slots));
	CHECK_OK(kvt_layout_init(&b, KVT_LAYOUT_PAGE_FIRST, &dl->geom, dl->slots));
	for (size_t i = 0; i < n; i++)
		s64[i] = ss[i], d64[i] = ds[i];
	CHECK_OK(kvt_layout_convert_ref(&a, fb, s64, &b, tb, d64, n));
	free(from);
	free(s64);
	free(d64);
	return to;
}

/* For memory tiers: the exact bytes of the destination region, through the
 * reference conversion in the tier's own layout (this also checks that
 * nothing outside the destination chunks was touched). */
static inline unsigned char *expect_region(kvt_tier *src, kvt_tier *dst,
					   const uint32_t *ss,
					   const uint32_t *ds, size_t n)
{
	const kvt_layout *dl = kvt_tier_layout(dst);
	uint64_t len, *s64 = malloc((n + 1) * 8), *d64 = malloc((n + 1) * 8);
	unsigned char *cur = tier_mem(dst, &len), *img = malloc(len);
	void **bufs = malloc(dl->nbufs * sizeof(void *));
	kvt_layout pf;
	unsigned char *pages = tier_pages(src);
	void *pb[1] = { pages };

	memcpy(img, cur, len);
	kvt_layout_bufs_carve(dl, img, bufs);
	CHECK_OK(kvt_layout_init(&pf, KVT_LAYOUT_PAGE_FIRST,
				 &kvt_tier_layout(src)->geom,
				 kvt_tier_layout(src)->slots));
	for (size_t i = 0; i < n; i++)
		s64[i] = ss[i], d64[i] = ds[i];
	CHECK_OK(kvt_layout_convert_ref(&pf, pb, s64, dl, bufs, d64, n));
	free(pages);
	free(bufs);
	free(s64);
	free(d64);
	return img;
}

/* XXH3 of page-first slot @s of any tier. */
static inline uint64_t page_xxh3(kvt_tier *t, uint32_t s)
{
	const kvt_layout *l = kvt_tier_layout(t);
	unsigned char *p = malloc(l->page_bytes);
	uint64_t h;

	CHECK_OK(kvt_tier_read(t, s, p));
	h = XXH3_64bits(p, l->page_bytes);
	free(p);
	return h;
}

/* Random slot lists: @n distinct slots out of @nslots each side. */
static inline void pick_slots(uint64_t *seed, uint32_t *out, size_t n,
			      uint64_t nslots, int mode)
{
	uint32_t *perm = malloc(nslots * sizeof(*perm));

	for (uint64_t i = 0; i < nslots; i++)
		perm[i] = (uint32_t)i;
	if (mode == 0) { /* random, unordered */
		for (uint64_t i = nslots - 1; i > 0; i--) {
			uint64_t k = test_rand(seed) % (i + 1);
			uint32_t t = perm[i];
			perm[i] = perm[k];
			perm[k] = t;
		}
	} else if (mode == 2) { /* reversed */
		for (uint64_t i = 0; i < nslots; i++)
			perm[i] = (uint32_t)(nslots - 1 - i);
	} /* mode 1: consecutive from 0 */
	memcpy(out, perm, n * sizeof(*out));
	free(perm);
}

/* Submit and wait. */
static inline int run_job(kvt_xfer *x, kvt_xfer_desc *d)
{
	kvt_xfer_job *j;
	int err = kvt_xfer_submit(x, d, &j);

	if (err)
		return err;
	err = kvt_xfer_wait(j, -1);
	kvt_xfer_job_free(j);
	return err;
}

#endif
