/*
 * client_mem.c — engine memory through the daemon, the client's side:
 * REGISTER / REGISTER_ROWS of memfds, of device allocations (CUDA IPC
 * handles or exported fds) and of plain pointers, the library's own
 * memfd-backed allocation (kvt_client_mem_alloc) and UNREGISTER.
 *
 * A kvt_client_mem is linked on its client (cl->mems, under cl->mu) from
 * a successful REGISTER until kvt_client_mem_free() (UNREGISTER, then
 * unmap) or the client's close (client.c: unmap only, the daemon drops a
 * closed connection's memory itself); kvti_client_mem_release() runs
 * with cl->mu held. The requests go through kvti_client_rpc()
 * (client.c), so the connection's rules (broken, gone, deadlines) apply
 * unchanged. Split from client.c, which had passed ~1,000 lines.
 */
#include "server/client_impl.h"

/* ---- memory ------------------------------------------------------------------ */

/* REGISTER: segments, then per layer (segment, offset); the fds of the
 * segments that carry one go with it. REGISTER_ROWS when @hs is not the
 * packed head stride D*s (a daemon older than it still takes every packed
 * layout). */
static int reg_segs(kvt_client *cl, int device, const uint8_t *uuid,
		    const kvt_client_seg *segs, uint32_t nseg,
		    const uint32_t *layer_seg, const uint64_t *layer_off,
		    uint32_t nlayers, uint64_t nblocks, uint64_t bs,
		    uint64_t ks, uint64_t ts, uint64_t hs, uint32_t *id)
{
	static const uint8_t zero[KVTD_UUID_BYTES];
	uint64_t row = (uint64_t)cl->g.head_dim * cl->g.dtype_bytes;
	int rows = hs != row && cl->g.kv_heads > 1;
	int fds[KVTD_MAX_SEGS], nfds = 0;
	kvtd_rd rd;
	int err;

	if (!layer_off || !nlayers || nlayers > KVTD_MAX_LAYERS)
		return kvti_fail(-EINVAL, "client register: %u layer offsets",
				 nlayers);
	if (!segs || !nseg || nseg > KVTD_MAX_SEGS)
		return kvti_fail(-EINVAL, "client register: %u allocations "
				 "(1..%d)", nseg, KVTD_MAX_SEGS);
	for (uint32_t i = 0; i < nseg; i++) {
		if (segs[i].kind < KVT_CLIENT_SEG_MEMFD ||
		    segs[i].kind > KVT_CLIENT_SEG_EMU_FD)
			return kvti_fail(-EINVAL, "client register: allocation "
					 "%u of kind %u", i, segs[i].kind);
		if (kvtd_seg_has_fd(segs[i].kind)) {
			if (segs[i].fd < 0)
				return kvti_fail(-EINVAL, "client register: "
						 "allocation %u has no fd", i);
			fds[nfds++] = segs[i].fd;
		}
	}
	for (uint32_t l = 0; l < nlayers; l++)
		if ((layer_seg ? layer_seg[l] : 0) >= nseg)
			return kvti_fail(-EINVAL, "client register: layer %u in "
					 "allocation %u of %u", l, layer_seg[l],
					 nseg);
	pthread_mutex_lock(&cl->mu);
	kvti_client_begin(cl, rows ? KVTD_MSG_REGISTER_ROWS : KVTD_MSG_REGISTER);
	kvtd_put_u32(&cl->out, (uint32_t)device);
	kvtd_put_u32(&cl->out, nlayers);
	kvtd_put_u64(&cl->out, nblocks);
	kvtd_put_u64(&cl->out, bs);
	kvtd_put_u64(&cl->out, ks);
	kvtd_put_u64(&cl->out, ts);
	if (rows)
		kvtd_put_u64(&cl->out, hs);
	kvtd_put_bytes(&cl->out, uuid ? uuid : zero, KVTD_UUID_BYTES);
	kvtd_put_u32(&cl->out, nseg);
	for (uint32_t i = 0; i < nseg; i++) {
		kvtd_put_u32(&cl->out, segs[i].kind);
		kvtd_put_u64(&cl->out, segs[i].bytes);
		kvtd_put_bytes(&cl->out, segs[i].handle, KVTD_HANDLE_BYTES);
	}
	for (uint32_t l = 0; l < nlayers; l++) {
		kvtd_put_u32(&cl->out, layer_seg ? layer_seg[l] : 0);
		kvtd_put_u64(&cl->out, layer_off[l]);
	}
	err = kvti_client_rpc(cl, fds, nfds, &rd);
	if (!err) {
		*id = kvtd_get_u32(&rd);
		err = kvti_client_body_end(&rd);
	}
	pthread_mutex_unlock(&cl->mu);
	return err;
}

static int reg_fd(kvt_client *cl, int fd, const uint64_t *layer_off,
		  uint32_t nlayers, uint64_t nblocks, uint64_t bs, uint64_t ks,
		  uint64_t ts, uint64_t hs, int device, uint32_t *id)
{
	kvt_client_seg seg = { .kind = KVT_CLIENT_SEG_MEMFD, .fd = fd };

	if (device != KVT_DEVICE_HOST)
		return kvti_fail(-EINVAL, "client register: a memfd is host "
				 "memory (device %d: use "
				 "kvt_client_register_dev())", device);
	return reg_segs(cl, KVT_DEVICE_HOST, NULL, &seg, 1, NULL, layer_off,
			nlayers, nblocks, bs, ks, ts, hs, id);
}

static void mem_link(kvt_client *cl, kvt_client_mem *m)
{
	pthread_mutex_lock(&cl->mu);
	m->next = cl->mems;
	cl->mems = m;
	pthread_mutex_unlock(&cl->mu);
}

int kvt_client_register_fd(kvt_client *cl, int fd, const uint64_t *layer_off,
			   uint32_t nlayers, uint64_t nblocks,
			   uint64_t block_stride, uint64_t kv_stride,
			   uint64_t token_stride, int device,
			   kvt_client_mem **out)
{
	if (!cl)
		return kvti_fail(-EINVAL, "client register: bad arguments");
	return kvt_client_register_fd_rows(cl, fd, layer_off, nlayers, nblocks,
					   block_stride, kv_stride,
					   token_stride,
					   (uint64_t)cl->g.head_dim *
					   cl->g.dtype_bytes, device, out);
}

int kvt_client_register_fd_rows(kvt_client *cl, int fd,
				const uint64_t *layer_off, uint32_t nlayers,
				uint64_t nblocks, uint64_t block_stride,
				uint64_t kv_stride, uint64_t token_stride,
				uint64_t head_stride, int device,
				kvt_client_mem **out)
{
	kvt_client_mem *m;
	int err;

	kvti_errclear();
	if (!cl || !out || fd < 0)
		return kvti_fail(-EINVAL, "client register: bad arguments");
	if (!(m = kvt_calloc(1, sizeof(*m))))
		return -ENOMEM;
	m->cl = cl;
	m->fd = -1;
	m->device = KVT_DEVICE_HOST;
	err = reg_fd(cl, fd, layer_off, nlayers, nblocks, block_stride,
		     kv_stride, token_stride, head_stride, device, &m->id);
	if (err) {
		kvt_free(m);
		return err;
	}
	mem_link(cl, m);
	*out = m;
	return 0;
}

int kvt_client_register_dev(kvt_client *cl, int device, const uint8_t *uuid,
			    const kvt_client_seg *segs, uint32_t nseg,
			    const uint32_t *layer_seg, const uint64_t *layer_off,
			    uint32_t nlayers, uint64_t nblocks,
			    uint64_t block_stride, uint64_t kv_stride,
			    uint64_t token_stride, kvt_client_mem **out)
{
	kvt_client_mem *m;
	int err;

	kvti_errclear();
	if (!cl || !out || device < KVT_DEVICE_HOST)
		return kvti_fail(-EINVAL, "client register: bad arguments");
	if (!(m = kvt_calloc(1, sizeof(*m))))
		return -ENOMEM;
	m->cl = cl;
	m->fd = -1;
	m->device = device;
	err = reg_segs(cl, device, uuid, segs, nseg, layer_seg, layer_off,
		       nlayers, nblocks, block_stride, kv_stride, token_stride,
		       (uint64_t)cl->g.head_dim * cl->g.dtype_bytes, &m->id);
	if (err) {
		kvt_free(m);
		return err;
	}
	mem_link(cl, m);
	*out = m;
	return 0;
}

int kvt_client_register_ptrs(kvt_client *cl, kvt_dev *dev, void *const *base,
			     uint32_t nlayers, uint64_t nblocks,
			     uint64_t block_stride, uint64_t kv_stride,
			     uint64_t token_stride, kvt_client_mem **out)
{
	kvti_dev *d = (kvti_dev *)dev;
	kvt_client_seg segs[KVTD_MAX_SEGS];
	uint32_t nseg = 0, *lseg = NULL;
	uint64_t *loff = NULL;
	int err = 0;

	kvti_errclear();
	if (!cl || !dev || !base || !nlayers || nlayers > KVTD_MAX_LAYERS)
		return kvti_fail(-EINVAL, "client register: bad arguments");
	lseg = kvt_malloc(nlayers * sizeof(*lseg));
	loff = kvt_malloc(nlayers * sizeof(*loff));
	if (!lseg || !loff) {
		err = -ENOMEM;
		goto out;
	}
	/* one segment per allocation the layers lie in */
	for (uint32_t l = 0; l < nlayers && !err; l++) {
		kvti_dev_handle h;
		uint32_t k;

		if ((err = kvti_dev_export_mem(d, base[l], &h, &loff[l])))
			break;
		for (k = 0; k < nseg; k++)
			if (segs[k].fd == h.fd && segs[k].bytes == h.bytes &&
			    !memcmp(segs[k].handle, h.data, sizeof(h.data)))
				break;
		if (k == nseg) {
			if (nseg == KVTD_MAX_SEGS) {
				err = kvti_fail(-E2BIG, "client register: the "
						"layers lie in more than %d "
						"allocations", KVTD_MAX_SEGS);
				break;
			}
			segs[k].kind = h.kind == KVTI_DEV_H_CUDA_IPC ?
				       KVT_CLIENT_SEG_CUDA_IPC :
				       h.kind == KVTI_DEV_H_VMM_FD ?
				       KVT_CLIENT_SEG_VMM_FD :
				       KVT_CLIENT_SEG_EMU_FD;
			segs[k].fd = h.fd;
			segs[k].bytes = h.bytes;
			memcpy(segs[k].handle, h.data, sizeof(h.data));
			nseg++;
		}
		lseg[l] = k;
	}
	if (!err)
		err = kvt_client_register_dev(cl, d->id, d->uuid, segs, nseg,
					      lseg, loff, nlayers, nblocks,
					      block_stride, kv_stride,
					      token_stride, out);
out:
	kvt_free(lseg);
	kvt_free(loff);
	return err;
}

int kvt_client_mem_alloc(kvt_client *cl, uint64_t nblocks, void **base,
			 uint64_t *block_stride, uint64_t *kv_stride,
			 uint64_t *token_stride, kvt_client_mem **out)
{
	const kvt_geom *g;
	uint64_t chunk, kv, layer, ps = (uint64_t)sysconf(_SC_PAGESIZE);
	uint64_t off[KVTD_MAX_LAYERS];
	kvt_client_mem *m;
	int err;

	kvti_errclear();
	if (!cl || !out || !nblocks || nblocks > KVT_POOL_MAX_SLOTS)
		return kvti_fail(-EINVAL, "client mem alloc: bad arguments");
	g = &cl->g;
	chunk = kvt_geom_chunk_bytes(g);
	kv = kvt_geom_kv(g);
	layer = (kv * nblocks * chunk + ps - 1) / ps * ps;
	if (g->layers > KVTD_MAX_LAYERS || layer > (UINT64_MAX >> 8) / g->layers)
		return kvti_fail(-E2BIG, "client mem alloc: too large");
	if (!(m = kvt_calloc(1, sizeof(*m))))
		return -ENOMEM;
	m->cl = cl;
	m->device = KVT_DEVICE_HOST;
	m->len = (size_t)(layer * g->layers);
	m->fd = memfd_create("kvtier-kv", MFD_CLOEXEC | MFD_ALLOW_SEALING);
	if (m->fd < 0 || ftruncate(m->fd, (off_t)m->len) ||
	    fcntl(m->fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW |
		  F_SEAL_SEAL)) {
		err = kvti_fail(-errno, "client mem alloc: memfd of %zu bytes: "
				"%s", m->len, strerror(errno));
		goto fail;
	}
	m->map = mmap(NULL, m->len, PROT_READ | PROT_WRITE, MAP_SHARED, m->fd,
		      0);
	if (m->map == MAP_FAILED) {
		m->map = NULL;
		err = kvti_fail(-errno, "client mem alloc: mmap: %s",
				strerror(errno));
		goto fail;
	}
	for (uint32_t l = 0; l < g->layers; l++)
		off[l] = l * layer;
	err = reg_fd(cl, m->fd, off, g->layers, nblocks, chunk, nblocks * chunk,
		     (uint64_t)g->kv_heads * g->head_dim * g->dtype_bytes,
		     (uint64_t)g->head_dim * g->dtype_bytes, -1, &m->id);
	if (err)
		goto fail;
	if (base)
		for (uint32_t l = 0; l < g->layers; l++)
			base[l] = (uint8_t *)m->map + off[l];
	if (block_stride)
		*block_stride = chunk;
	if (kv_stride)
		*kv_stride = nblocks * chunk;
	if (token_stride)
		*token_stride = (uint64_t)g->kv_heads * g->head_dim *
				g->dtype_bytes;
	mem_link(cl, m);
	*out = m;
	return 0;
fail:
	if (m->map)
		munmap(m->map, m->len);
	if (m->fd >= 0)
		close(m->fd);
	kvt_free(m);
	return err;
}

void kvti_client_mem_release(kvt_client_mem *m, int tell)
{
	kvt_client *cl = m->cl;
	kvtd_rd rd;

	if (tell) {
		kvti_client_begin(cl, KVTD_MSG_UNREGISTER);
		kvtd_put_u32(&cl->out, m->id);
		kvti_client_rpc(cl, NULL, 0, &rd); /* a dead daemon has dropped it */
	}
	if (m->map)
		munmap(m->map, m->len);
	if (m->fd >= 0)
		close(m->fd);
	kvt_free(m);
}

void kvt_client_mem_free(kvt_client_mem *m)
{
	kvt_client *cl;

	if (!m)
		return;
	cl = m->cl;
	pthread_mutex_lock(&cl->mu);
	for (kvt_client_mem **p = &cl->mems; *p; p = &(*p)->next)
		if (*p == m) {
			*p = m->next;
			break;
		}
	kvti_client_mem_release(m, 1);
	pthread_mutex_unlock(&cl->mu);
}
