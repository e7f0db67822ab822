"""A stand-in vLLM engine for the kvtier tests: the vLLM stand-ins under
tests/python/shims/vllm (scheduler, KV cache manager, worker model runner)
with kvtier.vllm.KvtierConnector created twice through the connector
factory (role SCHEDULER and role WORKER), as vLLM does.

As a program (one engine process of the numerical proof):

  vllm_engine.py --socket S --tokens 1,2,3... --out F.npz
                 [--no-save] [--load-mode async|layerwise] [--torch]
                 [--backend FLASH_ATTN|FLASHINFER|CPU_ATTN|MLA]
                 [--kv-layout NHD|HND]
      [--mamba]
      serve one request (prefill, one token) with tinymodel: restore what
      the daemon has of the prompt through the connector, prefill the
      rest, store the computed pages; writes the last prefill's logits,
      the token it started at ("cached") and the failed blocks vLLM was
      told of.

There is no GPU: tinymodel reads and writes the registered host KV
caches directly (vLLM's attention would run on the device).
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "shims"))

import numpy as np  # noqa: E402

import tinymodel  # noqa: E402
from vllm.config import (CacheConfig, HFConfig, KVTransferConfig,  # noqa: E402
                         ModelConfig, SchedulerConfig, VllmConfig)
from vllm.distributed.kv_transfer.kv_connector.factory import \
    KVConnectorFactory  # noqa: E402
from vllm.distributed.kv_transfer.kv_connector.v1.base import \
    KVConnectorRole  # noqa: E402
from vllm.v1.core.kv_cache_manager import (STATE,  # noqa: E402
                                           HybridKVCacheManager,
                                           KVCacheManager)
from vllm.v1.core.kv_cache_utils import get_request_block_hasher  # noqa: E402
from vllm.v1.core.sched.scheduler import Scheduler  # noqa: E402
from vllm.v1.kv_cache_interface import (FullAttentionSpec,  # noqa: E402
                                        KVCacheConfig, KVCacheGroupSpec,
                                        KVCacheTensor, MambaSpec,
                                        MLAAttentionSpec, SlidingWindowSpec)
from vllm.v1.request import Request, RequestStatus  # noqa: E402
from vllm.v1.worker.kv_connector_model_runner_mixin import \
    KVConnectorModelRunner  # noqa: E402

P = 4  # vLLM's --block-size here; the daemon's --page-tokens


def vllm_config(extra: Optional[Dict[str, Any]], model_config: dict,
                block_size: int = P, cache_dtype: str = "auto",
                token_budget: int = 2048, ktc: Any = None,
                model: str = "tiny-llama") -> VllmConfig:
    """A VllmConfig with kvtier's connector (None: no connector; @ktc: the
    KVTransferConfig a command line gave). "decide" is false unless @extra
    says otherwise: these engines test the data path on tinymodel, whose
    prefill any GPU's cost model prices at nothing, so kvtier's
    load-or-recompute decision would recompute every hit
    (test_decide.py tests the decision)."""
    if ktc is None and extra is not None:
        ktc = KVTransferConfig(
            kv_connector="KvtierConnector",
            kv_connector_module_path="kvtier.vllm", kv_role="kv_both",
            kv_connector_extra_config={"decide": False, **extra})
    return VllmConfig(model_config=ModelConfig(model, HFConfig(model_config)),
                      cache_config=CacheConfig(block_size=block_size,
                                               cache_dtype=cache_dtype),
                      scheduler_config=SchedulerConfig(
                          max_num_batched_tokens=token_budget),
                      kv_transfer_config=ktc)


def hybrid_groups(cfg: dict) -> Optional[List[Tuple[int, List[int]]]]:
    """The KV cache groups vLLM's hybrid allocator makes of a model with
    sliding-window or recurrent layers (tinymodel.SWA_CONFIG,
    MAMBA_CONFIG): [(window, layers)], the sliding-window (or mamba:
    window STATE) group first; None for a model without."""
    types = cfg.get("layer_types")
    if not types:
        return None
    for kind, window in (("sliding_attention", cfg.get("sliding_window")),
                         ("mamba", STATE)):
        if kind in types:
            other = [i for i, t in enumerate(types) if t != kind]
            return [(int(window), [i for i, t in enumerate(types)
                                   if t == kind]), (0, other)]
    return None


def kv_cache_config(cfg: dict, num_blocks: int, block_size: int,
                    names: Sequence[str], mamba_mode: str = "align"
                    ) -> KVCacheConfig:
    """The KVCacheConfig vLLM builds for a model of one KV cache group, or
    for a hybrid model one per group, the k-th layer of every group
    sharing a tensor (a mamba group's state page padded to the attention
    page, mamba_page_size_padded, in mamba_cache_mode @mamba_mode)."""
    groups = hybrid_groups(cfg)
    if groups:
        h, d = cfg["num_key_value_heads"], cfg["head_dim"]
        page = 2 * block_size * h * d * 4
        specs = [MambaSpec(block_size, ((cfg["state_size"],),), mamba_mode,
                           page) if w == STATE else
                 SlidingWindowSpec(block_size, h, d, sliding_window=w) if w
                 else FullAttentionSpec(block_size, h, d) for w, _ in groups]
        n = len(groups[0][1])
        return KVCacheConfig(
            num_blocks, [KVCacheTensor(0, [names[ls[k]] for _, ls in groups])
                         for k in range(n)],
            [KVCacheGroupSpec([names[i] for i in ls], spec)
             for (_, ls), spec in zip(groups, specs)])
    mla = "kv_lora_rank" in cfg
    if mla:
        spec: Any = MLAAttentionSpec(block_size, 1, cfg["kv_lora_rank"] +
                                     cfg["qk_rope_head_dim"])
    else:
        spec = FullAttentionSpec(block_size, cfg["num_key_value_heads"],
                                 cfg["head_dim"])
    return KVCacheConfig(num_blocks, [KVCacheTensor(0, [n]) for n in names],
                         [KVCacheGroupSpec(list(names), spec)])


class Engine:
    """Scheduler + one worker, stepping as vLLM's EngineCore.step()."""

    def __init__(self, extra: Optional[Dict[str, Any]], num_blocks: int = 64,
                 model_config: Optional[dict] = None, use_torch: bool = False,
                 block_size: int = P, staged: bool = False,
                 backend: str = "FLASH_ATTN", kv_layout: str = "NHD",
                 cache_dtype: str = "auto", token_budget: int = 2048,
                 kv_config: Any = "default", ktc: Any = None,
                 model: str = "tiny-llama", emu: bool = False,
                 torch_device: str = "cpu", mamba_mode: str = "align",
                 prefix_caching: bool = True) -> None:
        cfg = model_config or tinymodel.CONFIG
        self.model_config = cfg
        self.mla = "kv_lora_rank" in cfg
        if self.mla:
            backend = "MLA"
        self.config = vllm_config(extra, cfg, block_size, cache_dtype,
                                  token_budget, ktc, model)
        self.config.cache_config.enable_prefix_caching = prefix_caching
        self.config.cache_config.mamba_cache_mode = mamba_mode
        if ktc is not None:
            extra = dict(ktc.kv_connector_extra_config)
        self.block_size = block_size
        self.sched_conn = self.worker_conn = None
        os.environ["VLLM_KV_CACHE_LAYOUT"] = kv_layout
        self.groups = hybrid_groups(cfg)
        self.state_layers = [l for w, ls in self.groups or [] if w == STATE
                             for l in ls]
        self.runner = KVConnectorModelRunner(
            None, cfg["num_hidden_layers"], self.config, backend,
            groups=[ls for _, ls in self.groups] if self.groups else None,
            state_layers={l: cfg["state_size"] for l in self.state_layers})
        if kv_config == "default":
            kv_config = kv_cache_config(cfg, num_blocks, block_size,
                                        self.runner.layer_names, mamba_mode)
        if extra is not None:
            self.sched_conn = KVConnectorFactory.create_connector(
                self.config, KVConnectorRole.SCHEDULER, kv_config)
            self.worker_conn = KVConnectorFactory.create_connector(
                self.config, KVConnectorRole.WORKER, kv_config)
        self.runner.connector = self.worker_conn
        self.kvm: Any = (HybridKVCacheManager(num_blocks, block_size,
                                              [w for w, _ in self.groups])
                         if self.groups else
                         KVCacheManager(num_blocks, block_size))
        self.scheduler = Scheduler(self.kvm, self.sched_conn,
                                   self.config.scheduler_config)
        import kvtier.vllm
        dtype: Any = np.float32
        if use_torch:
            import torch
            dtype = torch.float32
        heads = 1 if self.mla else cfg["num_key_value_heads"]
        dim = (cfg["kv_lora_rank"] + cfg["qk_rope_head_dim"] if self.mla
               else cfg["head_dim"])
        self.kv = self.runner.initialize_kv_cache(
            num_blocks, block_size, heads, dim, dtype,
            allocator=None if staged else kvtier.vllm.emu_kv_buffer if emu
            else kvtier.vllm.host_kv_buffer,
            use_torch=use_torch, cache_dtype=cache_dtype,
            torch_device=torch_device)
        from kvtier.layout import vllm_roles
        t0 = next(v for v in self.kv.values()
                  if not isinstance(v, list))
        self.roles = vllm_roles(tuple(t0.shape), block_size, heads, dim,
                                self.mla,
                                self.runner.backend.get_kv_cache_shape)
        self.hasher = get_request_block_hasher(block_size)
        self.invalid: List[int] = []
        self.stats: Dict[str, int] = {}
        self.outputs: Dict[str, Tuple[int, Any]] = {}   # rid -> (start, lg)
        self._start: Dict[str, int] = {}

    def add(self, rid: str, tokens: Sequence[int], max_tokens: int = 1,
            cache_salt: Optional[str] = None) -> Request:
        req = Request(rid, list(tokens), max_tokens, cache_salt, self.hasher)
        self.scheduler.add_request(req)
        return req

    def layer(self, l: int) -> Tuple[np.ndarray, np.ndarray]:
        """Layer @l's K and V caches as NumPy views [blocks, P, H, D],
        whatever the backend's layout (MLA: the latent [blocks, P, 1, Dk]
        twice)."""
        t = self.kv[self.runner.layer_names[l]]
        a = t.numpy() if hasattr(t, "numpy") else t
        want = ["block", "token", "head", "dim"]
        if self.mla:
            lat = a.transpose([self.roles.index(r) for r in
                               ("block", "token", "dim")])[:, :, None, :]
            return lat, lat
        a = a.transpose([self.roles.index(r) for r in ["kv"] + want])
        return a[0], a[1]

    def wait_stores(self) -> None:
        """Wait for every store the worker side has issued."""
        for jobs in self.worker_conn._store_jobs.values():
            for j in jobs:
                j.wait()

    def state(self, l: int) -> np.ndarray:
        """Recurrent layer @l's states [blocks, S] (vLLM's ssm state view
        of its layer's tensor; the rest of each page is padding)."""
        return self.kv[self.runner.layer_names[l]][0]

    def step(self, forward: Callable[..., Tuple[int, Any]]) -> List[str]:
        so = self.scheduler.schedule()
        for nr in so.scheduled_new_reqs:
            self._start[nr.req_id] = nr.num_computed_tokens
        for rid, c in zip(so.scheduled_cached_reqs.req_ids,
                          so.scheduled_cached_reqs.num_computed_tokens):
            self._start[rid] = c

        def tokens_of(rid: str) -> List[int]:
            return self.scheduler.requests[rid].all_token_ids
        mro = self.runner.execute_model(so, forward, tokens_of)
        kvo = mro.kv_connector_output
        if kvo is not None:
            self.invalid += sorted(kvo.invalid_block_ids)
            if kvo.kv_connector_stats is not None:
                self._count(kvo.kv_connector_stats)
        if self.sched_conn is not None:   # its own counters (decisions)
            self._count(self.sched_conn.get_kv_connector_stats())
        for rid, lg in mro.logits.items():
            self.outputs[rid] = (self._start[rid], lg)
        return self.scheduler.update_from_output(so, mro)

    def _count(self, stats: Any) -> None:
        for k, v in (stats.reduce() if stats is not None else {}).items():
            self.stats[k] = self.stats.get(k, 0) + v

    def run(self, forward: Callable[..., Tuple[int, Any]],
            timeout: float = 20.0, drain: bool = True) -> None:
        """Step as EngineCore does while the scheduler has requests
        (unfinished ones, finished ids to send, or a connector with
        pending work); a step with nothing to schedule sleeps 1 ms, as an
        idle engine waits for its workers. Upstream then stops stepping
        even when finished requests' blocks are still held (delay_free):
        with @drain the engine steps on until they are freed, as the next
        request's arrival would make it."""
        deadline = time.monotonic() + timeout
        while self.scheduler.has_requests() or (
                drain and self.scheduler.delayed_free):
            if time.monotonic() > deadline:
                raise RuntimeError(f"engine: requests still unfinished after "
                                   f"{timeout} s")
            if not self.scheduler.running and not any(
                    r.status != RequestStatus.WAITING_FOR_REMOTE_KVS
                    for r in self.scheduler.waiting):
                time.sleep(0.001)
            self.step(forward)

    def shutdown(self) -> None:
        for c in (self.worker_conn, self.sched_conn):
            if c is not None:
                c.shutdown()


def toks(seed: int, n: int) -> List[int]:
    """@n random tokens of tinymodel's vocabulary from @seed."""
    return [int(t) for t in np.random.default_rng(seed).integers(0, 256, n)]


def hybrid_engine(sock: str, cfg: dict, device: str = "host",
                  **kw: Any) -> Engine:
    """A stand-in engine of the hybrid model @cfg, 32 blocks; @device
    "emu": its KV caches in the emulated device's memory (the GPU path,
    registered by handle)."""
    extra = {"socket": sock}
    if device == "emu":
        extra["device"] = "emu"
        kw["emu"] = True
    return Engine(extra, num_blocks=32, model_config=cfg, **kw)


def serve(e: Engine, model: tinymodel.TinyModel, tokens: Sequence[int],
          rid: str = "r") -> Tuple[int, Any]:
    """Run one request through @e; its (last step's first token, its
    logits)."""
    e.add(rid, tokens)
    e.run(tiny_forward(e, model))
    return e.outputs[rid]


def tiny_forward(engine: Engine, model: tinymodel.TinyModel
                 ) -> Callable[..., Tuple[int, Any]]:
    """tinymodel over the engine's KV caches (paged by the block table, or
    by its group's under the hybrid allocator)."""
    group_of = {l: g for g, (_, ls) in enumerate(engine.groups or [])
                for l in ls}

    state = set(getattr(engine, "state_layers", ()))
    attn = next(l for l in range(model.layers) if l not in state)

    def forward(rid, tokens, block_ids, num_computed, wait, save):
        layers = [engine.layer(attn if l in state else l)
                  for l in range(model.layers)]
        kv = tinymodel.PagedKV([k for k, _ in layers], [v for _, v in layers])
        kv.states = {l: engine.state(l) for l in state}
        table = (lambda l: block_ids[group_of[l]]) if group_of else block_ids
        lg = model.prefill(tokens, kv, table, num_computed,
                           before_layer=wait, after_layer=save)
        return int(np.argmax(lg[-1])), lg
    return forward


def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--socket", required=True)
    ap.add_argument("--tokens", required=True)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--out", required=True)
    ap.add_argument("--load-mode", default="async")
    ap.add_argument("--no-save", action="store_true")
    ap.add_argument("--torch", action="store_true")
    ap.add_argument("--backend", default="FLASH_ATTN")
    ap.add_argument("--kv-layout", default="NHD")
    ap.add_argument("--mla", action="store_true",
                    help="tinymodel's MLA variant (one latent per token)")
    ap.add_argument("--mamba", action="store_true",
                    help="tinymodel.MAMBA_CONFIG: recurrent layers beside "
                    "attention (a mamba group in \"align\" mode; the daemon "
                    "serves one group's layers)")
    ap.add_argument("--staging", type=int, default=0, metavar="BLOCKS",
                    help="KV caches in memory the daemon cannot map, moved "
                    "through the connector's staging pool of BLOCKS blocks "
                    "(the GPU path)")
    ap.add_argument("--device", default="", help="emu: KV caches in the "
                    "emulated device's memory, registered by handle (the "
                    "GPU path, on CI)")
    a = ap.parse_args(argv)
    tokens = [int(t) for t in a.tokens.split(",")]
    extra = {"socket": a.socket, "load_mode": a.load_mode,
             "save": not a.no_save}
    if a.staging:
        extra.update(staging=True, staging_blocks=a.staging)
    if a.device == "emu":
        extra.update(device="emu")
    model = (tinymodel.TinyMLAModel(seed=a.seed) if a.mla else
             tinymodel.TinyModel(seed=a.seed, config=tinymodel.MAMBA_CONFIG)
             if a.mamba else tinymodel.TinyModel(seed=a.seed))
    eng = Engine(extra, num_blocks=len(tokens) // P + 4, use_torch=a.torch,
                 staged=a.staging > 0, backend=a.backend,
                 kv_layout=a.kv_layout, model_config=model.config,
                 emu=a.device == "emu")
    eng.add("r0", tokens)
    eng.run(tiny_forward(eng, model))
    eng.shutdown()
    start, lg = eng.outputs["r0"]
    np.savez(a.out, logits=lg, cached=start,
             invalid=np.array(eng.invalid, dtype=np.int64),
             load_pages=eng.stats.get("load_pages", 0),
             store_pages=eng.stats.get("store_pages", 0),
             store_dropped=eng.stats.get("store_dropped_pages", 0))
    return 0


if __name__ == "__main__":
    sys.exit(main())
