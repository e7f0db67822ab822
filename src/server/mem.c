/*
 * mem.c — REGISTER, UNREGISTER and EVENT: the memory and events an engine
 * shares with the daemon, by handle.
 *
 *   REGISTER: segments (allocations), then per layer (segment, offset)
 *     host memory    a memfd sealed F_SEAL_SHRINK --SCM_RIGHTS--> fstat,
 *                    seals, mmap shared
 *     device memory  opened in the daemon's own context on that device
 *                    (src/dev: one per device): a CUDA IPC handle
 *                    (cudaIpcOpenMemHandle), a VMM allocation's POSIX fd
 *                    (cuMemMap), an emulated device's memfd (mmap). A GPU
 *                    is found by its UUID (ordinals differ between
 *                    processes), else by the ordinal given.
 *     every chunk the strides name lies inside its segment --> kvt_cache_
 *     attach_rows() (per-layer bases, strides, the device; REGISTER_ROWS
 *     adds a head stride: host chunks kept in rows) --> c->mems[i]
 *   UNREGISTER / disconnect (kill -9 included): kvt_cache_detach() cancels
 *     the memory's jobs and waits for them — a device job ends only once
 *     the device's work for it has finished — and only then are the
 *     handles closed (cudaIpcCloseMemHandle, munmap): the daemon never
 *     writes into memory the engine may have freed or reused.
 *   EVENT: an engine's IPC event, opened on the device, named by jobs
 *     whose copies must wait for the engine's writes (stores) or reads
 *     (loads into reused blocks). Kept until the disconnect, after the
 *     jobs are gone.
 *
 * Only the connection thread touches c->mems and c->events (no lock);
 * d->registered is d->mu's.
 */
#include "server/daemon_impl.h"
#include "dev/dev.h"

#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>

static void gauge(struct conn *c, int64_t delta)
{
	pthread_mutex_lock(&c->d->mu);
	c->d->registered += (uint64_t)delta;
	kvtd_metrics_gauge_set(c->d->m, KVTD_G_REGISTERED_BYTES,
			       c->d->registered);
	pthread_mutex_unlock(&c->d->mu);
}

/* The daemon's device id for what the engine named: emulated devices by
 * number, GPUs by UUID when given (else the ordinal). */
static int resolve_device(int32_t device, const uint8_t *uuid, int *id)
{
	static const uint8_t zero[KVTD_UUID_BYTES];
	int ord;

	if (device >= KVT_DEVICE_EMU) {
		if (!kvti_dev_is_emu(device))
			return kvti_fail(-EINVAL, "device %d is not a device",
					 device);
		*id = device;
		return 0;
	}
	if (uuid && memcmp(uuid, zero, sizeof(zero))) {
		int err = kvti_dev_cuda_find(uuid, &ord);

		if (err)
			return err;
		*id = ord;
		return 0;
	}
	*id = device;
	return 0;
}

static void segs_release(struct cmem *cm)
{
	for (uint32_t i = 0; i < cm->nseg; i++) {
		struct cseg *s = &cm->seg[i];

		if (!s->base)
			continue;
		if (s->dev)
			kvti_dev_unimport(cm->dev, s->base);
		else
			munmap(s->base, s->len);
		s->base = NULL;
	}
	kvti_dev_put(cm->dev);
	cm->dev = NULL;
}

/* Map or import segment @i (its fd, if its kind has one: @fd). */
static int seg_open(struct conn *c, const kvtd_req *q, struct cmem *cm,
		    uint32_t i, int fd)
{
	uint32_t kind = kvtd_seg_kind(q, i);
	uint64_t bytes = kvtd_seg_size(q, i);
	struct cseg *s = &cm->seg[i];
	kvti_dev_handle h = { .fd = fd, .bytes = bytes };
	struct stat st;
	int seals;

	if ((kind == KVTD_SEG_MEMFD) != (cm->device < 0))
		return kvti_fail(-EINVAL, "REGISTER: segment %u: %s", i,
				 cm->device < 0 ? "host memory is a memfd" :
				 "device memory comes by a device handle, not "
				 "a memfd");
	if (kind == KVTD_SEG_MEMFD) {
		if (fstat(fd, &st))
			return kvti_fail(-errno, "REGISTER: fstat: %s",
					 strerror(errno));
		seals = fcntl(fd, F_GET_SEALS);
		if (!S_ISREG(st.st_mode) || seals < 0 ||
		    !(seals & F_SEAL_SHRINK))
			return kvti_fail(-EINVAL, "REGISTER: the fd must be a "
					 "memfd sealed with F_SEAL_SHRINK (it "
					 "could shrink under the daemon)");
		if (bytes > (uint64_t)st.st_size || !st.st_size)
			return kvti_fail(-EINVAL, "REGISTER: segment %u of %llu "
					 "bytes in a memfd of %lld", i,
					 (unsigned long long)bytes,
					 (long long)st.st_size);
		/* what the segment says it is (0: the whole file); REGISTER
		 * then counts it against the tenant's mem= */
		s->len = (size_t)(bytes ? bytes : (uint64_t)st.st_size);
		s->base = mmap(NULL, s->len, PROT_READ | PROT_WRITE, MAP_SHARED,
			       fd, 0);
		if (s->base == MAP_FAILED) {
			s->base = NULL;
			return kvti_fail(-errno, "REGISTER: mmap: %s",
					 strerror(errno));
		}
		return 0;
	}
	if (!bytes)
		return kvti_fail(-EINVAL, "REGISTER: segment %u has no size", i);
	if ((kind == KVTD_SEG_EMU_FD) != kvti_dev_is_emu(cm->device))
		return kvti_fail(-EINVAL, "REGISTER: segment %u: a handle of "
				 "another kind of device than %d", i,
				 cm->device);
	h.kind = kind == KVTD_SEG_CUDA_IPC ? KVTI_DEV_H_CUDA_IPC :
		 kind == KVTD_SEG_VMM_FD ? KVTI_DEV_H_VMM_FD : KVTI_DEV_H_EMU_FD;
	memcpy(h.data, kvtd_seg_handle(q, i), sizeof(h.data));
	s->len = (size_t)bytes;
	s->dev = 1;
	return kvti_dev_import(cm->dev, &h, &s->base);
}

int kvti_mem_register(struct conn *c, const kvtd_req *q, const int *fds,
		      int nfds, uint32_t *id)
{
	const kvt_geom *g = c->d->g;
	uint64_t hs = q->u.reg.head_stride;
	uint32_t L = q->u.reg.nlayers;
	void *base[KVTD_MAX_LAYERS];
	struct cmem *cm = NULL;
	kvt_layout lay;
	size_t total = 0;
	int err = 0, f = 0, dev = KVT_DEVICE_HOST;

	for (int i = 0; i < MAX_MEMS; i++)
		if (!c->mems[i].id) {
			cm = &c->mems[i];
			break;
		}
	if (!cm)
		return kvti_fail(KVT_EFULL, "REGISTER: %d memories already",
				 MAX_MEMS);
	if (nfds != kvtd_req_fds(q))
		return kvti_fail(KVT_EPROTO, "REGISTER: %d descriptors for %d "
				 "segments that carry one", nfds,
				 kvtd_req_fds(q));
	if (L != g->layers)
		return kvti_fail(KVT_EGEOM, "REGISTER: %u layers, the namespace "
				 "has %u", L, g->layers);
	if (!q->u.reg.nblocks || q->u.reg.nblocks > KVT_POOL_MAX_SLOTS)
		return kvti_fail(-EINVAL, "REGISTER: %llu blocks",
				 (unsigned long long)q->u.reg.nblocks);
	if (q->u.reg.device < -1)
		return kvti_fail(-EINVAL, "REGISTER: device %d", q->u.reg.device);
	if (!hs) /* REGISTER: packed rows */
		hs = (uint64_t)g->head_dim * g->dtype_bytes;
	/* the layout's own checks (rows, overlaps, overflow), and its span:
	 * from a layer's base to the end of its last row */
	if ((err = kvt_layout_init_rows(&lay, g, q->u.reg.nblocks,
					q->u.reg.block_stride,
					q->u.reg.kv_stride,
					q->u.reg.token_stride, hs)))
		return err;
	memset(cm, 0, sizeof(*cm));
	cm->device = -1;
	if (q->u.reg.device >= 0) {
		if ((err = resolve_device(q->u.reg.device, q->u.reg.uuid, &dev)) ||
		    (err = kvti_dev_get(dev, &cm->dev))) {
			kvti_errctx("REGISTER: device memory");
			goto fail;
		}
		cm->device = dev;
	}
	cm->nseg = q->u.reg.nseg;
	for (uint32_t i = 0; i < cm->nseg && !err; i++) {
		int fd = kvtd_seg_has_fd(kvtd_seg_kind(q, i)) ? fds[f++] : -1;

		err = seg_open(c, q, cm, i, fd);
		total += cm->seg[i].len;
	}
	if (err)
		goto fail;
	{
		/* the tenant's share taken (mapped, not yet used: a sparse
		 * file costs nothing until touched), given back on failure:
		 * two registrations at once cannot both pass the cap */
		uint64_t used = atomic_fetch_add(&c->t->mem_used, total);

		cm->reserved = total;
		if (total > c->t->mem_max || used > c->t->mem_max - total) {
			err = kvti_fail(KVT_EFULL, "REGISTER: %llu bytes: tenant "
					"%s has %llu registered, its most is %llu "
					"(mem=)", (unsigned long long)total,
					c->t->name, (unsigned long long)used,
					(unsigned long long)c->t->mem_max);
			goto fail;
		}
	}
	for (uint32_t l = 0; l < L; l++) {
		uint32_t si = kvtd_layer_seg(q, l);
		uint64_t off = kvtd_layer_off(q, l), end;

		if (off > UINT64_MAX / 4 || lay.buf_bytes > UINT64_MAX / 4) {
			err = kvti_fail(-EINVAL, "REGISTER: layer %u: strides "
					"out of range", l);
			goto fail;
		}
		end = off + lay.buf_bytes;
		if (end > cm->seg[si].len) {
			err = kvti_fail(-EINVAL, "REGISTER: layer %u ends at "
					"byte %llu, its segment %u has %zu", l,
					(unsigned long long)end, si,
					cm->seg[si].len);
			goto fail;
		}
		base[l] = (uint8_t *)cm->seg[si].base + off;
	}
	err = kvt_cache_attach_rows(c->d->c, base, L, q->u.reg.nblocks,
				    q->u.reg.block_stride, q->u.reg.kv_stride,
				    q->u.reg.token_stride, hs, cm->device,
				    &cm->m);
	if (err)
		goto fail;
	cm->len = total;
	cm->id = ++c->next_mem;
	*id = cm->id;
	gauge(c, (int64_t)total);
	return 0;
fail:
	segs_release(cm);
	atomic_fetch_sub(&c->t->mem_used, cm->reserved);
	memset(cm, 0, sizeof(*cm));
	return err;
}

void kvti_mem_drop(struct conn *c, struct cmem *cm)
{
	/* cancels its jobs and waits for them: the device is done with it */
	kvt_cache_detach(cm->m);
	segs_release(cm);
	gauge(c, -(int64_t)cm->len);
	atomic_fetch_sub(&c->t->mem_used, cm->reserved);
	memset(cm, 0, sizeof(*cm));
}

struct cmem *kvti_mem_find(struct conn *c, uint32_t id)
{
	for (int i = 0; i < MAX_MEMS; i++)
		if (id && c->mems[i].id == id)
			return &c->mems[i];
	return NULL;
}

/* ---- events -------------------------------------------------------------- */

int kvti_event_register(struct conn *c, const kvtd_req *q, int fd,
			uint32_t *id)
{
	struct cevent *ce = NULL;
	kvti_dev_handle h = { .fd = fd };
	int dev = -1, err;

	for (int i = 0; i < MAX_EVENTS; i++)
		if (!c->events[i].id) {
			ce = &c->events[i];
			break;
		}
	if (!ce)
		return kvti_fail(KVT_EFULL, "EVENT: %d events already",
				 MAX_EVENTS);
	if ((fd >= 0) != (q->u.event.kind == KVTD_EV_EMU_FD))
		return kvti_fail(KVT_EPROTO, "EVENT: an emulated event comes "
				 "with its memfd, a CUDA one without");
	if (q->u.event.device < 0)
		return kvti_fail(-EINVAL, "EVENT: device %d", q->u.event.device);
	if ((err = resolve_device(q->u.event.device, q->u.event.uuid, &dev)))
		return err;
	if ((q->u.event.kind == KVTD_EV_EMU_FD) != kvti_dev_is_emu(dev))
		return kvti_fail(-EINVAL, "EVENT: a handle of another kind of "
				 "device than %d", dev);
	h.kind = q->u.event.kind == KVTD_EV_EMU_FD ? KVTI_DEV_H_EVENT_EMU :
		 KVTI_DEV_H_EVENT_CUDA;
	memcpy(h.data, q->u.event.handle, sizeof(h.data));
	if ((err = kvti_dev_get(dev, &ce->dev)))
		return err;
	if ((err = kvti_dev_event_import(ce->dev, &h, &ce->ev))) {
		kvti_dev_put(ce->dev);
		ce->dev = NULL;
		return err;
	}
	ce->id = ++c->next_event;
	*id = ce->id;
	return 0;
}

void *kvti_event_find(struct conn *c, uint32_t id)
{
	for (int i = 0; i < MAX_EVENTS; i++)
		if (id && c->events[i].id == id)
			return c->events[i].ev;
	return NULL;
}

void kvti_events_drop(struct conn *c)
{
	for (int i = 0; i < MAX_EVENTS; i++) {
		struct cevent *ce = &c->events[i];

		if (!ce->id)
			continue;
		ce->dev->ops->event_destroy(ce->ev);
		kvti_dev_put(ce->dev);
		memset(ce, 0, sizeof(*ce));
	}
}
