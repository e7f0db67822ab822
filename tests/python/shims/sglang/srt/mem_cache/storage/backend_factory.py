"""STAND-IN for SGLang v0.5.6.post2 (commit 5c8bd8b51b53)
python/sglang/srt/mem_cache/storage/backend_factory.py: reproduces only the
"dynamic" backend path of StorageBackendFactory (import module_path, take
class_name, check it subclasses HiCacheStorage, construct it as
cls(storage_config, kwargs)); not SGLang. The built-in backends (file,
nixl, mooncake, hf3fs, aibrix, eic) are not reproduced.
"""
from __future__ import annotations

import importlib
from typing import Any, Dict

from sglang.srt.mem_cache.hicache_storage import (HiCacheStorage,
                                                  HiCacheStorageConfig)


class StorageBackendFactory:
    _registry: Dict[str, Dict[str, Any]] = {}

    @staticmethod
    def _load_backend_class(module_path: str, class_name: str,
                            backend_name: str) -> type:
        try:
            module = importlib.import_module(module_path)
        except ImportError as e:
            raise ImportError(f"Failed to import backend '{backend_name}' "
                              f"from '{module_path}': {e}") from e
        try:
            cls = getattr(module, class_name)
        except AttributeError as e:
            raise AttributeError(f"Class '{class_name}' not found in module "
                                 f"'{module_path}': {e}") from e
        if not (isinstance(cls, type) and issubclass(cls, HiCacheStorage)):
            raise TypeError(f"Backend class {class_name} must inherit from "
                            f"HiCacheStorage")
        return cls

    @classmethod
    def create_backend(cls, backend_name: str,
                       storage_config: HiCacheStorageConfig,
                       mem_pool_host: Any, **kwargs: Any) -> HiCacheStorage:
        if backend_name == "dynamic" and storage_config.extra_config is not None:
            cfg = storage_config.extra_config
            for f in ("backend_name", "module_path", "class_name"):
                if f not in cfg:
                    raise ValueError(f"Missing required field '{f}' in backend "
                                     f"config for 'dynamic' backend")
            backend_class = cls._load_backend_class(
                cfg["module_path"], cfg["class_name"], cfg["backend_name"])
            # upstream passes the keyword arguments as one positional dict
            return backend_class(storage_config, kwargs)
        raise ValueError(f"Unknown storage backend '{backend_name}'. "
                         f"Registered backends: {list(cls._registry)}. ")
