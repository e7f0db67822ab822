/*
 * devices.c — the owned host tiers as the devices see them.
 *
 * A device's copies and kernels reach host memory only once it is
 * registered with the device (page-locked and mapped): the fabric and
 * dram tiers and the ssd bounce (stage) tier. The cache registers them
 * itself, once per device it serves — at open for the devices named in
 * kvt_cache_config.devices (the daemon's --devices: "page-lock once at
 * start"), else when the first memory of a device is attached:
 *
 *   tier                         registered as
 *   dram, fabric on a NUMA node  PORTABLE (cudaHostRegisterPortable|Mapped)
 *   fabric on devdax (a device   IOMEM (also cudaHostRegisterIoMemory: the
 *   mapping, a PCIe BAR)         GPU's DMA resolves to the device itself,
 *                                as the dedicated-tier design registers it)
 *   fabric file/memfd (emulated) PORTABLE
 *   the ssd stage tier           PORTABLE
 *   ssd                          not memory: reached through the stage
 *
 * A tier already registered (CUDA: opened with 'pin'; or registered by
 * another GPU, since CUDA registration is process-wide and portable) is
 * used as it is and not unregistered by the cache. Registrations end at
 * close, after the transfer engine (whose lanes use them) has stopped
 * and before the tiers unmap.
 *
 * c->mu guards c->devs.
 */
#include "cache/cache_impl.h"
#include "dev/dev.h"

#include <errno.h>
#include <string.h>

/* The tier slots a device sees: fabric, dram, then the stage. */
#define REG_STAGE KVT_TIER_COUNT

static kvt_tier *reg_tier(kvt_cache *c, int k)
{
	if (k == REG_STAGE)
		return c->stage;
	if (k == KVT_TIER_FABRIC || k == KVT_TIER_DRAM)
		return c->tiers[k];
	return NULL;
}

static int register_tier(kvt_cache *c, struct kvti_cache_dev *cd, int k)
{
	kvt_tier *t = reg_tier(c, k);
	kvt_tier_desc td;
	unsigned flags;
	uint64_t t0 = kvt_now_ns();
	char sz[32];
	void *base;
	size_t len;
	int err;

	kvt_tier_info(t, &td);
	base = kvt_tier_bufs(t)[0];
	len = (size_t)kvt_layout_region_bytes(kvt_tier_layout(t));
	flags = td.backing == KVT_BACK_DEVDAX ?
		KVTI_DEV_HOST_IOMEM | KVTI_DEV_HOST_PORTABLE :
		KVTI_DEV_HOST_PORTABLE;
	err = cd->dev->ops->host_register(cd->dev, base, len, flags);
	if (err == -EEXIST) { /* 'pin', or another device did it */
		kvti_errclear();
		cd->done[k] = 1;
		return 0;
	}
	if (err) {
		kvti_errctx("cache: registering the %s tier (%s) with %s",
			    k == REG_STAGE ? "ssd bounce" : td.name,
			    kvt_size_format(len, sz, sizeof(sz)), cd->dev->name);
		return err;
	}
	cd->reg[k] = base;
	cd->done[k] = 1;
	kvti_info("cache: %s tier (%s) registered with %s%s in %.1f ms",
		  k == REG_STAGE ? "ssd bounce" : td.name,
		  kvt_size_format(len, sz, sizeof(sz)), cd->dev->name,
		  flags & KVTI_DEV_HOST_IOMEM ? " as I/O memory" : "",
		  (kvt_now_ns() - t0) / 1e6);
	return 0;
}

int kvti_cache_dev_use(kvt_cache *c, int id)
{
	struct kvti_cache_dev *cd = NULL;
	int err;

	for (int i = 0; i < c->ndevs; i++)
		if (c->devs[i].id == id)
			cd = &c->devs[i];
	if (!cd) {
		if (c->ndevs == KVTI_CACHE_MAX_DEVS)
			return kvti_fail(-ENOSPC, "cache: %d devices served "
					 "already", KVTI_CACHE_MAX_DEVS);
		cd = &c->devs[c->ndevs];
		memset(cd, 0, sizeof(*cd));
		cd->id = id;
		if ((err = kvti_dev_get(id, &cd->dev)))
			return err;
		c->ndevs++;
	}
	/* tiers opened since (the stage) are registered now */
	for (int k = 0; k <= REG_STAGE; k++)
		if (reg_tier(c, k) && !cd->done[k] &&
		    (err = register_tier(c, cd, k)))
			return err;
	return 0;
}

void kvti_cache_dev_release(kvt_cache *c)
{
	for (int i = 0; i < c->ndevs; i++) {
		struct kvti_cache_dev *cd = &c->devs[i];

		for (int k = 0; k <= REG_STAGE; k++)
			if (cd->reg[k])
				cd->dev->ops->host_unregister(cd->dev, cd->reg[k]);
		kvti_dev_put(cd->dev);
	}
	c->ndevs = 0;
}

int kvti_cache_devices_open(kvt_cache *c, const char *list)
{
	char buf[256], *save = NULL;
	int err = 0, id;

	if (!list || !*list)
		return 0;
	if (strlen(list) >= sizeof(buf))
		return kvti_fail(-EINVAL, "cache: devices '%.40s...' too long",
				 list);
	strcpy(buf, list);
	if (c->tiers[KVT_TIER_SSD] && (err = kvti_cache_open_stage(c)))
		return err;
	for (char *d = strtok_r(buf, ", ", &save); d && !err;
	     d = strtok_r(NULL, ", ", &save)) {
		if ((err = kvt_device_parse(d, &id)))
			break;
		if (id < 0) {
			err = kvti_fail(-EINVAL, "cache: devices: 'host' is not "
					"a device");
			break;
		}
		err = kvti_cache_dev_use(c, id);
	}
	if (err)
		kvti_errctx("cache: devices '%s'", list);
	return err;
}
