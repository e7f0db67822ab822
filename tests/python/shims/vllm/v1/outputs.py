# STAND-IN for vLLM v0.12.0 vllm/v1/outputs.py: reproduces only
# KVConnectorOutput (what the workers' connectors report each step); not vLLM.
from __future__ import annotations

import dataclasses
from typing import Any, Optional, Set


@dataclasses.dataclass
class KVConnectorOutput:
    finished_sending: Optional[Set[str]] = None
    finished_recving: Optional[Set[str]] = None
    kv_connector_stats: Any = None
    invalid_block_ids: Set[int] = dataclasses.field(default_factory=set)
