/*
 * test_sim_profile — hardware profiles: the built-in ones load, every
 * number in them names its source, they turn into a valid cost model; and
 * bad profiles fail with the file, line and key named.
 */
#include "harness.h"
#include "kvt_build.h"

static void test_builtins(void)
{
	const char *name;

	for (size_t i = 0; (name = kvt_hw_builtin_name(i)); i++) {
		kvt_hw hw;
		kvt_geom g;
		kvt_cost c;
		char path[1024], line[1024];
		FILE *f;
		int lineno = 0;

		CHECK_OK(kvt_hw_load(&hw, name));
		CHECK(!strcmp(hw.name, name));
		CHECK(hw.gpus >= 1);
		CHECK(hw.copy[KVT_COPY_CONTIG].n >= 1);
		CHECK_OK(kvt_geom_preset(&g, "llama-3.1-8b", 16, 1, 0));
		CHECK_OK(kvt_hw_cost(&hw, &g, &c));
		CHECK_OK(kvt_cost_check(&c));
		/* every line holding a value carries a '#' naming a source */
		snprintf(path, sizeof(path), "%s/profiles/%s.prof",
			 KVT_SOURCE_DIR, name);
		CHECK((f = fopen(path, "r")) != NULL);
		while (f && fgets(line, sizeof(line), f)) {
			char *eq = strchr(line, '='), *hash = strchr(line, '#');

			lineno++;
			if (!eq || (hash && hash < eq))
				continue;
			if (!strncmp(line, "name", 4) ||
			    !strncmp(line, "gpu.name", 8))
				continue;
			if (!hash || strlen(hash) < 8) {
				fprintf(stderr, "%s:%d: value without a source\n",
					path, lineno);
				CHECK(0);
			}
		}
		if (f)
			fclose(f);
	}
	/* the figures the calibration depends on */
	{
		kvt_hw a;

		CHECK_OK(kvt_hw_load(&a, "testbed-a"));
		CHECK_EQ(a.gpus, 4);
		CHECK(a.fabric_bytes >= 256e9);
		CHECK(a.dram_gbps == 200);
		CHECK_OK(kvt_hw_load(&a, "testbed-b"));
		CHECK_EQ(a.gpus, 8);
		CHECK_EQ(a.fabric_bytes, 0);
	}
}

static const char *base =
	"name = t\n gpu.name = X\ngpus = 2\ngpu.flops = 1e15\n"
	"gpu.gemm_eff = 0.5\ngpu.attn_eff = 0.5\ngpu.hbm_bytes = 80e9\n"
	"gpu.hbm_gbps = 3000\ngpu.hbm_eff = 0.8\ngpu.mem_util = 0.9\n"
	"gpu.reserve_bytes = 1e9\nengine.step_us = 500\ntp.ar_gbps = 100\n"
	"tp.ar_us = 5\nlink.gbps = 50\nlink.raw_gbps = 64\n"
	"link.latency_ns = 700\nlink.gpus_per_uplink = 0\n"
	"copy.contig = 1M:50   # a comment\ncopy.contig_call_us = 3\n"
	"host.sockets = 1\nhost.dram_gbps = 200\nhost.dram_eff = 0.8\n"
	"host.dram_latency_ns = 100\nhost.dram_bytes = 1e12\n"
	"host.dma_window = 1\nhost.stress_gbps = 10\n";

/* @text must fail with KVT_ECONFIG naming @needle, @hw untouched */
static void bad_text(const char *text, const char *needle)
{
	kvt_hw hw;

	memset(&hw, 0x5a, sizeof(hw));
	CHECK_ERR(kvt_hw_parse(&hw, text, "t.prof"), KVT_ECONFIG);
	if (!strstr(kvt_errdetail(), needle)) {
		fprintf(stderr, "detail '%s' lacks '%s'\n", kvt_errdetail(),
			needle);
		CHECK(0);
	}
	CHECK_EQ(((unsigned char *)&hw)[0], 0x5a); /* untouched */
}

/* base + @extra must fail naming @needle */
static void bad(const char *extra, const char *needle)
{
	char text[4096];

	snprintf(text, sizeof(text), "%s%s", base, extra);
	bad_text(text, needle);
}

/* base with line @old replaced by @new must fail naming @needle */
static void bad_swap(const char *old, const char *new, const char *needle)
{
	char text[4096];
	const char *at = strstr(base, old);

	CHECK(at != NULL);
	if (!at)
		return;
	snprintf(text, sizeof(text), "%.*s%s%s", (int)(at - base), base, new,
		 at + strlen(old));
	bad_text(text, needle);
}

/* Regression (issue 10): NaN passed every "d < lo || d > hi" range test
 * (gpus = nan then reached a double->uint32 cast; host.dram_gbps = nan gave
 * a TTFT of 40 million ms), infinities passed the curves' checks. */
static void test_nonfinite(void)
{
	bad_swap("gpus = 2", "gpus = nan", "gpus: nan is outside 1..1024");
	bad_swap("gpus = 2", "gpus = -nan", "is outside");
	bad_swap("gpus = 2", "gpus = 1e300", "is outside");
	bad_swap("gpus = 2", "gpus = 4294967297", "is outside");
	bad_swap("host.dram_gbps = 200", "host.dram_gbps = nan",
		 "host.dram_gbps: nan is outside");
	bad_swap("host.dram_gbps = 200", "host.dram_gbps = inf", "is outside");
	bad_swap("gpu.flops = 1e15", "gpu.flops = NAN", "is outside");
	bad_swap("copy.contig = 1M:50", "copy.contig = 1M:nan", "bad curve");
	bad_swap("copy.contig = 1M:50", "copy.contig = 1M:inf", "bad curve");
	bad_swap("copy.contig = 1M:50", "copy.contig = 1M:1e-300", "bad curve");
	bad_swap("copy.contig = 1M:50", "copy.contig = infK:50", "bad curve");
	bad_swap("copy.contig = 1M:50", "copy.contig = nan:50", "bad curve");
	bad_swap("copy.contig_call_us = 3", "copy.contig_call_us = nan",
		 "is outside");
}

static void test_errors(void)
{
	kvt_hw hw;
	char text[4096];

	CHECK_OK(kvt_hw_parse(&hw, base, "t.prof"));
	CHECK_EQ(hw.gpus, 2);
	CHECK_EQ(hw.copy[KVT_COPY_CONTIG].chunk_bytes[0], 1048576);
	snprintf(text, sizeof(text), "%scopy.batch = 4K:4, 64K:38, 1M:50\n",
		 base);
	CHECK_OK(kvt_hw_parse(&hw, text, "t.prof"));
	CHECK_EQ(hw.copy[KVT_COPY_BATCH].n, 3);

	bad("gpu.flopz = 1\n", "t.prof:28: unknown key 'gpu.flopz'");
	bad("gpus = 3\n", "t.prof:28: gpus: given twice");
	bad("copy.batch = 4K:4, 2K:5\n", "chunk sizes must increase");
	bad("copy.batch = 4K-4\n", "not CHUNK:GBPS");
	bad("copy.batch = 4Q:4\n", "bad curve point");
	bad("copy.gather_call_us = 3\n", "copy.gather_call_us without");
	bad("gpu.mem_util_x = 3\n", "unknown key");
	bad("just words\n", "t.prof:28: expected 'key = value'");
	bad("fabric.bytes = 1e9\n", "fabric.bytes needs");
	{
		/* out of range and non-numbers, in place of a good line */
		char t2[4096], *p;

		snprintf(t2, sizeof(t2), "%s", base);
		p = strstr(t2, "gpu.hbm_eff = 0.8");
		memcpy(p, "gpu.hbm_eff = 1.8", 17);
		CHECK_ERR(kvt_hw_parse(&hw, t2, "t.prof"), KVT_ECONFIG);
		CHECK(strstr(kvt_errdetail(), "gpu.hbm_eff: 1.8 is outside"));
		memcpy(p, "gpu.hbm_eff = abc", 17);
		CHECK_ERR(kvt_hw_parse(&hw, t2, "t.prof"), KVT_ECONFIG);
		CHECK(strstr(kvt_errdetail(), "not a number"));
		p = strstr(t2, "gpus = 2");
		memcpy(p, "gpus = .", 8);
		CHECK_ERR(kvt_hw_parse(&hw, t2, "t.prof"), KVT_ECONFIG);
		snprintf(t2, sizeof(t2), "%s", base);
		p = strstr(t2, "link.gpus_per_uplink = 0");
		memcpy(p, "link.gpus_per_uplink = 2", 24);
		CHECK_ERR(kvt_hw_parse(&hw, t2, "t.prof"), KVT_ECONFIG);
		CHECK(strstr(kvt_errdetail(), "needs link.uplink_gbps"));
	}
	/* a missing required key */
	CHECK_ERR(kvt_hw_parse(&hw, "name = x\n", "t.prof"), KVT_ECONFIG);
	CHECK(strstr(kvt_errdetail(), "missing key 'gpu.name'"));

	CHECK_ERR(kvt_hw_load(&hw, "no-such-box"), KVT_ENOTFOUND);
	CHECK(strstr(kvt_errdetail(), "no-such-box"));
	CHECK(strstr(kvt_errdetail(), "testbed-a"));
	CHECK_ERR(kvt_hw_load(&hw, "/nonexistent/x.prof"), -ENOENT);
	CHECK(strstr(kvt_errdetail(), "/nonexistent/x.prof"));

	/* TP larger than the node */
	{
		kvt_geom g;
		kvt_cost c;

		CHECK_OK(kvt_hw_parse(&hw, base, "t.prof"));
		CHECK_OK(kvt_geom_preset(&g, "llama-3.1-70b", 16, 4, 0));
		CHECK_ERR(kvt_hw_cost(&hw, &g, &c), KVT_ECONFIG);
		CHECK(strstr(kvt_errdetail(), "TP 4"));
	}
}

/* Copy rates measured by kvtier bench xfer --json replace the curves. */
static void test_xfer(void)
{
	const char *gpu =
		"{\"model\": \"llama-3.1-8b\", \"results\": ["
		"{\"method\": \"cuda-kernel\", \"direction\": \"load\", "
		"\"page_tokens\": 32, \"bytes\": 1, \"gbps\": 47.5, "
		"\"limit_gbps\": 53.2},"
		"{\"method\": \"cuda-kernel\", \"direction\": \"load\", "
		"\"page_tokens\": 16, \"gbps\": 45, \"limit_gbps\": 53},"
		"{\"method\": \"cuda-chunk\", \"direction\": \"load\", "
		"\"page_tokens\": 32, \"gbps\": 14.1, \"limit_gbps\": 53},"
		"{\"method\": \"cuda-batch\", \"direction\": \"store\", "
		"\"page_tokens\": 32, \"gbps\": 30, \"limit_gbps\": 53},"
		"{\"method\": \"cpu\", \"direction\": \"load\", "
		"\"page_tokens\": 32, \"gbps\": 9, \"limit_gbps\": 10}]}";
	const char *cpu = "{\"results\": [{\"method\": \"cpu\", "
		"\"direction\": \"load\", \"page_tokens\": 16, "
		"\"gbps\": 9}]}";
	kvt_hw hw, before;
	kvt_cost c;
	kvt_geom g;

	CHECK_OK(kvt_hw_load(&hw, "testbed-b"));
	before = hw;
	CHECK_OK(kvt_hw_apply_xfer(&hw, gpu, "x.json"));
	CHECK_EQ(hw.copy[KVT_COPY_GATHER].n, 2);
	CHECK_EQ(hw.copy[KVT_COPY_GATHER].chunk_bytes[0], 32768); /* P 16 */
	CHECK(hw.copy[KVT_COPY_GATHER].gbps[1] == 47.5);
	CHECK_EQ(hw.copy[KVT_COPY_MEMCPY].n, 1);
	CHECK_EQ(hw.copy[KVT_COPY_MEMCPY].call_us, 0);
	CHECK(hw.link_gbps == 53.2);
	/* stores are not loads: the batch curve stays the profile's */
	CHECK(!memcmp(&hw.copy[KVT_COPY_BATCH], &before.copy[KVT_COPY_BATCH],
		      sizeof(kvt_copy_curve)));
	CHECK_OK(kvt_geom_preset(&g, "llama-3.1-8b", 32, 1, 0));
	CHECK_OK(kvt_hw_cost(&hw, &g, &c));
	/* the measured rate comes back at the measured chunk size */
	CHECK(kvt_cost_copy_gbps(&c, KVT_COPY_MEMCPY, 65536) > 14.09 &&
	      kvt_cost_copy_gbps(&c, KVT_COPY_MEMCPY, 65536) < 14.11);
	hw = before;
	CHECK_ERR(kvt_hw_apply_xfer(&hw, cpu, "cpu.json"), KVT_ECONFIG);
	CHECK(strstr(kvt_errdetail(), "GPU"));
	CHECK_ERR(kvt_hw_apply_xfer(&hw, "{nope", "bad.json"), KVT_ECONFIG);
	CHECK(strstr(kvt_errdetail(), "bad.json: not JSON"));
	CHECK(!memcmp(&hw, &before, sizeof(hw)));
	/* Regression (issue 10): page_tokens 1e10 reached a double->uint32
	 * cast; gbps 1e-300 gave 4e300 ms; bad points were skipped silently */
	{
		static const char *const pts[] = {
			"\"page_tokens\": 1e10, \"gbps\": 40",
			"\"page_tokens\": 16, \"gbps\": 1e-300",
			"\"page_tokens\": 16, \"gbps\": 1e300",
			"\"page_tokens\": 16.5, \"gbps\": 40",
			"\"page_tokens\": -16, \"gbps\": 40",
			"\"page_tokens\": \"16\", \"gbps\": 40",
			"\"page_tokens\": 16",
			"\"page_tokens\": 16, \"gbps\": 40, \"limit_gbps\": 1e9",
		};
		char j[512];

		for (size_t i = 0; i < sizeof(pts) / sizeof(pts[0]); i++) {
			snprintf(j, sizeof(j), "{\"results\": [{\"method\": "
				 "\"cuda-kernel\", \"direction\": \"load\", "
				 "%s}]}", pts[i]);
			CHECK_ERR(kvt_hw_apply_xfer(&hw, j, "p.json"),
				  KVT_ECONFIG);
			CHECK(strstr(kvt_errdetail(), "p.json: cuda-kernel "
				     "load point 1: page_tokens must be"));
		}
		/* a null limit (measured without one) is fine */
		CHECK_OK(kvt_hw_apply_xfer(&hw, "{\"results\": [{\"method\": "
			"\"cuda-chunk\", \"direction\": \"load\", "
			"\"page_tokens\": 16, \"gbps\": 9, \"limit_gbps\": "
			"null}]}", "ok.json"));
		hw = before;
	}
}

/* Reading a profile allocates once (the file's text): failing it is a
 * clean -ENOMEM that leaves nothing behind and @hw untouched. */
static void test_alloc_fault(void)
{
	kvt_hw hw;
	int64_t live = kvt_alloc_live();

	memset(&hw, 0x5a, sizeof(hw));
	kvt_alloc_fail_at(1);
	CHECK_ERR(kvt_hw_load(&hw, "testbed-a"), -ENOMEM);
	kvt_alloc_fail_at(0);
	CHECK_EQ(kvt_alloc_live(), live);
	CHECK_EQ(((unsigned char *)&hw)[0], 0x5a);
	CHECK_OK(kvt_hw_load(&hw, "testbed-a"));
	CHECK_EQ(kvt_alloc_live(), live);
}

int main(void)
{
	test_alloc_fault();
	test_builtins();
	test_errors();
	test_nonfinite();
	test_xfer();
	TEST_DONE();
}
