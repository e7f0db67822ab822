"""STAND-IN for SGLang python/sglang/srt/managers/cache_controller.py
(v0.5.6.post2 at 5c8bd8b51b53; current's prefetch_io_aux_func and batch
loops read at SGLang main, the same shape): reproduces only the storage
half of HiCacheController, in upstream's call order and with upstream's
threads: creating the backend through StorageBackendFactory and
registering the host pool with it; choosing the zero-copy calls for a
"dynamic" backend only when its extra config says "interface_v1"; a
BACKUP thread (write_storage -> batches of storage_batch_size pages
through batch_set_v1, stopping at the first failed batch; MLA ranks other
than 0 skip backups), a PREFETCH thread (the hit query: chained page keys
of the new tokens, batch_exists per batch, leading run; the threshold;
slots past the hit released; the operation handed on) and the prefetch
I/O thread it starts (batches through batch_get_v1, counting completed
tokens up to the first failed page, the unfilled slots released). As
upstream, each thread loops on its queue catching only queue.Empty: any
exception a backend raises — or a None it returns where a list is
indexed — ends that thread for good (threads_alive() says so; upstream
never restarts them). Not SGLang. Differences on purpose: backup() and
run_prefetch() hand one operation to the threads and wait for it (the
scheduler polls upstream); no TP all-reduce of the hit count (one rank);
no rate limiting; the GPU<->host half (write / load / layer counters) is
absent.
"""
from __future__ import annotations

import logging
import threading
from queue import Empty, Queue
from typing import Any, List, Optional

import numpy as np

from sglang.srt.mem_cache.hicache_storage import (HiCacheStorageExtraInfo,
                                                  get_hash_str,
                                                  make_storage_config)

logger = logging.getLogger(__name__)


class StorageOperation:
    counter = 0

    def __init__(self, host_indices: Any, token_ids: List[int],
                 last_hash: Optional[str] = None,
                 hash_value: Optional[List[str]] = None,
                 prefix_keys: Optional[List[str]] = None) -> None:
        self.host_indices = host_indices
        self.token_ids = token_ids
        self.last_hash = last_hash
        self.completed_tokens = 0
        self.hash_value = hash_value if hash_value is not None else []
        self.prefix_keys = prefix_keys
        self.id = StorageOperation.counter
        StorageOperation.counter += 1
        self.done = threading.Event()   # NOT UPSTREAM: the test waits on it


class PrefetchOperation(StorageOperation):
    def __init__(self, request_id: str, host_indices: Any,
                 token_ids: List[int], last_hash: Optional[str] = None,
                 prefix_keys: Optional[List[str]] = None) -> None:
        self.request_id = request_id
        self._terminated = False
        super().__init__(host_indices, token_ids, last_hash,
                         prefix_keys=prefix_keys)

    def increment(self, num_tokens: int) -> bool:
        if self._terminated:
            return False
        self.completed_tokens += num_tokens
        return True

    def mark_terminate(self) -> None:
        self._terminated = True


class HiCacheController:
    """The storage side of SGLang's cache controller."""

    def __init__(self, mem_pool_host: Any, page_size: int,
                 storage_backend: Optional[str] = None,
                 model_name: Optional[str] = None,
                 storage_backend_extra_config: Optional[dict] = None,
                 tp_rank: int = 0, tp_size: int = 1,
                 is_mla_model: bool = False,
                 prefetch_threshold: int = 256) -> None:
        self.mem_pool_host = mem_pool_host
        self.page_size = page_size
        self.enable_storage = storage_backend is not None
        self.released: List[Any] = []  # host slots given back (upstream: a queue)
        if not self.enable_storage:
            return
        self.storage_backend_type = storage_backend
        self.get_hash_str = get_hash_str
        self.storage_config = make_storage_config(
            tp_rank=tp_rank, tp_size=tp_size, is_mla_model=is_mla_model,
            is_page_first_layout=mem_pool_host.layout == "page_first",
            model_name=model_name, extra_config=storage_backend_extra_config)
        self.backup_skip = is_mla_model and tp_rank != 0
        from sglang.srt.mem_cache.storage import StorageBackendFactory
        try:
            self.storage_backend = StorageBackendFactory.create_backend(
                storage_backend, self.storage_config, self.mem_pool_host)
        except ValueError as e:
            raise ValueError(f"Failed to create storage backend: {e}") from e
        self.storage_backend.register_mem_pool_host(self.mem_pool_host)
        self.prefetch_threshold = max(prefetch_threshold, self.page_size)
        self.storage_batch_size = 128
        self.page_get_func = self._generic_page_get
        self.page_set_func = self._generic_page_set
        if storage_backend == "dynamic" and bool(
                self.storage_config.extra_config.get("interface_v1", 0)):
            self.page_get_func = self._page_get_zero_copy
            self.page_set_func = self._page_set_zero_copy
        self._release_lock = threading.Lock()
        self.storage_stop_event = threading.Event()
        self.backup_queue: Queue = Queue()
        self.prefetch_queue: Queue = Queue()
        self.prefetch_buffer: Queue = Queue()
        self.backup_thread = threading.Thread(target=self.backup_thread_func,
                                              daemon=True)
        self.prefetch_thread = threading.Thread(
            target=self.prefetch_thread_func, daemon=True)
        self.backup_thread.start()
        self.prefetch_thread.start()

    def append_host_mem_release(self, indices: Any) -> None:
        with self._release_lock:
            self.released.append(indices)

    def threads_alive(self) -> dict:
        """NOT UPSTREAM: which storage threads still run."""
        aux = getattr(self, "prefetch_io_aux_thread", None)
        return {"backup": self.backup_thread.is_alive(),
                "prefetch": self.prefetch_thread.is_alive(),
                "prefetch_io": aux is not None and aux.is_alive()}

    def stop(self) -> None:
        """NOT UPSTREAM (upstream: reset / process exit): stop the
        threads."""
        if self.enable_storage:
            self.storage_stop_event.set()
            for t in (self.backup_thread, self.prefetch_thread,
                      getattr(self, "prefetch_io_aux_thread", None)):
                if t is not None:
                    t.join(timeout=5)

    # -- backup: host -> storage ----------------------------------------------

    def write_storage(self, host_indices: Any, token_ids: List[int],
                      hash_value: Optional[List[str]] = None,
                      prefix_keys: Optional[List[str]] = None) -> StorageOperation:
        return StorageOperation(host_indices, token_ids,
                                hash_value=hash_value, prefix_keys=prefix_keys)

    def _generic_page_set(self, hash_values, host_indices, extra_info=None) -> bool:
        data = [self.mem_pool_host.get_data_page(host_indices[i * self.page_size])
                for i in range(len(hash_values))]
        return self.storage_backend.batch_set(hash_values, data)

    def _page_set_zero_copy(self, hash_values, host_indices, extra_info=None) -> bool:
        return all(self.storage_backend.batch_set_v1(hash_values, host_indices,
                                                     extra_info))

    def _batches(self, operation: StorageOperation):
        """An operation's pages in batches of storage_batch_size: (keys,
        host slots, extra info); after each batch the caller continues the
        loop only if it went well. prefix_keys grow as upstream grows them
        (an empty list stays empty)."""
        prefix_keys = operation.prefix_keys
        for i in range(0, len(operation.hash_value), self.storage_batch_size):
            batch = operation.hash_value[i:i + self.storage_batch_size]
            idx = operation.host_indices[i * self.page_size:
                                         (i + len(batch)) * self.page_size]
            yield batch, idx, HiCacheStorageExtraInfo(prefix_keys=prefix_keys)
            if prefix_keys and len(prefix_keys) > 0:
                prefix_keys += batch

    def _page_backup(self, operation: StorageOperation) -> None:
        for batch, idx, extra in self._batches(operation):
            if not self.page_set_func(batch, idx, extra):
                logger.warning("Write page to storage: %d pages failed.",
                               len(batch))
                break
            operation.completed_tokens += self.page_size * len(batch)

    def backup_thread_func(self) -> None:
        while not self.storage_stop_event.is_set():
            try:
                operation = self.backup_queue.get(block=True, timeout=0.05)
                if operation is None:
                    continue
                if not self.backup_skip:
                    self._page_backup(operation)
                operation.done.set()
            except Empty:
                continue

    def backup(self, operation: StorageOperation,
               timeout: float = 30.0) -> int:
        """Hand @operation to the backup thread and wait for it; returns
        the tokens backed up. RuntimeError when the thread is gone."""
        self.backup_queue.put(operation)
        if not operation.done.wait(timeout):
            raise RuntimeError(f"backup of operation {operation.id} not "
                               f"done (threads: {self.threads_alive()})")
        return operation.completed_tokens

    # -- prefetch: storage -> host ----------------------------------------------

    def prefetch(self, request_id: str, host_indices: Any,
                 new_input_tokens: List[int], last_hash: Optional[str] = None,
                 prefix_keys: Optional[List[str]] = None) -> PrefetchOperation:
        return PrefetchOperation(request_id, host_indices, new_input_tokens,
                                 last_hash, prefix_keys)

    def terminate_prefetch(self, operation: PrefetchOperation):
        """The scheduler gives up on a prefetch (request aborted, or timed
        out): later pages are not counted. Returns (completed tokens, their
        keys)."""
        operation.mark_terminate()
        return operation.completed_tokens, operation.hash_value

    def _page_get_zero_copy(self, operation, hash_values, host_indices,
                            extra_info=None) -> None:
        results = self.storage_backend.batch_get_v1(hash_values, host_indices,
                                                    extra_info)
        inc = 0
        for i in range(len(hash_values)):
            if not results[i]:
                logger.warning("Prefetch operation %s failed to retrieve page "
                               "%s.", operation.request_id, hash_values[i])
                break
            inc += self.page_size
        operation.increment(inc)

    def _generic_page_get(self, operation, hash_values, host_indices,
                          extra_info=None) -> None:
        raise NotImplementedError("stand-in: the non-zero-copy prefetch path "
                                  "is not reproduced")

    def _page_transfer(self, operation: PrefetchOperation) -> None:
        for batch, idx, extra in self._batches(operation):
            before = operation.completed_tokens
            self.page_get_func(operation, batch, idx, extra)
            if operation.completed_tokens != before + len(batch) * self.page_size:
                operation.mark_terminate()
                break

    def _storage_hit_query(self, operation: PrefetchOperation):
        last_hash = operation.last_hash
        tokens = operation.token_ids
        prefix_keys = operation.prefix_keys.copy() if operation.prefix_keys else None
        hits, hash_value = 0, []
        step = self.page_size * self.storage_batch_size
        for start in range(0, len(tokens), step):
            batch_tokens = tokens[start:start + step]
            batch = []
            for i in range(0, len(batch_tokens), self.page_size):
                last_hash = self.get_hash_str(batch_tokens[i:i + self.page_size],
                                              last_hash)
                batch.append(last_hash)
            extra = HiCacheStorageExtraInfo(prefix_keys=prefix_keys)
            n = self.storage_backend.batch_exists(batch, extra)
            hash_value.extend(batch[:n])
            hits += n * self.page_size
            if n < len(batch):
                break
            if prefix_keys and len(prefix_keys) > 0:
                prefix_keys += batch
        return hash_value, hits

    def prefetch_io_aux_func(self) -> None:
        while not self.storage_stop_event.is_set():
            try:
                operation = self.prefetch_buffer.get(block=True, timeout=0.05)
                if operation is None:
                    continue
                self._page_transfer(operation)
                self.append_host_mem_release(
                    operation.host_indices[operation.completed_tokens:])
                operation.done.set()
            except Empty:
                continue

    def prefetch_thread_func(self) -> None:
        self.prefetch_io_aux_thread = threading.Thread(
            target=self.prefetch_io_aux_func, daemon=True)
        self.prefetch_io_aux_thread.start()
        while not self.storage_stop_event.is_set() or \
                not self.prefetch_queue.empty():
            try:
                operation = self.prefetch_queue.get(block=True, timeout=0.05)
                if operation is None:
                    continue
                hash_value, hits = self._storage_hit_query(operation)
                if hits < self.prefetch_threshold:
                    self.append_host_mem_release(operation.host_indices)
                    operation.done.set()
                    continue
                operation.hash_value = hash_value[:hits // self.page_size]
                self.append_host_mem_release(operation.host_indices[hits:])
                operation.host_indices = operation.host_indices[:hits]
                self.prefetch_buffer.put(operation)
            except Empty:
                continue

    def run_prefetch(self, operation: PrefetchOperation,
                     timeout: float = 30.0) -> int:
        """Hand @operation to the prefetch threads and wait for it; returns
        the tokens now in the host pool (a leading run of
        operation.host_indices). Slots not filled are released.
        RuntimeError when a thread is gone."""
        self.prefetch_queue.put(operation)
        if not operation.done.wait(timeout):
            raise RuntimeError(f"prefetch {operation.request_id} not done "
                               f"(threads: {self.threads_alive()})")
        return operation.completed_tokens


def page_hashes(tokens: List[int], page_size: int,
                prior_hash: Optional[str] = None) -> List[str]:
    """NOT UPSTREAM (upstream: compute_node_hash_values in
    mem_cache/utils.py, per radix node): the chained keys of the whole pages
    of @tokens."""
    out, h = [], prior_hash
    for i in range(0, len(tokens) - len(tokens) % page_size, page_size):
        h = get_hash_str(tokens[i:i + page_size], h)
        out.append(h)
    return out


def as_indices(values: Any) -> np.ndarray:
    """NOT UPSTREAM: host slot indices as the int64 array upstream keeps
    in a torch tensor."""
    return np.asarray(values, dtype=np.int64)
