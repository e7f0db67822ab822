# STAND-IN for vLLM v0.12.0 vllm/__init__.py: reproduces only the package; not vLLM.
# The stand-ins under tests/python/shims/vllm mirror the import paths and the
# call sequence of vLLM's v1 KV connector interface for kvtier's tests.
