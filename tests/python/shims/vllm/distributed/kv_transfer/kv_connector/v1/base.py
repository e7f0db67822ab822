# STAND-IN for vLLM vllm/distributed/kv_transfer/kv_connector/v1/base.py, in
# the generation $KVT_VLLM_GEN picks (vllm/__init__.py): "v0.12" as read at
# 13f4ad0f55b08ca1d37d1459f50ce950feaeb547 (handle_preemptions(
# preempted_req_ids: set[str]); kv_cache_config optional, a warning when
# absent), "v0.26" as read at 003df2961dd8830c317a61f9745ccd557da9fa06
# (handle_preemptions(kv_connector_metadata); kv_cache_config required;
# on_new_request, has_pending_push_work, build_connector_worker_meta; the
# requires_kv_delivery property, by default the producer role;
# requires_piecewise_for_cudagraph, False by default), "current"
# as read at 00f4240ee6458263d76cf51ca7901ce1350bb4d1 (all of v0.26's, and
# KVConnectorTransferResults and get_transfer_results, whose default wraps
# get_finished; finish_forward, reset_capture_state,
# has_pending_block_frees). SupportsHMA (request_finished_all_groups) and
# supports_hma() in v0.26 and current: the class a connector subclasses to
# run under vLLM's hybrid memory allocator (several KV cache groups), as
# read at 00f4240ee645 (and 003df2961dd8).
# Reproduces only KVConnectorRole, KVConnectorMetadata and
# KVConnectorBase_V1's constructor, metadata binding, abstract methods and
# the optional hooks' defaults (signatures as upstream, the method table in
# tests/python/conformance/vllm.json); not vLLM.
from __future__ import annotations

import dataclasses
import enum
import logging
from abc import ABC, abstractmethod
from typing import TYPE_CHECKING, Any, Dict, Iterable, Optional, Set, Tuple

if TYPE_CHECKING:   # the annotations name them, as upstream's do
    import torch
    from vllm.distributed.kv_events import KVCacheEvent  # noqa: F401


class KVConnectorRole(enum.Enum):
    SCHEDULER = 0
    WORKER = 1


class KVConnectorMetadata(ABC):  # noqa: B024
    """Scheduler-side connector -> worker-side connector, once per step."""


from vllm import GENERATION as _GEN

if _GEN == "current":
    @dataclasses.dataclass
    class KVConnectorTransferResults:
        """One worker's async transfer completions; failed receives are in
        finished_recving too (the scheduler releases the request)."""
        finished_sending: Set[str] = dataclasses.field(default_factory=set)
        finished_recving: Set[str] = dataclasses.field(default_factory=set)
        failed_recving: Set[str] = dataclasses.field(default_factory=set)
        prefix_replay_checkpoints: Dict[str, Tuple[str, int, str]] = \
            dataclasses.field(default_factory=dict)

log = logging.getLogger("vllm.kv_connector")

if _GEN != "v0.12":
    class SupportsHMA(ABC):
        """A connector that supports the hybrid memory allocator."""

        @abstractmethod
        def request_finished_all_groups(
                self, request: Any, block_ids: tuple[list[int], ...]
        ) -> tuple[bool, dict[str, Any] | None]:
            raise NotImplementedError

    def supports_hma(connector: Any) -> bool:
        if isinstance(connector, type):
            return issubclass(connector, SupportsHMA)
        return isinstance(connector, SupportsHMA)


class KVConnectorBase_V1(ABC):

    def _init(self, vllm_config: Any, role: KVConnectorRole,
              kv_cache_config: Any) -> None:
        self._connector_metadata: Optional[KVConnectorMetadata] = None
        self._vllm_config = vllm_config
        if vllm_config.kv_transfer_config is None:
            raise ValueError("kv_transfer_config must be set for "
                             "KVConnectorBase_V1")
        self._kv_transfer_config = vllm_config.kv_transfer_config
        self._kv_cache_config = kv_cache_config
        self._role = role

    if _GEN == "v0.12":
        def __init__(self, vllm_config: Any, role: KVConnectorRole,
                     kv_cache_config: Any = None) -> None:
            self._init(vllm_config, role, kv_cache_config)
            if kv_cache_config is None:
                log.warning("KVConnectorBase_V1 initialized without "
                            "kv_cache_config. This is deprecated")
    else:
        def __init__(self, vllm_config: Any, role: KVConnectorRole,
                     kv_cache_config: Any) -> None:
            self._init(vllm_config, role, kv_cache_config)

    @property
    def role(self) -> KVConnectorRole:
        return self._role

    # worker side
    def bind_connector_metadata(self, connector_metadata: KVConnectorMetadata
                                ) -> None:
        self._connector_metadata = connector_metadata

    def clear_connector_metadata(self) -> None:
        self._connector_metadata = None

    def _get_connector_metadata(self) -> KVConnectorMetadata:
        assert self._connector_metadata is not None
        return self._connector_metadata

    def has_connector_metadata(self) -> bool:
        return self._connector_metadata is not None

    def register_kv_caches(self, kv_caches: dict[str, torch.Tensor]) -> None:
        return

    if _GEN == "v0.12":
        def handle_preemptions(self, preempted_req_ids: Set[str]) -> None:
            return
    else:
        def handle_preemptions(self, kv_connector_metadata:
                               KVConnectorMetadata) -> None:
            return

        def build_connector_worker_meta(self) -> Any:
            return None

        def on_new_request(self, request: Any) -> None:
            return

        def has_pending_push_work(self) -> bool:
            return False

        @property
        def requires_kv_delivery(self) -> bool:
            return self._kv_transfer_config.is_kv_producer

        @classmethod
        def requires_piecewise_for_cudagraph(cls, extra_config: Dict[str, Any]
                                             ) -> bool:
            return False

    if _GEN == "current":
        def has_pending_block_frees(self) -> bool:
            return False

        def finish_forward(self) -> None:
            return

        def reset_capture_state(self) -> None:
            return

        def get_transfer_results(self, finished_req_ids: Set[str]
                                 ) -> KVConnectorTransferResults:
            sending, recving = self.get_finished(finished_req_ids)
            return KVConnectorTransferResults(
                finished_sending=set(sending or ()),
                finished_recving=set(recving or ()))

    @abstractmethod
    def start_load_kv(self, forward_context: Any, **kwargs: Any) -> None: ...

    @abstractmethod
    def wait_for_layer_load(self, layer_name: str) -> None: ...

    @abstractmethod
    def save_kv_layer(self, layer_name: str, kv_layer: Any,
                      attn_metadata: Any, **kwargs: Any) -> None: ...

    @abstractmethod
    def wait_for_save(self) -> None: ...

    def get_finished(self, finished_req_ids: Set[str]
                     ) -> Tuple[Optional[Set[str]], Optional[Set[str]]]:
        return None, None

    def get_block_ids_with_load_errors(self) -> Set[int]:
        return set()

    def shutdown(self) -> None:
        return None

    def get_kv_connector_stats(self) -> Any:
        return None

    # scheduler side
    @abstractmethod
    def get_num_new_matched_tokens(self, request: Any, num_computed_tokens: int
                                   ) -> Tuple[Optional[int], bool]: ...

    @abstractmethod
    def update_state_after_alloc(self, request: Any, blocks: Any,
                                 num_external_tokens: int) -> None: ...

    @abstractmethod
    def build_connector_meta(self, scheduler_output: Any
                             ) -> KVConnectorMetadata: ...

    def update_connector_output(self, connector_output: Any) -> None:
        return

    def request_finished(self, request: Any, block_ids: list[int]
                         ) -> Tuple[bool, Optional[Dict[str, Any]]]:
        return False, None

    def take_events(self) -> Iterable[KVCacheEvent]:
        return ()

    @classmethod
    def get_required_kvcache_layout(cls, vllm_config: Any) -> Optional[str]:
        return None

    @classmethod
    def build_kv_connector_stats(cls, data: Optional[Dict[str, Any]] = None
                                 ) -> Any:
        return None

    def reset_cache(self) -> Optional[bool]:
        return None
