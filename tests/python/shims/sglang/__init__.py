"""STAND-IN for SGLang v0.5.6.post2 (commit 5c8bd8b51b53) python/sglang/__init__.py:
reproduces only the package, so that `sglang.srt...` imports resolve in
the kvtier tests; not SGLang. See tests/python/shims/sglang/README.md."""
