# STAND-IN for vLLM v0.12.0 vllm/v1/worker/kv_connector_model_runner_mixin.py
# (and gpu_model_runner.py's KV cache set-up): reproduces only the worker's
# KV connector call sequence: KV caches allocated per layer in
# FlashAttention's shape (2, num_blocks, block_size, kv_heads, head_dim)
# and handed to connector.register_kv_caches(); per step
# handle_preemptions, bind_connector_metadata, start_load_kv, the forward
# pass (wait_for_layer_load before a layer reads its cache, save_kv_layer
# after it wrote it), wait_for_save, get_finished(finished_req_ids),
# get_block_ids_with_load_errors, get_kv_connector_stats,
# clear_connector_metadata. The metadata crosses a pickle, as it crosses
# processes upstream. Caches are NumPy arrays over a caller-given buffer
# allocator, or CPU torch tensors (torch.zeros, as upstream allocates);
# the "model" is a callable of the test's; not vLLM.
from __future__ import annotations

import dataclasses
import pickle
from typing import Any, Callable, Dict, List, Optional, Tuple

from ..core.sched.output import SchedulerOutput
from ..core.sched.scheduler import ModelRunnerOutput
from ..outputs import KVConnectorOutput

# forward(req_id, tokens, block_ids, num_computed, wait_layer, save_layer)
#   -> (sampled token, logits or None); wait_layer(l) / save_layer(l)
Forward = Callable[..., Tuple[int, Any]]


@dataclasses.dataclass
class _ReqState:
    block_ids: List[int]


@dataclasses.dataclass
class ForwardContext:
    """vllm/forward_context.py ForwardContext, reduced to the layers' KV
    caches by name."""
    kv_caches: Dict[str, Any]
    attn_metadata: Any = None


class KVConnectorModelRunner:

    def __init__(self, connector: Any, num_layers: int) -> None:
        self.connector = connector
        self.layer_names = [f"model.layers.{i}.self_attn.attn"
                            for i in range(num_layers)]
        self.kv_caches: Dict[str, Any] = {}
        self.reqs: Dict[str, _ReqState] = {}

    def initialize_kv_cache(self, num_blocks: int, block_size: int,
                            kv_heads: int, head_dim: int, dtype: Any,
                            allocator: Optional[Callable[[int], Any]] = None,
                            use_torch: bool = False) -> Dict[str, Any]:
        """Per layer (2, num_blocks, block_size, kv_heads, head_dim); with
        @allocator (NumPy) every layer's bytes come from one raw buffer
        allocator(nbytes), as upstream views one raw int8 tensor per
        layer group."""
        shape = (2, num_blocks, block_size, kv_heads, head_dim)
        if use_torch:
            import torch
            for name in self.layer_names:
                self.kv_caches[name] = torch.zeros(shape, dtype=dtype)
        else:
            import numpy as np
            per = int(np.prod(shape)) * np.dtype(dtype).itemsize
            raw = (allocator or bytearray)(per * len(self.layer_names))
            for i, name in enumerate(self.layer_names):
                self.kv_caches[name] = np.ndarray(shape, dtype=dtype,
                                                  buffer=raw, offset=i * per)
        if self.connector is not None:
            self.connector.register_kv_caches(self.kv_caches)
        return self.kv_caches

    def _update_states(self, so: SchedulerOutput) -> None:
        for rid in so.finished_req_ids:
            self.reqs.pop(rid, None)
        for rid in so.preempted_req_ids:
            self.reqs.pop(rid, None)
        for nr in so.scheduled_new_reqs:
            self.reqs[nr.req_id] = _ReqState(list(nr.block_ids[0]))
        cr = so.scheduled_cached_reqs
        for i, rid in enumerate(cr.req_ids):
            st = self.reqs.get(rid)
            new = cr.new_block_ids[i]
            if cr.resumed_from_preemption[i]:
                self.reqs[rid] = _ReqState(list(new[0]) if new else [])
            elif new and st is not None:
                st.block_ids += list(new[0])

    def execute_model(self, so: SchedulerOutput, forward: Forward,
                      tokens_of: Callable[[str], List[int]]
                      ) -> ModelRunnerOutput:
        """One step; @tokens_of(req_id) gives a request's tokens (upstream
        the runner's input batch keeps them)."""
        self._update_states(so)
        c = self.connector
        sampled: Dict[str, int] = {}
        logits: Dict[str, Any] = {}
        kvo: Optional[KVConnectorOutput] = None
        if c is not None:
            meta = pickle.loads(pickle.dumps(so.kv_connector_metadata))
            c.handle_preemptions(meta)
            c.bind_connector_metadata(meta)
            c.start_load_kv(ForwardContext(self.kv_caches))
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
        if c is not None:
            c.wait_for_save()
            sending, recving = c.get_finished(so.finished_req_ids)
            kvo = KVConnectorOutput(
                finished_sending=sending, finished_recving=recving,
                kv_connector_stats=c.get_kv_connector_stats(),
                invalid_block_ids=c.get_block_ids_with_load_errors())
            c.clear_connector_metadata()
        return ModelRunnerOutput(sampled, kvo, logits)
