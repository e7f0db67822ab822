# STAND-IN for vLLM v0.12.0 vllm/v1/core/__init__.py: reproduces only the package; not vLLM.
