/*
 * probe.c — what this machine offers kvtier: memory, NUMA nodes (and which
 * are CPU-less), devdax devices, hugepages, CUDA devices, io_uring.
 * Everything is read from /proc, /sys, libnuma, the CUDA runtime and one
 * trial io_uring; what cannot be read is reported absent, never fatal.
 */
#include "tier/tier_impl.h"
#include "core/cuda.h"

#include <dirent.h>
#include <liburing.h>
#include <numa.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static uint64_t meminfo(const char *text, const char *key)
{
	const char *p = strstr(text, key);
	return p ? strtoull(p + strlen(key), NULL, 10) * 1024 : 0;
}

static void probe_numa(kvt_machine *m)
{
	struct bitmask *bm;

	m->numa_available = numa_available() >= 0;
	if (!m->numa_available)
		return;
	bm = numa_allocate_cpumask();
	for (int n = 0; n <= numa_max_node() && m->nnodes < KVT_MAX_NODES; n++) {
		long long fr = 0, sz = numa_node_size64(n, &fr);
		int i = m->nnodes;

		if (sz <= 0)
			continue;
		m->nodes[i].id = n;
		m->nodes[i].mem_total = (uint64_t)sz;
		m->nodes[i].mem_free = fr > 0 ? (uint64_t)fr : 0;
		m->nodes[i].cpus = bm && !numa_node_to_cpus(n, bm) ?
					   (int)numa_bitmask_weight(bm) : 0;
		m->nnodes++;
	}
	if (bm)
		numa_free_cpumask(bm);
}

static void probe_dax(kvt_machine *m)
{
	DIR *d = opendir("/sys/bus/dax/devices");
	struct dirent *e;

	if (!d)
		return;
	while ((e = readdir(d)) && m->ndax < KVT_MAX_DAX) {
		char p[300], drv[256];
		const char *base;
		uint64_t node;
		ssize_t n;
		int i = m->ndax;

		if (strncmp(e->d_name, "dax", 3))
			continue;
		snprintf(m->dax[i].path, sizeof(m->dax[i].path), "/dev/%.50s",
			 e->d_name);
		snprintf(p, sizeof(p), "/sys/bus/dax/devices/%s/size", e->d_name);
		kvti_read_u64(p, &m->dax[i].size);
		snprintf(p, sizeof(p), "/sys/bus/dax/devices/%s/align", e->d_name);
		kvti_read_u64(p, &m->dax[i].align);
		snprintf(p, sizeof(p), "/sys/bus/dax/devices/%s/target_node",
			 e->d_name);
		m->dax[i].target_node = kvti_read_u64(p, &node) ? -1 : (int)node;
		snprintf(p, sizeof(p), "/sys/bus/dax/devices/%s/driver", e->d_name);
		n = readlink(p, drv, sizeof(drv) - 1);
		drv[n > 0 ? n : 0] = '\0';
		base = strrchr(drv, '/') ? strrchr(drv, '/') + 1 : drv;
		snprintf(m->dax[i].mode, sizeof(m->dax[i].mode), "%s",
			 !strcmp(base, "device_dax") ? "devdax" :
			 !strcmp(base, "kmem") ? "system-ram" : base);
		m->ndax++;
	}
	closedir(d);
}

static void probe_huge(kvt_machine *m, const char *mi)
{
	char p[128], *thp, *a, *b;

	m->hugepage_bytes = meminfo(mi, "Hugepagesize:");
	if (m->hugepage_bytes) {
		snprintf(p, sizeof(p),
			 "/sys/kernel/mm/hugepages/hugepages-%llukB/",
			 (unsigned long long)(m->hugepage_bytes / 1024));
		strcat(p, "nr_hugepages");
		kvti_read_u64(p, &m->hugepages_total);
		strcpy(strrchr(p, '/') + 1, "free_hugepages");
		kvti_read_u64(p, &m->hugepages_free);
	}
	snprintf(m->thp, sizeof(m->thp), "unknown");
	if (!kvti_read_file("/sys/kernel/mm/transparent_hugepage/enabled",
			    4096, &thp, NULL)) {
		a = strchr(thp, '[');
		b = a ? strchr(a, ']') : NULL;
		if (a && b)
			snprintf(m->thp, sizeof(m->thp), "%.*s", (int)(b - a - 1),
				 a + 1);
		kvt_free(thp);
	}
}

static void probe_cuda(kvt_machine *m)
{
	m->cuda_built = kvti_cuda_built();
	kvti_cuda_device_count(&m->ngpus, m->cuda_note, sizeof(m->cuda_note));
	if (m->ngpus > KVT_MAX_GPUS)
		m->ngpus = KVT_MAX_GPUS;
	for (int i = 0; i < m->ngpus; i++) {
		size_t mem = 0;
		kvti_cuda_device_info(i, m->gpus[i].name, sizeof(m->gpus[i].name),
				      &mem, &m->gpus[i].cc_major,
				      &m->gpus[i].cc_minor);
		m->gpus[i].mem = mem;
	}
}

static void probe_uring(kvt_machine *m)
{
	struct io_uring ring;
	int err = io_uring_queue_init(4, &ring, 0);

	if (err < 0) {
		snprintf(m->io_uring_note, sizeof(m->io_uring_note),
			 "io_uring_queue_init: %s", strerror(-err));
		return;
	}
	m->io_uring = 1;
	io_uring_queue_exit(&ring);
}

void kvt_probe(kvt_machine *m)
{
	char *mi = NULL;

	memset(m, 0, sizeof(*m));
	m->cpus = (int)sysconf(_SC_NPROCESSORS_ONLN);
	m->mem_total = kvti_mem_total();
	if (!kvti_read_file("/proc/meminfo", 1 << 16, &mi, NULL)) {
		m->mem_available = meminfo(mi, "MemAvailable:");
		probe_huge(m, mi);
		kvt_free(mi);
	}
	probe_numa(m);
	probe_dax(m);
	probe_cuda(m);
	probe_uring(m);
}
