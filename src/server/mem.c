/*
 * mem.c — REGISTER and UNREGISTER: an engine's memory shared with the
 * daemon.
 *
 *   client memfd (sealed F_SEAL_SHRINK) --SCM_RIGHTS--> fstat, seals,
 *   layer offsets and strides checked against its size --> mmap shared
 *   --> kvt_cache_attach_rows() (per-layer bases, strides; REGISTER_ROWS
 *   adds a head stride: chunks kept in rows) --> c->mems[i]
 *
 * Every chunk the strides can name lies inside the file, and the file
 * cannot shrink under the mapping (the seal), so no copy of the cache's
 * touches a byte outside it. A memory lives until UNREGISTER or the
 * disconnect; kvt_cache_detach() waits for the jobs that use it. Only the
 * connection thread touches c->mems (no lock); d->registered is d->mu's.
 */
#include "server/daemon_impl.h"

#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>

int kvti_mem_register(struct conn *c, const kvtd_req *q, int fd,
		      uint32_t *id)
{
	const kvt_geom *g = c->d->g;
	uint64_t hs = q->u.reg.head_stride;
	uint32_t L = q->u.reg.nlayers;
	void *base[KVTD_MAX_LAYERS];
	struct cmem *cm = NULL;
	kvt_layout lay;
	struct stat st;
	int seals, err;

	if (q->u.reg.device >= 0)
		return kvti_fail(KVT_ENOTBUILT, "REGISTER: GPU memory (CUDA "
				 "IPC handles) is not implemented yet; register "
				 "host memory");
	for (int i = 0; i < MAX_MEMS; i++)
		if (!c->mems[i].id) {
			cm = &c->mems[i];
			break;
		}
	if (!cm)
		return kvti_fail(KVT_EFULL, "REGISTER: %d memories already",
				 MAX_MEMS);
	if (fstat(fd, &st))
		return kvti_fail(-errno, "REGISTER: fstat: %s", strerror(errno));
	seals = fcntl(fd, F_GET_SEALS);
	if (!S_ISREG(st.st_mode) || seals < 0 || !(seals & F_SEAL_SHRINK))
		return kvti_fail(-EINVAL, "REGISTER: the fd must be a memfd "
				 "sealed with F_SEAL_SHRINK (it could shrink "
				 "under the daemon)");
	if (L != g->layers)
		return kvti_fail(KVT_EGEOM, "REGISTER: %u layers, the namespace "
				 "has %u", L, g->layers);
	if (!q->u.reg.nblocks || q->u.reg.nblocks > KVT_POOL_MAX_SLOTS)
		return kvti_fail(-EINVAL, "REGISTER: %llu blocks",
				 (unsigned long long)q->u.reg.nblocks);
	if (!hs) /* REGISTER: packed rows */
		hs = (uint64_t)g->head_dim * g->dtype_bytes;
	/* the layout's own checks (rows, overlaps, overflow), and its span:
	 * from a layer's base to the end of its last row */
	if ((err = kvt_layout_init_rows(&lay, g, q->u.reg.nblocks,
					q->u.reg.block_stride,
					q->u.reg.kv_stride,
					q->u.reg.token_stride, hs)))
		return err;
	for (uint32_t l = 0; l < L; l++) {
		uint64_t off = kvtd_u64_at(q->u.reg.layer_off, l), end;

		if (off > UINT64_MAX / 4 || lay.buf_bytes > UINT64_MAX / 4)
			return kvti_fail(-EINVAL, "REGISTER: layer %u: strides "
					 "out of range", l);
		end = off + lay.buf_bytes;
		if (end > (uint64_t)st.st_size)
			return kvti_fail(-EINVAL, "REGISTER: layer %u ends at "
					 "byte %llu, the memfd has %lld", l,
					 (unsigned long long)end,
					 (long long)st.st_size);
	}
	cm->len = (size_t)st.st_size;
	cm->map = mmap(NULL, cm->len, PROT_READ | PROT_WRITE, MAP_SHARED, fd,
		       0);
	if (cm->map == MAP_FAILED) {
		cm->map = NULL;
		return kvti_fail(-errno, "REGISTER: mmap: %s", strerror(errno));
	}
	for (uint32_t l = 0; l < L; l++)
		base[l] = (uint8_t *)cm->map + kvtd_u64_at(q->u.reg.layer_off, l);
	err = kvt_cache_attach_rows(c->d->c, base, L, q->u.reg.nblocks,
				    q->u.reg.block_stride, q->u.reg.kv_stride,
				    q->u.reg.token_stride, hs, -1, &cm->m);
	if (err) {
		munmap(cm->map, cm->len);
		cm->map = NULL;
		return err;
	}
	cm->id = ++c->next_mem;
	*id = cm->id;
	pthread_mutex_lock(&c->d->mu);
	c->d->registered += cm->len;
	kvtd_metrics_gauge_set(c->d->m, KVTD_G_REGISTERED_BYTES,
			       c->d->registered);
	pthread_mutex_unlock(&c->d->mu);
	return 0;
}

void kvti_mem_drop(struct conn *c, struct cmem *cm)
{
	kvt_cache_detach(cm->m);
	munmap(cm->map, cm->len);
	pthread_mutex_lock(&c->d->mu);
	c->d->registered -= cm->len;
	kvtd_metrics_gauge_set(c->d->m, KVTD_G_REGISTERED_BYTES,
			       c->d->registered);
	pthread_mutex_unlock(&c->d->mu);
	memset(cm, 0, sizeof(*cm));
}

struct cmem *kvti_mem_find(struct conn *c, uint32_t id)
{
	for (int i = 0; i < MAX_MEMS; i++)
		if (id && c->mems[i].id == id)
			return &c->mems[i];
	return NULL;
}
