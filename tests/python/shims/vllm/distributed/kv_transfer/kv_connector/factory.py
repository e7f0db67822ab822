# STAND-IN for vLLM vllm/distributed/kv_transfer/kv_connector/factory.py
# (v0.12.0 and current: the same call): reproduces only how an out-of-tree connector is found
# (kv_connector_module_path + kv_connector class name) and constructed as
# (vllm_config, role, kv_cache_config); not vLLM.
from __future__ import annotations

import importlib
from typing import Any

from .v1.base import KVConnectorBase_V1, KVConnectorRole


class KVConnectorFactory:

    @classmethod
    def create_connector(cls, config: Any, role: KVConnectorRole,
                         kv_cache_config: Any) -> KVConnectorBase_V1:
        ktc = config.kv_transfer_config
        if ktc is None or not ktc.kv_connector_module_path:
            raise ValueError("KV connector: no kv_connector_module_path")
        mod = importlib.import_module(ktc.kv_connector_module_path)
        connector_cls = getattr(mod, ktc.kv_connector)
        if not issubclass(connector_cls, KVConnectorBase_V1):
            raise TypeError(f"{ktc.kv_connector} is not a KVConnectorBase_V1")
        return connector_cls(config, role, kv_cache_config)
