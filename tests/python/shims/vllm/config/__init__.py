# STAND-IN for vLLM v0.12.0 vllm/config/{vllm,kv_transfer,cache,model,
# parallel}.py: reproduces only the fields a KV connector reads (VllmConfig.
# kv_transfer_config / cache_config / model_config / parallel_config,
# KVTransferConfig's connector fields); not vLLM.
from __future__ import annotations

import dataclasses
from typing import Any, Dict, Optional


@dataclasses.dataclass
class KVTransferConfig:
    kv_connector: Optional[str] = None
    kv_connector_module_path: Optional[str] = None
    kv_role: Optional[str] = None
    kv_connector_extra_config: Dict[str, Any] = dataclasses.field(
        default_factory=dict)

    @property
    def is_kv_producer(self) -> bool:
        return self.kv_role in ("kv_producer", "kv_both")

    def get_from_extra_config(self, key: str, default: Any) -> Any:
        return self.kv_connector_extra_config.get(key, default)


@dataclasses.dataclass
class CacheConfig:
    block_size: int = 16
    cache_dtype: str = "auto"
    enable_prefix_caching: bool = True


class HFConfig(dict):
    """transformers.PretrainedConfig stand-in: a dict with to_dict()."""

    def to_dict(self) -> Dict[str, Any]:
        return dict(self)


@dataclasses.dataclass
class ModelConfig:
    model: str = "model"
    hf_config: HFConfig = dataclasses.field(default_factory=HFConfig)
    served_model_name: Optional[str] = None


@dataclasses.dataclass
class ParallelConfig:
    tensor_parallel_size: int = 1


@dataclasses.dataclass
class VllmConfig:
    model_config: ModelConfig = dataclasses.field(default_factory=ModelConfig)
    cache_config: CacheConfig = dataclasses.field(default_factory=CacheConfig)
    parallel_config: ParallelConfig = dataclasses.field(
        default_factory=ParallelConfig)
    kv_transfer_config: Optional[KVTransferConfig] = None
