"""STAND-IN for SGLang v0.5.6.post2 (commit 5c8bd8b51b53) python/sglang/srt/mem_cache/storage/__init__.py: reproduces only the
export of StorageBackendFactory; not SGLang."""
from sglang.srt.mem_cache.storage.backend_factory import StorageBackendFactory

__all__ = ["StorageBackendFactory"]
