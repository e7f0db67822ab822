/*
 * tier.c — the tier interface: open/close dispatch, pools, layouts, the
 * plain read/write path.
 *
 * kvt_tier_open() picks the backend by kind and backing, lets it build the
 * backing store, then makes the layout and the pool over the slots it
 * found room for. Failure at any step unwinds what came before, so a
 * failed open leaves no mapping, file or fd behind.
 */
#include "tier/tier_impl.h"
#include "core/cuda.h"
#include "dev/dev.h"
#include "geom/rows.h"

#include <errno.h>
#include <numa.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

static const struct tier_ops *pick_ops(const kvt_tier_spec *s)
{
	switch (s->kind) {
	case KVT_TIER_HBM:
		return s->hostdev ? &kvti_tier_hostdev_ops : &kvti_tier_hbm_ops;
	case KVT_TIER_FABRIC:
		return &kvti_tier_fabric_ops;
	case KVT_TIER_DRAM:
		return &kvti_tier_dram_ops;
	case KVT_TIER_SSD:
		return &kvti_tier_ssd_ops;
	default:
		return NULL;
	}
}

uint64_t kvti_mem_total(void)
{
	long pages = sysconf(_SC_PHYS_PAGES), psz = sysconf(_SC_PAGESIZE);

	return pages > 0 && psz > 0 ? (uint64_t)pages * (uint64_t)psz : 0;
}

int kvti_numa_node_check(int node, int *cpus)
{
	struct bitmask *bm;
	int err;

	if (numa_available() < 0)
		return kvti_fail(KVT_ENODEV, "NUMA is not available on this "
				 "machine (numa=%d)", node);
	if (node > numa_max_node() || numa_node_size64(node, NULL) <= 0)
		return kvti_fail(KVT_ENODEV, "NUMA node %d does not exist or "
				 "has no memory (nodes 0..%d)", node,
				 numa_max_node());
	bm = numa_allocate_cpumask();
	if (!bm)
		return -ENOMEM;
	err = numa_node_to_cpus(node, bm);
	*cpus = err ? 0 : (int)numa_bitmask_weight(bm);
	numa_free_cpumask(bm);
	return 0;
}

int kvti_numa_node_fits(const char *what, int node, uint64_t bytes)
{
	long long avail = 0, total = numa_node_size64(node, &avail);
	char a[32], b[32], c[32];

	if (total > 0 && bytes > (uint64_t)avail)
		return kvti_fail(KVT_ESPEC, "tier spec '%s': NUMA node %d has "
				 "%s free of %s, less than the %s asked "
				 "(memory bound to a node is not taken from "
				 "others)", what, node,
				 kvt_size_format(avail > 0 ? (uint64_t)avail : 0,
						 a, sizeof(a)),
				 kvt_size_format((uint64_t)total, b, sizeof(b)),
				 kvt_size_format(bytes, c, sizeof(c)));
	return 0;
}

int kvti_tier_slots(kvt_tier *t, uint64_t bytes, uint64_t slot_bytes,
		    uint64_t *nslots)
{
	char a[32], b[32];
	uint64_t n = bytes / slot_bytes;

	if (!n)
		return kvti_fail(KVT_ESPEC, "tier spec '%s': %s holds no page "
				 "of %s (%s, %u tokens per page)", t->spec.text,
				 kvt_size_format(bytes, a, sizeof(a)),
				 kvt_size_format(slot_bytes, b, sizeof(b)),
				 t->geom.name, t->geom.page_tokens);
	if (n > KVT_POOL_MAX_SLOTS)
		return kvti_fail(KVT_ESPEC, "tier spec '%s': %llu page slots "
				 "exceed %u; use larger pages", t->spec.text,
				 (unsigned long long)n, KVT_POOL_MAX_SLOTS);
	*nslots = n;
	return 0;
}

int kvt_tier_open(kvt_tier **out, const kvt_tier_spec *spec,
		  const kvt_geom *g)
{
	kvt_tier *t;
	kvt_geom geom = *g;
	int err;

	kvti_errclear();
	if ((err = kvt_geom_finish(&geom)))
		return err;
	if (spec->kind == KVT_TIER_REMOTE)
		return kvti_fail(KVT_ENOTBUILT, "tier spec '%s': the remote tier "
				 "is not built yet", spec->text);
	t = kvt_calloc(1, sizeof(*t));
	if (!t)
		return -ENOMEM;
	t->ops = pick_ops(spec);
	t->spec = *spec;
	t->geom = geom;
	t->fd = -1;
	t->desc.numa_node = -1;
	if (!t->ops) {
		err = kvti_fail(KVT_ESPEC, "tier spec '%s': bad kind", spec->text);
		goto err_free;
	}
	err = t->ops->open(t);
	if (err)
		goto err_free;
	err = kvt_pool_create(&t->pool, t->desc.nslots, t->desc.slot_bytes);
	if (err)
		goto err_close;
	t->desc.kind = spec->kind;
	t->desc.backing = spec->backing;
	t->desc.hostdev = spec->hostdev;
	t->desc.name = spec->hostdev ? "hostdev" : kvt_tier_kind_name(spec->kind);
	t->desc.where = t->where;
	t->desc.note = t->note;
	t->desc.page_bytes = kvt_geom_page_bytes(&geom);
	t->desc.cuda_registered = t->cuda_registered;
	*out = t;
	return 0;

err_close:
	t->ops->close(t);
err_free:
	kvt_free(t->bufs);
	kvt_free(t);
	return err;
}

/* ---- memory someone else owns ---------------------------------------- */

static int wrap_open(kvt_tier *t)
{
	return 0;
}

static void wrap_close(kvt_tier *t)
{
	kvti_dev_put(t->dev);
	t->dev = NULL;
}


static const struct tier_ops wrap_host_ops = {
	.name = "engine", .open = wrap_open, .close = wrap_close,
};
static const struct tier_ops wrap_dev_ops = {
	.name = "engine", .open = wrap_open, .close = wrap_close,
	.read = kvti_tier_dev_read, .write = kvti_tier_dev_write,
};

int kvt_tier_wrap(kvt_tier **out, const kvt_layout *l, void *const *bufs,
		  int device)
{
	kvt_tier *t;
	int err;

	kvti_errclear();
	if (!out || !l || !bufs)
		return kvti_fail(-EINVAL, "tier wrap: NULL argument");
	for (uint32_t i = 0; i < l->nbufs; i++)
		if (!bufs[i])
			return kvti_fail(-EINVAL, "tier wrap: buffer %u is NULL", i);
	if (device >= 0 && !kvti_dev_is_emu(device) && !kvti_cuda_built())
		return kvti_fail(KVT_ENOTBUILT, "engine memory on cuda:%d needs a "
				 "CUDA build", device);
	t = kvt_calloc(1, sizeof(*t));
	if (!t)
		return -ENOMEM;
	/* device memory: hold the device for the plain path's copies */
	if (device >= 0 && (err = kvti_dev_get(device, &t->dev))) {
		kvt_free(t);
		return err;
	}
	t->ops = device >= 0 ? &wrap_dev_ops : &wrap_host_ops;
	t->fd = -1;
	t->geom = l->geom;
	t->layout = *l;
	t->spec.kind = KVT_TIER_HBM;
	t->spec.backing = KVT_BACK_ENGINE;
	t->spec.hostdev = device < 0;
	t->spec.device = device;
	t->spec.numa_node = -1;
	t->spec.layout = l->kind;
	snprintf(t->spec.text, sizeof(t->spec.text), "engine memory");
	t->bufs = kvt_calloc(l->nbufs, sizeof(void *));
	if (!t->bufs) {
		err = -ENOMEM;
		goto fail;
	}
	memcpy(t->bufs, bufs, l->nbufs * sizeof(void *));
	if ((err = kvt_pool_create(&t->pool, l->slots, l->page_bytes)))
		goto fail;
	if (device >= 0)
		snprintf(t->where, sizeof(t->where), "engine memory, %s, %s "
			 "layout", t->dev->name, kvt_layout_name(l->kind));
	else
		snprintf(t->where, sizeof(t->where), "engine memory (host), %s "
			 "layout", kvt_layout_name(l->kind));
	t->desc.kind = KVT_TIER_HBM;
	t->desc.backing = KVT_BACK_ENGINE;
	t->desc.hostdev = device < 0;
	t->desc.emulated = device < 0 || kvti_dev_is_emu(device);
	t->desc.name = device < 0 ? "hostdev" : "hbm";
	t->desc.where = t->where;
	t->desc.note = t->note;
	t->desc.nslots = l->slots;
	t->desc.slot_bytes = l->page_bytes;
	t->desc.page_bytes = l->page_bytes;
	t->desc.bytes = (uint64_t)l->nbufs * l->buf_bytes;
	t->desc.numa_node = -1;
	t->desc.layer_first = 1;
	*out = t;
	return 0;
fail:
	kvti_dev_put(t->dev);
	kvt_free(t->bufs);
	kvt_free(t);
	return err;
}

void kvt_tier_close(kvt_tier *t)
{
	if (!t)
		return;
	t->ops->close(t);
	kvt_pool_destroy(t->pool);
	kvt_free(t->bufs);
	kvt_free(t);
}

void kvt_tier_info(const kvt_tier *t, kvt_tier_desc *d)
{
	*d = t->desc;
}

kvt_pool *kvt_tier_pool(kvt_tier *t)
{
	return t->pool;
}

kvt_tier_kind kvt_tier_kind_of(const kvt_tier *t)
{
	return t->spec.kind;
}

const kvt_geom *kvt_tier_geom(const kvt_tier *t)
{
	return &t->geom;
}

const kvt_layout *kvt_tier_layout(const kvt_tier *t)
{
	return &t->layout;
}

void *const *kvt_tier_bufs(const kvt_tier *t)
{
	return t->bufs;
}

void *kvt_tier_slot_ptr(const kvt_tier *t, uint32_t slot)
{
	if (!t->bufs || t->layout.kind != KVT_LAYOUT_PAGE_FIRST ||
	    slot >= t->layout.slots)
		return NULL;
	return (char *)t->bufs[0] + (uint64_t)slot * t->layout.page_bytes;
}

/* Default plain path for mapped host memory: page-first is one memcpy,
 * layer-first a gather/scatter of L*kv chunks. */
static void chunks_copy(kvt_tier *t, uint32_t slot, void *page, int to_page)
{
	const kvt_layout *l = &t->layout;
	char *p = page;
	for (uint32_t layer = 0; layer < l->geom.layers; layer++)
		for (uint32_t kv = 0; kv < l->kv; kv++) {
			kvt_chunk_loc c = kvt_layout_chunk(l, slot, layer, kv);
			char *chunk = (char *)t->bufs[c.buf] + c.off;

			kvti_chunk_pack(l, chunk, p, to_page);
			p += l->chunk_bytes;
		}
}

int kvt_tier_read(kvt_tier *t, uint32_t slot, void *buf)
{
	if (slot >= t->desc.nslots)
		return kvti_fail(-ERANGE, "%s: slot %u of %llu", t->desc.name,
				 slot, (unsigned long long)t->desc.nslots);
	if (t->ops->read)
		return t->ops->read(t, slot, buf);
	chunks_copy(t, slot, buf, 1);
	return 0;
}

int kvt_tier_write(kvt_tier *t, uint32_t slot, const void *buf)
{
	if (slot >= t->desc.nslots)
		return kvti_fail(-ERANGE, "%s: slot %u of %llu", t->desc.name,
				 slot, (unsigned long long)t->desc.nslots);
	if (t->ops->write)
		return t->ops->write(t, slot, buf);
	chunks_copy(t, slot, (void *)buf, 0);
	return 0;
}
