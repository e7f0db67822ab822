"""STAND-IN for SGLang v0.5.6.post2 (commit 5c8bd8b51b53) python/sglang/srt/metrics/collector.py: reproduces only the
StorageMetrics record a storage backend's get_stats() returns (pages and
bandwidth per prefetch / backup call since the last call); not SGLang."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import List


@dataclass
class StorageMetrics:
    prefetch_pgs: List[int] = field(default_factory=list)
    backup_pgs: List[int] = field(default_factory=list)
    prefetch_bandwidth: List[float] = field(default_factory=list)
    backup_bandwidth: List[float] = field(default_factory=list)
