# STAND-IN for vLLM v0.12.0 vllm/distributed/kv_transfer/kv_connector/v1/
# metrics.py: reproduces only KVConnectorStats (a dataclass over a data dict
# with reset / aggregate / reduce / is_empty); not vLLM.
from __future__ import annotations

import dataclasses
from typing import Any, Dict


@dataclasses.dataclass
class KVConnectorStats:
    data: Dict[str, Any] = dataclasses.field(default_factory=dict)

    def reset(self) -> None:
        raise NotImplementedError

    def aggregate(self, other: "KVConnectorStats") -> "KVConnectorStats":
        raise NotImplementedError

    def reduce(self) -> Dict[str, Any]:
        raise NotImplementedError

    def is_empty(self) -> bool:
        raise NotImplementedError
