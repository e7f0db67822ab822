# STAND-IN for vLLM v0.12.0 vllm/distributed/kv_transfer/kv_connector/__init__.py: reproduces only the package; not vLLM.
