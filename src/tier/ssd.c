/*
 * ssd.c — the ssd tier: page slots in preallocated files under a directory.
 *
 * Slots are striped over the files (slot s lives in file s % nfiles at
 * index s / nfiles) so sequential slots spread over files. Each slot is the
 * page rounded up to KVT_SSD_ALIGN bytes, so every slot can be read or
 * written with O_DIRECT in one call. Each file starts with a 4 KiB header:
 *
 *   OFFSET  SIZE  DESCRIPTION
 *   0       8     magic "KVTSSD01"
 *   8       4     format version (1), little endian
 *   12      4     index of this file
 *   16      4     number of files in the set
 *   20      4     reserved (0)
 *   24      8     slot bytes (page bytes rounded up to 4096)
 *   32      8     slots in this file
 *   40      8     page bytes
 *   48      64    geometry name, NUL padded
 *   112     3984  zero
 *   4096    ...   slot 0, slot 1, ... of this file
 *
 * Opening a directory that holds a matching set reuses it (its data stays;
 * which slots hold what is the index's business, not this file's). A set
 * that does not match is refused unless the spec says 'fresh'. Files this
 * open created are removed if it fails. With 'temp' their names are
 * removed as soon as the open succeeds (the open fds keep the files until
 * close), so not even a SIGKILL leaves a temporary tier's data on disk;
 * whoever needs such a file afterwards reaches it through its fd
 * (kvt_tier_ssd_loc(), /proc/PID/fd/N). The plain path here is
 * pread/pwrite; the transfer engine drives the same files through
 * io_uring (kvt_tier_ssd_loc()).
 *
 * THE RECORD AREA ('persist'). One more file, kvtier-ssd-index.kvt, holds
 * a record of R bytes per slot (R = KVT_SSD_REC_BYTES(layers)) after a
 * 4 KiB header:
 *
 *   OFFSET  SIZE  DESCRIPTION
 *   0       8     magic "KVTSSDIX"
 *   8       4     format version (1), little endian
 *   12      4     record bytes R
 *   16      8     slots (all files)
 *   24      8     page bytes
 *   32      4     layers
 *   36      4     reserved (0)
 *   40      8     geometry fingerprint (kvt_tier_ssd_records())
 *   48      64    geometry name, NUL padded
 *   112     3984  zero
 *   4096    ...   record of slot 0, slot 1, ... (all zero: no record)
 *
 * The tier reserves the file's space (so a store into the mapping never
 * meets a full disk as SIGBUS), maps it shared and hands it out; what a
 * record says is the cache's business (src/cache/persist.c, FORMATS.md).
 * The area goes with the data: slot files created by this open (new,
 * 'fresh', or a set that was not there) mean an empty area; an area whose
 * header does not match is refused like a set that does not match. A
 * directory opened *without* 'persist' loses its area at open: that run
 * writes slots without keeping their records, so none could be trusted.
 */
#include "tier/tier_impl.h"
#include "xfer/xxh.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#define KVT_SSD_ALIGN 4096u
#define KVT_SSD_HEADER 4096u
#define KVT_SSD_MAGIC "KVTSSD01"
#define KVT_SSD_VERSION 1u
#define KVT_SSD_IX_MAGIC "KVTSSDIX"
#define KVT_SSD_IX_VERSION 1u
#define KVT_SSD_IX_NAME "kvtier-ssd-index.kvt"

struct ssd_header {
	char magic[8];
	uint32_t version, index, count, reserved;
	uint64_t slot_bytes, slots, page_bytes;
	char geom[64];
};

struct ssd_ix_header {
	char magic[8];
	uint32_t version, rec_bytes;
	uint64_t slots, page_bytes;
	uint32_t layers, reserved;
	uint64_t geom_fp;
	char geom[64];
};

static uint64_t file_slots(const kvt_tier *t, uint32_t f)
{
	uint64_t n = t->desc.nslots;
	return n / t->nfiles + (f < n % t->nfiles ? 1 : 0);
}

static void ssd_unlock_dir(kvt_tier *t)
{
	if (t->dir_fd >= 0) {
		close(t->dir_fd); /* and its lock */
		t->dir_fd = -1;
	}
}

static void ssd_close(kvt_tier *t)
{
	if (t->rec_map) {
		/* a clean close leaves records and data on the device */
		msync(t->rec_map, t->rec_len, MS_SYNC);
		munmap(t->rec_map, t->rec_len);
		t->rec_map = NULL;
	}
	if (t->rec_fd >= 0) {
		fdatasync(t->rec_fd);
		close(t->rec_fd);
		t->rec_fd = -1;
	}
	for (uint32_t f = 0; f < t->nfiles; f++) {
		struct ssd_file *sf = &t->files[f];

		if (sf->fd >= 0) {
			if (t->spec.persist)
				fdatasync(sf->fd);
			close(sf->fd);
		}
		if (!sf->unlinked &&
		    (sf->created || (t->spec.temp && sf->path[0])))
			unlink(sf->path);
	}
	kvt_free(t->files);
	t->files = NULL;
	t->nfiles = 0;
	ssd_unlock_dir(t);
	if (t->created_file && (t->spec.temp || !t->pool))
		rmdir(t->spec.path); /* only if we made it; fails if not empty */
}

static int ssd_header_write(kvt_tier *t, struct ssd_file *sf, uint32_t f)
{
	struct ssd_header *h;
	ssize_t n;
	int err = 0;

	h = kvti_aligned_alloc(KVT_SSD_ALIGN, KVT_SSD_HEADER);
	if (!h)
		return -ENOMEM;
	memset(h, 0, KVT_SSD_HEADER);
	memcpy(h->magic, KVT_SSD_MAGIC, 8);
	h->version = KVT_SSD_VERSION;
	h->index = f;
	h->count = t->nfiles;
	h->slot_bytes = t->desc.slot_bytes;
	h->slots = file_slots(t, f);
	h->page_bytes = kvt_geom_page_bytes(&t->geom);
	kvti_strlcpy(h->geom, t->geom.name, sizeof(h->geom));
	n = pwrite(sf->fd, h, KVT_SSD_HEADER, 0);
	if (n != KVT_SSD_HEADER)
		err = kvti_fail(n < 0 ? -errno : -EIO, "%s: writing header: %s",
				sf->path, n < 0 ? strerror(errno) : "short write");
	else if (fdatasync(sf->fd) < 0)
		err = kvti_fail(-errno, "%s: fdatasync: %s", sf->path,
				strerror(errno));
	kvt_free(h);
	return err;
}

/* 0: header matches; 1: file empty (new); KVT_ECORRUPT: another set. */
static int ssd_header_check(kvt_tier *t, struct ssd_file *sf, uint32_t f)
{
	struct ssd_header *h;
	ssize_t n;
	int err = 0;

	h = kvti_aligned_alloc(KVT_SSD_ALIGN, KVT_SSD_HEADER);
	if (!h)
		return -ENOMEM;
	n = pread(sf->fd, h, KVT_SSD_HEADER, 0);
	if (n == 0) {
		err = 1;
	} else if (n != KVT_SSD_HEADER || memcmp(h->magic, KVT_SSD_MAGIC, 8)) {
		err = kvti_fail(KVT_ECORRUPT, "%s exists and is not a kvtier ssd "
				"file; add 'fresh' to the spec to replace it",
				sf->path);
	} else if (h->version != KVT_SSD_VERSION || h->index != f ||
		   h->count != t->nfiles ||
		   h->slot_bytes != t->desc.slot_bytes ||
		   h->slots != file_slots(t, f) ||
		   h->page_bytes != kvt_geom_page_bytes(&t->geom)) {
		char name[sizeof(h->geom) + 1];

		/* it may be anything: another program's file, a torn write */
		kvti_printable(name, sizeof(name), h->geom, sizeof(h->geom));
		err = kvti_fail(KVT_ECORRUPT, "%s holds another set (file %u of "
				"%u, %llu slots of %llu bytes, geometry '%s'); "
				"add 'fresh' to the spec to replace it", sf->path,
				h->index, h->count, (unsigned long long)h->slots,
				(unsigned long long)h->slot_bytes, name);
	}
	kvt_free(h);
	return err;
}

static int ssd_open_file(kvt_tier *t, uint32_t f, uint64_t len)
{
	struct ssd_file *sf = &t->files[f];
	int flags = O_RDWR | O_CLOEXEC | (t->direct ? O_DIRECT : 0);
	struct stat st;
	int err;

	int existed;

	snprintf(sf->path, sizeof(sf->path), "%s/kvtier-ssd-%03u.kvt",
		 t->spec.path, f);
	if (t->spec.fresh)
		unlink(sf->path);
	existed = access(sf->path, F_OK) == 0;
	sf->fd = open(sf->path, flags | O_CREAT | O_EXCL, 0600);
	if (sf->fd >= 0)
		sf->created = t->any_created = 1;
	else if (errno == EEXIST)
		sf->fd = open(sf->path, flags);
	if (sf->fd < 0 && errno == EINVAL && t->direct) {
		/* the filesystem refuses O_DIRECT (tmpfs): say so, go on */
		t->direct = 0;
		if (!existed)
			unlink(sf->path); /* some kernels create it first */
		kvti_warn("%s: O_DIRECT not supported here; ssd tier uses "
			  "buffered I/O", t->spec.path);
		snprintf(t->note, sizeof(t->note),
			 "O_DIRECT unsupported by this filesystem: buffered I/O");
		return ssd_open_file(t, f, len);
	}
	if (sf->fd < 0)
		return kvti_fail(-errno, "%s: %s", sf->path, strerror(errno));
	if (fstat(sf->fd, &st) < 0 || !S_ISREG(st.st_mode))
		return kvti_fail(KVT_ESPEC, "%s is not a regular file", sf->path);
	err = ssd_header_check(t, sf, f);
	if (err < 0)
		return err;
	if (err == 1) { /* new file: reserve the space, then the header */
		int e;

		do /* a signal stops a long fallocate: go on */
			e = kvti_fault() ? ENOSPC :
					   posix_fallocate(sf->fd, 0, (off_t)len);
		while (e == EINTR);
		if (e) {
			char a[32];
			return kvti_fail(-e, "%s: reserving %s: %s", sf->path,
					 kvt_size_format(len, a, sizeof(a)),
					 strerror(e));
		}
		return ssd_header_write(t, sf, f);
	}
	/* a matching header on a file cut short (truncated, a copy that
	 * stopped): its slots past the end would read as nothing and write
	 * into space never reserved */
	if ((uint64_t)st.st_size < len) {
		char a[32], b[32];

		return kvti_fail(KVT_ECORRUPT, "%s is %s, shorter than the %s its "
				 "header says (truncated?); add 'fresh' to the "
				 "spec to replace it", sf->path,
				 kvt_size_format((uint64_t)st.st_size, a,
						 sizeof(a)),
				 kvt_size_format(len, b, sizeof(b)));
	}
	return 0;
}

/* ---- the record area ('persist') ------------------------------------------ */

/* What a record of this tier's pages must match: every field of the KV
 * shape and the model's name (two models of one shape hold different
 * pages). */
static uint64_t ssd_geom_fp(const kvt_geom *g)
{
	uint32_t v[10] = { g->layers, g->kv_heads_total, g->kv_heads,
			   g->head_dim, g->dtype_bytes, g->page_tokens,
			   g->tp_size, g->tp_rank, g->mla, KVT_SSD_IX_VERSION };
	uint64_t h = XXH3_64bits(v, sizeof(v));

	return XXH3_64bits_withSeed(g->name, strnlen(g->name, sizeof(g->name)),
				    h);
}

static void ssd_ix_path(const kvt_tier *t, char *p, size_t n)
{
	snprintf(p, n, "%s/" KVT_SSD_IX_NAME, t->spec.path);
}

static void ssd_ix_fill(const kvt_tier *t, struct ssd_ix_header *h)
{
	memset(h, 0, sizeof(*h));
	memcpy(h->magic, KVT_SSD_IX_MAGIC, 8);
	h->version = KVT_SSD_IX_VERSION;
	h->rec_bytes = t->rec_bytes;
	h->slots = t->desc.nslots;
	h->page_bytes = kvt_geom_page_bytes(&t->geom);
	h->layers = t->geom.layers;
	h->geom_fp = t->geom_fp;
	kvti_strlcpy(h->geom, t->geom.name, sizeof(h->geom));
}

/* A new, empty area: header, zeroed records, space reserved; made under
 * a temporary name and renamed into place, so a crash while making it
 * leaves no half-made area. Opens t->rec_fd on it. */
static int ssd_ix_create(kvt_tier *t, const char *path)
{
	struct ssd_ix_header h;
	unsigned char blk[KVT_SSD_HEADER];
	char tmp[KVT_PATH_MAX + 40];
	int e, err = 0;

	snprintf(tmp, sizeof(tmp), "%s.new", path);
	unlink(tmp);
	t->rec_fd = open(tmp, O_RDWR | O_CLOEXEC | O_CREAT | O_EXCL, 0600);
	if (t->rec_fd < 0)
		return kvti_fail(-errno, "%s: %s", tmp, strerror(errno));
	if (ftruncate(t->rec_fd, (off_t)t->rec_len) < 0) {
		err = kvti_fail(-errno, "%s: %s", tmp, strerror(errno));
		goto fail;
	}
	do
		e = kvti_fault() ? ENOSPC :
				   posix_fallocate(t->rec_fd, 0, (off_t)t->rec_len);
	while (e == EINTR);
	if (e) {
		err = kvti_fail(-e, "%s: reserving %llu bytes: %s", tmp,
				(unsigned long long)t->rec_len, strerror(e));
		goto fail;
	}
	ssd_ix_fill(t, &h);
	memset(blk, 0, sizeof(blk));
	memcpy(blk, &h, sizeof(h));
	if (pwrite(t->rec_fd, blk, sizeof(blk), 0) != (ssize_t)sizeof(blk)) {
		err = kvti_fail(-EIO, "%s: writing header: %s", tmp,
				strerror(errno));
		goto fail;
	}
	if (fdatasync(t->rec_fd) < 0 || rename(tmp, path) < 0) {
		err = kvti_fail(-errno, "%s: %s", tmp, strerror(errno));
		goto fail;
	}
	return 0;
fail:
	close(t->rec_fd);
	t->rec_fd = -1;
	unlink(tmp);
	return err;
}

/* 0: the existing area matches; KVT_ECORRUPT: refused, said why. */
static int ssd_ix_check(kvt_tier *t, const char *path)
{
	struct ssd_ix_header h, want;
	struct stat st;
	char name[sizeof(h.geom) + 1];

	if (pread(t->rec_fd, &h, sizeof(h), 0) != (ssize_t)sizeof(h) ||
	    memcmp(h.magic, KVT_SSD_IX_MAGIC, 8))
		return kvti_fail(KVT_ECORRUPT, "%s exists and is not a kvtier "
				 "page index; add 'fresh' to the spec to "
				 "replace it", path);
	if (h.version != KVT_SSD_IX_VERSION)
		return kvti_fail(KVT_ECORRUPT, "%s: page index format version "
				 "%u, this build reads %u; add 'fresh' to the "
				 "spec to start over", path, h.version,
				 KVT_SSD_IX_VERSION);
	ssd_ix_fill(t, &want);
	kvti_printable(name, sizeof(name), h.geom, sizeof(h.geom));
	if (h.geom_fp != want.geom_fp || h.layers != want.layers ||
	    h.page_bytes != want.page_bytes || h.rec_bytes != want.rec_bytes)
		return kvti_fail(KVT_ECORRUPT, "%s: pages of another geometry "
				 "('%s', %u layers, %llu-byte pages; this open: "
				 "'%s', %u layers, %llu-byte pages); add 'fresh' "
				 "to the spec to start over", path, name,
				 h.layers, (unsigned long long)h.page_bytes,
				 t->geom.name, want.layers,
				 (unsigned long long)want.page_bytes);
	if (h.slots != want.slots)
		return kvti_fail(KVT_ECORRUPT, "%s: %llu slots, this open has "
				 "%llu; add 'fresh' to the spec to start over",
				 path, (unsigned long long)h.slots,
				 (unsigned long long)want.slots);
	if (fstat(t->rec_fd, &st) < 0 || (uint64_t)st.st_size < t->rec_len)
		return kvti_fail(KVT_ECORRUPT, "%s is shorter than its header "
				 "says (truncated?); add 'fresh' to the spec to "
				 "start over", path);
	return 0;
}

/* Open (or make) the record area, or remove it without 'persist'. */
static int ssd_ix_open(kvt_tier *t)
{
	char path[KVT_PATH_MAX + 32];
	int err = 0;

	ssd_ix_path(t, path, sizeof(path));
	if (!t->spec.persist) {
		if (unlink(path) == 0)
			kvti_warn("%s: removed the page index of an earlier run "
				  "(this open has no 'persist')", path);
		return 0;
	}
	t->rec_bytes = KVT_SSD_REC_BYTES(t->geom.layers);
	t->geom_fp = ssd_geom_fp(&t->geom);
	t->rec_len = KVT_SSD_HEADER + t->desc.nslots * t->rec_bytes;
	if (t->spec.fresh || t->any_created)
		unlink(path); /* no data of an earlier run: no records */
	t->rec_fd = open(path, O_RDWR | O_CLOEXEC);
	if (t->rec_fd < 0 && errno != ENOENT)
		return kvti_fail(-errno, "%s: %s", path, strerror(errno));
	if (t->rec_fd < 0) {
		if (!t->any_created)
			kvti_warn("%s: no page index of an earlier run: the ssd "
				  "tier starts empty", path);
		err = ssd_ix_create(t, path);
	} else {
		err = ssd_ix_check(t, path);
	}
	if (err)
		return err;
	t->rec_map = mmap(NULL, t->rec_len, PROT_READ | PROT_WRITE, MAP_SHARED,
			  t->rec_fd, 0);
	if (t->rec_map == MAP_FAILED) {
		t->rec_map = NULL;
		return kvti_fail(-errno, "%s: mmap: %s", path, strerror(errno));
	}
	return 0;
}

int kvt_tier_ssd_records(kvt_tier *t, void **recs, uint32_t *rec_bytes,
			 uint64_t *geom_fp)
{
	if (t->spec.kind != KVT_TIER_SSD || !t->rec_map)
		return kvti_fail(-EINVAL, "tier %s keeps no page records (an "
				 "ssd tier with 'persist' does)",
				 t->ops ? t->ops->name : "?");
	*recs = (char *)t->rec_map + KVT_SSD_HEADER;
	*rec_bytes = t->rec_bytes;
	*geom_fp = t->geom_fp;
	return 0;
}

/* A persistent tier owns its directory (flock LOCK_EX, held until close):
 * another tier over it (another process, or another cache in this one)
 * would overwrite its slots, and without 'persist' remove its records.
 * Plain tiers take LOCK_SH: they still may share a directory with each
 * other as before, but not with a persistent one. */
static int ssd_lock_dir(kvt_tier *t)
{
	int e;

	t->dir_fd = open(t->spec.path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (t->dir_fd < 0)
		return kvti_fail(-errno, "tier spec '%s': directory %s: %s",
				 t->spec.text, t->spec.path, strerror(errno));
	if (flock(t->dir_fd, (t->spec.persist ? LOCK_EX : LOCK_SH) |
			     LOCK_NB) == 0)
		return 0;
	e = errno;
	ssd_unlock_dir(t);
	if (t->created_file)
		rmdir(t->spec.path);
	return kvti_fail(e == EWOULDBLOCK ? KVT_EBUSY : -e,
			 "tier spec '%s': %s is in use by %s ssd tier (a "
			 "persistent tier owns its directory; engines share "
			 "it through one process)", t->spec.text, t->spec.path,
			 t->spec.persist ? "another" : "a persistent");
}

static int ssd_open(kvt_tier *t)
{
	uint64_t page = kvt_geom_page_bytes(&t->geom), slot, nslots, need;
	struct statvfs vfs;
	struct stat st;
	char a[32], b[32];
	int err;

	t->rec_fd = t->dir_fd = -1;
	slot = KVT_ALIGN_UP(page, KVT_SSD_ALIGN);
	if ((err = kvti_tier_slots(t, t->spec.bytes, slot, &nslots)))
		return err;
	if (t->spec.files > nslots)
		return kvti_fail(KVT_ESPEC, "tier spec '%s': %u files for %llu "
				 "slots", t->spec.text, t->spec.files,
				 (unsigned long long)nslots);
	if (stat(t->spec.path, &st) < 0) {
		if (errno != ENOENT || mkdir(t->spec.path, 0700) < 0)
			return kvti_fail(-errno, "tier spec '%s': directory %s: "
					 "%s", t->spec.text, t->spec.path,
					 strerror(errno));
		t->created_file = 1; /* the directory: removed if we fail */
	} else if (!S_ISDIR(st.st_mode)) {
		return kvti_fail(KVT_ESPEC, "tier spec '%s': %s is not a "
				 "directory", t->spec.text, t->spec.path);
	}
	if ((err = ssd_lock_dir(t)))
		return err;
	t->desc.nslots = nslots;
	t->desc.slot_bytes = slot;
	t->nfiles = t->spec.files;
	need = nslots * slot + (uint64_t)t->nfiles * KVT_SSD_HEADER;
	if (statvfs(t->spec.path, &vfs) == 0 && !t->spec.fresh) {
		uint64_t avail = (uint64_t)vfs.f_bavail * vfs.f_frsize;
		/* files of an earlier run already hold their space */
		int reuse = 1;
		for (uint32_t f = 0; f < t->nfiles && reuse; f++) {
			char p[KVT_PATH_MAX + 32];
			snprintf(p, sizeof(p), "%s/kvtier-ssd-%03u.kvt",
				 t->spec.path, f);
			reuse = access(p, F_OK) == 0;
		}
		if (!reuse && avail < need) {
			ssd_unlock_dir(t);
			if (t->created_file)
				rmdir(t->spec.path);
			return kvti_fail(-ENOSPC, "tier spec '%s': needs %s in %s "
					 "but only %s is free", t->spec.text,
					 kvt_size_format(need, a, sizeof(a)),
					 t->spec.path,
					 kvt_size_format(avail, b, sizeof(b)));
		}
	}
	t->files = kvt_calloc(t->nfiles, sizeof(*t->files));
	if (!t->files) {
		ssd_unlock_dir(t);
		if (t->created_file)
			rmdir(t->spec.path);
		return -ENOMEM;
	}
	for (uint32_t f = 0; f < t->nfiles; f++)
		t->files[f].fd = -1;
	t->direct = 1;
	for (uint32_t f = 0; f < t->nfiles; f++) {
		err = ssd_open_file(t, f, KVT_SSD_HEADER + file_slots(t, f) * slot);
		if (err) {
			kvti_errctx("tier spec '%s'", t->spec.text);
			ssd_close(t);
			return err;
		}
	}
	if ((err = ssd_ix_open(t))) {
		kvti_errctx("tier spec '%s'", t->spec.text);
		ssd_close(t);
		return err;
	}
	for (uint32_t f = 0; f < t->nfiles; f++) {
		struct ssd_file *sf = &t->files[f];

		sf->created = 0; /* from now on they are the tier's data */
		/* 'temp': the name goes now, the fd keeps the file, so a
		 * process killed before its close leaves no data behind */
		if (t->spec.temp && unlink(sf->path) == 0)
			sf->unlinked = 1;
	}
	t->desc.bytes = nslots * slot;
	t->desc.persistent = t->rec_map != NULL;
	snprintf(t->where, sizeof(t->where), "%.200s (%u file%s%s%s)",
		 t->spec.path, t->nfiles, t->nfiles == 1 ? "" : "s",
		 t->direct ? ", O_DIRECT" : "",
		 t->rec_map ? ", persistent" : "");
	err = kvt_layout_init(&t->layout, KVT_LAYOUT_PAGE_FIRST, &t->geom,
			      nslots);
	if (err)
		ssd_close(t);
	return err;
}

int kvt_tier_ssd_loc(const kvt_tier *t, uint32_t slot, int *fd,
		     uint64_t *off)
{
	if (t->spec.kind != KVT_TIER_SSD || slot >= t->desc.nslots)
		return -EINVAL;
	*fd = t->files[slot % t->nfiles].fd;
	*off = KVT_SSD_HEADER + (uint64_t)(slot / t->nfiles) * t->desc.slot_bytes;
	return 0;
}

/* One whole-slot transfer; @buf must be aligned and slot_bytes long. */
static int ssd_io(kvt_tier *t, uint32_t slot, void *buf, int write)
{
	uint64_t off, n = t->desc.slot_bytes, done = 0;
	int fd;

	kvt_tier_ssd_loc(t, slot, &fd, &off);
	while (done < n) {
		ssize_t r = write ? pwrite(fd, (char *)buf + done, n - done,
					   (off_t)(off + done)) :
				    pread(fd, (char *)buf + done, n - done,
					  (off_t)(off + done));
		if (r < 0) {
			if (errno == EINTR)
				continue;
			return kvti_fail(-errno, "ssd slot %u: %s: %s", slot,
					 write ? "pwrite" : "pread",
					 strerror(errno));
		}
		if (r == 0)
			return kvti_fail(-EIO, "ssd slot %u: short %s (%llu of "
					 "%llu bytes)", slot,
					 write ? "write" : "read",
					 (unsigned long long)done,
					 (unsigned long long)n);
		done += (uint64_t)r;
	}
	return 0;
}

static int ssd_rw(kvt_tier *t, uint32_t slot, void *buf, int write)
{
	uint64_t page = kvt_geom_page_bytes(&t->geom);
	void *bounce;
	int err;

	if (((uintptr_t)buf % KVT_SSD_ALIGN) == 0 && page == t->desc.slot_bytes)
		return ssd_io(t, slot, buf, write);
	bounce = kvti_aligned_alloc(KVT_SSD_ALIGN, t->desc.slot_bytes);
	if (!bounce)
		return -ENOMEM;
	if (write) {
		memcpy(bounce, buf, page);
		memset((char *)bounce + page, 0, t->desc.slot_bytes - page);
	}
	err = ssd_io(t, slot, bounce, write);
	if (!err && !write)
		memcpy(buf, bounce, page);
	kvt_free(bounce);
	return err;
}

static int ssd_read(kvt_tier *t, uint32_t slot, void *buf)
{
	return ssd_rw(t, slot, buf, 0);
}

static int ssd_write(kvt_tier *t, uint32_t slot, const void *buf)
{
	return ssd_rw(t, slot, (void *)buf, 1);
}

const struct tier_ops kvti_tier_ssd_ops = {
	.name = "ssd",
	.open = ssd_open,
	.close = ssd_close,
	.read = ssd_read,
	.write = ssd_write,
};
