# STAND-IN for vLLM v0.12.0 vllm/distributed/kv_transfer/kv_connector/v1/__init__.py: reproduces only
# the names it exports; not vLLM.
from .base import KVConnectorBase_V1, KVConnectorRole

__all__ = ["KVConnectorBase_V1", "KVConnectorRole"]
