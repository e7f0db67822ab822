"""scripts/gpu_e2e.py — a real model's KV through kvtier and back (run by
scripts/gpu-e2e, which builds kvtier and picks a Python with torch).

For each context length N: prefill N tokens (the previous turn), store the
KV through the kvtier daemon, then serve the next turn (N + M tokens) in a
fresh KV cache the way an engine with kvtier would — look the prefix up,
load it into registered host memory, copy it to the device layer by layer,
prefill only the M new tokens — and compare with a full recompute of all
N + M tokens: the logits, and the time to first token (TTFT) of both.

The model is Llama-shaped with random weights built from a config (no
weights can be downloaded): Hugging Face transformers' LlamaForCausalLM
when transformers is installed (--impl auto/transformers), otherwise a
built-in PyTorch implementation of the same architecture (--impl builtin).

What the TTFTs contain (all measured on the wall clock, device synchronized):
  full:    the prefill of N + M tokens;
  restore: hashing the prompt (daemon), lookup, the load job into host
           memory (waited per layer), the host->device copy of every layer
           (from the registered memfd, page-locked with cudaHostRegister;
           asynchronous, so layer l's copy overlaps the wait for layer
           l + 1), building
           the engine's cache, the prefill of the M new tokens.
The KV round trip is checked bit for bit (the restored K and V equal what
the prefill computed), the restored logits against the same prefill from
the device-resident cache (bit-exact expected: the same arithmetic), and
against the full recompute within a tolerance (a different batch shape
changes the order of arithmetic in the GEMMs: exact equality is not
expected there; the tolerance is stated in the JSON).

Two restore paths (--path; both on a GPU, side by side in one run):
  device:  the engine's paged KV (vLLM's per-layer (2, blocks, P, H, D))
           lives in device memory registered with the daemon BY HANDLE
           (torch CUDA tensors: CUDA IPC handles, kvtier.torch_dev); the
           daemon DMAs the pages from its page-locked dram straight into
           it and verifies each layer on the GPU; the engine's stream
           waits for layer l on the job slot's word (cuStreamWaitValue32)
           and gathers it into the model's cache, so no CPU thread waits
           per layer or touches a byte. Stores name an IPC event recorded
           after the KV writes. The daemon's own counter of CPU-copied
           restore bytes must stay 0 (restore_cpu_copy_bytes).
           On the CPU (--device cpu) the same path runs on the emulated
           device (kvtier.Device("emu"): the daemon's copies are CPU copies
           counted as the device's; per-layer waits are futex waits).
  host:    registered host memory (a memfd the daemon maps, page-locked by
           cudaHostRegister), loads waited per layer on the CPU, then
           torch's host->device copies (the path before GPU registration).
"""
from __future__ import annotations

import argparse
import ctypes
import json
import math
import os
import platform
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

import torch
import torch.nn.functional as F

import kvtier
from kvtier.staging import pin_memory, unpin_memory

CONFIGS = {
    # Llama-3.2-1B's shapes (vocabulary cut to 32000): 32 KiB of bf16 KV
    # per token, 1 GiB at 32k tokens
    "llama-1b": dict(num_hidden_layers=16, hidden_size=2048,
                     num_attention_heads=32, num_key_value_heads=8,
                     head_dim=64, intermediate_size=8192, vocab_size=32000,
                     rope_theta=500000.0, rms_norm_eps=1e-5,
                     max_position_embeddings=131072),
    # small enough for a CPU run of the whole script in seconds
    "tiny": dict(num_hidden_layers=4, hidden_size=256,
                 num_attention_heads=8, num_key_value_heads=2, head_dim=32,
                 intermediate_size=512, vocab_size=1000, rope_theta=10000.0,
                 rms_norm_eps=1e-5, max_position_embeddings=8192),
}


def hf_config(name: str, dtype: torch.dtype) -> dict:
    c = dict(CONFIGS[name])
    c.update(architectures=["LlamaForCausalLM"], model_type="llama",
             torch_dtype={torch.bfloat16: "bfloat16",
                          torch.float16: "float16",
                          torch.float32: "float32"}[dtype],
             tie_word_embeddings=False, attention_bias=False,
             mlp_bias=False)
    return c


# -- the built-in model (same architecture as transformers' Llama) ----------

class BuiltinLlama(torch.nn.Module):
    """Llama: RMSNorm, GQA with rotary embeddings, SwiGLU; no bias."""

    def __init__(self, c: dict) -> None:
        super().__init__()
        self.c = c
        h, L = c["hidden_size"], c["num_hidden_layers"]
        self.qh, self.kvh = c["num_attention_heads"], c["num_key_value_heads"]
        self.d = c["head_dim"]
        lin = lambda i, o: torch.nn.Linear(i, o, bias=False)  # noqa: E731
        self.embed = torch.nn.Embedding(c["vocab_size"], h)
        self.layers = torch.nn.ModuleList()
        for _ in range(L):
            m = torch.nn.Module()
            m.ln1 = torch.nn.Parameter(torch.ones(h))
            m.q, m.k = lin(h, self.qh * self.d), lin(h, self.kvh * self.d)
            m.v, m.o = lin(h, self.kvh * self.d), lin(self.qh * self.d, h)
            m.ln2 = torch.nn.Parameter(torch.ones(h))
            inter = c["intermediate_size"]
            m.gate, m.up, m.down = lin(h, inter), lin(h, inter), lin(inter, h)
            self.layers.append(m)
        self.norm = torch.nn.Parameter(torch.ones(h))
        self.head = lin(h, c["vocab_size"])
        for p in self.parameters():
            if p.dim() == 2:
                torch.nn.init.normal_(p, std=0.02)
        self.inv_freq = 1.0 / (c["rope_theta"] ** (
            torch.arange(0, self.d, 2, dtype=torch.float32) / self.d))

    def _rms(self, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) +
                              self.c["rms_norm_eps"])
        return w * xf.to(x.dtype)

    def _rope(self, x: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        f = pos.float()[:, None] * self.inv_freq.to(x.device)[None, :]
        emb = torch.cat([f, f], dim=-1)
        cos, sin = emb.cos().to(x.dtype), emb.sin().to(x.dtype)
        half = self.d // 2
        rot = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
        return x * cos + rot * sin

    @staticmethod
    def _attend(q, k, v, q0):
        """Causal attention of queries at positions q0.. over keys 0..;
        q [qh, T, D], k/v [qh, S, D]."""
        T, S = q.shape[1], k.shape[1]
        qpos = torch.arange(q0, q0 + T, device=q.device)[:, None]
        mask = torch.arange(S, device=q.device)[None, :] <= qpos
        if hasattr(F, "scaled_dot_product_attention"):
            return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        out = torch.empty_like(q)
        step = 256  # bounded memory for long prompts
        for s in range(0, T, step):
            e = min(T, s + step)
            sc = (q[:, s:e] @ k.transpose(1, 2)).float() / math.sqrt(q.shape[-1])
            sc = sc.masked_fill(~mask[s:e], float("-inf"))
            out[:, s:e] = (sc.softmax(-1).to(v.dtype) @ v)
        return out

    def forward(self, ids: torch.Tensor, past=None):
        """ids [T]; past: per layer (k, v) [kvh, S, D] or None. Returns
        logits [T, V] and the new per-layer (k, v) [kvh, S + T, D]."""
        T = ids.shape[0]
        q0 = 0 if past is None else past[0][0].shape[1]
        pos = torch.arange(q0, q0 + T, device=ids.device)
        x = self.embed(ids)
        new = []
        g = self.qh // self.kvh
        for i, m in enumerate(self.layers):
            hn = self._rms(x, m.ln1)
            q = m.q(hn).view(T, self.qh, self.d).transpose(0, 1)
            k = m.k(hn).view(T, self.kvh, self.d).transpose(0, 1)
            v = m.v(hn).view(T, self.kvh, self.d).transpose(0, 1)
            q, k = self._rope(q, pos), self._rope(k, pos)
            if past is not None:
                k = torch.cat([past[i][0], k], dim=1)
                v = torch.cat([past[i][1], v], dim=1)
            new.append((k, v))
            a = self._attend(q, k.repeat_interleave(g, 0),
                             v.repeat_interleave(g, 0), q0)
            x = x + m.o(a.transpose(0, 1).reshape(T, self.qh * self.d))
            hn = self._rms(x, m.ln2)
            x = x + m.down(F.silu(m.gate(hn)) * m.up(hn))
        return self.head(self._rms(x, self.norm)), new


class Model:
    """One interface over transformers' Llama and the built-in one: KV as
    per-layer (k, v) of shape [kv_heads, tokens, head_dim]."""

    def __init__(self, impl: str, cfg: dict, dtype, device, seed: int) -> None:
        torch.manual_seed(seed)
        self.impl = impl
        if impl == "transformers":
            import transformers
            self.tf = transformers
            conf = transformers.LlamaConfig(**{k: v for k, v in cfg.items()
                                               if k not in ("architectures",
                                                            "model_type",
                                                            "torch_dtype")})
            self.m = transformers.LlamaForCausalLM(conf)
            self.version = transformers.__version__
        else:
            self.m = BuiltinLlama(cfg)
            self.version = "builtin"
        self.m = self.m.to(device=device, dtype=dtype).eval()

    @torch.no_grad()
    def prefill(self, ids: torch.Tensor, past=None):
        if self.impl == "builtin":
            return self.m(ids, past)
        cache = self.tf.DynamicCache()
        if past is not None:
            for i, (k, v) in enumerate(past):
                cache.update(k[None], v[None], i)
        out = self.m(ids[None], past_key_values=cache, use_cache=True)
        pkv = out.past_key_values
        kv = [(pkv[i][0][0], pkv[i][1][0]) for i in range(len(pkv))]
        return out.logits[0], kv


# -- the daemon ---------------------------------------------------------------

class Daemon:
    def __init__(self, binary: str, cfg: dict, page_tokens: int, tiers: str,
                 workdir: str, devices: str = "",
                 extra: tuple = ()) -> None:
        self.sock = os.path.join(workdir, "d.sock")
        path = os.path.join(workdir, "config.json")
        with open(path, "w") as f:
            json.dump(cfg, f)
        self.log = open(os.path.join(workdir, "kvtierd.log"), "w")
        self.p = subprocess.Popen([binary, "serve", "--socket", self.sock,
                                   "--model", path, "--page-tokens",
                                   str(page_tokens), "--tiers", tiers] +
                                  (["--devices", devices] if devices else []) +
                                  list(extra),
                                  stdout=self.log, stderr=subprocess.STDOUT)
        kvtier.Client.wait_daemon(self.sock, timeout=30)

    def stop(self) -> int:
        self.p.send_signal(signal.SIGTERM)
        rc = self.p.wait(timeout=60)
        self.log.close()
        return rc


def sync(dev: torch.device) -> None:
    if dev.type == "cuda":
        torch.cuda.synchronize()


def host_views(mem: kvtier.Memory, geo: kvtier.Geometry, dtype, nblocks):
    """Per layer a [2, nblocks, P, H, D] tensor over the registered memory
    (vLLM layout from Client.alloc: K blocks, then V blocks)."""
    n = 2 * nblocks * geo.page_tokens * geo.kv_heads * geo.head_dim
    return [torch.frombuffer(mem.buffer, dtype=dtype, count=n,
                             offset=mem.layer_offset(l)).view(
        2, nblocks, geo.page_tokens, geo.kv_heads, geo.head_dim)
        for l in range(geo.layers)]


class Path:
    """One way of restoring: an engine's two KV areas (the previous turn's
    writer, the next turn's reader) registered with the daemon, paged as
    vLLM's (2, blocks, P, H, D) per layer. Keys are salted per path so
    each path stores and restores its own pages in the one daemon."""

    name = ""

    def __init__(self, sock: str, geo, nb: int, dev, dtype) -> None:
        self.geo, self.nb, self.dev, self.dtype = geo, nb, dev, dtype
        self.P = geo.page_tokens
        self.cl = kvtier.Client(geo, socket=sock)

    def keys(self, ids) -> list:
        return kvtier.keys_from_hashes(self.cl.hash_tokens(ids.tolist()),
                                       f"gpu-e2e|{self.name}")

    def write(self, kv) -> None:
        """The previous turn's KV into the writer's blocks."""
        g, n = self.geo, self.nb * self.P
        for l, (k, v) in enumerate(kv):
            self.wv[l][0].view(n, g.kv_heads, g.head_dim).copy_(
                k[:, :n].transpose(0, 1))
            self.wv[l][1].view(n, g.kv_heads, g.head_dim).copy_(
                v[:, :n].transpose(0, 1))

    def gather(self, l: int, hit: int):
        """Layer l of the reader's first @hit blocks as the model's cache
        ([kv_heads, tokens, head_dim] each, on the device)."""
        g, n = self.geo, self.nb * self.P
        kl = self.rv[l][0].reshape(n, g.kv_heads, g.head_dim)[:hit * self.P]
        vl = self.rv[l][1].reshape(n, g.kv_heads, g.head_dim)[:hit * self.P]
        return kl, vl

    def restore_cpu_copy_bytes(self) -> int:
        return int(self.cl.stats()["datapath"]["restore_cpu_copy_bytes"])


class HostPath(Path):
    """Registered host memory (a memfd the daemon maps; page-locked with
    cudaHostRegister on a GPU): the CPU waits for each layer, then torch
    copies it to the device (asynchronously from page-locked memory, so
    layer l's copy overlaps the wait for layer l + 1)."""

    name = "host"

    def __init__(self, *a) -> None:
        super().__init__(*a)
        gpu = self.dev.type == "cuda"
        self.wmem, self.rmem = self.cl.alloc(self.nb), self.cl.alloc(self.nb)
        self.memory = pin_memory(self.rmem) if gpu else "cpu"
        if gpu:
            pin_memory(self.wmem)
        self.nbk = self.memory == "pinned"
        self.wv = host_views(self.wmem, self.geo, self.dtype, self.nb)
        self.rv = host_views(self.rmem, self.geo, self.dtype, self.nb)

    def store(self, keys):
        return self.cl.store(self.wmem, keys, list(range(self.nb)))

    def reset(self) -> None:
        for t in self.rv:
            t.zero_()

    def load(self, keys, hit):
        job = self.cl.load(self.rmem, keys[:hit], list(range(hit)))
        past, tw = [], 0.0
        for l in range(self.geo.layers):
            a = time.perf_counter()
            if not job.wait_layer(l):
                raise RuntimeError("every block failed to load")
            tw += time.perf_counter() - a
            kl, vl = self.gather(l, hit)
            past.append((kl.to(self.dev, non_blocking=self.nbk),
                         vl.to(self.dev, non_blocking=self.nbk)))
        past = [(k.transpose(0, 1).contiguous(),
                 v.transpose(0, 1).contiguous()) for k, v in past]
        return past, tw, job

    def close(self) -> None:
        unpin_memory(self.wmem)
        unpin_memory(self.rmem)
        self.cl.close()


class DevicePath(Path):
    """The engine's KV in device memory registered by handle: torch CUDA
    tensors on a GPU (CUDA IPC handles of their allocator segments), the
    emulated device's memory on the CPU. The daemon copies pages between
    its page-locked dram and them on the device and verifies each layer
    there; on a GPU the engine's stream waits for layer l on the job
    slot's word and gathers it, with no CPU wait per layer; stores and
    loads name an IPC event recorded after the engine's last use of the
    blocks."""

    name = "device"

    def __init__(self, *a) -> None:
        super().__init__(*a)
        self.gpu = self.dev.type == "cuda"
        if self.gpu:
            from kvtier import torch_dev
            idx = self.dev.index if self.dev.index is not None else \
                torch.cuda.current_device()
            self.kdev = kvtier.Device(f"cuda:{idx}")
            self.memory = "gpu (CUDA IPC handles)"
        else:
            self.kdev = kvtier.Device("emu")
            self.memory = "emulated device (memfd)"
        self._dm = []
        self.wv, self.wmem = self._area()
        self.rv, self.rmem = self._area()
        if self.gpu:
            self.tev, self.event = torch_dev.ipc_event(self.cl)
            self.stream = self.kdev.wrap_stream(
                torch.cuda.current_stream().cuda_stream)
        else:
            self.cev = self.cl.event(self.kdev)
            self.event = self.cev
            self.stream = self.kdev.stream()

    def _area(self):
        g = self.geo
        shape = (2, self.nb, self.P, g.kv_heads, g.head_dim)
        if self.gpu:
            t = [torch.zeros(shape, dtype=self.dtype, device=self.dev)
                 for _ in range(g.layers)]
            return t, self.cl.register_torch(t)
        e = torch.tensor([], dtype=self.dtype).element_size()
        layer = math.prod(shape) * e
        dm = self.kdev.alloc(layer * g.layers)
        self._dm.append(dm)
        t = [torch.frombuffer((ctypes.c_char * layer).from_address(
            dm.ptr + l * layer), dtype=self.dtype).view(shape)
            for l in range(g.layers)]
        mem = self.cl.register_device(
            self.kdev, [dm.ptr + l * layer for l in range(g.layers)],
            self.nb, block_stride=self.P * g.kv_heads * g.head_dim * e,
            kv_stride=self.nb * self.P * g.kv_heads * g.head_dim * e,
            token_stride=g.kv_heads * g.head_dim * e)
        return t, mem

    def _record(self) -> None:
        """The event after the engine's work so far (on its stream)."""
        if self.gpu:
            self.tev.record(torch.cuda.current_stream())
        else:
            self.cev.record(self.stream)

    def store(self, keys):
        self._record()  # after write(): the daemon reads what landed
        return self.cl.store(self.wmem, keys, list(range(self.nb)),
                             event=self.event)

    def reset(self) -> None:
        for t in self.rv:
            t.zero_()

    def load(self, keys, hit):
        self._record()  # after reset(): the daemon's copies come later
        job = self.cl.load(self.rmem, keys[:hit], list(range(hit)),
                           event=self.event)
        past, tw = [], 0.0
        for l in range(self.geo.layers):
            if self.gpu:  # the GPU waits; the CPU goes on enqueueing
                job.stream_wait(l, self.stream)
            else:
                a = time.perf_counter()
                if not job.wait_layer(l):
                    raise RuntimeError("every block failed to load")
                tw += time.perf_counter() - a
            kl, vl = self.gather(l, hit)
            past.append((kl.transpose(0, 1).contiguous(),
                         vl.transpose(0, 1).contiguous()))
        return past, tw, job

    def close(self) -> None:
        sync(self.dev)
        self.cl.close()
        for dm in self._dm:
            dm.free()
        self.kdev.close()


PATHS = {"host": HostPath, "device": DevicePath}


def run_size(model: Model, geo, sock, N, M, repeats, dev, dtype, vocab, tol,
             paths):
    P = geo.page_tokens
    gen = torch.Generator().manual_seed(N)
    ids = torch.randint(0, vocab, (N + M,), generator=gen).to(dev)
    nb = N // P
    res = dict(tokens=N, new_tokens=M, page_tokens=P, paths={})

    # the previous turn: prefill N tokens; the reference: the new turn
    # from the device-resident cache
    _, kv = model.prefill(ids[:N])
    ref_logits, _ = model.prefill(ids[N:], kv)
    ps = [PATHS[p](sock, geo, nb, dev, dtype) for p in paths]
    try:
        for p in ps:  # store the previous turn's KV through each path
            r = res["paths"][p.name] = dict(memory=p.memory)
            p.write(kv)
            sync(dev)
            t0 = time.perf_counter()
            with p.store(p.keys(ids[:N])) as job:
                failed = job.wait()
                st = job.stat()
            t1 = time.perf_counter()
            if failed:
                raise RuntimeError(f"{p.name}: store failed for blocks "
                                   f"{failed[:8]}...")
            r.update(store_job_s=t1 - t0, kv_bytes=st.bytes,
                     store_gbps=st.bytes / max(t1 - t0, 1e-9) / 1e9)
        times = {p.name: [] for p in ps}
        parts = {p.name: [] for p in ps}
        cpu_bytes = {p.name: 0 for p in ps}
        full, logits = [], {}
        for rep in range(repeats + 1):  # the first is a warm-up
            for p in ps:
                r = res["paths"][p.name]
                p.reset()
                sync(dev)
                c0 = p.restore_cpu_copy_bytes()
                t0 = time.perf_counter()
                keys = p.keys(ids)
                hit = p.cl.lookup(keys).pages
                t1 = time.perf_counter()
                past, tw, job = p.load(keys, hit)
                t2 = time.perf_counter()
                out, _ = model.prefill(ids[hit * P:], past)
                failed = job.wait()  # before the logits are used
                sync(dev)
                t3 = time.perf_counter()
                job.close()
                cpu_bytes[p.name] += p.restore_cpu_copy_bytes() - c0
                if failed:
                    raise RuntimeError(f"{p.name}: load failed for blocks "
                                       f"{failed[:8]}...")
                logits[p.name] = out
                if rep == 0:
                    r["hit_pages"] = hit
                    r["kv_roundtrip_exact"] = all(
                        torch.equal(a[0], b[0][:, :hit * P]) and
                        torch.equal(a[1], b[1][:, :hit * P])
                        for a, b in zip(past, kv))
                    r["logits_equal_device_cache"] = bool(
                        torch.equal(out, ref_logits))
                    continue
                times[p.name].append(t3 - t0)
                parts[p.name].append((t1 - t0, tw, t2 - t1 - tw, t3 - t2))
                del past
            if rep == 0:
                continue
            # the full recompute, alternated with the restores
            sync(dev)
            a = time.perf_counter()
            full_logits, _ = model.prefill(ids)
            sync(dev)
            full.append(time.perf_counter() - a)
        full_new = full_logits[N:].float()
        scale = full_new.abs().max().item()
        med = statistics.median
        res.update(ttft_full_s=med(full), ttft_full_all=full)
        ok = True
        for p in ps:
            r = res["paths"][p.name]
            got = logits[p.name].float()
            diff = (got - full_new).abs().max().item()
            top1 = (got.argmax(-1) == full_new.argmax(-1)).float().mean().item()
            pt = parts[p.name]
            r.update(
                ttft_restore_s=med(times[p.name]),
                ttft_restore_all=times[p.name],
                speedup=med(full) / med(times[p.name]),
                speedup_all=[f / t for f, t in zip(full, times[p.name])],
                restore_parts_median_s=dict(
                    hash_lookup=med([x[0] for x in pt]),
                    cpu_layer_wait=med([x[1] for x in pt]),
                    load_enqueue_or_h2d=med([x[2] for x in pt]),
                    prefill_new_and_wait=med([x[3] for x in pt])),
                restore_cpu_copy_bytes=cpu_bytes[p.name],
                vs_full_recompute=dict(max_abs_diff=diff,
                                       max_abs_logit=scale,
                                       rel=diff / scale if scale else 0.0,
                                       top1_agreement=top1,
                                       tolerance_rel=tol))
            r["ok"] = bool(r["kv_roundtrip_exact"] and
                           r["logits_equal_device_cache"] and
                           diff <= tol * scale and
                           (p.name != "device" or cpu_bytes[p.name] == 0))
            ok = ok and r["ok"]
        if "host" in res["paths"] and "device" in res["paths"]:
            res["device_vs_host"] = (res["paths"]["host"]["ttft_restore_s"] /
                                     res["paths"]["device"]["ttft_restore_s"])
        res["ok"] = ok
    finally:
        for p in ps:
            p.close()
    return res


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="auto", help="auto, cuda or cpu")
    ap.add_argument("--sizes", help="context lengths (default 8192,32768 "
                    "on a GPU, 256,1024 on the CPU)")
    ap.add_argument("--new-tokens", type=int, help="M (512 GPU, 32 CPU)")
    ap.add_argument("--repeats", type=int, help="timed repeats (5 GPU, 3 CPU)")
    ap.add_argument("--page-tokens", type=int, default=16)
    ap.add_argument("--config", help="llama-1b (GPU default) or tiny (CPU)")
    ap.add_argument("--path", default="host,device",
                    help="restore paths, side by side: host (registered "
                    "host memory + torch copies), device (device memory "
                    "registered by handle; the emulated device on the "
                    "CPU); default both")
    ap.add_argument("--impl", default="auto",
                    help="auto, transformers or builtin")
    ap.add_argument("--dtype", help="bf16 (GPU default) or fp32 (CPU)")
    ap.add_argument("--kvtier-bin", default=os.environ.get("KVTIER_BIN"))
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    a = ap.parse_args()

    if a.device == "auto":
        a.device = "cuda" if torch.cuda.is_available() else "cpu"
    if a.device not in ("cuda", "cpu"):
        ap.error("--device must be auto, cuda or cpu")
    if a.device == "cuda" and not torch.cuda.is_available():
        ap.error("--device cuda: torch sees no GPU")
    gpu = a.device == "cuda"
    sizes = [int(s) for s in (a.sizes or ("8192,32768" if gpu else
                                          "256,1024")).split(",")]
    M = a.new_tokens or (512 if gpu else 32)
    repeats = a.repeats or (5 if gpu else 3)
    cname = a.config or ("llama-1b" if gpu else "tiny")
    if cname not in CONFIGS:
        ap.error(f"--config: one of {', '.join(CONFIGS)}")
    dname = a.dtype or ("bf16" if gpu else "fp32")
    dtypes = {"bf16": torch.bfloat16, "fp16": torch.float16,
              "fp32": torch.float32}
    if dname not in dtypes:
        ap.error("--dtype: bf16, fp16 or fp32")
    dtype = dtypes[dname]
    if any(n % a.page_tokens or n <= 0 for n in sizes) or M <= 0:
        ap.error("--sizes must be positive multiples of --page-tokens")
    paths = [p for p in a.path.split(",") if p]
    if not paths or any(p not in PATHS for p in paths) or \
            len(set(paths)) != len(paths):
        ap.error("--path: host, device or both (comma-separated)")
    impl = a.impl
    if impl == "auto":
        try:
            import transformers  # noqa: F401
            impl = "transformers"
        except ImportError:
            impl = "builtin"
    if not a.kvtier_bin or not os.access(a.kvtier_bin, os.X_OK):
        ap.error("no kvtier binary: set KVTIER_BIN or --kvtier-bin")
    # bf16's 8-bit mantissa: logits of a different batch shape differ by a
    # few units of the last place of the largest; fp32 by far less
    tol = {torch.bfloat16: 5e-2, torch.float16: 1e-2, torch.float32: 1e-4}[dtype]

    dev = torch.device(a.device)
    cfg = hf_config(cname, dtype)
    model = Model(impl, cfg, dtype, dev, seed=1)
    geo = kvtier.Geometry.from_config(cfg, page_tokens=a.page_tokens)
    total = sum(sizes) * geo.page_bytes // a.page_tokens * len(paths)
    dram = max(64 << 20, int(total * 1.5))
    work = tempfile.mkdtemp(prefix="kvt-e2e-")
    devices = ""
    if "device" in paths:
        devices = f"cuda:{torch.cuda.current_device()}" if gpu else "emu"
    d = Daemon(a.kvtier_bin, cfg, a.page_tokens, f"dram:{dram}", work,
               devices)
    out = dict(
        script="scripts/gpu-e2e", date=time.strftime("%Y-%m-%dT%H:%M:%SZ",
                                                     time.gmtime()),
        host=platform.node(), device=a.device,
        device_name=(torch.cuda.get_device_name(0) if gpu else
                     platform.processor() or platform.machine()),
        torch=torch.__version__, impl=impl, impl_version=model.version,
        config=cname, dtype=dname, kvtier=kvtier.version(),
        geometry=repr(geo), dram_tier_bytes=dram,
        paths=paths, daemon_devices=devices,
        note=("paths.device: KV in device memory registered by handle, "
              "pages DMA'd by the daemon and verified on the device, "
              "layer waits on the engine's stream (GPU) or futex waits "
              "(emulated device, CPU); paths.host: registered host memory "
              "(page-locked when cudaHostRegister allows: memory says), "
              "then torch's host->device copies"),
        sizes=[])
    rc = 0
    try:
        for n in sizes:
            r = run_size(model, geo, d.sock, n, M, repeats, dev, dtype,
                         cfg["vocab_size"], tol, paths)
            out["sizes"].append(r)
            for name, q in r["paths"].items():
                print(f"N={n:6d} M={M} {name:6s}: full "
                      f"{r['ttft_full_s']*1e3:9.1f} ms, restore "
                      f"{q['ttft_restore_s']*1e3:9.1f} ms "
                      f"(x{q['speedup']:.2f}); kv exact "
                      f"{q['kv_roundtrip_exact']}, logits = device cache "
                      f"{q['logits_equal_device_cache']}, vs recompute rel "
                      f"{q['vs_full_recompute']['rel']:.2e} (tol {tol:g}), "
                      f"restore CPU-copied bytes "
                      f"{q['restore_cpu_copy_bytes']} -> "
                      f"{'ok' if q['ok'] else 'FAIL'}", flush=True)
            if "device_vs_host" in r:
                print(f"N={n:6d}: device path restore x"
                      f"{r['device_vs_host']:.2f} of the host path's",
                      flush=True)
            rc |= 0 if r["ok"] else 1
    finally:
        drc = d.stop()
        shutil.rmtree(work, ignore_errors=True)
    out["daemon_exit"] = drc
    out["ok"] = rc == 0 and drc == 0
    os.makedirs(a.out, exist_ok=True)
    path = os.path.join(a.out, "gpu-e2e.json")
    with open(path, "w") as f:
        json.dump(out, f, indent=1)
    print(f"results in {path}")
    return 0 if out["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
