/* test_spec — the tier spec parser on good and bad strings; format round trip. */
#include "harness.h"

static void good(void)
{
	kvt_tier_spec s[8], r[8];
	size_t n, m;
	char buf[512];

	CHECK_OK(kvt_tier_spec_parse("dram:8G", s, 8, &n));
	CHECK_EQ(n, 1);
	CHECK_EQ(s[0].kind, KVT_TIER_DRAM);
	CHECK_EQ(s[0].bytes, 8ull << 30);
	CHECK_EQ(s[0].numa_node, -1);

	CHECK_OK(kvt_tier_spec_parse("dram:8G,numa=0,hugepages,mlock", s, 8, &n));
	CHECK_EQ(s[0].backing, KVT_BACK_NUMA);
	CHECK_EQ(s[0].numa_node, 0);
	CHECK_EQ(s[0].huge, KVT_HUGE_EXPLICIT);
	CHECK(s[0].mlock);

	CHECK_OK(kvt_tier_spec_parse("fabric:/dev/dax0.0", s, 8, &n));
	CHECK_EQ(s[0].backing, KVT_BACK_DEVDAX);
	CHECK(!strcmp(s[0].path, "/dev/dax0.0"));
	CHECK_EQ(s[0].bytes, 0);

	CHECK_OK(kvt_tier_spec_parse("fabric:numa=2,64G", s, 8, &n));
	CHECK_EQ(s[0].backing, KVT_BACK_NUMA);
	CHECK_EQ(s[0].numa_node, 2);

	/* a relative directory is a path, not an option (issue 21) */
	CHECK_OK(kvt_tier_spec_parse("ssd:run/t1/ssd,1G", s, 8, &n));
	CHECK(n == 1 && !strcmp(s[0].path, "run/t1/ssd"));
	CHECK_OK(kvt_tier_spec_parse("ssd:/var/lib/kvtier,100G", s, 8, &n));
	CHECK_EQ(s[0].kind, KVT_TIER_SSD);
	CHECK(!strcmp(s[0].path, "/var/lib/kvtier"));

	/* the example: tiers and options share the comma */
	CHECK_OK(kvt_tier_spec_parse("dram:1G,fabric:file=/tmp/x,1G,ssd:/tmp/kvt,2G",
				     s, 8, &n));
	CHECK_EQ(n, 3);
	CHECK_EQ(s[1].kind, KVT_TIER_FABRIC);
	CHECK_EQ(s[1].backing, KVT_BACK_FILE);
	CHECK(!strcmp(s[1].path, "/tmp/x"));
	CHECK_EQ(s[1].bytes, 1ull << 30);
	CHECK_EQ(s[2].bytes, 2ull << 30);
	CHECK(!strcmp(s[1].text, "fabric:file=/tmp/x,1G"));

	/* other separators, hostdev, hbm, layouts */
	CHECK_OK(kvt_tier_spec_parse("hostdev:2G,layout=sglang; fabric:memfd,4G "
				     "hbm:40G,device=1 ssd:/d,1T,files=4,temp,fresh "
				     "remote:redis://127.0.0.1:6379", s, 8, &n));
	CHECK_EQ(n, 5);
	CHECK(s[0].hostdev && s[0].kind == KVT_TIER_HBM);
	CHECK_EQ(s[0].layout, KVT_LAYOUT_SGLANG);
	CHECK_EQ(s[1].backing, KVT_BACK_MEMFD);
	CHECK(!s[2].hostdev && s[2].device == 1);
	CHECK_EQ(s[3].files, 4);
	CHECK(s[3].temp && s[3].fresh);
	CHECK(!strcmp(s[4].path, "redis://127.0.0.1:6379"));

	CHECK_OK(kvt_tier_spec_parse("hostdev:64M,populate,mlock", r, 8, &m));
	CHECK(r[0].populate && r[0].mlock);

	/* format then parse gives the same spec */
	for (size_t i = 0; i < n; i++) {
		kvt_tier_spec_format(&s[i], buf, sizeof(buf));
		CHECK_OK(kvt_tier_spec_parse(buf, r, 8, &m));
		CHECK_EQ(m, 1);
		CHECK_EQ(r[0].kind, s[i].kind);
		CHECK_EQ(r[0].backing, s[i].backing);
		CHECK_EQ(r[0].bytes, s[i].bytes);
		CHECK_EQ(r[0].files, s[i].files);
		CHECK_EQ(r[0].layout, s[i].layout);
		CHECK(!strcmp(r[0].path, s[i].path));
	}
}

static void bad(const char *spec, const char *needle)
{
	kvt_tier_spec s[4];
	size_t n = 99;
	int err = kvt_tier_spec_parse(spec, s, 4, &n);

	if (err != KVT_ESPEC || !strstr(kvt_errdetail(), needle)) {
		fprintf(stderr, "spec '%s': got %d '%s', want KVT_ESPEC naming '%s'\n",
			spec, err, kvt_errdetail(), needle);
		kvt_test_failures++;
	}
	CHECK_EQ(n, 0);
}

int main(void)
{
	kvt_tier_spec s[2];
	size_t n;

	good();
	bad("", "empty");
	bad("8G", "does not start with a tier");
	bad("disk:8G", "does not start with a tier");
	bad("dram", "does not start with a tier");
	bad("dram:", "missing size");
	bad("dram:8Q", "8Q");
	bad("dram:0", "zero");
	bad("dram:8G,4G", "two sizes");
	bad("dram:8G,numa=x", "NUMA node 'x'");
	bad("dram:8G,frobnicate", "frobnicate");
	bad("dram:8G,file=/x", "does not apply to dram");
	bad("dram:8G,/tmp/x", "takes no path");
	bad("ssd:100G", "missing directory");
	bad("ssd:/d", "missing size");
	bad("ssd:/d,1G,files=0", "file count");
	bad("ssd:/d,1G,mlock", "does not apply to ssd");
	bad("fabric:4G", "needs a backing");
	bad("fabric:/tmp/file,4G", "must be a devdax");
	bad("fabric:memfd", "missing size");
	bad("fabric:memfd,file=/x,1G", "already has a backing");
	bad("fabric:memfd,4G,allow-cpus", "allow-cpus");
	bad("fabric:file=/x,1G,hugepages", "hugepage options");
	bad("hbm:4G,numa=1", "does not apply to hbm");
	bad("hostdev:4G,device=1", "does not apply to hostdev");
	bad("hostdev:4G,pin", "does not apply to hostdev");
	bad("hbm:4G,populate", "does not apply to hbm");
	bad("hostdev:4G,layout=page-first", "bad layout");
	bad("hostdev:4G,layout=nope", "bad layout");
	bad("remote:", "missing address");
	bad("dram:1G,huge=maybe", "huge mode");
	CHECK_ERR(kvt_tier_spec_parse("dram:1G,dram:1G,dram:1G", s, 2, &n), -E2BIG);
	TEST_DONE();
}
