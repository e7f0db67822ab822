/*
 * api.c — include/kvtier/dev.h: the device interface as an engine process
 * uses it, thin wrappers over dev.h. A kvt_dev is a kvti_dev (a registry
 * reference); streams and events carry their device.
 */
#include "dev/dev.h"
#include <kvtier/client.h>
#include <kvtier/dev.h>

#include <errno.h>
#include <string.h>

struct kvt_dev_stream {
	kvti_dev *d;
	kvti_dev_stream *s;
};

struct kvt_dev_event {
	kvti_dev *d;
	kvti_dev_event *e;
};

#define DEV(d) ((kvti_dev *)(d))

int kvt_dev_open(int device, kvt_dev **out)
{
	kvti_dev *d;
	int err;

	kvti_errclear();
	if (!out)
		return kvti_fail(-EINVAL, "kvt_dev_open: no handle to fill");
	if ((err = kvti_dev_get(device, &d)))
		return err;
	*out = (kvt_dev *)d;
	return 0;
}

void kvt_dev_close(kvt_dev *d)
{
	kvti_dev_put(DEV(d));
}

const char *kvt_dev_name(const kvt_dev *d)
{
	return ((const kvti_dev *)d)->name;
}

int kvt_dev_emulated(const kvt_dev *d)
{
	return !!(((const kvti_dev *)d)->caps & KVTI_DEV_CAP_EMULATED);
}

void kvt_dev_uuid(const kvt_dev *d, uint8_t uuid[16])
{
	memcpy(uuid, ((const kvti_dev *)d)->uuid, 16);
}

int kvt_dev_alloc(kvt_dev *d, size_t len, void **p)
{
	kvti_errclear();
	return DEV(d)->ops->alloc(DEV(d), len, p);
}

void kvt_dev_free(kvt_dev *d, void *p)
{
	DEV(d)->ops->free(DEV(d), p);
}

int kvt_dev_memcpy(kvt_dev *d, void *dst, const void *src, size_t n)
{
	kvti_errclear();
	return kvti_dev_copy_sync(DEV(d), dst, src, n);
}

int kvt_dev_export(kvt_dev *d, void *p, uint32_t *kind, int *fd,
		   uint64_t *bytes, uint8_t handle[64], uint64_t *off)
{
	kvti_dev_handle h;
	int err;

	kvti_errclear();
	if ((err = kvti_dev_export_mem(DEV(d), p, &h, off)))
		return err;
	*kind = h.kind == KVTI_DEV_H_CUDA_IPC ? KVT_CLIENT_SEG_CUDA_IPC :
		h.kind == KVTI_DEV_H_VMM_FD ? KVT_CLIENT_SEG_VMM_FD :
		KVT_CLIENT_SEG_EMU_FD;
	*fd = h.fd;
	*bytes = h.bytes;
	memcpy(handle, h.data, 64);
	return 0;
}

int kvt_dev_stream_create(kvt_dev *d, kvt_dev_stream **out)
{
	kvt_dev_stream *s = kvt_calloc(1, sizeof(*s));
	int err;

	kvti_errclear();
	if (!s)
		return -ENOMEM;
	s->d = DEV(d);
	if ((err = s->d->ops->stream_create(s->d, 1, &s->s))) {
		kvt_free(s);
		return err;
	}
	*out = s;
	return 0;
}

int kvt_dev_stream_wrap(kvt_dev *d, void *native, kvt_dev_stream **out)
{
	kvt_dev_stream *s;
	int err;

	kvti_errclear();
	if (!DEV(d)->ops->stream_wrap)
		return kvti_fail(-EOPNOTSUPP, "%s: no native streams to wrap",
				 DEV(d)->name);
	if (!(s = kvt_calloc(1, sizeof(*s))))
		return -ENOMEM;
	s->d = DEV(d);
	if ((err = s->d->ops->stream_wrap(s->d, native, &s->s))) {
		kvt_free(s);
		return err;
	}
	*out = s;
	return 0;
}

void kvt_dev_stream_destroy(kvt_dev_stream *s)
{
	if (!s)
		return;
	s->d->ops->stream_destroy(s->s);
	kvt_free(s);
}

int kvt_dev_stream_sync(kvt_dev_stream *s)
{
	kvti_errclear();
	return s->d->ops->stream_sync(s->s);
}

int kvt_dev_stream_memcpy(kvt_dev_stream *s, void *dst, const void *src,
			  size_t n)
{
	kvti_errclear();
	return s->d->ops->copy(s->s, dst, src, n);
}

int kvt_dev_stream_host_fn(kvt_dev_stream *s, void (*fn)(void *), void *arg)
{
	kvti_errclear();
	return kvti_dev_host_fn(s->d, s->s, fn, arg);
}

/* The backend's stream of a public one (the client's stream waits). */
kvti_dev_stream *kvti_dev_stream_of(kvt_dev_stream *s, kvti_dev **d)
{
	*d = s->d;
	return s->s;
}

kvti_dev_event *kvti_dev_event_of(kvt_dev_event *e, kvti_dev **d)
{
	*d = e->d;
	return e->e;
}

int kvt_dev_host_register(kvt_dev *d, void *p, size_t len)
{
	kvti_errclear();
	return DEV(d)->ops->host_register(DEV(d), p, len,
					  KVTI_DEV_HOST_PORTABLE);
}

void kvt_dev_host_unregister(kvt_dev *d, void *p)
{
	DEV(d)->ops->host_unregister(DEV(d), p);
}

int kvt_dev_event_create(kvt_dev *d, int ipc, kvt_dev_event **out)
{
	kvt_dev_event *e = kvt_calloc(1, sizeof(*e));
	int err;

	kvti_errclear();
	if (!e)
		return -ENOMEM;
	e->d = DEV(d);
	if ((err = e->d->ops->event_create(e->d, ipc ? KVTI_DEV_EV_IPC : 0,
					   &e->e))) {
		kvt_free(e);
		return err;
	}
	*out = e;
	return 0;
}

void kvt_dev_event_destroy(kvt_dev_event *e)
{
	if (!e)
		return;
	e->d->ops->event_destroy(e->e);
	kvt_free(e);
}

int kvt_dev_event_record(kvt_dev_event *e, kvt_dev_stream *s)
{
	kvti_errclear();
	if (e->d != s->d)
		return kvti_fail(-EINVAL, "an event of %s on a stream of %s",
				 e->d->name, s->d->name);
	return e->d->ops->event_record(e->e, s->s);
}

int kvt_dev_event_query(kvt_dev_event *e)
{
	return e->d->ops->event_query(e->e);
}

int kvt_dev_event_sync(kvt_dev_event *e, int64_t timeout_ns)
{
	kvti_errclear();
	return e->d->ops->event_sync(e->e, timeout_ns);
}

void kvt_dev_stat_get(kvt_dev *d, kvt_dev_stat *st)
{
	kvti_dev_stat s;

	kvti_dev_stat_get(DEV(d), &s);
	st->copy_engine_bytes = s.ce_bytes;
	st->copy_engine_ops = s.ce_ops;
	st->kernel_bytes = s.kernel_bytes;
	st->kernel_ops = s.kernel_ops;
	st->sum_bytes = s.sum_bytes;
	st->sum_items = s.sum_items;
	st->faults = s.faults;
	st->imports = s.imports;
	st->releases = s.releases;
	st->live_imports = s.live_imports;
}

void kvt_dev_set_delay(kvt_dev *d, uint64_t ns_per_mib)
{
	kvti_dev_emu_set_delay(DEV(d), ns_per_mib);
}
