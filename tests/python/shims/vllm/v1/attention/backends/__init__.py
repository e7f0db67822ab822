# STAND-IN for vLLM v1/attention/backends/__init__.py: reproduces only the package; not vLLM.
