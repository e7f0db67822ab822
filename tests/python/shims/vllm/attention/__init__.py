# STAND-IN for vLLM vllm/attention/__init__.py: reproduces only the package; not vLLM.
