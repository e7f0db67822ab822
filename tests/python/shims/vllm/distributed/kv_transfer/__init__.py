# STAND-IN for vLLM v0.12.0 vllm/distributed/kv_transfer/__init__.py: reproduces only the package; not vLLM.
