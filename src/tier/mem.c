/*
 * mem.c — memory tier backends: dram, fabric, hostdev and hbm.
 *
 *   dram     anonymous mmap; hugepages (explicit when reserved, else THP
 *            advice), NUMA binding (mbind), mlock, populate, CUDA pinning.
 *   fabric   the dedicated tier, from one of:
 *              devdax  /dev/daxX.Y, size and alignment from sysfs, MAP_SHARED
 *              numa    a CPU-less NUMA node (CXL memory onlined as RAM):
 *                      anonymous memory bound there; a node with CPUs is
 *                      refused unless allow-cpus, then labelled emulated
 *              file    a shared file mapping: EMULATED
 *              memfd   a memfd: EMULATED (shareable by fd with clients)
 *   hostdev  host memory holding pages layer-first, standing in for HBM
 *   hbm      a layer-first pool in device memory: a GPU's (cudaMalloc, CUDA
 *            builds with a GPU) or the emulated device's (device=emu:N)
 *
 * All host mappings go through kvti_mmap() (fault injection) and every
 * failure unwinds to nothing: mem_unmap() is safe on a half-built tier.
 */
#include "tier/tier_impl.h"
#include "core/cuda.h"
#include "dev/dev.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <numaif.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23
#endif

/* ---- hugepages ------------------------------------------------------ */

/* Default hugepage size and how many are free: on NUMA node @node when
 * the memory will be bound there (a bound fault takes only that node's
 * pages: SIGBUS if it has none), else machine-wide. */
static void hugepage_state(int node, uint64_t *size, uint64_t *nfree)
{
	char path[128];
	char *text, *p;

	*size = 0;
	*nfree = 0;
	if (kvti_read_file("/proc/meminfo", 1 << 16, &text, NULL))
		return;
	p = strstr(text, "Hugepagesize:");
	if (p)
		*size = strtoull(p + 13, NULL, 10) * 1024;
	kvt_free(text);
	if (!*size)
		return;
	if (node >= 0)
		snprintf(path, sizeof(path), "/sys/devices/system/node/node%d/"
			 "hugepages/hugepages-%llukB/free_hugepages", node,
			 (unsigned long long)(*size / 1024));
	else
		snprintf(path, sizeof(path),
			 "/sys/kernel/mm/hugepages/hugepages-%llukB/free_hugepages",
			 (unsigned long long)(*size / 1024));
	if (kvti_read_u64(path, nfree))
		*nfree = 0;
}

static void note_add(kvt_tier *t, const char *fmt, ...)
	__attribute__((format(printf, 2, 3)));
static void note_add(kvt_tier *t, const char *fmt, ...)
{
	size_t l = strlen(t->note);
	va_list ap;

	if (l && l + 2 < sizeof(t->note)) {
		strcpy(t->note + l, "; ");
		l += 2;
	}
	va_start(ap, fmt);
	vsnprintf(t->note + l, sizeof(t->note) - l, fmt, ap);
	va_end(ap);
}

/* ---- common: map, bind, lock, pin ------------------------------------ */

static void mem_unmap(kvt_tier *t)
{
	if (t->cuda_registered)
		kvti_cuda_host_unregister(t->base);
	t->cuda_registered = 0;
	if (t->base && t->map_len)
		munmap(t->base, t->map_len);
	t->base = NULL;
	t->map_len = 0;
	if (t->fd >= 0)
		close(t->fd);
	t->fd = -1;
	if (t->created_file && t->spec.path[0])
		unlink(t->spec.path);
	t->created_file = 0;
}

/* After the mapping exists: NUMA binding (anonymous only), mlock,
 * populate, CUDA registration. */
static int mem_finish_mapping(kvt_tier *t, int anon)
{
	const kvt_tier_spec *s = &t->spec;
	char sz[32];

	if (anon && s->numa_node >= 0) {
		unsigned long mask[KVT_MAX_NODES / (8 * sizeof(long)) + 1] = { 0 };

		mask[s->numa_node / (8 * sizeof(long))] |=
			1ul << (s->numa_node % (8 * sizeof(long)));
		if (mbind(t->base, t->map_len, MPOL_BIND, mask,
			  sizeof(mask) * 8, MPOL_MF_STRICT) < 0)
			return kvti_fail(-errno, "tier spec '%s': binding to NUMA "
					 "node %d: %s", s->text, s->numa_node,
					 strerror(errno));
		t->desc.numa_node = s->numa_node;
	}
	if (s->mlock) {
		if (mlock(t->base, t->map_len) < 0)
			return kvti_fail(-errno, "tier spec '%s': mlock of %s: %s "
					 "(raise the limit: ulimit -l)", s->text,
					 kvt_size_format(t->map_len, sz, sizeof(sz)),
					 strerror(errno));
		t->desc.locked = 1;
	} else if (s->populate) {
		if (madvise(t->base, t->map_len, MADV_POPULATE_WRITE) < 0) {
			long ps = sysconf(_SC_PAGESIZE);
			for (size_t o = 0; o < t->map_len; o += (size_t)ps)
				((volatile char *)t->base)[o] = 0;
		}
	}
	if (s->pin) {
		int err = kvti_cuda_host_register(t->base, t->map_len);
		if (err) {
			kvti_errctx("tier spec '%s': pin", s->text);
			return err;
		}
		t->cuda_registered = 1;
	}
	return 0;
}

/* Anonymous memory of at least @len bytes, hugepages per the spec. */
static int mem_map_anon(kvt_tier *t, size_t len)
{
	const kvt_tier_spec *s = &t->spec;
	uint64_t hp, hfree, hlen;
	int huge = s->huge;
	void *p;

	hugepage_state(s->numa_node, &hp, &hfree);
	hlen = hp ? KVT_ALIGN_UP(len, hp) : len;
	if (huge == KVT_HUGE_AUTO)
		huge = hp && hfree * hp >= hlen ? KVT_HUGE_EXPLICIT : KVT_HUGE_THP;
	if (huge == KVT_HUGE_EXPLICIT) {
		if (!hp || hfree * hp < hlen) {
			if (s->huge == KVT_HUGE_EXPLICIT)
				return kvti_fail(KVT_ESPEC, "tier spec '%s': "
						 "explicit hugepages asked for, "
						 "but %llu of %llu needed %llu kB "
						 "pages are free%s (vm.nr_hugepages%s);"
						 " drop 'hugepages' to use "
						 "transparent hugepages", s->text,
						 (unsigned long long)hfree,
						 (unsigned long long)(hp ? hlen / hp : 0),
						 (unsigned long long)(hp / 1024),
						 s->numa_node >= 0 ? " on the node" : "",
						 s->numa_node >= 0 ? ", per node under "
						 "/sys/devices/system/node" : "");
			huge = KVT_HUGE_THP;
		} else {
			p = kvti_mmap(NULL, hlen, PROT_READ | PROT_WRITE,
				      MAP_PRIVATE | MAP_ANONYMOUS | MAP_HUGETLB,
				      -1, 0);
			if (p != MAP_FAILED) {
				t->base = p;
				t->map_len = hlen;
				t->desc.huge = KVT_HUGE_EXPLICIT;
				return 0;
			}
			if (s->huge == KVT_HUGE_EXPLICIT)
				return kvti_fail(-errno, "tier spec '%s': "
						 "MAP_HUGETLB: %s", s->text,
						 strerror(errno));
			note_add(t, "explicit hugepages failed (%s): THP advice",
				 strerror(errno));
			huge = KVT_HUGE_THP;
		}
	}
	p = kvti_mmap(NULL, len, PROT_READ | PROT_WRITE,
		      MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
	if (p == MAP_FAILED)
		return kvti_fail(-errno, "tier spec '%s': mmap of %zu bytes: %s",
				 s->text, len, strerror(errno));
	t->base = p;
	t->map_len = len;
	if (huge == KVT_HUGE_THP && madvise(p, len, MADV_HUGEPAGE) < 0) {
		note_add(t, "MADV_HUGEPAGE refused (%s)", strerror(errno));
		huge = KVT_HUGE_NONE;
	}
	t->desc.huge = huge;
	return 0;
}

static int mem_check_ram(kvt_tier *t, uint64_t bytes)
{
	uint64_t total = kvti_mem_total();
	char a[32], b[32];

	if (total && bytes > total)
		return kvti_fail(KVT_ESPEC, "tier spec '%s': %s is more than "
				 "this machine's %s of memory", t->spec.text,
				 kvt_size_format(bytes, a, sizeof(a)),
				 kvt_size_format(total, b, sizeof(b)));
	return 0;
}

/* Page-first host tier over [base, base + nslots*page). */
static int mem_page_first(kvt_tier *t, uint64_t nslots)
{
	int err = kvt_layout_init(&t->layout, KVT_LAYOUT_PAGE_FIRST, &t->geom,
				  nslots);
	if (err)
		return err;
	t->bufs = kvt_malloc(sizeof(void *));
	if (!t->bufs)
		return -ENOMEM;
	t->bufs[0] = t->base;
	t->desc.nslots = nslots;
	t->desc.slot_bytes = t->layout.page_bytes;
	t->desc.bytes = t->map_len;
	return 0;
}

/* ---- dram ------------------------------------------------------------- */

static int dram_open(kvt_tier *t)
{
	uint64_t page = kvt_geom_page_bytes(&t->geom), nslots;
	int cpus, err;

	if ((err = kvti_tier_slots(t, t->spec.bytes, page, &nslots)) ||
	    (err = mem_check_ram(t, t->spec.bytes)))
		return err;
	if (t->spec.numa_node >= 0) {
		if ((err = kvti_numa_node_check(t->spec.numa_node, &cpus))) {
			kvti_errctx("tier spec '%s'", t->spec.text);
			return err;
		}
		snprintf(t->where, sizeof(t->where), "node %d",
			 t->spec.numa_node);
	}
	if ((err = mem_map_anon(t, nslots * page)) ||
	    (err = mem_finish_mapping(t, 1)) ||
	    (err = mem_page_first(t, nslots))) {
		mem_unmap(t);
		return err;
	}
	return 0;
}

static void mem_close(kvt_tier *t)
{
	mem_unmap(t);
}

const struct tier_ops kvti_tier_dram_ops = {
	.name = "dram",
	.open = dram_open,
	.close = mem_close,
};

/* ---- fabric ----------------------------------------------------------- */

/* Is @path a devdax character device? Fills size and alignment. */
static int devdax_probe(const char *path, uint64_t *size, uint64_t *align)
{
	char sys[128], link[256];
	struct stat st;
	ssize_t n;

	if (stat(path, &st) < 0)
		return kvti_fail(-errno, "%s: %s", path, strerror(errno));
	if (!S_ISCHR(st.st_mode))
		return kvti_fail(KVT_ESPEC, "%s is not a devdax device (not a "
				 "character device)", path);
	snprintf(sys, sizeof(sys), "/sys/dev/char/%u:%u/subsystem",
		 major(st.st_rdev), minor(st.st_rdev));
	n = readlink(sys, link, sizeof(link) - 1);
	if (n < 0)
		return kvti_fail(KVT_ESPEC, "%s is not a devdax device (no %s)",
				 path, sys);
	link[n] = '\0';
	if (!strstr(link, "/dax"))
		return kvti_fail(KVT_ESPEC, "%s is not a devdax device (its "
				 "subsystem is %s)", path,
				 strrchr(link, '/') ? strrchr(link, '/') + 1 : link);
	snprintf(sys, sizeof(sys), "/sys/dev/char/%u:%u/size",
		 major(st.st_rdev), minor(st.st_rdev));
	if (kvti_read_u64(sys, size) || !*size)
		return kvti_fail(KVT_ESPEC, "%s: cannot read its size from %s",
				 path, sys);
	snprintf(sys, sizeof(sys), "/sys/dev/char/%u:%u/align",
		 major(st.st_rdev), minor(st.st_rdev));
	if (kvti_read_u64(sys, align) || !*align)
		*align = 2u << 20;
	return 0;
}

static int fabric_devdax(kvt_tier *t, uint64_t page)
{
	uint64_t size, align, len, nslots;
	int err;
	void *p;

	if ((err = devdax_probe(t->spec.path, &size, &align)))
		goto fail;
	len = t->spec.bytes ? t->spec.bytes : size;
	if (len > size) {
		char a[32], b[32];
		err = kvti_fail(KVT_ESPEC, "%s holds %s, less than the %s asked",
				t->spec.path, kvt_size_format(size, a, sizeof(a)),
				kvt_size_format(len, b, sizeof(b)));
		goto fail;
	}
	if ((err = kvti_tier_slots(t, len, page, &nslots)))
		return err;
	len = KVT_ALIGN_UP(nslots * page, align);
	if (len > size)
		len = size / align * align; /* whole slots fit below it */
	t->fd = open(t->spec.path, O_RDWR | O_CLOEXEC);
	if (t->fd < 0) {
		err = kvti_fail(-errno, "%s: %s%s", t->spec.path, strerror(errno),
				errno == ENXIO ? " (no device behind it: onlined "
				"as system-ram? see kvtier info)" : "");
		goto fail;
	}
	/* one owner per device: a second tier over the same bytes would
	 * silently overwrite the first one's pages */
	if (flock(t->fd, LOCK_EX | LOCK_NB) < 0) {
		err = kvti_fail(errno == EWOULDBLOCK ? KVT_EBUSY : -errno,
				"%s is already in use by another fabric tier "
				"(one tier per device; engines share it through "
				"one process)", t->spec.path);
		goto fail;
	}
	p = kvti_mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, t->fd, 0);
	if (p == MAP_FAILED) {
		err = kvti_fail(-errno, "mmap of %s: %s", t->spec.path,
				strerror(errno));
		goto fail;
	}
	t->base = p;
	t->map_len = len;
	nslots = KVT_MIN(nslots, len / page);
	kvti_strlcpy(t->where, t->spec.path, sizeof(t->where));
	if ((err = mem_finish_mapping(t, 0)) ||
	    (err = mem_page_first(t, nslots)))
		goto fail;
	return 0;
fail:
	mem_unmap(t);
	if (err != -ENOMEM)
		kvti_errctx("tier spec '%s'", t->spec.text);
	return err;
}

static int fabric_numa(kvt_tier *t, uint64_t page)
{
	uint64_t nslots;
	int cpus, err;

	if ((err = kvti_tier_slots(t, t->spec.bytes, page, &nslots)))
		return err;
	if ((err = kvti_numa_node_check(t->spec.numa_node, &cpus))) {
		kvti_errctx("tier spec '%s'", t->spec.text);
		return err;
	}
	if (cpus > 0 && !t->spec.allow_cpus)
		return kvti_fail(KVT_ESPEC, "tier spec '%s': NUMA node %d has %d "
				 "CPUs, so it is not dedicated (CXL) memory; add "
				 "allow-cpus to use it anyway (it will be "
				 "labelled emulated)", t->spec.text,
				 t->spec.numa_node, cpus);
	if ((err = kvti_numa_node_fits(t->spec.text, t->spec.numa_node,
				       nslots * page)))
		return err;
	if (cpus > 0) {
		t->desc.emulated = 1;
		note_add(t, "NUMA node %d has %d CPUs: emulation on ordinary "
			 "memory", t->spec.numa_node, cpus);
	}
	snprintf(t->where, sizeof(t->where), "node %d", t->spec.numa_node);
	if ((err = mem_map_anon(t, nslots * page)) ||
	    (err = mem_finish_mapping(t, 1)) ||
	    (err = mem_page_first(t, nslots))) {
		mem_unmap(t);
		return err;
	}
	return 0;
}

/* Reserve @len bytes of @fd, with a clear message when the space is not
 * there. */
static int reserve_space(kvt_tier *t, int fd, uint64_t len, const char *what)
{
	char a[32], b[32];
	struct statvfs vfs;
	int e;

	/* a memfd's filesystem reports no size: posix_fallocate decides */
	if (t->spec.backing == KVT_BACK_FILE && fstatvfs(fd, &vfs) == 0 &&
	    (uint64_t)vfs.f_bavail * vfs.f_frsize < len) {
		struct stat st;
		if (fstat(fd, &st) < 0 || (uint64_t)st.st_blocks * 512 < len)
			return kvti_fail(-ENOSPC, "tier spec '%s': %s needs %s but "
					 "only %s is free", t->spec.text, what,
					 kvt_size_format(len, a, sizeof(a)),
					 kvt_size_format((uint64_t)vfs.f_bavail *
							 vfs.f_frsize, b,
							 sizeof(b)));
	}
	/* a signal (a timer, a profiler) stops a long fallocate: go on */
	do
		e = kvti_fault() ? ENOSPC : posix_fallocate(fd, 0, (off_t)len);
	while (e == EINTR);
	if (e)
		return kvti_fail(-e, "tier spec '%s': reserving %s for %s: %s",
				 t->spec.text, kvt_size_format(len, a, sizeof(a)),
				 what, strerror(e));
	return 0;
}

static int fabric_file(kvt_tier *t, uint64_t page, int memfd)
{
	uint64_t nslots, len;
	struct stat st;
	int err;
	void *p;

	if ((err = kvti_tier_slots(t, t->spec.bytes, page, &nslots)))
		return err;
	len = nslots * page;
	if (memfd) {
		if ((err = mem_check_ram(t, len)))
			return err;
		t->fd = memfd_create("kvtier-fabric", MFD_CLOEXEC);
		if (t->fd < 0)
			return kvti_fail(-errno, "memfd_create: %s",
					 strerror(errno));
		kvti_strlcpy(t->where, "memfd", sizeof(t->where));
		note_add(t, "a memfd stands in for fabric memory");
	} else {
		t->fd = open(t->spec.path, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC,
			     0600);
		if (t->fd >= 0) {
			t->created_file = 1;
		} else if (errno == EEXIST) {
			t->fd = open(t->spec.path, O_RDWR | O_CLOEXEC);
		}
		if (t->fd < 0) {
			err = kvti_fail(errno == EISDIR ? KVT_ESPEC : -errno,
					"tier spec '%s': %s: %s", t->spec.text,
					t->spec.path, strerror(errno));
			goto fail;
		}
		if (fstat(t->fd, &st) < 0 || !S_ISREG(st.st_mode)) {
			err = kvti_fail(KVT_ESPEC, "tier spec '%s': %s is not a "
					"regular file", t->spec.text,
					t->spec.path);
			goto fail;
		}
		kvti_strlcpy(t->where, t->spec.path, sizeof(t->where));
		note_add(t, "a file stands in for fabric memory");
	}
	t->desc.emulated = 1;
	if ((err = reserve_space(t, t->fd, len, memfd ? "memfd" : t->spec.path)))
		goto fail;
	p = kvti_mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, t->fd, 0);
	if (p == MAP_FAILED) {
		err = kvti_fail(-errno, "tier spec '%s': mmap: %s", t->spec.text,
				strerror(errno));
		goto fail;
	}
	t->base = p;
	t->map_len = len;
	t->desc.huge = KVT_HUGE_NONE;
	if ((err = mem_finish_mapping(t, 0)) ||
	    (err = mem_page_first(t, nslots)))
		goto fail;
	return 0;
fail:
	mem_unmap(t);
	return err;
}

static int fabric_open(kvt_tier *t)
{
	uint64_t page = kvt_geom_page_bytes(&t->geom);

	switch (t->spec.backing) {
	case KVT_BACK_DEVDAX:
		return fabric_devdax(t, page);
	case KVT_BACK_NUMA:
		return fabric_numa(t, page);
	case KVT_BACK_FILE:
		return fabric_file(t, page, 0);
	case KVT_BACK_MEMFD:
		return fabric_file(t, page, 1);
	default:
		return kvti_fail(KVT_ESPEC, "tier spec '%s': fabric needs a "
				 "backing", t->spec.text);
	}
}

static void fabric_close(kvt_tier *t)
{
	if (!t->spec.temp)
		t->created_file = 0; /* keep the file */
	else
		t->created_file = 1;
	mem_unmap(t);
}

const struct tier_ops kvti_tier_fabric_ops = {
	.name = "fabric",
	.open = fabric_open,
	.close = fabric_close,
};

/* ---- hostdev and hbm: layer-first pools ------------------------------- */

static int layer_first_layout(kvt_tier *t, uint64_t *nslots)
{
	uint64_t page = kvt_geom_page_bytes(&t->geom);
	int err;

	if ((err = kvti_tier_slots(t, t->spec.bytes, page, nslots)))
		return err;
	err = kvt_layout_init(&t->layout, (kvt_layout_kind)t->spec.layout,
			      &t->geom, *nslots);
	if (err)
		return err;
	t->bufs = kvt_calloc(t->layout.nbufs, sizeof(void *));
	if (!t->bufs)
		return -ENOMEM;
	t->desc.nslots = *nslots;
	t->desc.slot_bytes = page;
	t->desc.layer_first = 1;
	return 0;
}

static int hostdev_open(kvt_tier *t)
{
	uint64_t nslots;
	int err;

	if ((err = layer_first_layout(t, &nslots)) ||
	    (err = mem_check_ram(t, t->spec.bytes)) ||
	    (err = mem_map_anon(t, kvt_layout_region_bytes(&t->layout))) ||
	    (err = mem_finish_mapping(t, 1)))
		goto fail;
	kvt_layout_bufs_carve(&t->layout, t->base, t->bufs);
	t->desc.bytes = t->map_len;
	t->desc.emulated = 1;
	snprintf(t->where, sizeof(t->where), "host memory, %s layout",
		 kvt_layout_name(t->layout.kind));
	note_add(t, "host memory stands in for GPU HBM");
	return 0;
fail:
	mem_unmap(t);
	return err;
}

const struct tier_ops kvti_tier_hostdev_ops = {
	.name = "hostdev",
	.open = hostdev_open,
	.close = mem_close,
};

static int hbm_open(kvt_tier *t)
{
	uint64_t nslots;
	char dn[16];
	void *p = NULL;
	int err;

	if (!kvti_dev_is_emu(t->spec.device) && !kvti_cuda_built())
		return kvti_fail(KVT_ENOTBUILT, "tier spec '%s': hbm needs a CUDA "
				 "build and a GPU; use hostdev:SIZE for the host "
				 "stand-in, or device=emu for the emulated device",
				 t->spec.text);
	if ((err = layer_first_layout(t, &nslots)))
		return err;
	if (!kvti_dev_is_emu(t->spec.device) && kvti_fault())
		return -ENOMEM;
	if ((err = kvti_dev_get(t->spec.device, &t->dev)) ||
	    (err = t->dev->ops->alloc(t->dev,
				      kvt_layout_region_bytes(&t->layout), &p))) {
		kvti_dev_put(t->dev);
		t->dev = NULL;
		kvti_errctx("tier spec '%s'", t->spec.text);
		return err;
	}
	t->base = p;
	kvt_layout_bufs_carve(&t->layout, t->base, t->bufs);
	t->desc.bytes = kvt_layout_region_bytes(&t->layout);
	t->desc.emulated = kvti_dev_is_emu(t->spec.device);
	snprintf(t->where, sizeof(t->where), "%s, %s layout",
		 kvt_device_format(t->spec.device, dn, sizeof(dn)),
		 kvt_layout_name(t->layout.kind));
	if (t->desc.emulated)
		note_add(t, "the emulated device's memory stands in for GPU "
			 "HBM");
	return 0;
}

static void hbm_close(kvt_tier *t)
{
	if (t->base)
		t->dev->ops->free(t->dev, t->base);
	t->base = NULL;
	kvti_dev_put(t->dev);
	t->dev = NULL;
}

/* The plain path of device memory: one synchronous copy per chunk. */
static int hbm_copy(kvt_tier *t, uint32_t slot, void *page, int to_page)
{
	const kvt_layout *l = &t->layout;
	char *p = page;
	int err;

	for (uint32_t layer = 0; layer < l->geom.layers; layer++)
		for (uint32_t kv = 0; kv < l->kv; kv++) {
			kvt_chunk_loc c = kvt_layout_chunk(l, slot, layer, kv);
			char *chunk = (char *)t->bufs[c.buf] + c.off;

			err = to_page ? kvti_dev_copy_sync(t->dev, p, chunk,
							   l->chunk_bytes) :
					kvti_dev_copy_sync(t->dev, chunk, p,
							   l->chunk_bytes);
			if (err)
				return err;
			p += l->chunk_bytes;
		}
	return 0;
}

int kvti_tier_dev_read(kvt_tier *t, uint32_t slot, void *buf)
{
	return hbm_copy(t, slot, buf, 1);
}

int kvti_tier_dev_write(kvt_tier *t, uint32_t slot, const void *buf)
{
	return hbm_copy(t, slot, (void *)buf, 0);
}

const struct tier_ops kvti_tier_hbm_ops = {
	.name = "hbm",
	.open = hbm_open,
	.close = hbm_close,
	.read = kvti_tier_dev_read,
	.write = kvti_tier_dev_write,
};
