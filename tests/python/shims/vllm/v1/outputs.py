# STAND-IN for vLLM vllm/v1/outputs.py: reproduces only KVConnectorOutput
# (what the workers' connectors report each step) as in v0.12.0, plus
# current main's failed_recving (the requests whose whole load failed, as
# the workers at 00f4240ee645 copy it from get_transfer_results; the v0.12
# workers never set it); not vLLM.
from __future__ import annotations

import dataclasses
from typing import Any, Optional, Set


@dataclasses.dataclass
class KVConnectorOutput:
    finished_sending: Optional[Set[str]] = None
    finished_recving: Optional[Set[str]] = None
    kv_connector_stats: Any = None
    invalid_block_ids: Set[int] = dataclasses.field(default_factory=set)
    failed_recving: Set[str] = dataclasses.field(default_factory=set)
