# STAND-IN for vLLM vllm/config/{vllm,kv_transfer,cache,model,parallel,
# scheduler,compilation}.py (both generations, see vllm/__init__.py):
# reproduces only the fields a KV connector and the stand-in scheduler read
# (VllmConfig.kv_transfer_config / cache_config / model_config /
# parallel_config / scheduler_config / compilation_config.static_forward_context,
# KVTransferConfig's connector fields, CacheConfig.cache_dtype); not vLLM.
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
    kv_load_failure_policy: str = "recompute"

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
    prefix_caching_hash_algo: str = "sha256"
    num_gpu_blocks: Optional[int] = None


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
class SchedulerConfig:
    """max_num_batched_tokens: the step's token budget; max_num_seqs;
    enable_chunked_prefill; long_prefill_token_threshold (0: none)."""
    max_num_batched_tokens: int = 2048
    max_num_seqs: int = 256
    enable_chunked_prefill: bool = True
    long_prefill_token_threshold: int = 0


@dataclasses.dataclass
class CompilationConfig:
    """static_forward_context: layer name -> its attention layer (whose
    get_attn_backend() says the KV cache's shape)."""
    static_forward_context: Dict[str, Any] = dataclasses.field(
        default_factory=dict)


@dataclasses.dataclass
class VllmConfig:
    model_config: ModelConfig = dataclasses.field(default_factory=ModelConfig)
    cache_config: CacheConfig = dataclasses.field(default_factory=CacheConfig)
    parallel_config: ParallelConfig = dataclasses.field(
        default_factory=ParallelConfig)
    scheduler_config: SchedulerConfig = dataclasses.field(
        default_factory=SchedulerConfig)
    compilation_config: CompilationConfig = dataclasses.field(
        default_factory=CompilationConfig)
    kv_transfer_config: Optional[KVTransferConfig] = None
