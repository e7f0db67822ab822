/*
 * test_sim_profile — hardware profiles: the built-in ones load, every
 * number in them names its source, they turn into a valid cost model; and
 * bad profiles fail with the file, line and key named.
 */
#include "harness.h"
#include "kvt_build.h"
#include "core/core.h"

#include <strings.h>

/* A source comment passes when it says "assumed" first, or names
 * something a reader can look up. */
static int source_ok(const char *c, int *assumed)
{
	static const char *const marks[] = {
		"http", "SPEC.md", "datasheet", "et al", "paper",
		"kvtier bench", ".prof",
	};

	while (*c == ' ' || *c == '\t')
		c++;
	*assumed = !strncasecmp(c, "assumed", 7);
	if (*assumed)
		return 1;
	for (size_t i = 0; i < sizeof(marks) / sizeof(marks[0]); i++)
		if (strcasestr(c, marks[i]))
			return 1;
	return 0;
}

/* The rule itself rejects what it must. */
static void test_source_rule(void)
{
	int a;

	CHECK(!source_ok(" a comment", &a));
	CHECK(!source_ok("", &a));
	CHECK(!source_ok(" streaming kernels reach ~80%", &a));
	CHECK(source_ok(" assumed: one launch per job", &a) && a);
	CHECK(source_ok(" SPEC.md: 53-55 GB/s", &a) && !a);
	CHECK(source_ok(" NVIDIA H200 datasheet", &a) && !a);
	CHECK(source_ok(" see https://example.org/x", &a) && !a);
}

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
		/* every line holding a value carries a source a reader can
		 * follow, or says it is an assumption */
		snprintf(path, sizeof(path), "%s/profiles/%s.prof",
			 KVT_SOURCE_DIR, name);
		CHECK((f = fopen(path, "r")) != NULL);
		while (f && fgets(line, sizeof(line), f)) {
			char *eq = strchr(line, '='), *hash = strchr(line, '#');
			int assumed;

			lineno++;
			if (!eq || (hash && hash < eq))
				continue;
			if (!strncmp(line, "name", 4) ||
			    !strncmp(line, "gpu.name", 8))
				continue;
			if (!source_ok(hash ? hash + 1 : "", &assumed)) {
				fprintf(stderr, "%s:%d: value without a source "
					"(a URL, SPEC.md, a datasheet, a paper, a "
					"kvtier bench run, another .prof) or "
					"'assumed'\n", path, lineno);
				CHECK(0);
			}
			/* the reader records exactly those as assumptions */
			*eq = '\0';
			for (size_t k = 0; kvt_hw_key_name(k); k++)
				if (!strcmp(kvt_hw_key_name(k), kvti_trim(line)))
					CHECK_EQ(kvt_hw_key_assumed(&hw, k),
						 assumed);
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

/* --set and --explain's perturbations, by key name. */
static void test_overrides(void)
{
	kvt_hw a, b;
	double from, to;
	size_t up = 0, eff = 0, nm = 0, flops = 0, fab = 0, gat = 0;

	CHECK_OK(kvt_hw_load(&a, "testbed-a"));
	for (size_t i = 0; kvt_hw_key_name(i); i++) {
		const char *k = kvt_hw_key_name(i);

		up = strcmp(k, "link.gpus_per_uplink") ? up : i;
		eff = strcmp(k, "gpu.gemm_eff") ? eff : i;
		nm = strcmp(k, "gpu.name") ? nm : i;
		flops = strcmp(k, "gpu.flops") ? flops : i;
		fab = strcmp(k, "ssd.bytes") ? fab : i;
		gat = strcmp(k, "copy.gather") ? gat : i;
	}
	CHECK(up && eff && nm && flops && fab && gat);
	/* the shared uplink is an assumption (fitted) in testbed-a */
	CHECK(kvt_hw_key_assumed(&a, up));
	CHECK(!kvt_hw_key_assumed(&a, flops));
	b = a;
	CHECK_OK(kvt_hw_set(&b, "link.gpus_per_uplink", "0"));
	CHECK_EQ(b.gpus_per_uplink, 0);
	CHECK(!kvt_hw_key_assumed(&b, up));
	CHECK_OK(kvt_hw_set(&b, "copy.gather", "4K:10, 64K:40"));
	CHECK_EQ(b.copy[KVT_COPY_GATHER].n, 2);
	CHECK(b.copy[KVT_COPY_GATHER].gbps[1] == 40);
	CHECK(b.copy[KVT_COPY_GATHER].chunk_bytes[2] == 0);
	b = a;
	CHECK_ERR(kvt_hw_set(&b, "gpu.teleport", "1"), KVT_ECONFIG);
	CHECK(strstr(kvt_errdetail(), "gpu.teleport") != NULL);
	CHECK_ERR(kvt_hw_set(&b, "gpu.gemm_eff", "2"), KVT_ECONFIG);
	CHECK_ERR(kvt_hw_set(&b, "gpu.flops", "fast"), KVT_ECONFIG);
	CHECK(!memcmp(&a, &b, sizeof(a))); /* untouched on failure */
	/* an uplink needs its rate: testbed-b has none */
	CHECK_OK(kvt_hw_load(&b, "testbed-b"));
	CHECK_ERR(kvt_hw_set(&b, "link.gpus_per_uplink", "2"), KVT_ECONFIG);

	b = a;
	CHECK_OK(kvt_hw_key_scale(&b, flops, 2, &from, &to));
	CHECK(from == a.gpu_flops && to == 2 * a.gpu_flops);
	CHECK(b.gpu_flops == to);
	CHECK_OK(kvt_hw_key_scale(&b, eff, 2, &from, &to));
	CHECK(to == 1); /* clamped to the key's range */
	CHECK_OK(kvt_hw_key_scale(&b, gat, 0.5, &from, &to));
	CHECK(b.copy[KVT_COPY_GATHER].gbps[4] ==
	      a.copy[KVT_COPY_GATHER].gbps[4] / 2);
	CHECK_ERR(kvt_hw_key_scale(&b, nm, 2, &from, &to), -EINVAL);
	CHECK_ERR(kvt_hw_key_scale(&b, fab, 2, &from, &to), -EINVAL);
	CHECK_ERR(kvt_hw_key_scale(&b, flops, 0, &from, &to), -EINVAL);
	CHECK(kvt_hw_key_name(1000) == NULL);
}

int main(void)
{
	test_source_rule();
	test_overrides();
	test_alloc_fault();
	test_builtins();
	test_errors();
	test_nonfinite();
	test_xfer();
	TEST_DONE();
}
