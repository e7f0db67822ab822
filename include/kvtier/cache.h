/*
 * kvtier/cache.h — the node cache, as an inference engine uses it.
 * Included by <kvtier.h>.
 *
 * An engine (vLLM, SGLang, the demo, the daemon on an engine's behalf)
 * owns its GPU KV memory and its block ids. kvtier owns the tiers below it
 * (fabric, dram, ssd; a remote tier below them: end of this file) and the
 * index over them. The cache is
 * the glue: the engine registers its KV memory once, then asks
 *
 *     lookup(keys)               how many leading pages kvtier can supply,
 *                                by tier, and how many are still landing
 *     load(keys -> blocks)       copy pages into the engine's blocks,
 *                                layer by layer, verified       (async job)
 *     store(blocks -> keys)      copy computed pages out of the engine's
 *                                blocks into the owned tiers, the
 *                                fastest that has room first
 *                                                               (async job)
 *
 *   engine KV memory (registered, never allocated by kvtier)
 *   per layer l: base[l] + block*block_stride + kv*kv_stride + t*token_stride
 *        ^   load: one transfer job per source tier,  |  store: one job
 *        |   layer l ready = layer l of every block   |  into the top tier,
 *        |   landed AND verified                      v  per-layer sums taken
 *   +---------+   background demotion   +--------+   background   +-------+
 *   | fabric  | ----------------------> |  dram  | -------------> |  ssd  |
 *   +---------+   (watermarks, off the  +--------+                +-------+
 *                 critical path)
 *
 * KEYS. Pages are named by 128-bit keys (kvt_page_key): an engine's chained
 * block hashes, or kvt_cache_hash_tokens() of its token ids (XXH3-128
 * chained over the previous key and the page's tokens, seeded with the
 * tenant's salt: the same tokens give the same keys in every process and
 * after every restart; two tenants never share a page). A call names a
 * prefix by all its keys from the start, keys[0..nkeys), because a page's
 * key stands for everything before it.
 *
 * CHECKSUMS, LAYER BY LAYER. Every page copy in an owned tier carries one
 * XXH3-64 per layer, taken over that layer's K and V chunks in page-first
 * byte order (the same value wherever the page lives). A store takes the
 * sums of what it copies (host engine memory: what landed in the tier;
 * device memory: the engine's blocks, hashed on the device); every
 * demotion verifies what landed against them; a load verifies, per layer,
 * the bytes that landed in the engine's memory — on the CPU for host
 * memory, by a checksum kernel on the device for device memory (the same
 * XXH3-64 bit for bit, src/dev/xxh3.h: no CPU thread reads a page byte on
 * the way to a GPU, ssd loads included). So layer l is reported ready as
 * soon as layer l is verified; the whole page need not be. A page that
 * fails is reported in the job's failed-block list (the engine recomputes
 * it) and the failing copy is marked bad: never served again, and out of
 * the index at once (the page no longer counts it as a copy, its slot is
 * back in its pool). The same holds for every copy that fails to land — a
 * demotion to a full disk, a store's write — so errors cost the copies,
 * never the room.
 *
 * COMMIT. A page becomes visible to lookup and load only once its bytes
 * are in place and summed: a store in progress, a cancelled store and a
 * copy whose demotion is still moving are never served. Pages of a store in
 * progress are reported as in flight.
 *
 * EVICTION OFF THE CRITICAL PATH. A background thread keeps every owned
 * tier under its high watermark: it demotes the least recently used pages
 * down (fabric -> dram -> ssd -> gone) to the low watermark, copying
 * without holding the cache's lock. A store finds free slots in the common
 * case and waits on nothing. When the top tier is full anyway (a burst
 * faster than demotion), the store's own job demotes: the index decides
 * under the cache's lock, and the cache's room thread runs the copies
 * after the lock is dropped, waits until no demotion copy still reads the
 * store's fresh slots, and only then submits the store's transfers. The
 * storing thread waits for none of it: kvt_cache_store() returns at once,
 * and the job is done later by that much. That wait is measured
 * (kvt_cache_job_stat.wait_s).
 *
 * PERSISTENCE. With an ssd tier opened 'persist' (ssd:DIR,SIZE,persist)
 * the ssd tier and its part of the index survive a restart: each ssd slot
 * has a record (page key, parent key, tenant and salt, depth, geometry
 * fingerprint, layer sums, generation, checksum) written once the page's
 * bytes are in place and verified, and zeroed before the slot is written
 * again or when the page leaves. kvt_cache_open() reads the records and
 * puts every page whose record and chain of parents are whole back in the
 * index at its slot (kvt_cache_restore_info() says what it found and how
 * long it took); the pages of faster tiers are gone. After a kill -9 at
 * any moment, pages whose commit had not finished are absent; after a
 * machine crash a page may be recorded with bytes that did not all reach
 * the disk: every load verifies every layer against the recorded sums, so
 * such a page fails there (counted in kvt_cache_stat.corrupt, its record
 * dropped) and is never served. Tenants whose pages were restored exist
 * again at open with their recorded salt. A directory of another geometry
 * or format version is refused (add 'fresh' to start over); one in use by
 * another open ssd tier is refused (KVT_EBUSY). Needs
 * checksums (not with KVT_CACHE_NO_VERIFY). docs/FORMATS.md has the
 * record format.
 *
 * THREADS. Every call is thread-safe: an engine's scheduler thread may look
 * up while its worker threads load, store and wait. One lock guards the
 * index (held for decisions and bookkeeping only, never across a copy or
 * a wait for one); jobs run on the transfer engine's threads. A job handle belongs to its creator; wait,
 * poll, cancel and stat may come from any thread; free it once.
 *
 * ABI. Configuration is a versioned struct (its first field is its size);
 * everything else is opaque handles and flat calls with integers, pointers
 * and arrays: nothing a ctypes or C++ caller must mirror beyond
 * kvt_cache_config and the two result structs below, all plain fields.
 * The library's SONAME carries its major version.
 */
#ifndef KVTIER_CACHE_H
#define KVTIER_CACHE_H

#include <kvtier.h>
#include <kvtier/index.h>
#include <kvtier/remote.h>
#include <kvtier/xfer.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct kvt_cache kvt_cache;
typedef struct kvt_cache_job kvt_cache_job;
typedef struct kvt_cache_mem kvt_cache_mem;

/** kvt_cache_config.flags */
enum {
	KVT_CACHE_NO_VERIFY = 1u << 0,  /* keep no checksums (unchecked) */
	KVT_CACHE_STAGE_SSD = 1u << 1,  /* stage ssd -> engine loads through a
					   bounce tier even into host memory
					   (automatic for GPU memory) */
	KVT_CACHE_NO_BACKGROUND = 1u << 2, /* no background demotion: tiers
					   fill, then inserts evict
					   synchronously (tests, ablation) */
};

/**
 * struct kvt_cache_config - how to build a cache. Start from
 * KVT_CACHE_CONFIG_INIT (or zero it and set @size), then set fields; zero
 * means the default for every field but @size.
 *
 * @size:       sizeof(kvt_cache_config) as the caller knows it: the
 *              version. Fields past it are taken as zero.
 * @tiers:      owned tiers (tier.h spec): fabric, dram and/or ssd, at most
 *              one of each. hbm and hostdev are the engine's: register them
 *              with kvt_cache_register().
 * @model:      geometry: a preset name or a config.json path, used when
 *              @geom is NULL.
 * @geom:       geometry (C callers); copied. Overrides @model.
 * @page_tokens, @tp_size, @tp_rank: with @model (16, 1, 0).
 * @evict:      enum kvt_evict_policy (LRU).
 * @write:      enum kvt_write_policy (write-back).
 * @selective_hits: for KVT_WRITE_SELECTIVE.
 * @high, @low: background demotion watermarks of every owned tier, as
 *              fractions of its slots (0: KVT_CACHE_HIGH, KVT_CACHE_LOW).
 * @xfer_threads: transfer engine cpu workers (default of kvt_xfer).
 * @flags:      KVT_CACHE_* bits.
 * @remote:     a remote tier below the owned ones (kvtier/remote.h spec,
 *              e.g. "remote:redis://10.0.0.5:6379"), or NULL: see REMOTE
 *              TIER below.
 * @devices:    devices whose memory will be attached ("cuda:0,cuda:1",
 *              "emu"; kvt_device_parse() names), or NULL: the host tiers
 *              (and the ssd bounce) are registered with them at open —
 *              page-locked, mapped, a devdax fabric tier as I/O memory —
 *              instead of at the first kvt_cache_attach() of each device
 *              (which registers them otherwise). A tier opened with 'pin'
 *              is used as it is.
 * @dev_load, @dev_store: the device lanes' copy method for loads into
 *              device memory and stores out of it: KVT_XFER_CUDA_KERNEL
 *              (the SM-capped gather kernel), _BATCH (batched copy-engine
 *              DMA) or _CHUNK (one copy per chunk); 0: kernel for loads,
 *              batch for stores (kvt_xfer_config.cuda_load / cuda_store).
 * @thread_nice: the nice value (setpriority) of every thread the cache
 *              starts — its transfer engine's lanes and workers, its job
 *              workers, room and background threads; the remote tier's
 *              threads keep the caller's — 1 to 19, below the
 *              engine's own threads; 0: as created (the caller's). On a
 *              host with few cores a copy thread that takes the core of
 *              the engine's thread delays the step that thread drives
 *              (kvtier demo, whose thread is the emulated GPU, sets 10:
 *              docs/SIMULATOR.md §7).
 */
#define KVT_CACHE_HIGH 0.90  /* default high watermark */
#define KVT_CACHE_LOW 0.75   /* default low watermark */
/* Pages of the ssd bounce: an ssd -> device (or registered engine memory)
 * load is read into it and copied on, in rounds of half of it. */
#define KVT_CACHE_STAGE_SLOTS 64u

typedef struct kvt_cache_config {
	uint32_t size;
	uint32_t flags;
	const char *tiers;
	const char *model;
	const kvt_geom *geom;
	uint32_t page_tokens, tp_size, tp_rank;
	int evict, write;
	uint32_t selective_hits;
	double high, low;
	uint32_t xfer_threads;
	const char *remote;
	const char *devices;
	int dev_load, dev_store;
	int thread_nice;
} kvt_cache_config;

#define KVT_CACHE_CONFIG_INIT { .size = sizeof(kvt_cache_config) }

/**
 * kvt_cache_open() - build the owned tiers, the index (page keys) and the
 * transfer engine, and start the background demotion thread. Returns 0 and
 * *@out; -EINVAL for a bad @size or field (kvt_errdetail() names it);
 * KVT_ESPEC for a spec with no owned tier, an hbm/hostdev tier or two
 * tiers of one kind; the errors of kvt_geom_preset(),
 * kvt_geom_from_config(), kvt_tier_open(), kvt_index_create(),
 * kvt_xfer_create(). Nothing is left open on failure.
 */
KVT_API int kvt_cache_open(kvt_cache **out, const kvt_cache_config *cfg);

/** Cancel and wait for every job, stop the background thread, close (and
 *  for temp tiers remove) the tiers. Jobs not yet freed stay valid (done,
 *  -ECANCELED if they had not finished) until kvt_cache_job_free(). NULL
 *  is fine. */
KVT_API void kvt_cache_close(kvt_cache *c);

/**
 * kvt_cache_register() - the engine's KV memory, once per cache.
 * @base:         per layer, the address of block 0, K (MLA: the latent);
 *                @nlayers of them (must equal the geometry's L).
 * @nblocks:      blocks per layer; block ids are 0..nblocks-1.
 * @block_stride, @kv_stride, @token_stride: byte strides between blocks,
 *                between K and V of a block (ignored for MLA), between
 *                tokens of a block. A token's H*D elements must be
 *                contiguous: @token_stride >= H*D*s (other token and
 *                head strides: kvt_cache_attach_rows()); the chunks of
 *                different (block, kv) must not overlap: K/V outer
 *                (vLLM flash-attn: kv_stride >= nblocks*block_stride) or
 *                block outer (block_stride >= 2*kv_stride).
 * @device:       -1: host memory (CPU engines, tests, the demo without a
 *                GPU); a device id (kvtier.h: a CUDA ordinal, or
 *                KVT_DEVICE_EMU + n): device pointers of that device. The
 *                host tiers are registered with the device then, if they
 *                were not at open (@devices).
 *
 * Returns 0; KVT_EBUSY if memory is already registered; KVT_EGEOM for
 * strides or a layer count that do not fit the geometry (kvt_errdetail()
 * says which); KVT_ENOTBUILT / KVT_ENODEV for GPU memory without CUDA or
 * a GPU; -ENOMEM. The memory must stay valid until kvt_cache_close().
 */
KVT_API int kvt_cache_register(kvt_cache *c, void *const *base,
			       uint32_t nlayers, uint64_t nblocks,
			       uint64_t block_stride, uint64_t kv_stride,
			       uint64_t token_stride, int device);

/**
 * kvt_cache_attach() - more engine memory, for a cache that serves several
 * engines (the node daemon: one per client process and TP rank). The
 * arguments and checks are kvt_cache_register()'s; any number may be
 * attached, and kvt_cache_register()'s memory is unaffected. Jobs name the
 * memory they use through kvt_cache_io.mem. Returns 0 and *@out, or
 * kvt_cache_register()'s errors (KVT_EBUSY excepted).
 */
KVT_API int kvt_cache_attach(kvt_cache *c, void *const *base,
			     uint32_t nlayers, uint64_t nblocks,
			     uint64_t block_stride, uint64_t kv_stride,
			     uint64_t token_stride, int device,
			     kvt_cache_mem **out);

/**
 * kvt_cache_attach_rows() - kvt_cache_attach() for memory whose chunks
 * are kept in rows (kvtier/geom.h "ROWS"): the D*s bytes of token t, head
 * h of a block's chunk at t * @token_stride + h * @head_stride from the
 * chunk's start (kvt_layout_init_rows() says which strides fit). Heads
 * before tokens (vLLM's HND and CPU-backend caches) or layers interleaved
 * between tokens (SGLang's page_first, page_head host pools) are moved
 * row by row, checksummed in [P][H][D] order: a page stored from such
 * memory loads into any other layout. Host memory only (@device -1):
 * KVT_ENOTBUILT for GPU memory with rows. Returns kvt_cache_attach()'s
 * values.
 */
KVT_API int kvt_cache_attach_rows(kvt_cache *c, void *const *base,
				  uint32_t nlayers, uint64_t nblocks,
				  uint64_t block_stride, uint64_t kv_stride,
				  uint64_t token_stride, uint64_t head_stride,
				  int device, kvt_cache_mem **out);

/**
 * kvt_cache_detach() - forget attached memory: new jobs on it fail
 * (KVT_EBUSY), the jobs running on it are cancelled (a load's blocks go on
 * its failed list, a store commits nothing) and waited for; when it
 * returns kvtier touches the memory no more and it may be unmapped. Job
 * handles stay valid until freed. Memory not detached is dropped by
 * kvt_cache_close(). NULL is fine.
 */
KVT_API void kvt_cache_detach(kvt_cache_mem *m);

/** Register @tenant with @salt (its keys never match another's).
 *  0, -EEXIST, -ENOMEM. Tenant 0 (salt 0) always exists. A tenant that
 *  the open re-created from a persistent ssd tier (PERSISTENCE) may be
 *  added once more: with its recorded salt that is 0 and its pages stay;
 *  with another salt its restored pages are dropped first (KVT_EBUSY if
 *  some are in use by a job). */
KVT_API int kvt_cache_tenant_add(kvt_cache *c, uint32_t tenant,
				 uint64_t salt);

/**
 * kvt_cache_tenant_quota() - at most @max_pages pages of @tenant in owned
 * tier @tier (0: no limit, the default); see kvt_index_tenant_quota(). A
 * store of a tenant at its quota in the top tier makes room by demoting
 * its own least recently used pages (never another tenant's), and the
 * background demotion moves a tenant's pages into a lower tier within its
 * quota there (its own pages go further down or leave). Lowering a quota
 * demotes the excess at once, in the calling thread (the copies run before
 * it returns). Read what a tenant holds with kvt_cache_tenant_usage().
 * Returns 0, KVT_ENOTFOUND for an unknown
 * tenant or a tier the cache does not own.
 */
KVT_API int kvt_cache_tenant_quota(kvt_cache *c, uint32_t tenant,
				   kvt_tier_kind tier, uint64_t max_pages);

/** What @tenant holds per tier (kvt_index_tenant_usage()), under the
 *  cache's lock: safe while jobs run (a moment's snapshot). 0 or
 *  KVT_ENOTFOUND. */
KVT_API int kvt_cache_tenant_usage(kvt_cache *c, uint32_t tenant,
				   kvt_tenant_usage *u);

/** The chained keys of @tokens for @tenant (ntokens / P of them; a partial
 *  last page is ignored). 0, KVT_ENOTFOUND (tenant), -EINVAL. */
KVT_API int kvt_cache_hash_tokens(kvt_cache *c, uint32_t tenant,
				  const uint32_t *tokens, size_t ntokens,
				  kvt_page_key *keys);

/** What kvt_cache_lookup() found, in pages. */
typedef struct kvt_cache_lookup_result {
	uint64_t pages;                    /* leading pages a load can supply
					      now (committed) */
	uint64_t tier_pages[KVT_TIER_COUNT]; /* of which, by fastest copy */
	uint64_t inflight;                 /* pages right after them that are
					      being stored or moved: ask
					      again soon */
} kvt_cache_lookup_result;

/** kvt_cache_lookup() flags */
enum {
	KVT_LOOKUP_TOUCH = 1u << 0, /* count a hit (recency, LFU counts) */
	KVT_LOOKUP_EACH = 1u << 1,  /* every key is a one-page prefix of its
				       own (below) */
};

/**
 * kvt_cache_lookup() - how many leading pages of keys[0..nkeys) the cache
 * can load now. Read-only unless KVT_LOOKUP_TOUCH; takes no lease, so a
 * page may be evicted before a later load (the load then reports that
 * block failed, and the engine computes it). 0, KVT_ENOTFOUND (tenant),
 * -EINVAL, -E2BIG.
 *
 * KVT_LOOKUP_EACH: each key names a prefix of one page (keys an engine
 * chains itself, stored one page per prefix: SGLang's page hashes), so
 * the answer is the leading run of keys each of which is cached, then the
 * run after it being stored — what n one-key lookups would say, in one
 * call. The remote tier is not consulted for such lookups.
 */
KVT_API int kvt_cache_lookup(kvt_cache *c, uint32_t tenant,
			     const kvt_page_key *keys, size_t nkeys,
			     unsigned flags, kvt_cache_lookup_result *r);

/** One run of the leading loadable pages: @pages in a row whose fastest
 *  committed copy is in tier @tier. */
typedef struct kvt_cache_run {
	uint32_t tier;   /* kvt_tier_kind */
	uint32_t pages;
} kvt_cache_run;

#define KVT_CACHE_MAX_RUNS 8

/**
 * kvt_cache_lookup_runs() - kvt_cache_lookup(), and where its r->pages
 * leading pages are, in prefix order: runs of consecutive pages whose
 * fastest copy is in one tier, at most @max of them (<= KVT_CACHE_MAX_RUNS
 * is plenty: eviction demotes leaves first, so a prefix is mostly fast
 * tiers first). When there are more runs, the last one takes the rest of
 * the pages under the slowest tier among them. *@nruns gets the count; the
 * runs' pages add up to r->pages. For a scheduler that decides per tier
 * run whether loading beats recomputing (kvt_sched_req.run_*). Same
 * errors as kvt_cache_lookup(), and -EINVAL for @max 0 or NULL arrays.
 */
KVT_API int kvt_cache_lookup_runs(kvt_cache *c, uint32_t tenant,
				  const kvt_page_key *keys, size_t nkeys,
				  unsigned flags, kvt_cache_lookup_result *r,
				  kvt_cache_run *runs, size_t max,
				  size_t *nruns);

/**
 * kvt_cache_rates() - the transfer engine's recent measured rates between
 * every pair of tier kinds (kvt_xfer_rate_get(); the engine's registered
 * memory is KVT_TIER_HBM): rates[src][dst]. What a scheduler prices loads
 * (from each tier into hbm) and stores with, instead of constants. Loads
 * from ssd staged through the bounce tier (GPU memory, or
 * KVT_CACHE_STAGE_SSD) show as their two hops, ssd -> dram (the bounce
 * tier is of kind dram) and dram -> hbm, and as a whole under ssd -> hbm
 * (from the first read to the last copy: what a load from the ssd takes;
 * stores the same under hbm -> ssd), so a scheduler prices the ssd at its
 * own rate on a GPU host too (before 2026-12-07 that pair stayed empty
 * there, and an engine fell back to a link's rate for its ssd runs).
 * Returns 0, or -EINVAL for NULL arguments.
 */
KVT_API int kvt_cache_rates(kvt_cache *c,
			    kvt_xfer_rate rates[KVT_TIER_COUNT][KVT_TIER_COUNT]);

/**
 * kvt_cache_load() - start copying pages first..nkeys-1 of the prefix
 * keys[0..nkeys) into engine blocks blocks[0..nkeys-first).
 *
 * The pages are leased for the job's life (no eviction takes them); each
 * comes from its fastest committed copy. The call never waits: a page
 * that is not in the cache (never stored, evicted since the lookup, failed
 * its checksum: KVT_ENOTFOUND) or not loadable yet (being stored, or moved
 * between tiers at this instant: KVT_EBUSY) is not an error of the call:
 * its block goes on the job's failed list and nothing is written to it.
 * Needs registered memory.
 *
 * Returns 0 and *@out (free with kvt_cache_job_free()); -EINVAL (first >
 * nkeys, NULL arrays, a block out of range or named twice), KVT_ENOTFOUND
 * (tenant), KVT_EBUSY (no memory registered), -ENOMEM, the submit errors of
 * kvt_xfer_submit(). On error nothing was started.
 */
KVT_API int kvt_cache_load(kvt_cache *c, uint32_t tenant,
			   const kvt_page_key *keys, size_t nkeys,
			   size_t first, const uint32_t *blocks,
			   kvt_cache_job **out);

/**
 * kvt_cache_store() - start copying pages first..nkeys-1 of the prefix
 * keys[0..nkeys) out of engine blocks blocks[0..nkeys-first) into the
 * owned tiers. The blocks must hold their final bytes and must not change
 * until the job is done (kvt_cache_job_wait()).
 *
 * PLACED BY ROOM. The new pages go into the fastest owned tier while it
 * has room (making room by demoting, EVICTION above), the rest straight into the
 * next tiers down, leading pages first: a prompt longer than the top tier
 * is storable. Pages already cached (committed or being stored) are
 * skipped and stay where they are: nothing is brought back up. Pages that
 * fit in no tier (everything there leased, or the tenant at its quotas)
 * are not an error of the call: their blocks go on the job's failed list
 * (KVT_EFULL), as a load's absent pages do, and the pages before them are
 * stored.
 *
 * The pages before @first must be cached or being stored (the prefix's
 * parents), in any tier: KVT_ENOTFOUND names the first that is not. The
 * stored pages become visible when the job is done and every page
 * verified (COMMIT above); a cancelled or failed store leaves nothing
 * visible (its slots go back to their pools as the job ends).
 *
 * Returns 0 and *@out; -EINVAL, KVT_ENOTFOUND, KVT_EBUSY as for load;
 * -ENOMEM; submit errors. On error nothing was started or reserved.
 */
KVT_API int kvt_cache_store(kvt_cache *c, uint32_t tenant,
			    const kvt_page_key *keys, size_t nkeys,
			    size_t first, const uint32_t *blocks,
			    kvt_cache_job **out);

/**
 * struct kvt_cache_progress - what a kvt_cache_io.progress callback is told.
 * @layers: layers 0..layers-1 of every block are in place and verified
 *          (failed blocks excepted); grows, never shrinks.
 * @failed: nonzero (the error) once every block is known to have failed,
 *          when kvt_cache_job_wait_layer() would return it.
 * @done, @result: the job is done, with kvt_cache_job_wait()'s result.
 */
typedef struct kvt_cache_progress {
	uint32_t layers;
	int failed;
	int done;
	int result;
} kvt_cache_progress;

/**
 * kvt_cache_progress_fn - called from the cache's own threads, in order,
 * each time a job's progress changes, and once with @p->done set (the
 * last call; the job handle may be freed by the caller from then on). It
 * runs under the job's lock: it must only record and wake (a store to
 * shared memory, a futex or eventfd wake), never call kvtier.
 */
typedef void kvt_cache_progress_fn(void *arg, const kvt_cache_progress *p);

/**
 * struct kvt_cache_io - options of kvt_cache_load_ex() / _store_ex().
 * @size:     sizeof(kvt_cache_io) as the caller knows it (the version).
 * @mem:      engine memory from kvt_cache_attach(); NULL: the registered.
 * @progress, @arg: an optional progress callback.
 * @flags:    KVT_CACHE_IO_EACH (below), or 0.
 * @wait:     libkvtier's own (the daemon): a device event imported from
 *            the engine (src/dev/dev.h); the job's copies into or out of
 *            device memory wait for the engine's last record of it
 *            before they start — a store reads the blocks only once the
 *            engine's writes to them are done. NULL: none.
 */
typedef struct kvt_cache_io {
	uint32_t size;
	kvt_cache_mem *mem;
	kvt_cache_progress_fn *progress;
	void *arg;
	uint32_t flags;   /* KVT_CACHE_IO_* */
	void *wait;
} kvt_cache_io;

/** kvt_cache_io.flags */
enum {
	/* every key is a one-page prefix of its own (keys an engine chains
	 * itself, as SGLang's page hashes; see KVT_LOOKUP_EACH): page i
	 * is keys[i], into / out of blocks[i]; @first must be 0. Each page
	 * is leased (load) or inserted (store) on its own: a page that is
	 * absent, busy, or finds no room fails alone (its block on the
	 * failed list); one request, one job for many such pages. Not
	 * written through to the remote tier (remote values are chained
	 * prefixes). */
	KVT_CACHE_IO_EACH = 1u << 0,
};

#define KVT_CACHE_IO_INIT { .size = sizeof(kvt_cache_io) }

/** kvt_cache_load() / kvt_cache_store() with options (@io may be NULL):
 *  other engine memory, a progress callback. -EINVAL for a bad @io->size
 *  or memory of another cache; KVT_EBUSY for memory being detached. */
KVT_API int kvt_cache_load_ex(kvt_cache *c, uint32_t tenant,
			      const kvt_page_key *keys, size_t nkeys,
			      size_t first, const uint32_t *blocks,
			      const kvt_cache_io *io, kvt_cache_job **out);
KVT_API int kvt_cache_store_ex(kvt_cache *c, uint32_t tenant,
			       const kvt_page_key *keys, size_t nkeys,
			       size_t first, const uint32_t *blocks,
			       const kvt_cache_io *io, kvt_cache_job **out);

/**
 * kvt_cache_job_wait_layer() - block until layer @layer of every block of a
 * load is in place and verified (blocks that fail excepted: they are on
 * the failed list once the job is done), or
 * @timeout_ns passed (< 0: no limit). For a store: until layer @layer of
 * every page has landed in the tier and is summed.
 * Returns 0, -ETIMEDOUT, -ERANGE (layer >= L), -ECANCELED (cancelled before
 * that layer), or an error (KVT_ECORRUPT, KVT_ENOTFOUND, KVT_EBUSY, -EIO)
 * as soon as every block is known to have failed at or before @layer: a
 * layer is never reported ready for a block whose copy of it failed.
 */
KVT_API int kvt_cache_job_wait_layer(kvt_cache_job *j, uint32_t layer,
				     int64_t timeout_ns);

/**
 * kvt_cache_job_layer_ns() - when layer @layer became ready for
 * kvt_cache_job_wait_layer(): the kvt_now_ns() (CLOCK_MONOTONIC) instant
 * its last copy landed and verified, or the job ended, whichever came
 * first; 0 while it has not (and for @layer out of range).
 *
 * A waiter wakes some time after that instant (the thread must be
 * scheduled). A GPU's stream wait on the same readiness does not: the
 * engine's next kernel starts when the copy lands. An engine that emulates
 * a device (kvtier demo) starts the layer's work here, not when its thread
 * woke; one that measures its host's wake-up latency subtracts the two.
 */
KVT_API uint64_t kvt_cache_job_layer_ns(kvt_cache_job *j, uint32_t layer);

/**
 * kvt_cache_job_wait() - block until the job is done (every layer, the
 * commit of a store, the release of a load's leases). Returns 0 when every
 * block succeeded; otherwise the first failure's code (KVT_ECORRUPT,
 * KVT_ENOTFOUND for a page not in the cache, KVT_EBUSY for one not
 * loadable yet, -EIO, -ECANCELED, ...) with
 * the blocks on kvt_cache_job_failed(); -ETIMEDOUT.
 */
KVT_API int kvt_cache_job_wait(kvt_cache_job *j, int64_t timeout_ns);

/** As kvt_cache_job_wait() with no blocking: -EINPROGRESS while it runs. */
KVT_API int kvt_cache_job_poll(kvt_cache_job *j);

/**
 * kvt_cache_job_fd() - an eventfd (nonblocking, close-on-exec) that becomes
 * readable when the job is done, for poll/epoll/asyncio loops. Owned by
 * the job; closed by kvt_cache_job_free().
 */
KVT_API int kvt_cache_job_fd(kvt_cache_job *j);

/**
 * kvt_cache_job_cancel() - stop a job: copies not started are dropped. A
 * cancelled load puts every block not yet complete on the failed list; a
 * cancelled store commits nothing (its pages are dropped, never served).
 * Returns 0, or -EALREADY if the job was done. Waiting still applies.
 */
KVT_API int kvt_cache_job_cancel(kvt_cache_job *j);

/**
 * kvt_cache_job_failed() - the engine block ids whose copy failed, in
 * request order, once the job is done: writes min(n, @max) of them to
 * @blocks and returns n (0: every block succeeded; -EINPROGRESS before
 * done). An engine recomputes these blocks (vLLM:
 * get_block_ids_with_load_errors()).
 */
KVT_API long kvt_cache_job_failed(kvt_cache_job *j, uint32_t *blocks,
				  size_t max);

/** What one job did and waited for (plain values; read once done). */
typedef struct kvt_cache_job_stat {
	uint64_t pages;          /* pages the job was asked for */
	uint64_t copied;         /* pages copied (load: loaded; store:
				    stored, not skipped) */
	uint64_t skipped;        /* store: already cached */
	uint64_t failed;         /* blocks on the failed list */
	uint64_t busy;           /* load: of them, pages being stored or
				    moved when the load began (not loadable
				    yet: a load never waits for a store) */
	uint64_t absent;         /* load: of them, pages with no copy when
				    the load began (evicted since the
				    lookup, or never cached); the rest of
				    the failed ones were cancelled or could
				    not be read right
				    (kvt_cache_job_read_failures()) */
	uint64_t verified;       /* pages whose every layer sum matched */
	uint64_t from[KVT_TIER_COUNT]; /* load: pages by source tier */
	uint64_t bytes;
	double wait_s;           /* waited for room: the demotions a store
				    decided, slots still read by other
				    copies (a store: on the room thread,
				    before its transfers started) */
	double layer0_s;         /* submit -> layer 0 ready (every
				    transfer of the job past layer 0) */
	double total_s;          /* submit -> done */
} kvt_cache_job_stat;
KVT_API void kvt_cache_job_stat_get(kvt_cache_job *j, kvt_cache_job_stat *st);

/** kvt_cache_job_read_failures() - of a load's failed blocks, those whose
 *  copy was there but could not be read right (an I/O error, a checksum
 *  that did not match), by the tier read from; pages absent or busy are
 *  not counted (misses). 0 once done, -EINPROGRESS before. */
KVT_API int kvt_cache_job_read_failures(kvt_cache_job *j,
					uint64_t per_tier[KVT_TIER_COUNT]);

/** Release a job handle: a job not done is cancelled and waited for. NULL
 *  is fine. */
KVT_API void kvt_cache_job_free(kvt_cache_job *j);

/* ------------------------------------------------------------------------
 * Accounting, checking
 * ------------------------------------------------------------------------ */

/** Running totals (a consistent snapshot). */
typedef struct kvt_cache_stat {
	uint64_t loads, load_pages, load_bytes;   /* into engine memory */
	uint64_t stores, store_pages, store_bytes;/* out of engine memory */
	uint64_t moves, move_pages, move_bytes;   /* demotions and copies
						     between owned tiers */
	uint64_t move_errors;   /* page copies between tiers that failed
				   with an I/O error (page dropped) */
	uint64_t evicted;       /* pages that left a tier */
	uint64_t verified;      /* page copies verified, all moves */
	uint64_t corrupt;       /* page copies that failed verification */
	uint64_t failed_blocks; /* blocks put on a load's failed list */
	uint64_t bg_passes;     /* background demotion passes that moved */
	double bg_s;            /* background time spent moving */
	double wait_s;          /* foreground waits for room, all jobs */
} kvt_cache_stat;
KVT_API void kvt_cache_stat_get(kvt_cache *c, kvt_cache_stat *st);

/** What kvt_cache_verify() found. */
typedef struct kvt_cache_check {
	uint64_t checked;   /* committed page copies read back and hashed */
	uint64_t bad;       /* of which did not match */
	uint64_t per_tier[KVT_TIER_COUNT]; /* checked, by tier */
} kvt_cache_check;

/**
 * kvt_cache_verify() - wait until no job or background copy runs, then read
 * back every committed page copy in every owned tier and check its layer
 * sums. Returns 0 when every copy matched (and fills @r), KVT_ECORRUPT
 * naming the first bad (tier, slot), -EINVAL for a cache opened with
 * KVT_CACHE_NO_VERIFY (it has no sums), or a tier read's error (-EIO).
 * For tests and the end of the demo; holds the cache's lock throughout.
 */
KVT_API int kvt_cache_verify(kvt_cache *c, kvt_cache_check *r);

/** What the open found in a persistent ssd tier (PERSISTENCE). */
typedef struct kvt_cache_restore {
	uint64_t records;     /* whole records found (checksum, geometry and
				 place right) */
	uint64_t restored;    /* pages put back in the index */
	uint64_t bad_records; /* records that failed their checksum, layer
				 count, geometry or place: dropped */
	uint64_t orphans;     /* whole records whose chain of parents is not
				 (a parent missing, of another depth or
				 salt): dropped */
	uint64_t duplicates;  /* older records of a page recorded twice */
	uint64_t failed;      /* pages the index refused (kvt_errdetail()
				 was logged): dropped */
	uint64_t tenants;     /* tenants other than 0 re-created */
	double scan_s;        /* reading the records */
	double rebuild_s;     /* the whole rebuild, scan included */
} kvt_cache_restore;

/** Fill @r for a cache whose ssd tier is persistent: 0, or -EINVAL (no
 *  persistent ssd tier). */
KVT_API int kvt_cache_restore_info(kvt_cache *c, kvt_cache_restore *r);

/** The geometry in use; the tier of kind @k or NULL; the index and the
 *  transfer engine (for statistics; do not call the index directly while
 *  jobs run). */
KVT_API const kvt_geom *kvt_cache_geom(const kvt_cache *c);
KVT_API kvt_tier *kvt_cache_tier(kvt_cache *c, kvt_tier_kind k);
KVT_API kvt_index *kvt_cache_index(kvt_cache *c);
KVT_API kvt_xfer *kvt_cache_xfer(kvt_cache *c);

/**
 * kvt_cache_quiesce() - wait until the background thread has nothing
 * running and every owned tier is at or below its high watermark (or
 * nothing more can be demoted). For tests and benchmarks that want a
 * settled state.
 */
KVT_API void kvt_cache_quiesce(kvt_cache *c);

/* ------------------------------------------------------------------------
 * The remote tier (kvt_cache_config.remote; src/cache/cache_remote.c)
 *
 * Pages shared across nodes through Redis / Valkey, below the owned tiers:
 *
 *   store      after a store job commits, its pages are written to the
 *              remote tier by a writer thread (write-through, off the
 *              engine's path): read back from the top tier into a staging
 *              area, EXISTS first (pages already there are not sent again),
 *              then one pipelined SET batch. Never blocks the store; a full
 *              queue drops (counted).
 *   lookup     kvt_cache_lookup() reports how many pages follow the local
 *              leading run in the remote tier (only when none is in
 *              flight): tier_pages[KVT_TIER_REMOTE]. It never waits on
 *              the network: it answers from what this node knows (pages
 *              it wrote, or that an EXISTS probe, a write-through or a
 *              prefetch saw, within the last minute), and keys it does not
 *              know are probed by a thread of their own, batched, for the
 *              next lookup. A prefix asked about for the first time, or a
 *              hung server, reports no remote run until a probe answers.
 *              They are not in @pages: a load cannot supply them until
 *              kvt_cache_prefetch() has brought them in.
 *   prefetch   kvt_cache_prefetch() (blocking) or kvt_cache_prefetch_start()
 *              / _end() (in the background, cut off when the request is
 *              scheduled): remote -> staging -> a store into the top tier
 *              (sums taken, committed as any store), so the next
 *              kvt_cache_load() gets them from dram like any page.
 *
 * A remote failure (server down, node killed, timeout, a value that fails
 * its checks) is a miss and a counter; the owned tiers and every other
 * call keep working. kvt_cache_close() drops writes still queued: call
 * kvt_cache_remote_flush() first to keep them.
 * ------------------------------------------------------------------------ */

/**
 * kvt_cache_prefetch() - bring pages first..nkeys-1 of keys[0..nkeys) from
 * the remote tier into the top owned tier, in batches, stopping at the
 * first page the remote tier cannot supply. Pages before @first must be
 * cached (as for kvt_cache_store()). Blocks the calling thread (network
 * time); serialized with other prefetches. *@pages: pages brought in.
 * Returns 0 (also when the remote tier had nothing), KVT_ENOTFOUND (no
 * remote tier, or a parent page not cached), kvt_cache_store()'s errors.
 */
KVT_API int kvt_cache_prefetch(kvt_cache *c, uint32_t tenant,
			       const kvt_page_key *keys, size_t nkeys,
			       size_t first, uint64_t *pages);

/**
 * kvt_cache_prefetch_start() - the same, in a thread of its own, in
 * batches of up to 16 MiB, while the caller goes on (a request waiting in
 * the scheduler's queue). kvt_cache_prefetch_end() then either waits for
 * it (@cut 0) or cuts it off (@cut 1: returns at once, no other batch
 * starts; whatever arrived is in the top tier and loadable; the batch in
 * flight, if any, finishes in the background and frees the handle), frees
 * the handle and gives the pages brought in so far. End every prefetch before
 * kvt_cache_close() (which stops them between batches).
 * start: 0, -EINVAL, KVT_ENOTFOUND (no remote tier), -ENOMEM.
 * end: kvt_cache_prefetch()'s result.
 */
typedef struct kvt_cache_fetch kvt_cache_fetch;
KVT_API int kvt_cache_prefetch_start(kvt_cache *c, uint32_t tenant,
				     const kvt_page_key *keys, size_t nkeys,
				     size_t first, kvt_cache_fetch **out);
KVT_API int kvt_cache_prefetch_end(kvt_cache_fetch *f, int cut,
				   uint64_t *pages);

/** Give the cache's tenant @tenant a remote MAC key of its own
 *  (kvt_remote_tenant_key(): its write-through and prefetches use it):
 *  0, KVT_ENOTFOUND (no remote tier), KVT_ECONFIG (the key file). */
KVT_API int kvt_cache_remote_tenant_key(kvt_cache *c, uint32_t tenant,
					const char *path);

/** Wait until every queued remote write is done (or @timeout_ns passed,
 *  < 0: no limit): 0, -ETIMEDOUT, KVT_ENOTFOUND (no remote tier). */
KVT_API int kvt_cache_remote_flush(kvt_cache *c, int64_t timeout_ns);

/** What the cache's remote tier did (plain values). */
typedef struct kvt_cache_remote_stat {
	kvt_remote_stat remote;  /* the connections' own counters (lookups
				    and prefetches, write-through), added */
	uint64_t queued;         /* pages queued for write-through */
	uint64_t written;        /* of those, stored by the server */
	uint64_t present;        /* of those, already there: not sent */
	uint64_t dropped;        /* of those, not written: queue full, page
				    gone from the owned tiers, cache closed */
	uint64_t failed;         /* of those, refused or lost by the server */
	uint64_t lookups;        /* lookups that asked the remote tier */
	uint64_t lookup_pages;   /* pages they found there */
	uint64_t prefetched;     /* pages brought in by kvt_cache_prefetch */
	uint64_t probe_pages;    /* pages asked about off the lookup path */
	uint64_t probe_dropped;  /* pages not asked about: probes queue full */
} kvt_cache_remote_stat;

/** Copy the counters: 0, or KVT_ENOTFOUND (no remote tier). */
KVT_API int kvt_cache_remote_stat_get(kvt_cache *c,
				      kvt_cache_remote_stat *st);

#ifdef __cplusplus
}
#endif

#endif /* KVTIER_CACHE_H */
