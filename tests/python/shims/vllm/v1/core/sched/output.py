# STAND-IN for vLLM v0.12.0 vllm/v1/core/sched/output.py: reproduces only
# the SchedulerOutput fields a KV connector reads (new and cached requests'
# block ids and computed tokens, tokens scheduled, finished and preempted
# request ids, the connector metadata); not vLLM.
from __future__ import annotations

import dataclasses
from typing import Any, Dict, List, Optional, Set, Tuple


@dataclasses.dataclass
class NewRequestData:
    req_id: str
    prompt_token_ids: List[int]
    block_ids: Tuple[List[int], ...]
    num_computed_tokens: int


@dataclasses.dataclass
class CachedRequestData:
    req_ids: List[str] = dataclasses.field(default_factory=list)
    resumed_from_preemption: List[bool] = dataclasses.field(
        default_factory=list)
    new_block_ids: List[Optional[Tuple[List[int], ...]]] = dataclasses.field(
        default_factory=list)
    num_computed_tokens: List[int] = dataclasses.field(default_factory=list)


@dataclasses.dataclass
class SchedulerOutput:
    scheduled_new_reqs: List[NewRequestData]
    scheduled_cached_reqs: CachedRequestData
    num_scheduled_tokens: Dict[str, int]
    finished_req_ids: Set[str]
    preempted_req_ids: Set[str] = dataclasses.field(default_factory=set)
    kv_connector_metadata: Any = None
