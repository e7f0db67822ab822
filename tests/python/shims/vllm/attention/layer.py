# STAND-IN for vLLM vllm/attention/layer.py (v0.12.0 and current, see
# vllm/__init__.py): reproduces only Attention.get_attn_backend() (the layer
# object vLLM keeps in compilation_config.static_forward_context by layer
# name); not vLLM.
from __future__ import annotations

from typing import Any


class Attention:
    def __init__(self, layer_name: str, backend: Any) -> None:
        self.layer_name = layer_name
        self.attn_backend = backend

    def get_attn_backend(self) -> Any:
        return self.attn_backend
