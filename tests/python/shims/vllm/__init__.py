# STAND-IN for vLLM vllm/__init__.py: reproduces only the package; not vLLM.
# The stand-ins under tests/python/shims/vllm mirror the import paths and the
# call sequence of vLLM's v1 KV connector interface for kvtier's tests, in two
# generations chosen by $KVT_VLLM_GEN (docs/ENGINES.md "Pinned versions"):
#   "v0.12"   vLLM v0.12.0 (tag 86e178f7c4d8c3b0eaf3c8e3f810a83f63b90e24):
#             base.py read at 13f4ad0f55b08ca1d37d1459f50ce950feaeb547
#   "v0.26"   vLLM after about v0.15 and before the post-forward load start
#             (about v0.16 - v0.28): base.py read at
#             003df2961dd8830c317a61f9745ccd557da9fa06 (an older main), the
#             worker as docs.vllm.ai/en/v0.18.2 and /en/v0.26.0 show it
#   "current" vLLM main as stored, its newest readable interface: base.py,
#             v1/worker/kv_connector_model_runner_mixin.py and
#             v1/worker/gpu/kv_connector.py all at
#             00f4240ee6458263d76cf51ca7901ce1350bb4d1 (one commit);
#             v1/core/sched/scheduler.py 00024d314514900f361ad072af6931e403b7f589
#             (the v0.26 text has no get_transfer_results, finish_forward or
#             reset_capture_state, and starts every load before the forward)
# Per generation: distributed/kv_transfer/kv_connector/v1/base.py,
# v1/core/sched/{scheduler,output}.py, v1/worker/kv_connector_model_runner_mixin.py
# (each names what it follows). The same for both, as read for v0.12.0 and
# not re-read at the current pin: config, distributed (TP rank), factory,
# metrics (KVConnectorStats), v1/outputs.py (current main's KVConnectorOutput
# adds failed_recving — reproduced —, kv_cache_events and worker metadata,
# which the connector neither sends nor reads), v1/request.py, v1/core/kv_cache_utils.py,
# v1/core/kv_cache_manager.py. Several KV cache groups (hybrid models,
# v0.26 and current): SupportsHMA in base.py (00f4240ee645, 003df2961dd8),
# the scheduler's hybrid calls as scheduler.py reads at 00f4240ee645, the
# hybrid allocator in v1/core/kv_cache_manager.py (HybridKVCacheManager:
# behaviour from copies of upstream's managers, named there).
# The attention backends name their own reads.
# entrypoints/cli/main.py is the `vllm serve` command line of the docs.
import os as _os

GENERATION = _os.environ.get("KVT_VLLM_GEN", "current")
if GENERATION not in ("v0.12", "v0.26", "current"):
    raise ImportError(f"vllm stand-in: KVT_VLLM_GEN={GENERATION!r}: "
                      f"\"v0.12\", \"v0.26\" or \"current\"")
__version__ = {"v0.12": "0.12.0", "v0.26": "0.26.0"}.get(GENERATION,
                                                         "0.33.0+stand-in")
