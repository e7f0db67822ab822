"""STAND-IN for SGLang v0.5.6.post2 (commit 5c8bd8b51b53) python/sglang/srt/metrics/__init__.py: reproduces only the package;
not SGLang."""
