/*
 * test_fabric_kernel — the fabric tier on the kernel interfaces real CXL
 * memory uses, checked with the kernel's own accounting, not kvtier's word:
 *
 *   fabric:numa=N   every page of the tier is on node N (move_pages() query
 *                   of every 4 KiB page, and /proc/self/numa_maps); a node
 *                   with CPUs is refused unless allow-cpus; more than the
 *                   node has free is refused at open (not an OOM kill later)
 *   fabric:/dev/daxX.Y  mapped at the device's alignment, size from sysfs;
 *                   the transfer engine's copies into and out of it are
 *                   bit-exact against kvt_layout_convert_ref(); a second
 *                   open of the same device is refused (KVT_EBUSY); pin
 *                   without a GPU fails and leaves nothing behind
 *   a tier chain    hostdev + fabric + dram:numa=0 with the fabric tier on
 *                   the node and then on the device: stores, demotions
 *                   fabric -> dram, loads from both, every copy checksummed
 *                   and compared with the originals (pools and transfer
 *                   engine, as the node cache drives them)
 *
 * Runs where the machine has a CPU-less NUMA node or a devdax device:
 * scripts/vm-fabric boots a VM with both and runs it there. Environment:
 * KVT_FABRIC_NODE (default: the first CPU-less node), KVT_FABRIC_DAX
 * (default: the first devdax device), KVT_FABRIC_STRICT=1 (a missing one is
 * a failure, not a skip). It may overwrite the device's contents.
 *
 * Output: besides the harness's messages on stderr, one line per check on
 * stdout, "KVTVM PASS|FAIL <check> <detail>" (the VM's console protocol).
 * Exit 0 pass, 1 fail, 77 when neither a CPU-less node nor a devdax device
 * is here.
 */
#include "harness.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <numaif.h>
#include <unistd.h>
#include <xxhash.h>

#define P 8

static kvt_geom geom;
static uint64_t page_bytes;
static char detail[512];

/* ---- the verdict per check -------------------------------------------- */

static int check_start;

static void begin(void)
{
	check_start = kvt_test_failures;
	detail[0] = '\0';
}

static void verdict(const char *name)
{
	printf("KVTVM %s %s %s\n", kvt_test_failures == check_start ? "PASS" :
	       "FAIL", name, detail);
	fflush(stdout);
}

/* 4 layers, 2 KV heads of 64, bf16, 8 tokens a page: 16 KiB pages, each
 * 8 chunks of 2 KiB in the layer-first pool. */
static void fabric_geom(void)
{
	static const char cfg[] = "{\"num_hidden_layers\": 4, "
		"\"num_attention_heads\": 2, \"num_key_value_heads\": 2, "
		"\"hidden_size\": 128, \"torch_dtype\": \"bfloat16\"}";

	CHECK_OK(kvt_geom_from_json(&geom, cfg, "fabric-test", P, 1, 0));
	page_bytes = kvt_geom_page_bytes(&geom);
	CHECK_EQ(page_bytes, 16384);
}

static int open_spec(kvt_tier **t, const char *s)
{
	kvt_tier_spec spec;
	size_t n;
	int err = kvt_tier_spec_parse(s, &spec, 1, &n);

	return err ? err : kvt_tier_open(t, &spec, &geom);
}

static void fill(void *p, size_t len, uint64_t seed)
{
	for (size_t i = 0; i + 8 <= len; i += 8) {
		uint64_t x = test_rand(&seed);
		memcpy((char *)p + i, &x, 8);
	}
}

/* ---- the kernel's accounting -------------------------------------------- */

/* move_pages(2) with no target nodes only reports where each page is.
 * Counts the 4 KiB pages of [p, p+len) on @node, on other nodes (the first
 * one named in *other_node) and not faulted in yet (-EFAULT, -ENOENT). */
static void pages_where(void *p, size_t len, int node, size_t *on,
			size_t *other, int *other_node, size_t *absent)
{
	size_t ps = (size_t)sysconf(_SC_PAGESIZE), n = len / ps;
	void **pages = malloc(n * sizeof(void *));
	int *status = malloc(n * sizeof(int));

	*on = *other = *absent = 0;
	*other_node = node;
	if (!pages || !status) {
		CHECK(0);
		goto out;
	}
	for (size_t i = 0; i < n; i++)
		pages[i] = (char *)p + i * ps;
	if (move_pages(0, (unsigned long)n, pages, NULL, status, 0) < 0) {
		fprintf(stderr, "move_pages: %s\n", strerror(errno));
		CHECK(0);
		goto out;
	}
	for (size_t i = 0; i < n; i++) {
		if (status[i] == node) {
			(*on)++;
		} else if (status[i] == -EFAULT || status[i] == -ENOENT) {
			(*absent)++;
		} else {
			if (!*other)
				*other_node = status[i];
			(*other)++;
		}
	}
out:
	free(pages);
	free(status);
}

/* The /proc/self/numa_maps line of the mapping at @p: pages per node as the
 * kernel counts them (N<node>=<pages>, in units of kernelpagesize_kB). Fills
 * bytes on @node and on any other node. Returns 0 if the line was found. */
static int numa_maps(void *p, int node, uint64_t *on, uint64_t *off,
		     char *policy, size_t plen)
{
	FILE *f = fopen("/proc/self/numa_maps", "r");
	char line[4096], want[32];
	int found = -1;

	*on = *off = 0;
	if (!f)
		return -1;
	snprintf(want, sizeof(want), "%lx ", (unsigned long)(uintptr_t)p);
	while (fgets(line, sizeof(line), f)) {
		uint64_t kb = 4, counts[KVT_MAX_NODES] = { 0 };
		char *tok, *save = NULL;

		if (strncmp(line, want, strlen(want)))
			continue;
		found = 0;
		/* address, policy, then key=value fields */
		strtok_r(line, " \n", &save);
		tok = strtok_r(NULL, " \n", &save);
		if (tok)
			snprintf(policy, plen, "%s", tok);
		while ((tok = strtok_r(NULL, " \n", &save))) {
			int n;
			unsigned long long v;

			if (sscanf(tok, "N%d=%llu", &n, &v) == 2 && n >= 0 &&
			    n < KVT_MAX_NODES)
				counts[n] = v;
			else if (sscanf(tok, "kernelpagesize_kB=%llu", &v) == 1)
				kb = v;
		}
		for (int n = 0; n < KVT_MAX_NODES; n++) {
			if (n == node)
				*on += counts[n] * kb * 1024;
			else
				*off += counts[n] * kb * 1024;
		}
		break;
	}
	fclose(f);
	return found;
}

/* Both accountings agree that every page of @t the kernel has is on @node
 * (and, with @all, that it has every page). */
static void tier_on_node(kvt_tier *t, int node, int all, const char *what)
{
	size_t ps = (size_t)sysconf(_SC_PAGESIZE), on, other, absent;
	kvt_tier_desc d;
	uint64_t nm_on, nm_off;
	char policy[64] = "?";
	int other_node;
	void *base = kvt_tier_slot_ptr(t, 0);

	kvt_tier_info(t, &d);
	pages_where(base, d.bytes, node, &on, &other, &other_node, &absent);
	if (other) {
		fprintf(stderr, "%s: %zu of %zu pages not on node %d (first "
			"one: %d)\n", what, other, on + other, node, other_node);
		CHECK(0);
	}
	CHECK(on > 0);
	if (all)
		CHECK_EQ(absent, 0);
	CHECK_EQ(numa_maps(base, node, &nm_on, &nm_off, policy,
			   sizeof(policy)), 0);
	CHECK_EQ(nm_off, 0);
	CHECK_EQ(nm_on, on * ps);
	snprintf(detail + strlen(detail), sizeof(detail) - strlen(detail),
		 "%s%s: move_pages %zu/%zu pages on node %d (%zu not faulted "
		 "in), numa_maps N%d=%llu KiB policy %s", detail[0] ? "; " : "",
		 what, on, d.bytes / ps, node, absent, node,
		 (unsigned long long)(nm_on / 1024), policy);
}

/* ---- fabric:numa=N ------------------------------------------------------ */

static int cpu_node(void)
{
	kvt_machine m;

	kvt_probe(&m);
	for (int i = 0; i < m.nnodes; i++)
		if (m.nodes[i].cpus > 0)
			return m.nodes[i].id;
	return -1;
}

static void numa_placement(int node, int populate)
{
	char s[128];
	kvt_tier *t = NULL;
	kvt_tier_desc d;
	unsigned char *page = malloc(page_bytes);

	begin();
	snprintf(s, sizeof(s), "fabric:numa=%d,32M%s", node,
		 populate ? ",populate" : "");
	CHECK_OK(open_spec(&t, s));
	if (!t || !page)
		goto out;
	kvt_tier_info(t, &d);
	CHECK_EQ(d.emulated, 0);
	CHECK_EQ(d.numa_node, node);
	CHECK_EQ(d.backing, KVT_BACK_NUMA);
	CHECK_EQ(d.nslots, 32 << 20 >> 14);
	/* without populate the pages fault in here, under the policy */
	for (uint32_t i = 0; i < d.nslots; i++) {
		fill(page, page_bytes, i + 1);
		CHECK_OK(kvt_tier_write(t, i, page));
	}
	tier_on_node(t, node, 1, s);
out:
	kvt_tier_close(t);
	free(page);
	verdict(populate ? "numa-placement-populate" : "numa-placement");
}

static void numa_refusals(int node)
{
	char s[128];
	kvt_tier *t = NULL;
	kvt_tier_desc d;
	kvt_machine m;
	int cnode = cpu_node();

	begin();
	/* a node with CPUs is not dedicated memory */
	if (cnode < 0) {
		fprintf(stderr, "no node with CPUs?\n");
		CHECK(0);
	} else {
		snprintf(s, sizeof(s), "fabric:numa=%d,8M", cnode);
		CHECK_ERR(open_spec(&t, s), KVT_ESPEC);
		CHECK(strstr(kvt_errdetail(), "CPUs") != NULL);
		snprintf(detail, sizeof(detail), "numa=%d refused: %s; ", cnode,
			 kvt_errdetail());
		snprintf(s, sizeof(s), "fabric:numa=%d,8M,allow-cpus", cnode);
		CHECK_OK(open_spec(&t, s));
		if (t) {
			kvt_tier_info(t, &d);
			CHECK_EQ(d.emulated, 1);
			kvt_tier_close(t);
			t = NULL;
		}
	}
	/* more than the node has: refused at open, not an OOM kill later */
	kvt_probe(&m);
	for (int i = 0; i < m.nnodes; i++)
		if (m.nodes[i].id == node) {
			snprintf(s, sizeof(s), "fabric:numa=%d,%lluM", node,
				 (unsigned long long)(m.nodes[i].mem_total >> 20) + 64);
			CHECK_ERR(open_spec(&t, s), KVT_ESPEC);
			snprintf(detail + strlen(detail),
				 sizeof(detail) - strlen(detail), "%s",
				 kvt_errdetail());
		}
	/* no such node */
	CHECK_ERR(open_spec(&t, "fabric:numa=63,8M"), KVT_ENODEV);
	verdict("numa-refusals");
}

static int node_hugepages_once(int node, unsigned n);

/* Reserve @n default-size hugepages on node @node (root only), compacting
 * memory once if it is too fragmented; -1 if the kernel cannot. */
static int node_hugepages(int node, unsigned n)
{
	FILE *f;

	if (!node_hugepages_once(node, n))
		return 0;
	f = fopen("/proc/sys/vm/compact_memory", "w");
	if (f) {
		fputs("1\n", f);
		fclose(f);
	}
	return node_hugepages_once(node, n);
}

static int node_hugepages_once(int node, unsigned n)
{
	char p[160];
	FILE *f;
	kvt_machine m;
	unsigned got = 0;

	kvt_probe(&m);
	if (!m.hugepage_bytes) {
		fprintf(stderr, "no hugepages on this kernel\n");
		return -1;
	}
	snprintf(p, sizeof(p), "/sys/devices/system/node/node%d/hugepages/"
		 "hugepages-%llukB/nr_hugepages", node,
		 (unsigned long long)(m.hugepage_bytes >> 10));
	f = fopen(p, "w");
	if (!f || fprintf(f, "%u\n", n) < 0 || fclose(f)) {
		fprintf(stderr, "%s: %s\n", p, strerror(errno));
		return -1;
	}
	f = fopen(p, "r");
	if (!f || fscanf(f, "%u", &got) != 1)
		got = 0;
	if (f)
		fclose(f);
	if (got != n)
		fprintf(stderr, "%s: %u, not %u\n", p, got, n);
	return got == n ? 0 : -1;
}

/* In a child: open @spec, write every slot, check the pages are on @node.
 * Returns the child's exit status, or 128 + the signal that killed it (a
 * SIGBUS here is a hugepage the node did not have). */
static int open_and_touch(const char *spec, int node, int *huge)
{
	int st, fd[2];
	pid_t pid;

	if (pipe(fd))
		return -1;
	pid = fork();
	if (pid == 0) {
		kvt_tier *t = NULL;
		kvt_tier_desc d;
		unsigned char *page = malloc(page_bytes);
		int err = open_spec(&t, spec);

		close(fd[0]);
		if (err) {
			fprintf(stderr, "%s: %s\n", spec, kvt_errdetail());
			_exit(err == KVT_ESPEC ? 3 : 2);
		}
		kvt_tier_info(t, &d);
		if (write(fd[1], &d.huge, sizeof(d.huge)) != sizeof(d.huge))
			_exit(2);
		for (uint32_t i = 0; i < d.nslots && page; i++) {
			fill(page, page_bytes, i);
			kvt_tier_write(t, i, page);
		}
		tier_on_node(t, node, 1, spec);
		kvt_tier_close(t);
		_exit(kvt_test_failures ? 1 : 0);
	}
	close(fd[1]);
	*huge = -1;
	if (read(fd[0], huge, sizeof(*huge)) != sizeof(*huge))
		*huge = -1;
	close(fd[0]);
	if (pid < 0 || waitpid(pid, &st, 0) != pid)
		return -1;
	return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

/* Explicit hugepages reserved on another node than the tier's: the tier
 * must not take them for its own (a fault would find none on its node). */
static void numa_hugepages(int node, int cnode)
{
	char s[128];
	int rc, huge;

	begin();
	if (cnode < 0 || node_hugepages(cnode, 2) || node_hugepages(node, 0)) {
		snprintf(detail, sizeof(detail), "cannot reserve hugepages here");
		CHECK(0);
		goto out;
	}
	/* default (auto): 2 reserved machine-wide, none on the node */
	snprintf(s, sizeof(s), "fabric:numa=%d,4M", node);
	rc = open_and_touch(s, node, &huge);
	CHECK_EQ(rc, 0);
	CHECK(huge != KVT_HUGE_EXPLICIT);
	snprintf(detail, sizeof(detail), "hugepages on node %d only: %s -> %s "
		 "(%s); ", cnode, s, rc == 0 ? "ok" : rc >= 128 ? "KILLED" :
		 "failed", rc >= 128 ? strsignal(rc - 128) :
		 huge >= 0 ? kvt_huge_name(huge) : "-");
	/* asked for explicitly: refused at open */
	snprintf(s, sizeof(s), "fabric:numa=%d,4M,hugepages", node);
	rc = open_and_touch(s, node, &huge);
	CHECK_EQ(rc, 3);
	snprintf(detail + strlen(detail), sizeof(detail) - strlen(detail),
		 "%s -> %s; ", s, rc == 3 ? "refused" : rc >= 128 ?
		 strsignal(rc - 128) : "not refused");
	/* reserved on the node: used */
	if (node_hugepages(node, 2)) {
		CHECK(0);
		goto out;
	}
	rc = open_and_touch(s, node, &huge);
	CHECK_EQ(rc, 0);
	CHECK_EQ(huge, KVT_HUGE_EXPLICIT);
	snprintf(detail + strlen(detail), sizeof(detail) - strlen(detail),
		 "with 2 on node %d: %s", node, rc == 0 && huge ==
		 KVT_HUGE_EXPLICIT ? "explicit, on the node" : "FAILED");
out:
	node_hugepages(node, 0);
	if (cnode >= 0)
		node_hugepages(cnode, 0);
	verdict("numa-hugepages");
}

/* ---- fabric:/dev/daxX.Y ----------------------------------------------- */

static uint64_t sysfs_u64(const char *dax, const char *attr)
{
	char p[256];
	unsigned long long v = 0;
	FILE *f;

	snprintf(p, sizeof(p), "/sys/bus/dax/devices/%s/%s",
		 strrchr(dax, '/') + 1, attr);
	f = fopen(p, "r");
	if (!f || fscanf(f, "%llu", &v) != 1)
		v = 0;
	if (f)
		fclose(f);
	return v;
}

/* The /proc/self/maps line of @p names @path and spans @len bytes. */
static int mapped_as(void *p, const char *path, uint64_t len)
{
	FILE *f = fopen("/proc/self/maps", "r");
	char line[512];
	int ok = 0;

	if (!f)
		return 0;
	while (fgets(line, sizeof(line), f)) {
		unsigned long a, b;
		if (sscanf(line, "%lx-%lx", &a, &b) == 2 &&
		    a == (unsigned long)(uintptr_t)p) {
			ok = b - a == len && strstr(line, path) &&
			     strstr(line, "rw-s");
			break;
		}
	}
	fclose(f);
	return ok;
}

static void dax_map(const char *dax)
{
	uint64_t size = sysfs_u64(dax, "size"), align = sysfs_u64(dax, "align");
	char s[128];
	kvt_tier *t = NULL;
	kvt_tier_desc d;

	begin();
	CHECK(size > 0);
	CHECK(align >= 4096);
	snprintf(s, sizeof(s), "fabric:%s", dax);
	CHECK_OK(open_spec(&t, s));
	if (!t)
		goto out;
	kvt_tier_info(t, &d);
	CHECK_EQ(d.emulated, 0);
	CHECK_EQ(d.backing, KVT_BACK_DEVDAX);
	CHECK(!strcmp(d.where, dax));
	/* the whole device: every slot that fits, the mapping whole
	 * alignment units within it */
	CHECK(d.bytes <= size);
	CHECK_EQ(d.bytes % align, 0);
	CHECK_EQ(d.nslots, size / align * align / page_bytes);
	CHECK_EQ((uintptr_t)kvt_tier_slot_ptr(t, 0) % align, 0);
	CHECK(mapped_as(kvt_tier_slot_ptr(t, 0), dax, d.bytes));
	snprintf(detail, sizeof(detail), "sysfs size %llu align %llu: mapped "
		 "%llu bytes at %p (%s aligned), %llu slots of %llu",
		 (unsigned long long)size, (unsigned long long)align,
		 (unsigned long long)d.bytes, kvt_tier_slot_ptr(t, 0),
		 (uintptr_t)kvt_tier_slot_ptr(t, 0) % align ? "NOT" : "2M",
		 (unsigned long long)d.nslots, (unsigned long long)page_bytes);
	kvt_tier_close(t);
	t = NULL;

	/* a part of it: whole alignment units */
	snprintf(s, sizeof(s), "fabric:%s,3M", dax);
	CHECK_OK(open_spec(&t, s));
	if (t) {
		kvt_tier_info(t, &d);
		CHECK_EQ(d.nslots, (3 << 20) / page_bytes);
		CHECK_EQ(d.bytes, ((3u << 20) + align - 1) / align * align);
		CHECK(mapped_as(kvt_tier_slot_ptr(t, 0), dax, d.bytes));
		kvt_tier_close(t);
		t = NULL;
	}
	/* more than it holds */
	snprintf(s, sizeof(s), "fabric:%s,%lluM", dax,
		 (unsigned long long)(size >> 20) + 2);
	CHECK_ERR(open_spec(&t, s), KVT_ESPEC);
out:
	kvt_tier_close(t);
	verdict("dax-map");
}

static void dax_exclusive(const char *dax)
{
	char s[128];
	kvt_tier *a = NULL, *b = NULL;
	int fds;

	begin();
	fds = test_count_entries("/proc/self/fd");
	snprintf(s, sizeof(s), "fabric:%s,4M", dax);
	CHECK_OK(open_spec(&a, s));
	CHECK_ERR(open_spec(&b, s), KVT_EBUSY);
	snprintf(detail, sizeof(detail), "second open: %s", kvt_errdetail());
	CHECK(b == NULL);
	kvt_tier_close(a);
	a = NULL;
	/* free again once the first is closed */
	CHECK_OK(open_spec(&b, s));
	kvt_tier_close(b);
	b = NULL;
	/* pin needs a GPU: an explicit error, nothing left open or locked */
	snprintf(s, sizeof(s), "fabric:%s,4M,pin", dax);
	{
		int err = open_spec(&b, s);
		CHECK(err == KVT_ENOTBUILT || err == KVT_ENODEV);
		snprintf(detail + strlen(detail), sizeof(detail) - strlen(detail),
			 "; pin without a GPU: %s", kvt_errdetail());
	}
	snprintf(s, sizeof(s), "fabric:%s,4M,populate,mlock", dax);
	CHECK_OK(open_spec(&b, s));
	kvt_tier_close(b);
	CHECK_EQ(test_count_entries("/proc/self/fd"), fds);
	verdict("dax-exclusive");
}

/* The transfer engine between a layer-first hostdev tier and the device,
 * both ways, against the reference conversion. */
static void dax_xfer(const char *dax)
{
	enum { N = 48 };
	char s[128];
	kvt_tier *hd = NULL, *fx = NULL;
	kvt_xfer *x = NULL;
	kvt_xfer_job *job = NULL;
	uint32_t hs[N], fs[N], back[N];
	uint64_t rs[N], rd[N], sums[N];
	const kvt_layout *hl, *fl;
	kvt_layout pf;
	void *ref = NULL, *refb[1], *hback = NULL;
	void **hbufs2 = NULL;
	size_t bad = 0;

	begin();
	CHECK_OK(open_spec(&hd, "hostdev:4M"));
	snprintf(s, sizeof(s), "fabric:%s,8M", dax);
	CHECK_OK(open_spec(&fx, s));
	CHECK_OK(kvt_xfer_create(&x, NULL));
	if (!hd || !fx || !x)
		goto out;
	hl = kvt_tier_layout(hd);
	fl = kvt_tier_layout(fx);
	for (uint32_t b = 0; b < hl->nbufs; b++)
		fill(kvt_tier_bufs(hd)[b], hl->buf_bytes, 100 + b);
	/* scattered slots both sides */
	for (uint32_t i = 0; i < N; i++) {
		hs[i] = (uint32_t)((i * 7 + 3) % hl->slots);
		fs[i] = (uint32_t)((i * 37 + 11) % fl->slots);
		back[i] = (uint32_t)((i * 5 + 1) % hl->slots);
	}
	/* distinct destinations (7, 37 and 5 are prime to the slot counts) */
	for (uint32_t i = 0; i < N; i++)
		for (uint32_t j = 0; j < i; j++)
			CHECK(fs[i] != fs[j] && back[i] != back[j]);

	/* store: hostdev (vLLM layer-first) -> fabric (page-first) */
	{
		kvt_xfer_desc d = { .src = hd, .dst = fx, .src_slots = hs,
				    .dst_slots = fs, .npages = N,
				    .flags = KVT_XFER_SUM, .sums = sums };
		CHECK_OK(kvt_xfer_submit(x, &d, &job));
		if (job)
			CHECK_OK(kvt_xfer_wait(job, -1));
		kvt_xfer_job_free(job);
		job = NULL;
	}
	/* the oracle: the same pages into a plain page-first buffer */
	CHECK_OK(kvt_layout_init(&pf, KVT_LAYOUT_PAGE_FIRST, &geom, N));
	ref = malloc(N * page_bytes);
	if (!ref)
		goto out;
	refb[0] = ref;
	for (uint32_t i = 0; i < N; i++) {
		rs[i] = hs[i];
		rd[i] = i;
	}
	CHECK_OK(kvt_layout_convert_ref(hl, kvt_tier_bufs(hd), rs, &pf, refb,
					rd, N));
	for (uint32_t i = 0; i < N; i++) {
		if (memcmp((char *)ref + i * page_bytes,
			   kvt_tier_slot_ptr(fx, fs[i]), page_bytes))
			bad++;
		CHECK_EQ(sums[i], XXH3_64bits((char *)ref + i * page_bytes,
					      page_bytes));
	}
	CHECK_EQ(bad, 0);

	/* load: fabric -> hostdev, other slots, verified against the sums */
	{
		kvt_xfer_desc d = { .src = fx, .dst = hd, .src_slots = fs,
				    .dst_slots = back, .npages = N,
				    .flags = KVT_XFER_VERIFY, .sums = sums };
		/* the oracle: reference conversion from the device's pages
		 * into a copy of hostdev taken before, compared buffer by
		 * buffer (a stray write anywhere shows) */
		hback = malloc(kvt_layout_region_bytes(hl));
		hbufs2 = calloc(hl->nbufs, sizeof(void *));
		if (!hback || !hbufs2)
			goto out;
		kvt_layout_bufs_carve(hl, hback, hbufs2);
		for (uint32_t b = 0; b < hl->nbufs; b++)
			memcpy(hbufs2[b], kvt_tier_bufs(hd)[b], hl->buf_bytes);
		CHECK_OK(kvt_xfer_submit(x, &d, &job));
		if (job)
			CHECK_OK(kvt_xfer_wait(job, -1));
		kvt_xfer_job_free(job);
		job = NULL;
		for (size_t i = 0; i < d.npages; i++) {
			rs[i] = fs[i];
			rd[i] = back[i];
		}
		CHECK_OK(kvt_layout_convert_ref(fl, kvt_tier_bufs(fx), rs, hl,
						hbufs2, rd, d.npages));
		bad = 0;
		for (uint32_t b = 0; b < hl->nbufs; b++)
			bad += memcmp(hbufs2[b], kvt_tier_bufs(hd)[b],
				      hl->buf_bytes) != 0;
		CHECK_EQ(bad, 0);
		snprintf(detail, sizeof(detail), "%d pages stored hostdev(vllm) "
			 "-> %s and %d loaded back, bit-exact against "
			 "kvt_layout_convert_ref, sums verified", N, dax, N);
	}
out:
	kvt_xfer_job_free(job);
	kvt_xfer_destroy(x);
	kvt_tier_close(hd);
	kvt_tier_close(fx);
	free(ref);
	free(hback);
	free(hbufs2);
	verdict("dax-xfer-reference");
}

/* ---- a tier chain: hostdev -> fabric -> dram and back -------------------- */

/* One checksummed job; returns its result. */
static int move(kvt_xfer *x, kvt_tier *src, const uint32_t *ss, kvt_tier *dst,
		const uint32_t *ds, size_t n, unsigned flags, uint64_t *sums)
{
	kvt_xfer_desc d = { .src = src, .dst = dst, .src_slots = ss,
			    .dst_slots = ds, .npages = n, .flags = flags,
			    .sums = sums };
	kvt_xfer_job *job = NULL;
	int err = kvt_xfer_submit(x, &d, &job);

	if (!err)
		err = kvt_xfer_wait(job, -1);
	kvt_xfer_job_free(job);
	return err;
}

/*
 * What the node cache does with the fabric tier, done with the pools and the
 * transfer engine directly (the cache's own calls are being reworked):
 *
 *   hostdev (48 pages, layer-first)  --store, SUM-->  fabric (64 slots)
 *   fabric (32 of the 48)            --demote, VERIFY--> dram:numa=D (96)
 *   hostdev poisoned ("evicted"); then loads, VERIFY, into other slots:
 *   dram -> hostdev (32), fabric -> hostdev (16)
 *
 * Every loaded page must equal the original (kvt_layout_convert_ref of the
 * hostdev pool before the poison); a byte flipped in the dram tier must
 * fail its load with KVT_ECORRUPT; slots are taken from and given back to
 * the pools; afterwards the kernel must hold the fabric pages on the
 * fabric node (when it is one) and the dram pages on node D.
 */
static void chain_run(const char *fabric, int fabric_node, int dram_node,
		      const char *name)
{
	enum { N = 48, DEM = 32 };
	char spec[256];
	kvt_tier *hd = NULL, *fx = NULL, *dr = NULL;
	kvt_xfer *x = NULL;
	uint32_t hs[N], fs[N], ds[DEM], back[N];
	uint64_t sums[N], rs[N], rd[N];
	kvt_layout pf;
	void *ref = NULL, *refb[1];
	unsigned char *page = malloc(page_bytes);
	size_t bad = 0;
	int err;

	begin();
	snprintf(spec, sizeof(spec), "fabric:%s,%llu", fabric,
		 (unsigned long long)(64 * page_bytes));
	CHECK_OK(open_spec(&hd, "hostdev:768K"));
	CHECK_OK(open_spec(&fx, spec));
	snprintf(spec, sizeof(spec), "dram:%llu,numa=%d",
		 (unsigned long long)(96 * page_bytes), dram_node);
	CHECK_OK(open_spec(&dr, spec));
	CHECK_OK(kvt_xfer_create(&x, NULL));
	ref = malloc(N * page_bytes);
	if (!hd || !fx || !dr || !x || !ref || !page)
		goto out;
	CHECK_EQ(kvt_tier_layout(hd)->slots, N);
	for (uint32_t b = 0; b < kvt_tier_layout(hd)->nbufs; b++)
		fill(kvt_tier_bufs(hd)[b], kvt_tier_layout(hd)->buf_bytes, 300 + b);
	for (uint32_t i = 0; i < N; i++) {
		hs[i] = i;
		back[i] = N - 1 - i;
		rs[i] = i;
		rd[i] = i;
	}
	/* the originals, page-first */
	CHECK_OK(kvt_layout_init(&pf, KVT_LAYOUT_PAGE_FIRST, &geom, N));
	refb[0] = ref;
	CHECK_OK(kvt_layout_convert_ref(kvt_tier_layout(hd), kvt_tier_bufs(hd),
					rs, &pf, refb, rd, N));

	/* store into fabric slots from its pool */
	CHECK_OK(kvt_pool_alloc_n(kvt_tier_pool(fx), fs, N));
	CHECK_OK(move(x, hd, hs, fx, fs, N, KVT_XFER_SUM, sums));
	/* demote the first DEM to dram, give their fabric slots back */
	CHECK_OK(kvt_pool_alloc_n(kvt_tier_pool(dr), ds, DEM));
	CHECK_OK(move(x, fx, fs, dr, ds, DEM, KVT_XFER_VERIFY, sums));
	for (uint32_t i = 0; i < DEM; i++)
		CHECK_OK(kvt_pool_free(kvt_tier_pool(fx), fs[i]));
	CHECK_EQ(kvt_pool_used(kvt_tier_pool(fx)), N - DEM);
	CHECK_EQ(kvt_pool_used(kvt_tier_pool(dr)), DEM);
	/* the fabric slots now free get other data: a stale read would show */
	for (uint32_t i = 0; i < DEM; i++)
		memset(kvt_tier_slot_ptr(fx, fs[i]), 0x5a, page_bytes);
	/* evicted from hostdev */
	for (uint32_t b = 0; b < kvt_tier_layout(hd)->nbufs; b++)
		memset(kvt_tier_bufs(hd)[b], 0xee, kvt_tier_layout(hd)->buf_bytes);

	/* loads from both, verified, into other slots */
	CHECK_OK(move(x, dr, ds, hd, back, DEM, KVT_XFER_VERIFY, sums));
	CHECK_OK(move(x, fx, fs + DEM, hd, back + DEM, N - DEM, KVT_XFER_VERIFY,
		      sums + DEM));
	for (uint32_t i = 0; i < N; i++) {
		CHECK_OK(kvt_tier_read(hd, back[i], page));
		bad += memcmp(page, (char *)ref + i * page_bytes, page_bytes) != 0;
	}
	CHECK_EQ(bad, 0);

	/* a flipped byte in the dram copy fails its load */
	((unsigned char *)kvt_tier_slot_ptr(dr, ds[5]))[100] ^= 1;
	err = move(x, dr, ds + 5, hd, back + 5, 1, KVT_XFER_VERIFY, sums + 5);
	CHECK_EQ(err, KVT_ECORRUPT);
	snprintf(detail, sizeof(detail), "hostdev -> %s: %d pages stored (sums), "
		 "%d demoted fabric -> dram:numa=%d (verified), loads dram %d + "
		 "fabric %d (verified) equal the originals; a flipped dram byte: "
		 "%s", fabric, N, DEM, dram_node, DEM, N - DEM,
		 err == KVT_ECORRUPT ? "KVT_ECORRUPT" : "NOT CAUGHT");

	/* and the kernel holds the pages where the specs said */
	if (fabric_node >= 0)
		tier_on_node(fx, fabric_node, 0, "fabric");
	tier_on_node(dr, dram_node, 0, "dram");
	for (uint32_t i = 0; i < DEM; i++)
		CHECK_OK(kvt_pool_free(kvt_tier_pool(dr), ds[i]));
	for (uint32_t i = DEM; i < N; i++)
		CHECK_OK(kvt_pool_free(kvt_tier_pool(fx), fs[i]));
out:
	kvt_xfer_destroy(x);
	kvt_tier_close(hd);
	kvt_tier_close(fx);
	kvt_tier_close(dr);
	free(ref);
	free(page);
	verdict(name);
}

int main(void)
{
	kvt_machine m;
	const char *env_node = getenv("KVT_FABRIC_NODE");
	const char *dax = getenv("KVT_FABRIC_DAX");
	int strict = getenv("KVT_FABRIC_STRICT") &&
		     !strcmp(getenv("KVT_FABRIC_STRICT"), "1");
	int node = -1, dram_node;

	kvt_probe(&m);
	if (env_node && *env_node) {
		node = atoi(env_node);
	} else {
		for (int i = 0; i < m.nnodes && node < 0; i++)
			if (m.nodes[i].cpus == 0)
				node = m.nodes[i].id;
	}
	if (!dax || !*dax)
		dax = m.ndax ? m.dax[0].path : NULL;
	if (dax && access(dax, R_OK | W_OK)) {
		fprintf(stderr, "%s: %s\n", dax, strerror(errno));
		if (strict)
			return 1;
		dax = NULL;
	}
	if (node < 0 && !dax)
		SKIP("no CPU-less NUMA node and no devdax device here "
		     "(scripts/vm-fabric runs this in a VM that has both)");
	if (strict && (node < 0 || !dax)) {
		printf("KVTVM FAIL setup %s\n", node < 0 ? "no CPU-less node" :
		       "no devdax device");
		return 1;
	}
	fabric_geom();
	dram_node = cpu_node();
	if (dram_node < 0)
		dram_node = 0;
	if (node >= 0) {
		/* first, while memory is not yet fragmented */
		if (getuid() == 0)
			numa_hugepages(node, dram_node);
		numa_placement(node, 0);
		numa_placement(node, 1);
		numa_refusals(node);
		{
			char f[32];
			snprintf(f, sizeof(f), "numa=%d", node);
			chain_run(f, node, dram_node, "chain-fabric-numa");
		}
	}
	if (dax) {
		dax_map(dax);
		dax_exclusive(dax);
		dax_xfer(dax);
		chain_run(dax, -1, dram_node, "chain-fabric-dax");
	}
	TEST_DONE();
}
