/*
 * kvtier/tier.h — memory tiers, tier specs and page pools. Included by
 * <kvtier.h>.
 *
 * TIERS, fastest first
 *
 *   kind    backing                         layout      reached by
 *   ------  ------------------------------  ----------  ---------------------
 *   hbm     cudaMalloc (CUDA builds)        layer-first the engine's KV pool
 *           hostdev: host memory stand-in   layer-first tests, sim, demo
 *   fabric  devdax /dev/daxX.Y              page-first  mmap (+cudaHostRegister)
 *           CPU-less NUMA node (CXL)        page-first  mmap + mbind
 *           file or memfd  (EMULATED)       page-first  mmap of the file
 *   dram    anonymous memory                page-first  mmap (+hugepages, NUMA,
 *                                                       mlock, cudaHostRegister)
 *   ssd     preallocated files in a dir     page-first  O_DIRECT pread/pwrite
 *                                                       (io_uring: transfer engine)
 *   remote  (not built yet)                 page-first  -
 *
 * Every tier is an array of fixed-size page *slots* numbered 0..nslots-1,
 * with a page pool (below) that hands them out. A tier knows nothing of the
 * index or of what its pages hold.
 *
 * TIER SPECS
 *
 * One short string, the same in flags (--tiers), the environment
 * (KVT_TIERS) and config files (tiers = ...). Tiers are separated by ',',
 * ';' or blanks; a token that begins with a tier kind and ':' starts the next
 * tier, every other token is an option of the current one:
 *
 *   dram:8G                        8 GiB of anonymous memory
 *   dram:8G,numa=0,hugepages,mlock bound to node 0, explicit 2 MiB pages
 *                                  (error if not reserved), locked
 *   fabric:/dev/dax0.0             a whole devdax device (size from sysfs)
 *   fabric:numa=2,64G              64 GiB on CPU-less node 2
 *   fabric:file=/path,4G           emulated by a shared file mapping
 *   fabric:memfd,4G                emulated by a memfd
 *   ssd:/var/lib/kvtier,100G       files under a directory
 *   hostdev:2G   hbm:40G,device=0  GPU pool stand-in / real GPU pool
 *
 *   option          tiers             meaning
 *   SIZE            all               bytes (K/M/G/T suffixes, powers of 1024)
 *   numa=N          dram, fabric      bind to NUMA node N
 *   hugepages       dram, fabric      explicit hugepages, error if unavailable
 *                                     (on node N with numa=N)
 *   thp / nohuge    dram, fabric      only transparent-hugepage advice / none
 *                                     (default: explicit if reserved, else thp)
 *   mlock           dram, fabric,     lock the pages in memory
 *                   hostdev
 *   populate        dram, fabric,     fault every page in at open
 *                   hostdev
 *   pin             dram, fabric      cudaHostRegister (error without CUDA)
 *   allow-cpus      fabric            accept a NUMA node that has CPUs
 *                                     (then reported as emulated)
 *   file=PATH       fabric            back with a file (emulated)
 *   memfd           fabric            back with a memfd (emulated)
 *   /dev/daxX.Y     fabric            a devdax device
 *   DIR             ssd               directory for the slot files
 *   files=N         ssd               number of files (default 1)
 *   temp            fabric(file), ssd remove the files at close; an ssd
 *                                     tier unlinks them as soon as it is
 *                                     open (a killed process leaves none)
 *   fresh           ssd               discard files of an earlier run
 *   persist         ssd               keep a page record per slot
 *                                     (kvtier-ssd-index.kvt) so the node
 *                                     cache rebuilds its index at the next
 *                                     open (docs/FORMATS.md); not with temp;
 *                                     owns DIR while open (flock: another
 *                                     ssd tier over it is KVT_EBUSY)
 *   device=N        hbm               CUDA device
 *   layout=L        hbm, hostdev      vllm (default) or sglang
 *
 * Errors (KVT_ESPEC, with kvt_errdetail() naming the token): unknown kinds or
 * options, options on the wrong tier, missing or zero sizes, sizes that hold
 * no page, two sizes, paths on memory tiers.
 */
#ifndef KVTIER_TIER_H
#define KVTIER_TIER_H

#include <kvtier.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ------------------------------------------------------------------------
 * Page pools
 *
 * A pool accounts the slots of one tier: O(1) alloc and free, thread-safe
 * (one short spinlock), with occupancy, high/low watermarks and an eviction
 * callback. It holds no page data. Slot ids are 32-bit; KVT_SLOT_NONE is
 * never a valid slot.
 *
 * Watermarks: when an allocation takes occupancy above the high mark, the
 * pool calls evict(pool, want, arg) — outside its lock, in the allocating
 * thread, never recursively — asking the owner to free @want slots, enough
 * to come back down to the low mark. When the pool is empty, alloc calls
 * evict(pool, want >= 1, arg) once and retries; if still empty it returns
 * KVT_EFULL. A pool never blocks waiting for space.
 * ------------------------------------------------------------------------ */
#define KVT_SLOT_NONE UINT32_MAX
#define KVT_POOL_MAX_SLOTS (UINT32_MAX - 1u)

typedef struct kvt_pool kvt_pool;
typedef void (*kvt_pool_evict_fn)(kvt_pool *pool, uint64_t want, void *arg);

typedef struct kvt_pool_stat {
	uint64_t slots;      /* capacity in slots */
	uint64_t used;       /* slots allocated now */
	uint64_t peak;       /* highest 'used' seen */
	uint64_t slot_bytes; /* bytes per slot */
	uint64_t allocs;     /* successful allocations, ever */
	uint64_t frees;      /* successful frees, ever */
	uint64_t full;       /* allocations refused with KVT_EFULL */
	uint64_t evict_calls;/* times the eviction callback ran */
} kvt_pool_stat;

/**
 * kvt_pool_create() - a pool of @nslots slots of @slot_bytes each.
 * Returns 0, -EINVAL for zero sizes, -E2BIG for more than
 * KVT_POOL_MAX_SLOTS slots, -ENOMEM. Free with kvt_pool_destroy().
 */
KVT_API int kvt_pool_create(kvt_pool **out, uint64_t nslots,
			    uint64_t slot_bytes);
KVT_API void kvt_pool_destroy(kvt_pool *p);

/** Take one free slot into *@slot: 0 or KVT_EFULL. Thread-safe. Slots are
 *  handed out lowest-first in a fresh pool; a freed slot is reused first. */
KVT_API int kvt_pool_alloc(kvt_pool *p, uint32_t *slot);
/** Take @n slots at once, all or none: 0 or KVT_EFULL. */
KVT_API int kvt_pool_alloc_n(kvt_pool *p, uint32_t *slots, size_t n);
/** Give a slot back: 0, or -EINVAL if it is out of range or not allocated
 *  (a double free is reported, never corrupts the pool). Thread-safe. */
KVT_API int kvt_pool_free(kvt_pool *p, uint32_t slot);
/** Take a particular free slot (used to rebuild state after a restart):
 *  0, -EINVAL out of range, KVT_EBUSY if already allocated. */
KVT_API int kvt_pool_reserve(kvt_pool *p, uint32_t slot);
/** 1 if @slot is allocated, 0 if free or out of range. */
KVT_API int kvt_pool_is_used(kvt_pool *p, uint32_t slot);

/**
 * kvt_pool_set_watermarks() - fractions of capacity, 0 < low <= high <= 1,
 * and the callback (NULL: none). -EINVAL for bad fractions.
 */
KVT_API int kvt_pool_set_watermarks(kvt_pool *p, double high, double low,
				    kvt_pool_evict_fn evict, void *arg);
KVT_API void kvt_pool_stat_get(kvt_pool *p, kvt_pool_stat *st);
/** Slots in use now (a relaxed read, for accounting). */
KVT_API uint64_t kvt_pool_used(kvt_pool *p);
KVT_API uint64_t kvt_pool_slots(kvt_pool *p);

/* ------------------------------------------------------------------------
 * Tier specs
 * ------------------------------------------------------------------------ */
typedef enum kvt_tier_kind {
	KVT_TIER_HBM = 0,
	KVT_TIER_FABRIC = 1,
	KVT_TIER_DRAM = 2,
	KVT_TIER_SSD = 3,
	KVT_TIER_REMOTE = 4,
	KVT_TIER_COUNT = 5
} kvt_tier_kind;

typedef enum kvt_backing {
	KVT_BACK_ANON = 0,  /* anonymous mmap (dram) */
	KVT_BACK_NUMA,      /* anonymous mmap bound to a NUMA node */
	KVT_BACK_DEVDAX,    /* a /dev/daxX.Y device */
	KVT_BACK_FILE,      /* a shared file mapping (emulation) */
	KVT_BACK_MEMFD,     /* a memfd (emulation) */
	KVT_BACK_DIR,       /* slot files under a directory (ssd) */
	KVT_BACK_CUDA,      /* cudaMalloc */
	KVT_BACK_HOSTDEV,   /* host memory standing in for GPU memory */
	KVT_BACK_NONE,      /* remote: not built */
	KVT_BACK_ENGINE,    /* an engine's own KV memory (kvt_tier_wrap) */
} kvt_backing;

enum kvt_huge_mode {
	KVT_HUGE_AUTO = 0,   /* explicit when reserved pages suffice, else THP */
	KVT_HUGE_EXPLICIT,   /* MAP_HUGETLB or fail */
	KVT_HUGE_THP,        /* madvise(MADV_HUGEPAGE) */
	KVT_HUGE_NONE,       /* neither */
};

#define KVT_PATH_MAX 256

/** One parsed tier spec. A plain value. */
typedef struct kvt_tier_spec {
	kvt_tier_kind kind;
	kvt_backing backing;
	int hostdev;           /* hbm kind served by host memory */
	uint64_t bytes;        /* 0: whole device (devdax only) */
	int numa_node;         /* -1: none */
	int huge;              /* enum kvt_huge_mode */
	int mlock;
	int populate;
	int pin;               /* cudaHostRegister */
	int allow_cpus;
	int temp;
	int fresh;
	int persist;           /* ssd: keep the per-slot record area */
	int device;            /* CUDA device for hbm */
	uint32_t files;        /* ssd files (>= 1) */
	int layout;            /* kvt_layout_kind for hbm/hostdev */
	char path[KVT_PATH_MAX];
	char text[KVT_PATH_MAX]; /* the spec as written, for messages */
} kvt_tier_spec;

/**
 * kvt_tier_spec_parse() - parse a spec string holding one or more tiers.
 * @specs: room for @max specs; *@n receives how many were parsed.
 * Returns 0, KVT_ESPEC (kvt_errdetail() names the token and why), -E2BIG if
 * more than @max tiers are given. Nothing is opened or touched.
 */
KVT_API int kvt_tier_spec_parse(const char *s, kvt_tier_spec *specs,
				size_t max, size_t *n);
/** Write a spec back as a string (canonical order); returns buf. */
KVT_API char *kvt_tier_spec_format(const kvt_tier_spec *s, char *buf,
				   size_t len);

KVT_API const char *kvt_tier_kind_name(kvt_tier_kind k);
KVT_API const char *kvt_backing_name(kvt_backing b);
KVT_API const char *kvt_huge_name(int huge);

/* ------------------------------------------------------------------------
 * Tiers
 * ------------------------------------------------------------------------ */
typedef struct kvt_tier kvt_tier;

/** What a tier is, as kvt_tier_info() reports it. */
typedef struct kvt_tier_desc {
	kvt_tier_kind kind;
	kvt_backing backing;
	int emulated;          /* 1: stands in for hardware this machine lacks */
	int hostdev;           /* hbm served by host memory */
	const char *name;      /* "dram", "fabric", "hostdev", ... */
	const char *where;     /* path, device or node, "" if none */
	uint64_t bytes;        /* bytes mapped or preallocated */
	uint64_t slot_bytes;   /* bytes per page slot (ssd: O_DIRECT-aligned) */
	uint64_t page_bytes;   /* bytes of page data per slot */
	uint64_t nslots;
	int numa_node;         /* -1: not bound */
	int huge;              /* what was obtained: enum kvt_huge_mode */
	int locked;            /* mlock'ed */
	int cuda_registered;   /* cudaHostRegister'ed */
	int layer_first;       /* hbm/hostdev: slots are layer-first pages */
	int persistent;        /* ssd 'persist': keeps a record area
				  (kvt_tier_ssd_records()) */
	const char *note;      /* why emulated, fallbacks taken; "" if none */
} kvt_tier_desc;

/**
 * kvt_tier_open() - build one tier for pages of geometry @g.
 * Maps or creates the backing store, sizes it to whole page slots and makes
 * the pool. hbm/hostdev tiers hold pages layer-first (layout from the spec),
 * all others page-first.
 *
 * Returns 0 and *@out, or: KVT_ESPEC for a spec that cannot be built here
 * (a size holding no page, a NUMA node with CPUs without allow-cpus, a
 * fabric size larger than its node has free, a devdax path that is not
 * one, more memory than the machine has), KVT_ENODEV (no such NUMA node,
 * no GPU), KVT_EBUSY (the devdax device is already another tier's: one
 * tier per device, held with flock(2) until kvt_tier_close()),
 * KVT_ENOTBUILT (CUDA features in a build without CUDA, remote), -ENOSPC
 * (disk full), -ENOMEM, -errno from the system. On failure nothing is left
 * behind: no mapping, no file this call created.
 *
 * fabric:numa=N binds anonymous memory to the node (MPOL_BIND): its pages
 * are never taken from another node. fabric:/dev/daxX.Y maps the device
 * MAP_SHARED from offset 0, its length rounded up to the device's alignment
 * (2 MiB or 1 GiB), and overwrites what was there. docs/FABRIC.md says how
 * both are set up on a CXL machine and what was tested where.
 */
KVT_API int kvt_tier_open(kvt_tier **out, const kvt_tier_spec *spec,
			  const kvt_geom *g);
/**
 * kvt_tier_wrap() - a tier over memory someone else owns: an engine's KV
 * blocks, described by @layout (usually kvt_layout_init_strided()) and its
 * buffers @bufs (layout->nbufs pointers, copied). Kind hbm; host memory
 * (@device < 0, reported as hostdev) or CUDA device memory on @device.
 * Slots are the engine's block ids; the pool accounts nothing for anyone
 * (the engine allocates its blocks). kvt_tier_close() frees only the
 * tier's own bookkeeping, never the memory. Returns 0, -EINVAL (NULL or
 * NULL buffers), KVT_ENOTBUILT (device memory without CUDA), -ENOMEM.
 */
KVT_API int kvt_tier_wrap(kvt_tier **out, const kvt_layout *layout,
			  void *const *bufs, int device);

/** Unmap, close, remove temp files, free. NULL is fine. */
KVT_API void kvt_tier_close(kvt_tier *t);

KVT_API void kvt_tier_info(const kvt_tier *t, kvt_tier_desc *d);
KVT_API kvt_pool *kvt_tier_pool(kvt_tier *t);
KVT_API kvt_tier_kind kvt_tier_kind_of(const kvt_tier *t);
KVT_API const kvt_geom *kvt_tier_geom(const kvt_tier *t);

/**
 * kvt_tier_layout() - the layout of the tier's slots: page-first for host
 * tiers and ssd, layer-first (vLLM or SGLang) for hbm and hostdev.
 */
KVT_API const kvt_layout *kvt_tier_layout(const kvt_tier *t);
/**
 * kvt_tier_bufs() - base pointers of the layout's buffers, nbufs of them;
 * NULL for ssd (no mapping). hbm: device pointers.
 */
KVT_API void *const *kvt_tier_bufs(const kvt_tier *t);
/** Address of page slot @slot on a mapped page-first tier; NULL for ssd,
 *  layer-first tiers and slots out of range. */
KVT_API void *kvt_tier_slot_ptr(const kvt_tier *t, uint32_t slot);
/**
 * kvt_tier_ssd_loc() - file descriptor (opened O_DIRECT) and offset of an
 * ssd slot, for the transfer engine. -EINVAL for other tiers or slots out
 * of range. The fd is owned by the tier.
 */
KVT_API int kvt_tier_ssd_loc(const kvt_tier *t, uint32_t slot, int *fd,
			     uint64_t *off);

/**
 * kvt_tier_ssd_records() - the record area of an ssd tier opened with
 * 'persist': one record of *@rec_bytes bytes per slot, slot s at
 * (char *)*@recs + s * *@rec_bytes, mapped shared from
 * DIR/kvtier-ssd-index.kvt (all zero when nothing was recorded). The
 * tier only keeps the area with its slot files (fresh files, fresh area;
 * a mismatching area is refused at open; msync at close); what a record
 * holds is its user's (the node cache: docs/FORMATS.md). *@geom_fp is the
 * fingerprint of the tier's geometry (shape and model name) that the area's
 * header carries. Valid until kvt_tier_close(). Returns 0, or -EINVAL for a
 * tier without a record area.
 */
#define KVT_SSD_REC_BYTES(layers) \
	((((uint64_t)(layers) * 8u + 88u) + 63u) & ~(uint64_t)63u)
KVT_API int kvt_tier_ssd_records(kvt_tier *t, void **recs,
				 uint32_t *rec_bytes, uint64_t *geom_fp);

/**
 * kvt_tier_read() / kvt_tier_write() - the plain path: copy one whole page
 * (page_bytes, in page-first order) between @buf and slot @slot. Works on
 * every tier (ssd by pread/pwrite, with a bounce buffer when @buf is not
 * aligned for O_DIRECT; layer-first tiers gather/scatter the chunks).
 * Slower paths than the transfer engine's, and always correct. The slot
 * need not be allocated in the pool (the caller owns that bookkeeping).
 * Returns 0, -ERANGE for a bad slot, -EIO on a short transfer, -errno.
 * Thread-safe for distinct slots.
 */
KVT_API int kvt_tier_read(kvt_tier *t, uint32_t slot, void *buf);
KVT_API int kvt_tier_write(kvt_tier *t, uint32_t slot, const void *buf);

/* ------------------------------------------------------------------------
 * The machine
 * ------------------------------------------------------------------------ */
#define KVT_MAX_NODES 64
#define KVT_MAX_DAX 16
#define KVT_MAX_GPUS 16

/** What this machine offers to kvtier (kvt_probe()). */
typedef struct kvt_machine {
	uint64_t mem_total;            /* bytes of RAM (MemTotal) */
	uint64_t mem_available;        /* MemAvailable */
	int cpus;                      /* online CPUs */
	int numa_available;            /* libnuma works */
	int nnodes;
	struct {
		int id;
		int cpus;                  /* 0: CPU-less (CXL-like) */
		uint64_t mem_total, mem_free;
	} nodes[KVT_MAX_NODES];
	int ndax;
	struct {
		char path[64];
		uint64_t size;
		uint64_t align;
		int target_node;           /* the node its memory belongs to */
		char mode[16];             /* "devdax" (device_dax: usable as
					      fabric:/dev/daxX.Y), "system-ram"
					      (kmem: onlined into target_node,
					      use fabric:numa=N), "" unbound */
	} dax[KVT_MAX_DAX];
	uint64_t hugepage_bytes;       /* default hugepage size, 0 if none */
	uint64_t hugepages_total, hugepages_free;
	char thp[32];                  /* transparent hugepages: "madvise", ... */
	int cuda_built;                /* this build has CUDA */
	int ngpus;
	struct {
		char name[96];
		uint64_t mem;
		int cc_major, cc_minor;
	} gpus[KVT_MAX_GPUS];
	char cuda_note[128];           /* why no GPU, if none */
	int io_uring;                  /* io_uring_queue_init() works */
	char io_uring_note[128];
} kvt_machine;

/** Probe the machine. Never fails: what cannot be read is reported absent. */
KVT_API void kvt_probe(kvt_machine *m);

#ifdef __cplusplus
}
#endif

#endif /* KVTIER_TIER_H */
