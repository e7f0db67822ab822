/* test_core — errors, sizes, options, the allocation wrapper. */
#include "harness.h"
#include "core/core.h"

#include <errno.h>
#include <unistd.h>

static void test_errors(void)
{
	CHECK(!strcmp(kvt_strerror(0), "success"));
	CHECK(strstr(kvt_strerror(KVT_EFULL), "no free slot"));
	CHECK(strstr(kvt_strerror(-ENOMEM), "memory"));
	CHECK(!strcmp(kvt_strerror(ENOMEM), kvt_strerror(-ENOMEM)));
	CHECK(!strcmp(kvt_strerror(-99999), "unknown error"));
	for (int e = KVT_ERR_LAST; e <= KVT_ERR_FIRST; e++)
		CHECK(strcmp(kvt_strerror(e), "unknown error"));
	CHECK(!strcmp(kvt_version(), KVT_VERSION_STRING));
}

/* Regression (issue 10): adding context to the current detail passed
 * kvt_errdetail() back into kvti_fail(), which wrote the same buffer it was
 * reading (overlapping vsnprintf; `kvtier info --tiers dram:1G,numa=1`
 * printed the spec twice and a torn message). */
static void test_errdetail_overlap(void)
{
	CHECK_EQ(kvti_fail(KVT_ESPEC, "node %d has no memory", 7), KVT_ESPEC);
	CHECK_EQ(kvti_fail(KVT_ESPEC, "tier spec '%s': %s", "dram:1G,numa=7",
			   kvt_errdetail()), KVT_ESPEC);
	CHECK(!strcmp(kvt_errdetail(),
		      "tier spec 'dram:1G,numa=7': node 7 has no memory"));
	kvti_errctx("tier '%s'", kvt_errdetail());
	CHECK(!strncmp(kvt_errdetail(), "tier 'tier spec 'dram:1G,numa=7': node"
		       " 7 has no memory': tier spec", 64));
	kvti_errclear();
	kvti_errctx("opening %s", "x");
	CHECK(!strcmp(kvt_errdetail(), "opening x"));
}

static void test_sizes(void)
{
	static const struct {
		const char *s;
		int err;
		uint64_t v;
	} t[] = {
		{ "4096", 0, 4096 },        { "64K", 0, 65536 },
		{ "8G", 0, 8ull << 30 },    { "1.5T", 0, 3ull << 39 },
		{ "512MiB", 0, 512ull << 20 }, { "2gb", 0, 2ull << 30 },
		{ "", -EINVAL, 0 },         { "-1G", -EINVAL, 0 },
		{ "8Q", -EINVAL, 0 },       { "G", -EINVAL, 0 },
		{ "1.5", -EINVAL, 0 },      { "10G junk", -EINVAL, 0 },
		{ "9999999P", -ERANGE, 0 }, { "0", 0, 0 },
	};
	char buf[32];

	for (size_t i = 0; i < sizeof(t) / sizeof(t[0]); i++) {
		uint64_t v = 12345;
		int err = kvt_size_parse(t[i].s, &v);
		if (err != t[i].err || (!err && v != t[i].v)) {
			fprintf(stderr, "size '%s': got %d/%llu\n", t[i].s, err,
				(unsigned long long)v);
			CHECK(0);
		}
	}
	CHECK(!strcmp(kvt_size_format(1536, buf, sizeof(buf)), "1.50 KiB"));
	CHECK(!strcmp(kvt_size_format(100, buf, sizeof(buf)), "100 B"));
}

static void test_opts(void)
{
	const char *path = "/tmp/kvt-test-opts.conf";
	const char *n, *v, *h, *src;
	kvt_opts *o;
	FILE *f;
	int i;

	CHECK_OK(kvt_opts_create(&o));
	CHECK(!strcmp(kvt_opts_get(o, "model"), "llama-3.1-8b"));
	CHECK_EQ(kvt_opts_get_int(o, "page-tokens"), 16);
	CHECK_ERR(kvt_opts_set(o, "no_such", "1"), KVT_ENOTFOUND);
	CHECK_ERR(kvt_opts_set(o, "page_tokens", "x12"), KVT_ECONFIG);
	CHECK(strstr(kvt_errdetail(), "page_tokens"));

	f = fopen(path, "w");
	fprintf(f, "# comment\npage_tokens = 32\n\nmodel = qwen2.5-7b # x\n");
	fclose(f);
	CHECK_OK(kvt_opts_load_file(o, path));
	CHECK_EQ(kvt_opts_get_int(o, "page_tokens"), 32);
	setenv("KVT_PAGE_TOKENS", "64", 1);
	CHECK_OK(kvt_opts_load_env(o));
	CHECK_EQ(kvt_opts_get_int(o, "page_tokens"), 64);
	unsetenv("KVT_PAGE_TOKENS");
	CHECK_OK(kvt_opts_set(o, "page-tokens", "128"));
	CHECK_EQ(kvt_opts_get_int(o, "page_tokens"), 128);
	for (i = 0; kvt_opts_describe(o, i, &n, &v, &h, &src) == 0; i++)
		if (!strcmp(n, "model"))
			CHECK(!strcmp(src, "file") && !strcmp(v, "qwen2.5-7b"));
	CHECK(i > 3);

	f = fopen(path, "w");
	fprintf(f, "page_tokens = 32\nthis line is wrong\n");
	fclose(f);
	CHECK_ERR(kvt_opts_load_file(o, path), KVT_ECONFIG);
	CHECK(strstr(kvt_errdetail(), ":2"));
	/* blank lines count: the error names the file's own line number */
	f = fopen(path, "w");
	fprintf(f, "page_tokens = 32\n\n\nthis line is wrong\n");
	fclose(f);
	CHECK_ERR(kvt_opts_load_file(o, path), KVT_ECONFIG);
	CHECK(strstr(kvt_errdetail(), ".conf:4: expected"));
	setenv("KVT_TP", "two", 1);
	CHECK_ERR(kvt_opts_load_env(o), KVT_ECONFIG);
	CHECK(strstr(kvt_errdetail(), "KVT_TP"));
	unsetenv("KVT_TP");
	CHECK(kvt_opts_load_file(o, "/nonexistent/x.conf") == -ENOENT);
	kvt_opts_destroy(o);
	unlink(path);
}

static void test_alloc(void)
{
	int64_t live = kvt_alloc_live();
	void *a, *b;

	a = kvt_malloc(10);
	CHECK(a != NULL);
	CHECK_EQ(kvt_alloc_live(), live + 1);
	kvt_alloc_fail_at(2);
	b = kvt_malloc(10); /* 1st: succeeds */
	CHECK(b != NULL);
	CHECK(kvt_malloc(10) == NULL); /* 2nd: injected */
	CHECK(errno == ENOMEM);
	kvt_free(b);
	b = kvt_malloc(10); /* injection fires once */
	CHECK(b != NULL);
	kvt_free(b);
	kvt_free(a);
	CHECK_EQ(kvt_alloc_live(), live);
}

int main(void)
{
	test_errors();
	test_errdetail_overlap();
	test_sizes();
	test_opts();
	test_alloc();
	TEST_DONE();
}
