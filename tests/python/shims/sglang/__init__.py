"""STAND-IN for SGLang python/sglang/__init__.py: reproduces only the
package, so that `sglang.srt...` imports resolve in the kvtier tests; not
SGLang. See tests/python/shims/sglang/README.md.

Two interface generations, chosen by $KVT_SGLANG_GEN:
  "v0.5.6.post2"  the version bump commit 5c8bd8b51b53b9b39eb1edec582ee43b21002106
  "current"       SGLang main as stored: mem_cache/hicache_storage.py at
                  001067fffe33427bee0ed2f007fb7551a1d76b44, pool_host/mha.py
                  at 0047d999bb3a3ad311df5a4b6356bfb5586e0d66, pool_host/mla.py
                  at 01c0ede38cc9645488fd2847dbea8a2f6a9241d8
"""
import os as _os

GENERATION = _os.environ.get("KVT_SGLANG_GEN", "current")
if GENERATION not in ("v0.5.6.post2", "current"):
    raise ImportError(f"sglang stand-in: KVT_SGLANG_GEN={GENERATION!r}: "
                      f"\"v0.5.6.post2\" or \"current\"")
