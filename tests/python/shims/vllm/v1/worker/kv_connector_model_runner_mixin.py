# STAND-IN for vLLM vllm/v1/worker/kv_connector_model_runner_mixin.py and
# the KV connector part of the GPU model runners (execute_model,
# initialize_kv_cache), in the generation of vllm/__init__.py: "current" as
# read at 00f4240ee6458263d76cf51ca7901ce1350bb4d1 — the mixin (V1 runner)
# and vllm/v1/worker/gpu/kv_connector.py (V2 runner) at that commit:
# handle_preemptions(scheduler_output.kv_connector_metadata) and
# bind_connector_metadata before every forward; start_load_kv BEFORE the
# forward only when scheduler_output.has_sync_kv_loads (a load this step's
# forward reads), otherwise AFTER it ("keeping their host-side submission
# cost off the critical path"); after the forward finish_forward() (V2),
# then the deferred start_load_kv, wait_for_save,
# get_transfer_results(finished_req_ids) (finished_sending / _recving,
# failed_recving), get_block_ids_with_load_errors, get_kv_connector_stats,
# clear_connector_metadata. Under several KV cache groups (the hybrid
# allocator) the k-th layer of every group views one tensor, as upstream's
# KVCacheTensor.shared_by lays them out, and each request keeps a block
# table per group. "v0.26" as the worker of docs.vllm.ai/en/v0.18.2
# and /en/v0.26.0: handle_preemptions(metadata) every step, start_load_kv
# before the forward, get_finished. "v0.12" as in v0.12.0's gpu_model_runner
# (handle_preemptions(scheduler_output.preempted_req_ids) only in a step
# that preempted, before the persistent batch is updated and before the
# metadata is bound; start_load_kv before the forward; get_finished).
# Reproduces only the worker's KV connector call sequence: KV caches
# allocated per layer in the attention backend's get_kv_cache_shape,
# permuted by its get_kv_cache_stride_order exactly as upstream views a raw
# per-layer buffer (so HND caches have permuted strides), registered with
# the layers in the static forward context and handed to
# connector.register_kv_caches(); per step the calls above, the forward
# pass between them (wait_for_layer_load before a layer reads its cache,
# save_kv_layer after it wrote it). The metadata crosses a pickle, as it
# crosses processes upstream. Caches are NumPy arrays over a caller-given
# buffer allocator, or CPU torch tensors; the "model" is a callable of the
# test's; not vLLM.
from __future__ import annotations

import dataclasses
import pickle
from typing import Any, Callable, Dict, List, Optional, Tuple

from vllm import GENERATION as _GEN

from ..core.sched.output import SchedulerOutput
from ..core.sched.scheduler import ModelRunnerOutput
from ..outputs import KVConnectorOutput

# forward(req_id, tokens, block_ids, num_computed, wait_layer, save_layer)
#   -> (sampled token, logits or None); wait_layer(l) / save_layer(l);
#   block_ids: the request's block table, or under several KV cache groups
#   a tuple of them, one per group
Forward = Callable[..., Tuple[int, Any]]

_STORE_DTYPES = {"fp8": "uint8", "fp8_e4m3": "uint8", "fp8_e5m2": "uint8"}


@dataclasses.dataclass
class _ReqState:
    groups: List[List[int]]     # a block table per KV cache group

    @property
    def block_ids(self) -> Any:
        """Group 0's table; every group's (a tuple) under several."""
        return self.groups[0] if len(self.groups) == 1 else \
            tuple(self.groups)


@dataclasses.dataclass
class ForwardContext:
    """vllm/forward_context.py ForwardContext, reduced to the layers' KV
    caches by name."""
    kv_caches: Dict[str, Any]
    attn_metadata: Any = None


def backend_class(name: str) -> Any:
    """NOT UPSTREAM: the stand-in backend of a name (the attention selector
    picks one upstream)."""
    from ..attention.backends.cpu_attn import CPUAttentionBackend
    from ..attention.backends.flash_attn import FlashAttentionBackend
    from ..attention.backends.flashinfer import FlashInferBackend
    from ..attention.backends.mla.common import MLACommonBackend
    return {"FLASH_ATTN": FlashAttentionBackend,
            "FLASHINFER": FlashInferBackend, "CPU_ATTN": CPUAttentionBackend,
            "MLA": MLACommonBackend}[name]


class KVConnectorModelRunner:

    def __init__(self, connector: Any, num_layers: int,
                 vllm_config: Any = None, backend: str = "FLASH_ATTN",
                 groups: Optional[List[List[int]]] = None,
                 state_layers: Optional[Dict[int, int]] = None) -> None:
        from vllm.attention.layer import Attention
        self.connector = connector
        self.layer_names = [f"model.layers.{i}.self_attn.attn"
                            for i in range(num_layers)]
        # KV cache groups (layer indices) under the hybrid allocator: the
        # k-th layer of every group views one tensor (upstream's
        # KVCacheTensor shared_by), blocks being the pool's, not a group's
        self.groups = groups
        # mamba layers (index: state floats): their kv cache a list of
        # state views of the layer's tensor, one block a page; beside them
        # attention blocks are whole pages too (K and V inside the block),
        # as vLLM's GPU model runner lays them out beside mamba layers
        # (_update_hybrid_attention_mamba_layout; not read at the pin)
        self.state_layers = dict(state_layers or {})
        self.backend = backend_class(backend)
        if vllm_config is not None:
            ctx = vllm_config.compilation_config.static_forward_context
            for n in self.layer_names:
                ctx[n] = Attention(n, self.backend)
        self.kv_caches: Dict[str, Any] = {}
        self.reqs: Dict[str, _ReqState] = {}

    def initialize_kv_cache(self, num_blocks: int, block_size: int,
                            kv_heads: int, head_dim: int, dtype: Any,
                            allocator: Optional[Callable[[int], Any]] = None,
                            use_torch: bool = False,
                            cache_dtype: str = "auto",
                            torch_device: str = "cpu") -> Dict[str, Any]:
        """Per layer the backend's shape, in its physical stride order;
        with @allocator (NumPy) every layer's bytes come from one raw
        buffer allocator(nbytes), as upstream views one raw int8 tensor per
        layer. fp8 caches are 1-byte (uint8) elements, as upstream stores
        them. With @use_torch the caches are torch tensors on
        @torch_device ("cuda:0": GPU KV caches, as vLLM's)."""
        shape = self.backend.get_kv_cache_shape(num_blocks, block_size,
                                                kv_heads, head_dim,
                                                cache_dtype)
        order = self.backend.get_kv_cache_stride_order()
        phys = tuple(shape[i] for i in order)
        inv = tuple(order.index(i) for i in range(len(order)))
        store = _STORE_DTYPES.get(cache_dtype)
        if use_torch:
            import torch
            dt = getattr(torch, store) if store else dtype
            for name in self.layer_names:
                self.kv_caches[name] = torch.zeros(
                    phys, dtype=dt, device=torch_device).permute(*inv)
        else:
            import numpy as np
            dt = np.dtype(store or dtype)
            per = int(np.prod(phys)) * dt.itemsize
            tensor_of = list(range(len(self.layer_names)))
            if self.groups:
                for g in self.groups:
                    for k, layer in enumerate(g):
                        tensor_of[layer] = k
            raw = (allocator or bytearray)(per * (max(tensor_of) + 1))
            for i, name in enumerate(self.layer_names):
                if self.state_layers:
                    self.kv_caches[name] = self._state_layout(
                        i, raw, tensor_of[i] * per, shape, dt, num_blocks)
                    continue
                self.kv_caches[name] = np.ndarray(
                    phys, dtype=dt, buffer=raw,
                    offset=tensor_of[i] * per).transpose(inv)
        if self.connector is not None:
            self.connector.register_kv_caches(self.kv_caches)
        return self.kv_caches

    def _state_layout(self, i: int, raw: Any, off: int, shape: Any, dt: Any,
                      num_blocks: int) -> Any:
        """Layer @i's cache in a model with mamba layers: FlashAttention's
        (2, blocks, P, H, D) with K and V inside each block's page, or a
        mamba layer's [state view (blocks, S)]."""
        import numpy as np
        if tuple(self.backend.get_kv_cache_stride_order()) != (0, 1, 2, 3,
                                                               4):
            raise NotImplementedError("stand-in: mamba layers beside "
                                      "FLASH_ATTN NHD only")
        isz = dt.itemsize
        half = int(np.prod(shape[2:])) * isz
        if i in self.state_layers:
            return [np.ndarray((num_blocks, self.state_layers[i]), dt,
                               buffer=raw, offset=off,
                               strides=(2 * half, isz))]
        inner = tuple(int(np.prod(shape[j + 1:])) * isz
                      for j in range(2, 5))
        return np.ndarray(shape, dt, buffer=raw, offset=off,
                          strides=(half, 2 * half) + inner)

    def _update_states(self, so: SchedulerOutput) -> None:
        for rid in so.finished_req_ids:
            self.reqs.pop(rid, None)
        for rid in so.preempted_req_ids:
            self.reqs.pop(rid, None)
        for nr in so.scheduled_new_reqs:
            self.reqs[nr.req_id] = _ReqState([list(g) for g in nr.block_ids])
        cr = so.scheduled_cached_reqs
        for i, rid in enumerate(cr.req_ids):
            st = self.reqs.get(rid)
            new = cr.new_block_ids[i]
            if rid in cr.resumed_req_ids:
                self.reqs[rid] = _ReqState(
                    [list(g) for g in new] if new else
                    [[] for _ in (self.groups or [0])])
            elif new and st is not None:
                for have, add in zip(st.groups, new):
                    have += list(add)

    def execute_model(self, so: SchedulerOutput, forward: Forward,
                      tokens_of: Callable[[str], List[int]]
                      ) -> ModelRunnerOutput:
        """One step; @tokens_of(req_id) gives a request's tokens (upstream
        the runner's input batch keeps them)."""
        c = self.connector
        meta = None
        if c is not None:
            meta = pickle.loads(pickle.dumps(so.kv_connector_metadata))
            if _GEN == "v0.12" and so.preempted_req_ids:
                c.handle_preemptions(set(so.preempted_req_ids))
        self._update_states(so)
        sampled: Dict[str, int] = {}
        logits: Dict[str, Any] = {}
        kvo: Optional[KVConnectorOutput] = None
        load_started = False
        if c is not None:
            if _GEN != "v0.12":
                c.handle_preemptions(meta)
            c.bind_connector_metadata(meta)
            if _GEN != "current" or so.has_sync_kv_loads:
                c.start_load_kv(ForwardContext(self.kv_caches))
                load_started = True
        names = self.layer_names
        so_cr = so.scheduled_cached_reqs
        computed = {nr.req_id: nr.num_computed_tokens
                    for nr in so.scheduled_new_reqs}
        computed.update(zip(so_cr.req_ids, so_cr.num_computed_tokens))
        for rid, n in so.num_scheduled_tokens.items():
            st = self.reqs[rid]
            done = computed[rid] + n
            toks = list(tokens_of(rid))[:done]
            wait = (lambda l: c.wait_for_layer_load(names[l])) if c else None
            save = (lambda l: c.save_kv_layer(
                names[l], self.kv_caches[names[l]], None)) if c else None
            tok, lg = forward(rid, toks, st.block_ids, computed[rid], wait,
                              save)
            if done >= len(tokens_of(rid)):
                sampled[rid] = tok
                logits[rid] = lg
        if c is not None and _GEN != "current":
            c.wait_for_save()
            sending, recving = c.get_finished(so.finished_req_ids)
            kvo = KVConnectorOutput(
                finished_sending=sending, finished_recving=recving,
                kv_connector_stats=c.get_kv_connector_stats(),
                invalid_block_ids=c.get_block_ids_with_load_errors())
            c.clear_connector_metadata()
        elif c is not None:
            c.finish_forward()
            if not load_started:
                c.start_load_kv(ForwardContext(self.kv_caches))
            c.wait_for_save()
            res = c.get_transfer_results(so.finished_req_ids)
            kvo = KVConnectorOutput(
                finished_sending=res.finished_sending or None,
                finished_recving=res.finished_recving or None,
                failed_recving=res.failed_recving,
                kv_connector_stats=c.get_kv_connector_stats(),
                invalid_block_ids=c.get_block_ids_with_load_errors())
            c.clear_connector_metadata()
        return ModelRunnerOutput(sampled, kvo, logits)
