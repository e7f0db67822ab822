/*
 * kvtier/client.h — an engine process talking to the node daemon (kvtierd,
 * `kvtier serve`). The same shape as the in-process cache (cache.h): keys,
 * lookup, asynchronous layer-wise load and store jobs into engine blocks,
 * failed-block lists — so a connector can use either.
 *
 * WHY A DAEMON
 *
 *   Every process of a node (the TP ranks of one engine, several engines,
 *   a prefill and a decode instance) shares one set of fabric, dram and ssd
 *   tiers and one index, owned by the daemon. Page data never goes through
 *   the socket: the client's KV memory is shared with the daemon once
 *   (REGISTER), and the daemon's transfer engine copies pages straight
 *   between its tiers and the client's blocks.
 *
 *      engine process                          kvtierd
 *   +---------------------+   unix socket   +---------------------------+
 *   | kvt_client          | --------------> | protocol (src/server/)    |
 *   |  KV memory (memfd)  | <== mapped ===> | kvt_cache: index, tiers,  |
 *   |  job slots (shared) | <== progress == |   transfer engine         |
 *   +---------------------+                 +---------------------------+
 *
 * MEMORY
 *
 *   Host memory is shared as a memfd sealed against shrinking (the daemon
 *   refuses one that could shrink under it). kvt_client_mem_alloc() makes
 *   one in the vLLM layout (per layer: K blocks then V blocks) and registers
 *   it; kvt_client_register_fd() registers a memfd the caller laid out.
 *
 *   Device memory is shared by handle, and the daemon moves pages straight
 *   between its page-locked tiers and it on the device — no CPU copy of a
 *   page byte, verified by a checksum kernel over what landed:
 *   kvt_client_register_dev() takes the handles (a CUDA IPC handle of each
 *   allocation holding the KV tensors, with offsets: what PyTorch's
 *   storage sharing gives; a VMM allocation's POSIX fd; the emulated
 *   device's memfd); kvt_client_register_ptrs() takes device pointers of
 *   this process and finds the handles itself (kvtier/dev.h).
 *
 *      engine GPU memory  <== DMA / gather kernel ==>  daemon's tiers
 *          ^   the daemon's stream waits on the engine's IPC event
 *          |   (kvt_client_event_*) before it reads blocks a store names
 *          +-- the engine's stream waits on the job slot's word
 *              (kvt_client_job_stream_wait()) before layer l's attention
 *
 *   UNREGISTER or the client's death cancels the memory's jobs, waits for
 *   the device's work on them and only then closes the handles.
 *
 * JOBS
 *
 *   A load or store is one request; its progress (layers ready, done, the
 *   result) comes back through a slot of a shared memory page the daemon
 *   writes and the client waits on with a futex: wait_layer(l) costs no
 *   round trip. For device memory the engine's stream waits instead:
 *   kvt_client_job_stream_wait() enqueues a wait on the slot's word in the
 *   client's own wait words (cuStreamWaitValue32), so layer l's attention
 *   starts as soon as layer l has landed and been verified, without the
 *   CPU; a daemon that dies mid-job releases those waits (the job fails).
 *   The failed-block list and statistics are fetched once, when the job
 *   is done, by the first call that needs them. A job holds its pages (a
 *   lease) until it is done, at most the daemon's lease time; when the
 *   client disconnects or dies, its jobs are cancelled and its memory
 *   unmapped by the daemon.
 *
 * THREADS
 *
 *   Every call is thread-safe; requests of one client are serialized on its
 *   socket (one round trip at a time), waits are not. Use one kvt_client per
 *   process (or per TP rank: each rank connects with its own rank).
 *   kvt_client_shutdown() may run while other threads wait on jobs (they
 *   return); kvt_client_close() frees the handles, so nothing else may be
 *   called on the client, its memories or jobs once it has begun (it does
 *   wait for waits already inside the library to return).
 *
 * TIMEOUTS AND A DAEMON THAT STOPS ANSWERING
 *
 *   A request (anything but the waits) has timeout_ms for its reply. When
 *   it passes, the call returns -ETIMEDOUT and the connection is dropped
 *   for good: a late reply would put every later one out of step, so the
 *   client never reads it; later requests fail with -ECONNRESET (connect
 *   again). Jobs already started end as the daemon tears the connection
 *   down (their waits return then, every block failed). A LOAD or STORE
 *   that timed out may have been started by the daemon: the call returns
 *   only once the daemon has let go of the connection (it closes its end
 *   only after its jobs have stopped and it has unmapped this client's
 *   memory), at most lease_ms + timeout_ms later, so no block of that
 *   request is written or read after the call returns. A daemon that has
 *   not let go by then is hung: the call still returns -ETIMEDOUT, with a
 *   detail and a warning saying the memory may still be written.
 *
 * ERRORS
 *
 *   kvtier codes as everywhere (kvt_strerror(), kvt_errdetail()); the
 *   daemon's detail text travels with its errors. -ECONNRESET / -EPIPE: the
 *   daemon went away (every job of the client has failed with it).
 *   KVT_EPROTO: a message the other side could not accept.
 */
#ifndef KVTIER_CLIENT_H
#define KVTIER_CLIENT_H

#include <kvtier.h>
#include <kvtier/cache.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct kvt_client kvt_client;
typedef struct kvt_client_mem kvt_client_mem;
typedef struct kvt_client_job kvt_client_job;

/** The daemon's default socket (also KVT_SOCKET in the environment). */
#define KVT_CLIENT_SOCKET "/run/kvtier/kvtierd.sock"

/**
 * struct kvt_client_config - who the client is. Start from
 * KVT_CLIENT_CONFIG_INIT; zero is the default for every field but @size.
 * @size:        sizeof(kvt_client_config) (the version).
 * @socket:      the daemon's socket (KVT_SOCKET, else KVT_CLIENT_SOCKET).
 * @tenant:      the tenant to act as (0); the daemon checks the process's
 *               uid/gid against that tenant's allow-list.
 * @ns:          the model namespace the daemon serves ("default").
 * @model, @geom, @page_tokens, @tp_size, @tp_rank: this process's geometry
 *               as in kvt_cache_config; the daemon refuses a client whose
 *               geometry differs from its namespace's (KVT_EGEOM). With
 *               neither @model nor @geom the client is a monitor (`kvtier
 *               stat`): it may call kvt_client_stats() and nothing else
 *               (the daemon answers KVT_EPROTO).
 * @timeout_ms:  per request, a deadline for its whole reply (10000); see
 *               TIMEOUTS above for what a timeout does to the connection.
 */
typedef struct kvt_client_config {
	uint32_t size;
	uint32_t tenant;
	const char *socket;
	const char *ns;
	const char *model;
	const kvt_geom *geom;
	uint32_t page_tokens, tp_size, tp_rank;
	uint32_t timeout_ms;
} kvt_client_config;

#define KVT_CLIENT_CONFIG_INIT { .size = sizeof(kvt_client_config) }

/**
 * kvt_client_wait_daemon() - wait until a daemon accepts connections on
 * @socket (NULL: KVT_SOCKET or KVT_CLIENT_SOCKET), at most @timeout_ms;
 * for scripts and tests that start one. 0, -ETIMEDOUT, or -EINVAL for a
 * path too long. Connects and hangs up without a HELLO.
 */
KVT_API int kvt_client_wait_daemon(const char *socket, uint32_t timeout_ms);

/**
 * kvt_client_connect() - connect and say HELLO. Returns 0 and *@out;
 * -ENOENT / -ECONNREFUSED (no daemon at the socket), -EACCES (the tenant
 * does not allow this uid or any of its groups, or does not exist: the
 * daemon does not say which), KVT_EGEOM, KVT_ENOTFOUND (namespace unknown
 * to the daemon), KVT_EBUSY (a connection limit), KVT_EPROTO (a daemon of
 * another protocol version), -ETIMEDOUT, -ENOMEM.
 */
KVT_API int kvt_client_connect(kvt_client **out, const kvt_client_config *cfg);

/**
 * kvt_client_shutdown() - end the connection: the daemon cancels every job
 * of this client and unmaps its memory; returns once it has (at most
 * lease_ms + timeout_ms: past that a warning says the daemon is hung).
 * Waits in other threads return (a job not done: -ECONNRESET, every block
 * failed); every later request fails with -ECONNRESET. The handles stay
 * valid until kvt_client_close(). Safe to call from any thread, more than
 * once. NULL is fine.
 */
KVT_API void kvt_client_shutdown(kvt_client *cl);

/** kvt_client_shutdown(), then wait for the waits of other threads to
 *  return, then free the client and every job and memory handle not yet
 *  freed (memory from kvt_client_mem_alloc() is unmapped). NULL is fine. */
KVT_API void kvt_client_close(kvt_client *cl);

/** The daemon's lease (HELLO), and this client's request timeout: a live
 *  daemon ends any job within their sum of a cancel (the bound the
 *  library's own waits use). */
KVT_API uint32_t kvt_client_lease_ms(const kvt_client *cl);
KVT_API uint32_t kvt_client_timeout_ms(const kvt_client *cl);

/** The geometry the daemon confirmed. */
KVT_API const kvt_geom *kvt_client_geom(const kvt_client *cl);

/**
 * kvt_client_mem_alloc() - allocate @nblocks engine blocks of host memory
 * shared with the daemon (a sealed memfd, vLLM layout: per layer, the K
 * chunks of every block, then the V chunks), and register them. @base gets
 * the address of block 0 (K) of each layer, @block_stride / @kv_stride /
 * @token_stride the strides (any may be NULL). The memory is zeroed and
 * lives until kvt_client_mem_free() or kvt_client_close().
 */
KVT_API int kvt_client_mem_alloc(kvt_client *cl, uint64_t nblocks,
				  void **base, uint64_t *block_stride,
				  uint64_t *kv_stride, uint64_t *token_stride,
				  kvt_client_mem **out);

/**
 * kvt_client_register_fd() - register memory the caller laid out in a
 * memfd @fd (sealed F_SEAL_SHRINK; the daemon checks): layer l's block 0
 * starts at byte @layer_off[l] of the file; strides as in
 * kvt_cache_register(); @device must be -1 (device memory:
 * kvt_client_register_dev(); -EINVAL otherwise).
 * The fd is sent to the daemon and stays the caller's. Returns 0 and
 * *@out; KVT_EGEOM / -EINVAL as kvt_cache_register(), or the daemon's
 * refusal (a file too small or not sealed: -EINVAL).
 */
KVT_API int kvt_client_register_fd(kvt_client *cl, int fd,
				   const uint64_t *layer_off, uint32_t nlayers,
				   uint64_t nblocks, uint64_t block_stride,
				   uint64_t kv_stride, uint64_t token_stride,
				   int device, kvt_client_mem **out);

/**
 * kvt_client_register_fd_rows() - kvt_client_register_fd() for host memory
 * whose chunks are kept in rows: token t, head h of a chunk at
 * t * @token_stride + h * @head_stride (kvt_cache_attach_rows(); vLLM's
 * HND and CPU-backend caches, SGLang's page_first and page_head pools).
 * Sent as REGISTER_ROWS (docs/PROTOCOL.md) unless @head_stride is the
 * packed D*s, then as REGISTER. Returns kvt_client_register_fd()'s values;
 * KVT_EGEOM names strides whose rows would overlap.
 */
KVT_API int kvt_client_register_fd_rows(kvt_client *cl, int fd,
					const uint64_t *layer_off,
					uint32_t nlayers, uint64_t nblocks,
					uint64_t block_stride,
					uint64_t kv_stride,
					uint64_t token_stride,
					uint64_t head_stride, int device,
					kvt_client_mem **out);

/** Kinds of kvt_client_seg (the wire's REGISTER segment kinds). */
enum kvt_client_seg_kind {
	KVT_CLIENT_SEG_MEMFD = 1,    /* host memory: a memfd sealed
					F_SEAL_SHRINK */
	KVT_CLIENT_SEG_CUDA_IPC = 2, /* handle: a cudaIpcMemHandle_t of the
					allocation's base */
	KVT_CLIENT_SEG_VMM_FD = 3,   /* fd: a cuMemCreate allocation's POSIX
					fd (cuMemExportToShareableHandle) */
	KVT_CLIENT_SEG_EMU_FD = 4,   /* fd: emulated device memory
					(kvt_dev_export()) */
};

/** One allocation holding KV: how the daemon opens it. */
typedef struct kvt_client_seg {
	uint32_t kind;        /* enum kvt_client_seg_kind */
	int fd;               /* fd kinds (sent, stays the caller's); -1 */
	uint64_t bytes;       /* the allocation's size (memfd: 0 = its size) */
	uint8_t handle[64];   /* KVT_CLIENT_SEG_CUDA_IPC */
} kvt_client_seg;

/**
 * kvt_client_register_dev() - register engine KV memory by handle.
 * @device:     KVT_DEVICE_HOST (memfd segments), a CUDA ordinal of this
 *              process, or KVT_DEVICE_EMU + n.
 * @uuid:       the GPU's UUID (16 bytes: kvt_dev_uuid(), PyTorch's
 *              get_device_properties().uuid), or NULL: the daemon uses
 *              @device as its own ordinal.
 * @segs, @nseg: the allocations (1..8).
 * @layer_seg, @layer_off: per layer, the allocation and the byte offset of
 *              block 0 (K) in it; strides as in kvt_cache_register().
 * The daemon opens every allocation in its own context on that device,
 * checks every chunk lies inside its allocation, and attaches it. Returns
 * 0 and *@out, or the daemon's refusal (-EINVAL: a chunk outside its
 * allocation, a memfd not sealed; KVT_ENODEV: no such device there;
 * KVT_ENOTBUILT: a GPU and a daemon without CUDA).
 */
KVT_API int kvt_client_register_dev(kvt_client *cl, int device,
				    const uint8_t *uuid,
				    const kvt_client_seg *segs, uint32_t nseg,
				    const uint32_t *layer_seg,
				    const uint64_t *layer_off, uint32_t nlayers,
				    uint64_t nblocks, uint64_t block_stride,
				    uint64_t kv_stride, uint64_t token_stride,
				    kvt_client_mem **out);

/** kvt_client_register_dev() for device pointers of this process: per
 *  layer the address of block 0 (K) in memory of @dev (kvt_dev_alloc(),
 *  cudaMalloc, PyTorch's allocator); the handles of the allocations
 *  holding them are found here (kvt_dev_export()). */
KVT_API int kvt_client_register_ptrs(kvt_client *cl, kvt_dev *dev,
				     void *const *base, uint32_t nlayers,
				     uint64_t nblocks, uint64_t block_stride,
				     uint64_t kv_stride, uint64_t token_stride,
				     kvt_client_mem **out);

/** Unregister: the daemon cancels the jobs on it, waits for their device
 *  work and closes its handles (or unmaps it); memory from
 *  kvt_client_mem_alloc() is unmapped here too. NULL is fine. */
KVT_API void kvt_client_mem_free(kvt_client_mem *m);

/**
 * Events: ordering the daemon's device copies after the engine's work.
 * An engine records the event on its stream after it has written the
 * blocks a store names (or finished reading blocks a load will
 * overwrite) and names the event in the job (kvt_client_store_ev()): the
 * daemon's stream waits for that record before it touches the blocks.
 * Without it a store may read blocks the engine is still writing —
 * corrupted KV, stored and served. kvt_client_event_new() makes an IPC
 * event of @dev and registers it; kvt_client_event_register() registers
 * a handle the caller made (PyTorch: torch.cuda.Event(interprocess=True)
 * .ipc_handle()), kind KVT_CLIENT_EVENT_*.
 */
typedef struct kvt_client_event kvt_client_event;
enum { KVT_CLIENT_EVENT_CUDA_IPC = 1, KVT_CLIENT_EVENT_EMU_FD = 2 };
KVT_API int kvt_client_event_new(kvt_client *cl, kvt_dev *dev,
				 kvt_client_event **out);
KVT_API int kvt_client_event_record(kvt_client_event *e, kvt_dev_stream *s);
KVT_API uint32_t kvt_client_event_id(const kvt_client_event *e);
KVT_API void kvt_client_event_free(kvt_client_event *e);
KVT_API int kvt_client_event_register(kvt_client *cl, int device,
				      const uint8_t *uuid, uint32_t kind,
				      const uint8_t handle[64], int fd,
				      uint32_t *id);

/** The chained page keys of @tokens for this client's tenant (computed by
 *  the daemon with the tenant's salt): ntokens / P keys. */
KVT_API int kvt_client_hash_tokens(kvt_client *cl, const uint32_t *tokens,
				   size_t ntokens, kvt_page_key *keys);

/** kvt_cache_lookup() through the daemon (KVT_LOOKUP_TOUCH, KVT_LOOKUP_EACH
 *  in @flags). */
KVT_API int kvt_client_lookup(kvt_client *cl, const kvt_page_key *keys,
			      size_t nkeys, unsigned flags,
			      kvt_cache_lookup_result *r);

/**
 * kvt_client_load() / kvt_client_store() - kvt_cache_load() /
 * kvt_cache_store() into / out of registered memory @m: the same rules
 * (pages first..nkeys-1 into blocks[0..nkeys-first); never blocks on the
 * cache; absent or busy pages go on the failed list). Returns 0 and *@out
 * once the daemon accepted the job, or the daemon's error (nothing
 * started); KVT_EBUSY when the client has KVT_CLIENT_MAX_JOBS jobs not
 * freed.
 */
KVT_API int kvt_client_load(kvt_client *cl, kvt_client_mem *m,
			    const kvt_page_key *keys, size_t nkeys,
			    size_t first, const uint32_t *blocks,
			    kvt_client_job **out);
KVT_API int kvt_client_store(kvt_client *cl, kvt_client_mem *m,
			     const kvt_page_key *keys, size_t nkeys,
			     size_t first, const uint32_t *blocks,
			     kvt_client_job **out);

/** kvt_client_load() / _store() with @flags: KVT_CACHE_IO_EACH (every key
 *  a one-page prefix of its own, page i into / out of blocks[i], @first
 *  0: one request and one job for pages an engine keys itself, as
 *  SGLang's; cache.h), or 0. -EINVAL for other flags. */
KVT_API int kvt_client_load_ex(kvt_client *cl, kvt_client_mem *m,
			       const kvt_page_key *keys, size_t nkeys,
			       size_t first, const uint32_t *blocks,
			       unsigned flags, kvt_client_job **out);
KVT_API int kvt_client_store_ex(kvt_client *cl, kvt_client_mem *m,
				const kvt_page_key *keys, size_t nkeys,
				size_t first, const uint32_t *blocks,
				unsigned flags, kvt_client_job **out);
/** _ex() naming an event (kvt_client_event_id(), or the id from
 *  kvt_client_event_register(); 0: none) the daemon's copies wait for:
 *  device memory only. */
KVT_API int kvt_client_load_ev(kvt_client *cl, kvt_client_mem *m,
			       const kvt_page_key *keys, size_t nkeys,
			       size_t first, const uint32_t *blocks,
			       unsigned flags, uint32_t event,
			       kvt_client_job **out);
KVT_API int kvt_client_store_ev(kvt_client *cl, kvt_client_mem *m,
				const kvt_page_key *keys, size_t nkeys,
				size_t first, const uint32_t *blocks,
				unsigned flags, uint32_t event,
				kvt_client_job **out);

/**
 * kvt_client_job_stream_wait() - enqueue on @s (a stream of the device
 * the job's memory is on) a wait until layer @layer of the job is in
 * place and verified, or the job is over (done, or every block failed:
 * the engine must then check the job's failed blocks before using them);
 * the work the engine enqueues after it (layer @layer's attention) runs
 * only then, with no CPU round trip. The wait is on the client's own
 * wait word for the job's slot (a memfd shared with the daemon at
 * connect, PROTOCOL.md "Wait words"), registered with the device at the
 * first call; that call also starts a thread that watches the connection:
 * when the daemon dies (or closes the connection) mid-job, it sets the
 * word of every job not done to its end value, so the stream goes on,
 * and the job ends with -ECONNRESET (kvt_client_job_failed() returns it):
 * the engine must not use its blocks. -EOPNOTSUPP where the device cannot
 * wait on a value; -ERANGE for a layer out of range.
 */
KVT_API int kvt_client_job_stream_wait(kvt_client_job *j, uint32_t layer,
				       kvt_dev_stream *s);

#define KVT_CLIENT_MAX_JOBS 1024

/** As kvt_cache_job_wait_layer(), _wait(), _poll(), _cancel(),
 *  _failed(), _stat_get(), _free(); waits cost no round trip. A job of a
 *  client whose daemon died, or whose connection was dropped, ends with
 *  -ECONNRESET (every block failed) once the daemon has let go of it.
 *  kvt_client_job_free() of a running job cancels it and waits for it to
 *  stop, at most lease_ms + timeout_ms; a daemon still running it then
 *  is hung: the connection is dropped, and after as long again the handle
 *  is freed with a warning. */
KVT_API int kvt_client_job_wait_layer(kvt_client_job *j, uint32_t layer,
				      int64_t timeout_ns);
KVT_API int kvt_client_job_wait(kvt_client_job *j, int64_t timeout_ns);
/** As kvt_cache_job_layer_ns(), from the daemon's stamp in the job's slot:
 *  the instant the daemon last reported progress, at or after the one
 *  layer @layer landed (an upper bound when later layers came since);
 *  0 while not ready, once released, or from a daemon that stamps none. */
KVT_API uint64_t kvt_client_job_layer_ns(kvt_client_job *j, uint32_t layer);
KVT_API int kvt_client_job_poll(kvt_client_job *j);
KVT_API int kvt_client_job_cancel(kvt_client_job *j);
KVT_API long kvt_client_job_failed(kvt_client_job *j, uint32_t *blocks,
				   size_t max);
KVT_API void kvt_client_job_stat_get(kvt_client_job *j,
				     kvt_cache_job_stat *st);
KVT_API void kvt_client_job_free(kvt_client_job *j);

/**
 * kvt_client_fd() - an eventfd (nonblocking) the daemon signals whenever a
 * job of this client is done, for poll/epoll/asyncio: when readable, read
 * it (8 bytes) and poll the jobs you wait for. Owned by the client.
 */
KVT_API int kvt_client_fd(kvt_client *cl);

/** The daemon's metrics as JSON (docs/METRICS.md), malloc'd into *@json
 *  (free()). */
KVT_API int kvt_client_stats(kvt_client *cl, char **json);

/** kvt_cache_lookup_runs() through the daemon (at most
 *  KVT_CACHE_MAX_RUNS runs). A daemon too old for it answers KVT_EPROTO. */
KVT_API int kvt_client_lookup_runs(kvt_client *cl, const kvt_page_key *keys,
				   size_t nkeys, unsigned flags,
				   kvt_cache_lookup_result *r,
				   kvt_cache_run *runs, size_t max,
				   size_t *nruns);

/** kvt_cache_rates() of the daemon's cache (RATES): its transfer engine's
 *  measured rates between tier kinds. 0 or a protocol error. */
KVT_API int kvt_client_rates(kvt_client *cl,
			     kvt_xfer_rate rates[KVT_TIER_COUNT][KVT_TIER_COUNT]);

/** Bytes of a page-hash fingerprint (kvt_client_fingerprint()). */
#define KVT_CLIENT_FP_BYTES 32
/** Fingerprint schemes: whose page hashes a fingerprint describes. */
#define KVT_CLIENT_FP_VLLM 1
#define KVT_CLIENT_FP_SGLANG 2

/** Publish a fingerprint of what determines this engine's page hashes
 *  (FPRINT): for vLLM a one-way hash of its chain seed NONE_HASH (from
 *  PYTHONHASHSEED), its prefix-caching hash algorithm, block size and
 *  model — never the seed itself. The daemon keeps, per tenant, the
 *  distinct fingerprints published (at most 8) and answers in *@others
 *  how many of @scheme (1..255) differ from @fp: nonzero means engines of
 *  this tenant whose page keys never match this one's (0 hits between
 *  them). *@conflicts (optional) gets the tenant's conflict count
 *  (kvtier_fingerprint_conflicts_total). A daemon too old for it answers
 *  KVT_EPROTO. */
KVT_API int kvt_client_fingerprint(kvt_client *cl, uint32_t scheme,
				   const uint8_t fp[KVT_CLIENT_FP_BYTES],
				   uint32_t *others, uint64_t *conflicts);

/** Wait until the daemon's background demotion has settled
 *  (kvt_cache_quiesce(); for tests and benchmarks that want a settled
 *  state). Holds the client's socket meanwhile. */
KVT_API int kvt_client_quiesce(kvt_client *cl);

#ifdef __cplusplus
}
#endif

#endif /* KVTIER_CLIENT_H */
