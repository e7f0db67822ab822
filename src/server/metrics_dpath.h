/*
 * metrics_dpath.h — the data path's metrics (metrics_dpath.c): a snapshot
 * the metrics registry takes with its others, rendered as Prometheus text
 * and as the STATS JSON's "datapath" and "devices" (docs/METRICS.md).
 */
#ifndef KVT_SERVER_METRICS_DPATH_H
#define KVT_SERVER_METRICS_DPATH_H

#include <kvtier.h>
#include <kvtier/cache.h>
#include <kvtier/dev.h>

#include <cjson/cJSON.h>

#define KVTD_DPATH_MAX_DEVS 8

struct kvtd_dpath {
	int present;             /* a cache to read */
	kvt_xfer_stat xs;
	int ndev;
	int id[KVTD_DPATH_MAX_DEVS];
	kvt_dev_stat dev[KVTD_DPATH_MAX_DEVS];
};

static inline int kvti_dev_id_is_emu(int id)
{
	return id >= KVT_DEVICE_EMU && id < KVT_DEVICE_EMU + KVT_DEVICE_EMU_MAX;
}

/* Read the counters of @c's transfer engine (NULL: none). */
void kvtd_dpath_snap(kvt_cache *c, struct kvtd_dpath *dp);
/* The text families, kvt_malloc'ed into *@out (NULL when nothing). */
int kvtd_dpath_text(const struct kvtd_dpath *dp, char **out);
/* "datapath" and "devices" into @root. 0 or -ENOMEM. */
int kvtd_dpath_json(const struct kvtd_dpath *dp, cJSON *root);

#endif
