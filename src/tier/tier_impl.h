/*
 * tier_impl.h — what a tier is inside, and the backend contract.
 *
 * A backend fills in a kvt_tier from its spec: it maps or creates the
 * backing store, sets base/bufs/nslots/slot_bytes and the description, and
 * on failure undoes everything it did (tier.c then frees the struct). The
 * common code in tier.c makes the pool and the layout, dispatches the plain
 * read/write path and closes.
 *
 *   member   required  what
 *   open     yes       build the backing store (see above)
 *   close    yes       undo open
 *   read     no        default: memcpy from the page-first slot address,
 *                      or a chunk gather for layer-first tiers
 *   write    no        default: the mirror of read
 */
#ifndef KVT_TIER_IMPL_H
#define KVT_TIER_IMPL_H

#include "core/core.h"

struct tier_ops {
	const char *name;
	int (*open)(kvt_tier *t);
	void (*close)(kvt_tier *t);
	int (*read)(kvt_tier *t, uint32_t slot, void *buf);
	int (*write)(kvt_tier *t, uint32_t slot, const void *buf);
};

struct ssd_file {
	int fd;
	int created;       /* this open created the file */
	int unlinked;      /* 'temp': its name is gone, the fd holds it */
	char path[KVT_PATH_MAX + 32];
};

struct kvt_tier {
	const struct tier_ops *ops;
	kvt_tier_spec spec;
	kvt_geom geom;
	kvt_layout layout;       /* page-first, or layer-first for hbm */
	kvt_pool *pool;
	kvt_tier_desc desc;
	char where[KVT_PATH_MAX];
	char note[256];

	/* memory tiers */
	struct kvti_dev *dev;    /* hbm and wrapped device memory: the device
				    (a reference) */
	void *base;              /* mapping or device allocation */
	size_t map_len;
	void **bufs;             /* layout.nbufs buffer pointers */
	int fd;                  /* file/memfd/devdax backing, -1 if none */
	int created_file;        /* fabric file created by this open */
	int cuda_registered;

	/* ssd */
	struct ssd_file *files;
	uint32_t nfiles;
	int direct;              /* files opened O_DIRECT */
	int any_created;         /* this open created a slot file */
	int dir_fd;              /* the directory, flock'ed: one tier per dir */
	/* ssd 'persist': the record area (kvtier-ssd-index.kvt), mapped */
	int rec_fd;
	void *rec_map;
	size_t rec_len;
	uint32_t rec_bytes;
	uint64_t geom_fp;
};

extern const struct tier_ops kvti_tier_dram_ops;
extern const struct tier_ops kvti_tier_fabric_ops;
extern const struct tier_ops kvti_tier_ssd_ops;
extern const struct tier_ops kvti_tier_hostdev_ops;
extern const struct tier_ops kvti_tier_hbm_ops;

/* The plain path of a tier in GPU memory (hbm, or an engine's wrapped
 * device memory): one cudaMemcpy per chunk between the page-first @buf and
 * the tier's layout. */
int kvti_tier_dev_read(kvt_tier *t, uint32_t slot, void *buf);
int kvti_tier_dev_write(kvt_tier *t, uint32_t slot, const void *buf);

/* Slots that fit in @bytes for the tier's geometry, or a KVT_ESPEC saying
 * why none (or too many) fit. */
int kvti_tier_slots(kvt_tier *t, uint64_t bytes, uint64_t slot_bytes,
		    uint64_t *nslots);
/* The machine's MemTotal in bytes (0 if unknown). */
uint64_t kvti_mem_total(void);
/* Check a NUMA node exists; *cpus gets its CPU count. */
int kvti_numa_node_check(int node, int *cpus);
/* KVT_ESPEC (naming tier spec @what) unless NUMA node @node has @bytes
 * free: memory bound there with MPOL_BIND is never taken from another node,
 * and a fault past the node's end is an OOM kill, so the tier refuses at
 * open instead. */
int kvti_numa_node_fits(const char *what, int node, uint64_t bytes);

#endif
