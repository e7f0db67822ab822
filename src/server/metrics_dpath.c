/*
 * metrics_dpath.c — the data path's metrics: who moved the bytes (the
 * CPU, storage, a device's copy engines, a device kernel) and where to
 * (restore: into engine memory; save: out of it; tier: between the
 * daemon's tiers), who hashed them, what each device did. Read from the
 * cache's transfer engine (kvt_xfer_stat_get(), kvt_xfer_devices(): relaxed
 * counters, safe from the render thread) in the metrics snapshot, and
 * written into the Prometheus text and the STATS JSON (docs/METRICS.md
 * "Data path").
 *
 * The headline: kvtier_restore_cpu_copy_bytes_total, the bytes a CPU
 * thread copied into engine memory — 0 when the engines' KV is device
 * memory (the daemon DMAs from its page-locked tiers). On the emulated
 * device the device's bytes are CPU copies made by its stream threads:
 * kvtier_device_info{emulated="1"} says so.
 */
#include "server/metrics_dpath.h"
#include "core/core.h"

#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

void kvtd_dpath_snap(kvt_cache *c, struct kvtd_dpath *dp)
{
	kvt_xfer *x = c ? kvt_cache_xfer(c) : NULL;

	memset(dp, 0, sizeof(*dp));
	if (!x)
		return;
	dp->present = 1;
	kvt_xfer_stat_get(x, &dp->xs);
	dp->ndev = kvt_xfer_devices(x, dp->id, dp->dev, KVTD_DPATH_MAX_DEVS);
	if (dp->ndev > KVTD_DPATH_MAX_DEVS)
		dp->ndev = KVTD_DPATH_MAX_DEVS;
}

/* Append to a kvt_malloc'ed text (the render's, or a fresh one). */
struct txt {
	char *p;
	size_t len, cap;
	int err;
};

static void tput(struct txt *t, const char *fmt, ...)
	__attribute__((format(printf, 2, 3)));
static void tput(struct txt *t, const char *fmt, ...)
{
	va_list ap;
	int n;

	for (;;) {
		if (t->err)
			return;
		va_start(ap, fmt);
		n = vsnprintf(t->p ? t->p + t->len : NULL,
			      t->p ? t->cap - t->len : 0, fmt, ap);
		va_end(ap);
		if (n < 0) {
			t->err = -EINVAL;
			return;
		}
		if (t->p && t->len + (size_t)n < t->cap) {
			t->len += (size_t)n;
			return;
		}
		if (kvti_grow((void **)&t->p, &t->cap, t->len + (size_t)n + 1,
			      1, 4096)) {
			t->err = -ENOMEM;
			return;
		}
	}
}

static void fam(struct txt *t, const char *name, const char *type,
		const char *help)
{
	tput(t, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

int kvtd_dpath_text(const struct kvtd_dpath *dp, char **out)
{
	struct txt t = { 0 };
	char dn[16];

	*out = NULL;
	if (!dp->present)
		return 0;
	fam(&t, "kvtier_restore_cpu_copy_bytes_total", "counter",
	    "Page bytes a CPU thread copied into engine memory (0 on the "
	    "device path: the daemon's devices move them).");
	tput(&t, "kvtier_restore_cpu_copy_bytes_total %" PRIu64 "\n",
	     dp->xs.bytes[KVT_XFER_MOVER_CPU][KVT_XFER_FLOW_RESTORE]);
	fam(&t, "kvtier_datapath_bytes_total", "counter",
	    "Page bytes moved, by who moved them and where to.");
	for (int m = 0; m < KVT_XFER_MOVER_COUNT; m++)
		for (int f = 0; f < KVT_XFER_FLOW_COUNT; f++)
			tput(&t, "kvtier_datapath_bytes_total{mover=\"%s\","
			     "flow=\"%s\"} %" PRIu64 "\n", kvt_xfer_mover_name(m),
			     kvt_xfer_flow_name(f), dp->xs.bytes[m][f]);
	fam(&t, "kvtier_datapath_hashed_bytes_total", "counter",
	    "Page bytes read to checksum them, by the CPU or a device kernel.");
	for (int f = 0; f < KVT_XFER_FLOW_COUNT; f++) {
		tput(&t, "kvtier_datapath_hashed_bytes_total{by=\"cpu\","
		     "flow=\"%s\"} %" PRIu64 "\n", kvt_xfer_flow_name(f),
		     dp->xs.cpu_hashed[f]);
		tput(&t, "kvtier_datapath_hashed_bytes_total{by=\"device\","
		     "flow=\"%s\"} %" PRIu64 "\n", kvt_xfer_flow_name(f),
		     dp->xs.dev_hashed[f]);
	}
	fam(&t, "kvtier_device_checksums_total", "counter",
	    "Page layers checksummed by a device kernel.");
	tput(&t, "kvtier_device_checksums_total %" PRIu64 "\n",
	     dp->xs.dev_verified);
	fam(&t, "kvtier_device_checksum_failures_total", "counter",
	    "Page layers that landed in device memory and failed their "
	    "checksum on the device (the blocks failed, never ready).");
	tput(&t, "kvtier_device_checksum_failures_total %" PRIu64 "\n",
	     dp->xs.dev_failed);
	fam(&t, "kvtier_device_method_substituted_total", "counter",
	    "Device jobs moved by another method than the one chosen for "
	    "them (batched copies not built: one copy per chunk, still the "
	    "device's DMA).");
	tput(&t, "kvtier_device_method_substituted_total %" PRIu64 "\n",
	     dp->xs.method_substituted);
	fam(&t, "kvtier_device_info", "gauge",
	    "A device the daemon's transfer engine runs on (always 1); "
	    "emulated=\"1\": no hardware, its copies are CPU copies.");
	for (int i = 0; i < dp->ndev; i++)
		tput(&t, "kvtier_device_info{device=\"%s\",emulated=\"%d\"} 1\n",
		     kvt_device_format(dp->id[i], dn, sizeof(dn)),
		     kvti_dev_id_is_emu(dp->id[i]));
	fam(&t, "kvtier_device_bytes_total", "counter",
	    "Bytes a device moved (copy engines, the gather kernel) or hashed "
	    "(the checksum kernel).");
	for (int i = 0; i < dp->ndev; i++) {
		const char *d = kvt_device_format(dp->id[i], dn, sizeof(dn));

		tput(&t, "kvtier_device_bytes_total{device=\"%s\",op=\""
		     "copy_engine\"} %" PRIu64 "\n", d,
		     dp->dev[i].copy_engine_bytes);
		tput(&t, "kvtier_device_bytes_total{device=\"%s\",op=\"kernel\"} "
		     "%" PRIu64 "\n", d, dp->dev[i].kernel_bytes);
		tput(&t, "kvtier_device_bytes_total{device=\"%s\",op=\""
		     "checksum\"} %" PRIu64 "\n", d, dp->dev[i].sum_bytes);
	}
	fam(&t, "kvtier_device_faults_total", "counter",
	    "Device accesses outside memory the device knows, refused "
	    "(emulated device; 0 is right).");
	for (int i = 0; i < dp->ndev; i++)
		tput(&t, "kvtier_device_faults_total{device=\"%s\"} %" PRIu64
		     "\n", kvt_device_format(dp->id[i], dn, sizeof(dn)),
		     dp->dev[i].faults);
	fam(&t, "kvtier_device_imports", "gauge",
	    "Engine allocations open on a device now.");
	for (int i = 0; i < dp->ndev; i++)
		tput(&t, "kvtier_device_imports{device=\"%s\"} %" PRIu64 "\n",
		     kvt_device_format(dp->id[i], dn, sizeof(dn)),
		     dp->dev[i].live_imports);
	if (t.err) {
		kvt_free(t.p);
		return t.err;
	}
	*out = t.p;
	return 0;
}

static int num(cJSON *o, const char *k, double v)
{
	return cJSON_AddNumberToObject(o, k, v) ? 0 : -ENOMEM;
}

int kvtd_dpath_json(const struct kvtd_dpath *dp, cJSON *root)
{
	cJSON *o, *a, *y;
	char dn[16];
	int err = 0;

	if (!dp->present)
		return cJSON_AddNullToObject(root, "datapath") ? 0 : -ENOMEM;
	if (!(o = cJSON_AddObjectToObject(root, "datapath")))
		return -ENOMEM;
	err |= num(o, "restore_cpu_copy_bytes",
		   (double)dp->xs.bytes[KVT_XFER_MOVER_CPU][KVT_XFER_FLOW_RESTORE]);
	err |= num(o, "device_checksums", (double)dp->xs.dev_verified);
	err |= num(o, "device_checksum_failures", (double)dp->xs.dev_failed);
	err |= num(o, "method_substituted",
		   (double)dp->xs.method_substituted);
	if (!(a = cJSON_AddArrayToObject(o, "bytes")))
		return -ENOMEM;
	for (int m = 0; m < KVT_XFER_MOVER_COUNT; m++)
		for (int f = 0; f < KVT_XFER_FLOW_COUNT; f++) {
			if (!(y = cJSON_CreateObject()) ||
			    !cJSON_AddItemToArray(a, y))
				return -ENOMEM;
			if (!cJSON_AddStringToObject(y, "mover",
						     kvt_xfer_mover_name(m)) ||
			    !cJSON_AddStringToObject(y, "flow",
						     kvt_xfer_flow_name(f)))
				return -ENOMEM;
			err |= num(y, "bytes", (double)dp->xs.bytes[m][f]);
		}
	for (int by = 0; by < 2; by++) {
		const uint64_t *h = by ? dp->xs.dev_hashed : dp->xs.cpu_hashed;

		if (!(y = cJSON_AddObjectToObject(o, by ? "device_hashed" :
						     "cpu_hashed")))
			return -ENOMEM;
		for (int f = 0; f < KVT_XFER_FLOW_COUNT; f++)
			err |= num(y, kvt_xfer_flow_name(f), (double)h[f]);
	}
	if (!(a = cJSON_AddArrayToObject(root, "devices")))
		return -ENOMEM;
	for (int i = 0; i < dp->ndev; i++) {
		const kvt_dev_stat *s = &dp->dev[i];

		if (!(y = cJSON_CreateObject()) || !cJSON_AddItemToArray(a, y))
			return -ENOMEM;
		if (!cJSON_AddStringToObject(y, "device",
				kvt_device_format(dp->id[i], dn, sizeof(dn))) ||
		    !cJSON_AddBoolToObject(y, "emulated",
					   kvti_dev_id_is_emu(dp->id[i])))
			return -ENOMEM;
		err |= num(y, "copy_engine_bytes", (double)s->copy_engine_bytes);
		err |= num(y, "kernel_bytes", (double)s->kernel_bytes);
		err |= num(y, "checksum_bytes", (double)s->sum_bytes);
		err |= num(y, "faults", (double)s->faults);
		err |= num(y, "live_imports", (double)s->live_imports);
	}
	return err ? -ENOMEM : 0;
}
