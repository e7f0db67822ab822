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

Known limit: GPU memory registration with the daemon is not implemented
(KVT_ENOTBUILT), so the device<->host copies are torch's (copy engines),
not kvtier's gather kernel, and they are not overlapped with the prefill.
"""
from __future__ import annotations

import argparse
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
                 workdir: str) -> None:
        self.sock = os.path.join(workdir, "d.sock")
        path = os.path.join(workdir, "config.json")
        with open(path, "w") as f:
            json.dump(cfg, f)
        self.log = open(os.path.join(workdir, "kvtierd.log"), "w")
        self.p = subprocess.Popen([binary, "serve", "--socket", self.sock,
                                   "--model", path, "--page-tokens",
                                   str(page_tokens), "--tiers", tiers],
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


def run_size(model: Model, geo, sock, N, M, repeats, dev, dtype, vocab, tol):
    P = geo.page_tokens
    gen = torch.Generator().manual_seed(N)
    ids = torch.randint(0, vocab, (N + M,), generator=gen).to(dev)
    nb = N // P
    res = dict(tokens=N, new_tokens=M, page_tokens=P)

    # the previous turn: prefill N tokens, store their KV through kvtier
    _, kv = model.prefill(ids[:N])
    writer = kvtier.Client(geo, socket=sock)
    wmem = writer.alloc(nb)
    res["store_host_memory"] = pin_memory(wmem) if dev.type == "cuda" \
        else "cpu"
    hv = host_views(wmem, geo, dtype, nb)
    sync(dev)
    t0 = time.perf_counter()
    for l, (k, v) in enumerate(kv):
        hv[l][0].view(nb * P, geo.kv_heads, geo.head_dim).copy_(
            k[:, :nb * P].transpose(0, 1))
        hv[l][1].view(nb * P, geo.kv_heads, geo.head_dim).copy_(
            v[:, :nb * P].transpose(0, 1))
    t1 = time.perf_counter()
    keys = writer.hash_tokens(ids[:N].tolist())
    with writer.store(wmem, keys, list(range(nb))) as job:
        failed = job.wait()
        st = job.stat()
    t2 = time.perf_counter()
    if failed:
        raise RuntimeError(f"store failed for blocks {failed[:8]}...")
    res.update(store_d2h_s=t1 - t0, store_job_s=t2 - t1,
               store_gbps=st.bytes / max(t2 - t1, 1e-9) / 1e9,
               kv_bytes=st.bytes)

    # the reference: the new turn from the device-resident cache
    ref_logits, _ = model.prefill(ids[N:], kv)

    # the new turn through kvtier, in a fresh engine process's cache
    reader = kvtier.Client(geo, socket=sock)
    rmem = reader.alloc(nb)
    # the restore path's memory: asynchronous copies only when page-locked
    res["host_memory"] = pin_memory(rmem) if dev.type == "cuda" else "cpu"
    nbk = res["host_memory"] == "pinned"
    rv = host_views(rmem, geo, dtype, nb)
    restore, parts, full = [], [], []
    exact_kv = exact_ref = None
    logits = None
    for r in range(repeats + 1):  # the first is a warm-up
        for t in rv:
            t.zero_()
        sync(dev)
        t0 = time.perf_counter()
        rkeys = reader.hash_tokens(ids.tolist())
        hit = reader.lookup(rkeys).pages
        t1 = time.perf_counter()
        past = []
        with reader.load(rmem, rkeys[:hit], list(range(hit))) as job:
            tw = 0.0
            for l in range(geo.layers):
                a = time.perf_counter()
                if not job.wait_layer(l):
                    raise RuntimeError("every block failed to load")
                tw += time.perf_counter() - a
                kl = rv[l][0].reshape(nb * P, geo.kv_heads, geo.head_dim)
                vl = rv[l][1].reshape(nb * P, geo.kv_heads, geo.head_dim)
                # asynchronous from pinned memory: layer l's copy runs
                # while the load of layer l + 1 is waited for
                past.append((kl[:hit * P].to(dev, non_blocking=nbk),
                             vl[:hit * P].to(dev, non_blocking=nbk)))
            past = [(k.transpose(0, 1).contiguous(),
                     v.transpose(0, 1).contiguous()) for k, v in past]
            failed = job.wait()
        if failed:
            raise RuntimeError(f"load failed for blocks {failed[:8]}...")
        sync(dev)
        t2 = time.perf_counter()
        logits, _ = model.prefill(ids[hit * P:], past)
        sync(dev)
        t3 = time.perf_counter()
        if r == 0:
            exact_kv = all(torch.equal(a[0], b[0][:, :hit * P]) and
                           torch.equal(a[1], b[1][:, :hit * P])
                           for a, b in zip(past, kv))
            exact_ref = bool(torch.equal(logits, ref_logits))
            res["hit_pages"] = hit
            continue
        restore.append(t3 - t0)
        parts.append((t1 - t0, tw, t2 - t1 - tw, t3 - t2))
        del past
        # the full recompute, alternated with the restore
        sync(dev)
        a = time.perf_counter()
        full_logits, _ = model.prefill(ids)
        sync(dev)
        full.append(time.perf_counter() - a)
    full_new = full_logits[N:].float()
    got = logits.float()
    diff = (got - full_new).abs().max().item()
    scale = full_new.abs().max().item()
    top1 = (got.argmax(-1) == full_new.argmax(-1)).float().mean().item()
    med = lambda xs: statistics.median(xs)  # noqa: E731
    res.update(
        ttft_full_s=med(full), ttft_restore_s=med(restore),
        speedup=med(full) / med(restore),
        ttft_full_all=full, ttft_restore_all=restore,
        restore_parts_median_s=dict(
            hash_lookup=med([p[0] for p in parts]),
            load_wait=med([p[1] for p in parts]),
            h2d_copy=med([p[2] for p in parts]),
            prefill_new=med([p[3] for p in parts])),
        kv_roundtrip_exact=exact_kv,
        logits_equal_device_cache=exact_ref,
        vs_full_recompute=dict(max_abs_diff=diff, max_abs_logit=scale,
                               rel=diff / scale if scale else 0.0,
                               top1_agreement=top1, tolerance_rel=tol),
    )
    res["ok"] = bool(exact_kv and exact_ref and diff <= tol * scale)
    sync(dev)
    unpin_memory(wmem)
    unpin_memory(rmem)
    writer.close()
    reader.close()
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
    total = sum(sizes) * geo.page_bytes // a.page_tokens
    dram = max(64 << 20, int(total * 1.5))
    work = tempfile.mkdtemp(prefix="kvt-e2e-")
    d = Daemon(a.kvtier_bin, cfg, a.page_tokens, f"dram:{dram}", work)
    out = dict(
        script="scripts/gpu-e2e", date=time.strftime("%Y-%m-%dT%H:%M:%SZ",
                                                     time.gmtime()),
        host=platform.node(), device=a.device,
        device_name=(torch.cuda.get_device_name(0) if gpu else
                     platform.processor() or platform.machine()),
        torch=torch.__version__, impl=impl, impl_version=model.version,
        config=cname, dtype=dname, kvtier=kvtier.version(),
        geometry=repr(geo), dram_tier_bytes=dram,
        note=("GPU memory registration with the daemon is not implemented: "
              "device<->host copies are torch copies (copy engines) from "
              "the registered memory, page-locked when cudaHostRegister "
              "allows (host_memory says)"),
        sizes=[])
    rc = 0
    try:
        for n in sizes:
            r = run_size(model, geo, d.sock, n, M, repeats, dev, dtype,
                         cfg["vocab_size"], tol)
            out["sizes"].append(r)
            print(f"N={n:6d} M={M}: full {r['ttft_full_s']*1e3:9.1f} ms, "
                  f"restore {r['ttft_restore_s']*1e3:9.1f} ms "
                  f"(x{r['speedup']:.2f}); kv exact {r['kv_roundtrip_exact']}"
                  f", logits = device cache {r['logits_equal_device_cache']}"
                  f", vs recompute rel {r['vs_full_recompute']['rel']:.2e} "
                  f"(tol {tol:g}) -> {'ok' if r['ok'] else 'FAIL'}",
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
