# STAND-IN for vLLM v1/attention/__init__.py: reproduces only the package; not vLLM.
