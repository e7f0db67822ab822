# STAND-IN for vLLM vllm/entrypoints/__init__.py: reproduces only the package; not vLLM.
