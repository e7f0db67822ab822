/*
 * dev.c — the device interface's common layer (dev.h is the contract):
 * the registry of open devices (one per id per process, counted), imports
 * deduplicated per process, the defaults of the optional calls, device
 * ids as text.
 *
 * Locking: reg_mu guards the registry and every device's refs; a
 * device's mu guards its import list. Backends lock their own state.
 */
#include "dev/dev.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

/* One import of a peer allocation, shared by every kvti_dev_import() of
 * the same handle in this process. */
struct kvti_dev_imp {
	int kind;
	uint8_t key[KVTI_DEV_HANDLE_BYTES]; /* CUDA IPC handle */
	dev_t sdev;                          /* fd kinds: the file */
	ino_t ino;
	void *base, *priv;
	int count;
	struct kvti_dev_imp *next;
};

static pthread_mutex_t reg_mu = PTHREAD_MUTEX_INITIALIZER;
static kvti_dev *reg;

int kvt_device_parse(const char *s, int *id)
{
	char *end;
	long n;

	if (!s || !id)
		return kvti_fail(-EINVAL, "device: NULL");
	if (kvti_streq_ci(s, "host") || kvti_streq_ci(s, "cpu")) {
		*id = KVT_DEVICE_HOST;
		return 0;
	}
	if (kvti_streq_ci(s, "emu")) {
		*id = KVT_DEVICE_EMU;
		return 0;
	}
	if (!strncmp(s, "emu:", 4) || !strncmp(s, "cuda:", 5)) {
		int emu = s[0] == 'e';
		const char *p = s + (emu ? 4 : 5);

		errno = 0;
		n = strtol(p, &end, 10);
		if (p[0] >= '0' && p[0] <= '9' && !*end && !errno && n >= 0 &&
		    n < (emu ? KVT_DEVICE_EMU_MAX : KVT_DEVICE_EMU)) {
			*id = (int)n + (emu ? KVT_DEVICE_EMU : 0);
			return 0;
		}
	} else if (s[0] >= '0' && s[0] <= '9') {
		errno = 0;
		n = strtol(s, &end, 10);
		if (!*end && !errno && n < KVT_DEVICE_EMU) {
			*id = (int)n;
			return 0;
		}
	}
	return kvti_fail(-EINVAL, "device '%.40s': host, cuda:N (or N), emu or "
			 "emu:N (N < %d)", s, KVT_DEVICE_EMU_MAX);
}

char *kvt_device_format(int id, char *buf, size_t len)
{
	if (id < 0)
		snprintf(buf, len, "host");
	else if (kvti_dev_is_emu(id))
		snprintf(buf, len, "emu:%d", id - KVT_DEVICE_EMU);
	else if (id < KVT_DEVICE_EMU)
		snprintf(buf, len, "cuda:%d", id);
	else
		snprintf(buf, len, "?%d", id);
	return buf;
}

/* ---- the registry ------------------------------------------------------- */

int kvti_dev_get(int id, kvti_dev **out)
{
	const struct kvti_dev_ops *ops;
	kvti_dev *d;
	int err;

	if (id < 0 || (id >= KVT_DEVICE_EMU && !kvti_dev_is_emu(id)))
		return kvti_fail(-EINVAL, "device id %d is not a device", id);
	ops = kvti_dev_is_emu(id) ? &kvti_dev_emu_ops : &kvti_dev_cuda_ops;
	pthread_mutex_lock(&reg_mu);
	for (d = reg; d; d = d->next)
		if (d->id == id) {
			d->refs++;
			pthread_mutex_unlock(&reg_mu);
			*out = d;
			return 0;
		}
	d = kvt_calloc(1, sizeof(*d));
	if (!d) {
		pthread_mutex_unlock(&reg_mu);
		return -ENOMEM;
	}
	d->ops = ops;
	d->id = id;
	d->index = kvti_dev_is_emu(id) ? id - KVT_DEVICE_EMU : id;
	pthread_mutex_init(&d->mu, NULL);
	kvt_device_format(id, d->name, sizeof(d->name));
	/* opened under the registry lock: two first users of one device
	 * must not both create its context */
	if ((err = ops->open(d))) {
		pthread_mutex_unlock(&reg_mu);
		pthread_mutex_destroy(&d->mu);
		kvt_free(d);
		return err;
	}
	d->refs = 1;
	d->next = reg;
	reg = d;
	pthread_mutex_unlock(&reg_mu);
	*out = d;
	return 0;
}

void kvti_dev_put(kvti_dev *d)
{
	if (!d)
		return;
	pthread_mutex_lock(&reg_mu);
	if (--d->refs > 0) {
		pthread_mutex_unlock(&reg_mu);
		return;
	}
	for (kvti_dev **p = &reg; *p; p = &(*p)->next)
		if (*p == d) {
			*p = d->next;
			break;
		}
	pthread_mutex_unlock(&reg_mu);
	/* imports nobody released: a caller's leak, closed here */
	while (d->imps) {
		struct kvti_dev_imp *m = d->imps;

		d->imps = m->next;
		kvti_warn("device %s closed with an import still open: released",
			  d->name);
		d->ops->release(d, m->base, m->priv);
		kvt_free(m);
	}
	d->ops->close(d);
	pthread_mutex_destroy(&d->mu);
	kvt_free(d);
}

void kvti_dev_stat_get(kvti_dev *d, kvti_dev_stat *st)
{
	uint64_t v[10];

	for (int i = 0; i < 10; i++)
		v[i] = atomic_load_explicit(&d->st[i], memory_order_relaxed);
	st->ce_bytes = v[DST_CE_BYTES];
	st->ce_ops = v[DST_CE_OPS];
	st->kernel_bytes = v[DST_KERNEL_BYTES];
	st->kernel_ops = v[DST_KERNEL_OPS];
	st->sum_bytes = v[DST_SUM_BYTES];
	st->sum_items = v[DST_SUM_ITEMS];
	st->faults = v[DST_FAULTS];
	st->imports = v[DST_IMPORTS];
	st->releases = v[DST_RELEASES];
	st->live_imports = v[DST_LIVE];
}

/* ---- imports --------------------------------------------------------------- */

static int imp_key(const kvti_dev_handle *h, struct kvti_dev_imp *k)
{
	struct stat st;

	memset(k, 0, sizeof(*k));
	k->kind = h->kind;
	switch (h->kind) {
	case KVTI_DEV_H_CUDA_IPC:
		memcpy(k->key, h->data, sizeof(k->key));
		return 0;
	case KVTI_DEV_H_VMM_FD:
	case KVTI_DEV_H_EMU_FD:
		if (h->fd < 0 || fstat(h->fd, &st))
			return kvti_fail(-EBADF, "device import: no descriptor "
					 "with the handle");
		k->sdev = st.st_dev;
		k->ino = st.st_ino;
		return 0;
	default:
		return kvti_fail(-EINVAL, "device import: handle kind %d is "
				 "not memory", h->kind);
	}
}

static int imp_same(const struct kvti_dev_imp *a, const struct kvti_dev_imp *b)
{
	if (a->kind != b->kind)
		return 0;
	if (a->kind == KVTI_DEV_H_CUDA_IPC)
		return !memcmp(a->key, b->key, sizeof(a->key));
	return a->sdev == b->sdev && a->ino == b->ino;
}

int kvti_dev_import(kvti_dev *d, const kvti_dev_handle *h, void **base)
{
	struct kvti_dev_imp k, *m;
	int err;

	if ((err = imp_key(h, &k)))
		return err;
	pthread_mutex_lock(&d->mu);
	for (m = d->imps; m; m = m->next)
		if (imp_same(m, &k)) {
			m->count++;
			*base = m->base;
			pthread_mutex_unlock(&d->mu);
			return 0;
		}
	if (!(m = kvt_malloc(sizeof(*m)))) {
		pthread_mutex_unlock(&d->mu);
		return -ENOMEM;
	}
	*m = k;
	if ((err = d->ops->import(d, h, &m->base, &m->priv))) {
		pthread_mutex_unlock(&d->mu);
		kvt_free(m);
		return err;
	}
	m->count = 1;
	m->next = d->imps;
	d->imps = m;
	pthread_mutex_unlock(&d->mu);
	kvti_dev_count(d, DST_IMPORTS, 1);
	kvti_dev_count(d, DST_LIVE, 1);
	*base = m->base;
	return 0;
}

void kvti_dev_unimport(kvti_dev *d, void *base)
{
	struct kvti_dev_imp *m = NULL;

	if (!d || !base)
		return;
	pthread_mutex_lock(&d->mu);
	for (struct kvti_dev_imp **p = &d->imps; *p; p = &(*p)->next)
		if ((*p)->base == base) {
			m = *p;
			if (--m->count == 0)
				*p = m->next;
			break;
		}
	pthread_mutex_unlock(&d->mu);
	if (!m || m->count)
		return;
	d->ops->release(d, m->base, m->priv);
	kvti_dev_count(d, DST_RELEASES, 1);
	atomic_fetch_sub_explicit(&d->st[DST_LIVE], 1, memory_order_relaxed);
	kvt_free(m);
}

/* ---- optional calls --------------------------------------------------------- */

static int unsupported(kvti_dev *d, const char *what)
{
	return kvti_fail(-EOPNOTSUPP, "device %s: %s is not supported", d->name,
			 what);
}

int kvti_dev_event_export(kvti_dev *d, kvti_dev_event *e, kvti_dev_handle *h)
{
	return d->ops->event_export ? d->ops->event_export(e, h) :
				      unsupported(d, "exporting an event");
}

int kvti_dev_event_import(kvti_dev *d, const kvti_dev_handle *h,
			  kvti_dev_event **e)
{
	return d->ops->event_import ? d->ops->event_import(d, h, e) :
				      unsupported(d, "importing an event");
}

int kvti_dev_stream_wait_value(kvti_dev *d, kvti_dev_stream *s,
			       const uint32_t *addr, uint32_t value)
{
	if (!d->ops->stream_wait_value || !(d->caps & KVTI_DEV_CAP_WAIT_VALUE))
		return unsupported(d, "a stream wait on a memory value");
	return d->ops->stream_wait_value(s, addr, value);
}

int kvti_dev_host_fn(kvti_dev *d, kvti_dev_stream *s, void (*fn)(void *),
		     void *arg)
{
	return d->ops->host_fn ? d->ops->host_fn(s, fn, arg) :
				 unsupported(d, "host functions on a stream");
}

int kvti_dev_export_mem(kvti_dev *d, void *p, kvti_dev_handle *h,
			uint64_t *off)
{
	return d->ops->export_mem ? d->ops->export_mem(d, p, h, off) :
				    unsupported(d, "exporting memory");
}

int kvti_dev_copy_sync(kvti_dev *d, void *dst, const void *src, size_t n)
{
	kvti_dev_stream *s;
	int err;

	if (d->ops->copy_sync)
		return d->ops->copy_sync(d, dst, src, n);
	if ((err = d->ops->stream_create(d, 0, &s)))
		return err;
	err = d->ops->copy(s, dst, src, n);
	if (!err)
		err = d->ops->stream_sync(s);
	else
		d->ops->stream_sync(s);
	d->ops->stream_destroy(s);
	return err;
}
