/*
 * emu_event.c — the emulated device's events (emu.c has the design). An
 * event is a shared record {recorded, completed, status, futex}: private
 * memory, or a memfd page for an IPC event, which a peer imports read-only
 * (it waits, the owner records). A record (emu_stream.c) bumps `recorded`
 * when enqueued and `completed` when its stream reaches it; a query or CPU
 * wait compares the two, and a failure since the stream's last record
 * travels in status and detail. References: the creator's plus one per
 * record or stream wait still queued (kvti_emu_event_put()). Lock-free:
 * atomics and a shared futex word.
 */
#include "dev/emu_impl.h"

/* ---- events ---------------------------------------------------------------- */

int kvti_emu_event_create(kvti_dev *d, unsigned flags, kvti_dev_event **out)
{
	kvti_dev_event *ev = kvt_calloc(1, sizeof(*ev));
	int err;

	if (!ev)
		return -ENOMEM;
	ev->d = d;
	ev->fd = -1;
	atomic_init(&ev->refs, 1);
	if (flags & KVTI_DEV_EV_IPC) {
		ev->fd = memfd_create("kvtier-emu-event", MFD_CLOEXEC |
				      MFD_ALLOW_SEALING);
		if (ev->fd < 0 || ftruncate(ev->fd, EV_BYTES) ||
		    fcntl(ev->fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW)) {
			err = kvti_fail(-errno, "%s: IPC event: %s", d->name,
					strerror(errno));
			goto fail;
		}
		ev->sh = kvti_mmap(NULL, EV_BYTES, PROT_READ | PROT_WRITE,
				   MAP_SHARED, ev->fd, 0);
		if (ev->sh == MAP_FAILED) {
			ev->sh = NULL;
			err = kvti_fail(-errno, "%s: IPC event: mmap: %s",
					d->name, strerror(errno));
			goto fail;
		}
		ev->mapped = 1;
	} else if (!(ev->sh = kvt_calloc(1, sizeof(*ev->sh)))) {
		err = -ENOMEM;
		goto fail;
	}
	*out = ev;
	return 0;
fail:
	if (ev->fd >= 0)
		close(ev->fd);
	kvt_free(ev);
	return err;
}

void kvti_emu_event_put(kvti_dev_event *ev)
{
	if (atomic_fetch_sub(&ev->refs, 1) != 1)
		return;
	if (ev->mapped)
		munmap(ev->sh, EV_BYTES);
	else
		kvt_free(ev->sh);
	if (ev->fd >= 0)
		close(ev->fd);
	kvt_free(ev);
}

void kvti_emu_event_destroy(kvti_dev_event *ev)
{
	if (ev)
		kvti_emu_event_put(ev);
}

int kvti_emu_event_export(kvti_dev_event *ev, kvti_dev_handle *h)
{
	if (ev->fd < 0 || ev->imported)
		return kvti_fail(-EINVAL, "%s: only an IPC event this process "
				 "created can be exported", ev->d->name);
	memset(h, 0, sizeof(*h));
	h->kind = KVTI_DEV_H_EVENT_EMU;
	h->fd = ev->fd;
	h->bytes = EV_BYTES;
	return 0;
}

int kvti_emu_event_import(kvti_dev *d, const kvti_dev_handle *h,
			    kvti_dev_event **out)
{
	kvti_dev_event *ev;
	struct stat st;

	if (h->kind != KVTI_DEV_H_EVENT_EMU || h->fd < 0)
		return kvti_fail(-EINVAL, "%s: not an emulated IPC event "
				 "(handle kind %d)", d->name, h->kind);
	if (fstat(h->fd, &st) || !S_ISREG(st.st_mode) ||
	    st.st_size < (off_t)EV_BYTES || fcntl(h->fd, F_GET_SEALS) < 0 ||
	    !(fcntl(h->fd, F_GET_SEALS) & F_SEAL_SHRINK))
		return kvti_fail(-EINVAL, "%s: an IPC event must be a sealed "
				 "memfd of %u bytes", d->name, EV_BYTES);
	if (!(ev = kvt_calloc(1, sizeof(*ev))))
		return -ENOMEM;
	/* read only: this side waits, the owner records */
	ev->sh = kvti_mmap(NULL, EV_BYTES, PROT_READ, MAP_SHARED, h->fd, 0);
	if (ev->sh == MAP_FAILED) {
		int err = kvti_fail(-errno, "%s: IPC event: mmap: %s", d->name,
				    strerror(errno));
		kvt_free(ev);
		return err;
	}
	ev->d = d;
	ev->fd = -1;
	ev->imported = 1;
	ev->mapped = 1;
	atomic_init(&ev->refs, 1);
	*out = ev;
	return 0;
}

static int ev_result(kvti_dev_event *ev)
{
	int st = atomic_load(&ev->sh->status);
	char det[sizeof(ev->sh->detail)];

	if (!st)
		return 1;
	memcpy(det, ev->sh->detail, sizeof(det));
	det[sizeof(det) - 1] = 0;
	return kvti_fail(st, "%s", det[0] ? det : "device operation failed");
}

int kvti_emu_event_query(kvti_dev_event *ev)
{
	uint64_t target = atomic_load(&ev->sh->recorded);

	return atomic_load(&ev->sh->completed) >= target ? ev_result(ev) : 0;
}

int kvti_emu_event_sync(kvti_dev_event *ev, int64_t timeout_ns)
{
	uint64_t target = atomic_load(&ev->sh->recorded);
	uint64_t end = timeout_ns < 0 ? UINT64_MAX : kvt_now_ns() + timeout_ns;

	while (atomic_load(&ev->sh->completed) < target) {
		uint32_t f = atomic_load(&ev->sh->futex);

		if (atomic_load(&ev->sh->completed) >= target)
			break;
		if (kvt_now_ns() >= end)
			return kvti_fail(-ETIMEDOUT, "%s: event not complete "
					 "after %lld ns", ev->d->name,
					 (long long)timeout_ns);
		fwait(&ev->sh->futex, f, 10 * 1000 * 1000);
	}
	return ev_result(ev) == 1 ? 0 : atomic_load(&ev->sh->status);
}

