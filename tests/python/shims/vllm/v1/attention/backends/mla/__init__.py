# STAND-IN for vLLM v1/attention/backends/mla/__init__.py: reproduces only the package; not vLLM.
