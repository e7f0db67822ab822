# STAND-IN for vLLM vllm/v1/core/sched/output.py (the generation of
# vllm/__init__.py; upstream CachedRequestData as documented for v0.11.2,
# v0.12.0 and later releases): reproduces only the SchedulerOutput fields a
# KV connector reads (new and cached requests' block ids and computed
# tokens, tokens scheduled, finished and preempted request ids, the
# connector metadata). CachedRequestData has resumed_req_ids (a set); in
# "v0.12" also the deprecated per-request resumed_from_preemption list
# derived from it, which later releases removed; not vLLM.
from __future__ import annotations

import dataclasses
from typing import Any, Dict, List, Optional, Set, Tuple

from vllm import GENERATION as _GEN


@dataclasses.dataclass
class NewRequestData:
    req_id: str
    prompt_token_ids: List[int]
    block_ids: Tuple[List[int], ...]
    num_computed_tokens: int


@dataclasses.dataclass
class CachedRequestData:
    req_ids: List[str] = dataclasses.field(default_factory=list)
    # for ids in the set, new_block_ids replace the request's block ids
    resumed_req_ids: Set[str] = dataclasses.field(default_factory=set)
    new_token_ids: List[List[int]] = dataclasses.field(default_factory=list)
    all_token_ids: Dict[str, List[int]] = dataclasses.field(
        default_factory=dict)
    new_block_ids: List[Optional[Tuple[List[int], ...]]] = dataclasses.field(
        default_factory=list)
    num_computed_tokens: List[int] = dataclasses.field(default_factory=list)
    num_output_tokens: List[int] = dataclasses.field(default_factory=list)

    @property
    def num_reqs(self) -> int:
        return len(self.req_ids)

    if _GEN == "v0.12":
        @property
        def resumed_from_preemption(self) -> List[bool]:
            """Deprecated upstream ("use resumed_req_ids field")."""
            return [r in self.resumed_req_ids for r in self.req_ids]


@dataclasses.dataclass
class SchedulerOutput:
    scheduled_new_reqs: List[NewRequestData]
    scheduled_cached_reqs: CachedRequestData
    num_scheduled_tokens: Dict[str, int]
    total_num_scheduled_tokens: int
    finished_req_ids: Set[str]
    preempted_req_ids: Set[str] = dataclasses.field(default_factory=set)
    kv_connector_metadata: Any = None
    # current: a request of this step loads synchronously (its load feeds
    # this step's forward), so the workers start loads before the forward;
    # otherwise after it (kv_connector_model_runner_mixin @00f4240ee645)
    has_sync_kv_loads: bool = False
