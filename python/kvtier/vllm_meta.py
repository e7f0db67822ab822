"""The vLLM connector's step metadata (scheduler side to workers) and its
counters: the data kvtier.vllm.KvtierConnector sends, in a file of its own
so the connector's module holds only its calls.

KvtierConnectorMetadata crosses a pickle each step (vLLM ships it from the
scheduler process to every worker): plain dataclasses of ids, keys and
block numbers, nothing that holds a handle. A LoadSpec / SaveSpec names
one request's pages of one KV cache group (always group 0 but for hybrid
models, kvtier.vllm_hybrid).
"""
from __future__ import annotations

import dataclasses
from typing import Dict, List, Optional, Set

from vllm.distributed.kv_transfer.kv_connector.v1.base import \
    KVConnectorMetadata
from vllm.distributed.kv_transfer.kv_connector.v1.metrics import \
    KVConnectorStats

from .decide import STAT_KEYS as DECIDE_STAT_KEYS

__all__ = ["LoadSpec", "SaveSpec", "KvtierConnectorMetadata", "KvtierStats"]


class _FailedLoad:
    """A load the daemon did not take (it went away): every block failed,
    reported as a finished job so vLLM's bookkeeping runs as usual."""

    def __init__(self, blocks: List[int]) -> None:
        self.blocks = list(blocks)
        self.failed = list(blocks)

    def wait_layer(self, layer: int, timeout: Optional[float] = None) -> bool:
        return False

    def wait(self, timeout: Optional[float] = None) -> List[int]:
        return list(self.blocks)

    def poll(self) -> bool:
        return True

    def cancel(self) -> bool:
        return False

    def close(self) -> None:
        pass


@dataclasses.dataclass
class LoadSpec:
    """Load pages first..len(keys)-1 of the prefix @keys into @blocks."""
    req_id: str
    keys: List[bytes]
    first: int
    blocks: List[int]
    is_async: bool = True
    # hybrid models (kvtier.vllm_hybrid): the KV cache group, and whether
    # every key is a one-page prefix of its own (sliding-window groups)
    group: int = 0
    each: bool = False


@dataclasses.dataclass
class SaveSpec:
    """Store pages first..len(keys)-1 of the prefix @keys out of
    blocks[first:] (@blocks: the request's blocks from page 0)."""
    req_id: str
    keys: List[bytes]
    first: int
    blocks: List[int]
    group: int = 0          # as LoadSpec's
    each: bool = False


@dataclasses.dataclass
class KvtierConnectorMetadata(KVConnectorMetadata):
    """One step's orders, scheduler side to worker side."""
    loads: List[LoadSpec] = dataclasses.field(default_factory=list)
    saves: List[SaveSpec] = dataclasses.field(default_factory=list)
    preempted: Set[str] = dataclasses.field(default_factory=set)
    # finished requests whose blocks vLLM keeps until the workers return
    # them in finished_sending (request_finished said delay_free)
    delayed: Set[str] = dataclasses.field(default_factory=set)
    # finished (aborted) requests whose async load vLLM still waits for:
    # stop it, report it in finished_recving once it has stopped (vLLM
    # frees the blocks then; never in finished_sending, which it asserts)
    aborted: Set[str] = dataclasses.field(default_factory=set)
    # hybrid models: requests some of whose sliding-window blocks vLLM
    # freed in this step's allocation (they left the window) while a store
    # of an earlier step may still read them: the workers wait for those
    # stores before the forward can overwrite the blocks
    sw_wait: Set[str] = dataclasses.field(default_factory=set)


_STAT_KEYS = ("loads", "load_pages", "load_failed_blocks", "stores",
              "store_pages", "store_failed_blocks", "store_errors",
              "store_dropped_pages", "cancelled", "stop_timeouts",
              # hybrid models: stores waited for before a forward (their
              # sliding-window blocks left the window), loads failed as a
              # whole request (failed_recving)
              "store_waits", "failed_requests", "sw_wait_requests",
              # scheduler side: get_num_new_matched_tokens' decisions
              *DECIDE_STAT_KEYS)


@dataclasses.dataclass
class KvtierStats(KVConnectorStats):
    """Worker counters since the last interval (get_kv_connector_stats)."""

    def __post_init__(self) -> None:
        for k in _STAT_KEYS:
            self.data.setdefault(k, 0)

    def reset(self) -> None:
        self.data = {k: 0 for k in _STAT_KEYS}

    def aggregate(self, other: KVConnectorStats) -> "KvtierStats":
        for k in _STAT_KEYS:
            self.data[k] = self.data.get(k, 0) + other.data.get(k, 0)
        return self

    def reduce(self) -> Dict[str, int]:
        return dict(self.data)

    def is_empty(self) -> bool:
        return not any(self.data.get(k, 0) for k in _STAT_KEYS)
