# STAND-IN for vLLM vllm/entrypoints/cli/__init__.py: reproduces only the package; not vLLM.
