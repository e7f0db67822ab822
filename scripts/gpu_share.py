"""scripts/gpu_share.py — what the daemon's device copies cost an engine's
kernels on a GPU they share (run by scripts/gpu-check; needs torch).

The daemon's copies run in its own CUDA context. Without MPS the GPU
time-slices between contexts, so the daemon's gather and checksum kernels
and the engine's kernels take turns; under MPS they share the SMs. This
measures it, for each load method the daemon has (--load-method
cuda-kernel, the SM-capped gather kernel; cuda-batch, copy-engine DMA):

  a daemon (kvtier serve --devices cuda:N --load-method M) and this
  process as the engine: Llama-3.1-8B KV in 32-token pages (4 MiB each) in
  torch CUDA tensors registered by IPC handle, stored once; then, repeats
  alternated:
    compute alone   a fixed GEMM loop on the engine's stream (bf16
                    4096 x 4096, about 0.2 s), timed by CUDA events
    loads alone     loads of every page back to back (verified on the
                    GPU), GB/s
    shared          the same GEMM loop while loads run back to back from
                    another thread: the loop's time, the loads' GB/s
  slowdown = shared / alone GEMM time, the median of per-repeat ratios.

The machine's compute mode and whether an MPS control daemon runs are in
the JSON: the figures are for that mode only. On the CPU (--device cpu)
the emulated device and a CPU matmul stand in, to test this script: those
figures say nothing about a GPU.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time

import torch

import kvtier
from gpu_e2e import Daemon, DevicePath, sync

LLAMA_8B = dict(num_hidden_layers=32, hidden_size=4096, num_attention_heads=32,
                num_key_value_heads=8, head_dim=128, intermediate_size=14336,
                vocab_size=128256, architectures=["LlamaForCausalLM"],
                model_type="llama", torch_dtype="bfloat16")
TINY = dict(num_hidden_layers=4, hidden_size=256, num_attention_heads=8,
            num_key_value_heads=2, head_dim=32, intermediate_size=512,
            vocab_size=1000, architectures=["LlamaForCausalLM"],
            model_type="llama", torch_dtype="float32")


def gpu_mode() -> dict:
    def q(args):
        try:
            return subprocess.run(args, capture_output=True, text=True,
                                  timeout=10).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            return ""
    return dict(compute_mode=q(["nvidia-smi", "--query-gpu=compute_mode",
                                "--format=csv,noheader"]).split("\n")[0],
                mps="running" if q(["pgrep", "-x", "nvidia-cuda-mps-control"])
                else "off")


class Gemm:
    """A fixed amount of engine work on the current stream."""

    def __init__(self, dev, dtype, target_s: float) -> None:
        n = 4096 if dev.type == "cuda" else 384
        self.dev = dev
        self.a = torch.randn(n, n, device=dev, dtype=dtype)
        self.b = torch.randn(n, n, device=dev, dtype=dtype)
        self.iters = 4
        t = self.run()
        self.iters = max(4, int(self.iters * target_s / max(t, 1e-6)))

    def run(self) -> float:
        """Seconds the loop took (CUDA events on a GPU)."""
        if self.dev.type == "cuda":
            s, e = (torch.cuda.Event(enable_timing=True) for _ in range(2))
            s.record()
            for _ in range(self.iters):
                self.a @ self.b
            e.record()
            e.synchronize()
            return s.elapsed_time(e) / 1e3
        t0 = time.perf_counter()
        for _ in range(self.iters):
            self.a @ self.b
        return time.perf_counter() - t0


def loads(p: DevicePath, keys, n: int, stop: threading.Event,
          out: list) -> None:
    """Loads of every page back to back until @stop: (bytes, seconds)."""
    t0, moved = time.perf_counter(), 0
    first = True
    while first or not stop.is_set():
        with p.cl.load(p.rmem, keys, list(range(n))) as job:
            if job.wait():
                raise RuntimeError("a load failed")
            moved += job.stat().bytes
        first = False
        out.append(None)  # one load done: the shared phase may start
    out.append((moved, time.perf_counter() - t0))


def one_method(a, method: str, dev, dtype, cfg: dict) -> dict:
    geo = kvtier.Geometry.from_config(cfg, page_tokens=a.page_tokens)
    n = a.pages
    work = tempfile.mkdtemp(prefix="kvt-share-")
    devices = f"cuda:{torch.cuda.current_device()}" if dev.type == "cuda" \
        else "emu"
    d = Daemon(a.kvtier_bin, cfg, a.page_tokens,
               f"dram:{int(n * geo.page_bytes * 1.5) + (64 << 20)}", work,
               devices, ("--load-method", method))
    res = dict(method=method)
    try:
        p = DevicePath(d.sock, geo, n, dev, dtype)
        try:
            for t in p.wv:
                t.normal_()
            sync(dev)
            keys = kvtier.keys_from_hashes(
                [i.to_bytes(16, "little") for i in range(1, n + 1)],
                f"gpu-share|{method}")
            with p.store(keys) as job:
                if job.wait():
                    raise RuntimeError("the store failed")
            gemm = Gemm(dev, dtype, a.gemm_s)
            alone, shared, slow, lg_alone, lg_shared = [], [], [], [], []
            for _ in range(a.repeats):
                t = gemm.run()
                alone.append(t)
                out: list = []
                stop = threading.Event()
                stop.set()
                loads(p, keys, n, stop, out)  # loads alone: one round
                lg_alone.append(out[-1][0] / out[-1][1] / 1e9)
                out, stop = [], threading.Event()
                th = threading.Thread(target=loads,
                                      args=(p, keys, n, stop, out))
                th.start()
                while not out:
                    time.sleep(0.001)
                ts = gemm.run()
                stop.set()
                th.join()
                shared.append(ts)
                slow.append(ts / t)
                lg_shared.append(out[-1][0] / out[-1][1] / 1e9)
            med = statistics.median
            res.update(
                gemm_iters=gemm.iters, gemm_alone_s=med(alone),
                gemm_shared_s=med(shared), slowdown=med(slow),
                slowdown_min=min(slow), slowdown_max=max(slow),
                load_gbps_alone=med(lg_alone),
                load_gbps_shared=med(lg_shared), runs=[
                    dict(gemm_alone_s=x, gemm_shared_s=y,
                         load_gbps_alone=u, load_gbps_shared=v)
                    for x, y, u, v in zip(alone, shared, lg_alone,
                                          lg_shared)],
                restore_cpu_copy_bytes=p.restore_cpu_copy_bytes())
        finally:
            p.close()
    finally:
        res["daemon_exit"] = d.stop()
        shutil.rmtree(work, ignore_errors=True)
    return res


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="auto", help="auto, cuda or cpu")
    ap.add_argument("--methods", default="cuda-kernel,cuda-batch")
    ap.add_argument("--pages", type=int, help="pages (256 GPU, 8 CPU)")
    ap.add_argument("--page-tokens", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--gemm-s", type=float, default=0.2,
                    help="the GEMM loop's length alone (s)")
    ap.add_argument("--kvtier-bin", default=os.environ.get("KVTIER_BIN"))
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    a = ap.parse_args()
    if a.device == "auto":
        a.device = "cuda" if torch.cuda.is_available() else "cpu"
    if a.device == "cuda" and not torch.cuda.is_available():
        ap.error("--device cuda: torch sees no GPU")
    if not a.kvtier_bin or not os.access(a.kvtier_bin, os.X_OK):
        ap.error("no kvtier binary: set KVTIER_BIN or --kvtier-bin")
    gpu = a.device == "cuda"
    a.pages = a.pages or (256 if gpu else 8)
    if a.pages <= 0 or a.repeats <= 0:
        ap.error("--pages and --repeats must be positive")
    dev = torch.device(a.device)
    dtype = torch.bfloat16 if gpu else torch.float32
    cfg = LLAMA_8B if gpu else TINY
    out = dict(script="scripts/gpu-share",
               date=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
               host=platform.node(), device=a.device,
               device_name=(torch.cuda.get_device_name(0) if gpu else
                            platform.machine()),
               torch=torch.__version__, kvtier=kvtier.version(),
               pages=a.pages, page_tokens=a.page_tokens,
               repeats=a.repeats, **(gpu_mode() if gpu else {}),
               note=("slowdown: the engine's GEMM loop while the daemon loads "
                     "back to back, over the loop alone (median of per-repeat "
                     "ratios); for this machine's compute mode only" if gpu
                     else "CPU: the emulated device and a CPU matmul, a test "
                     "of this script; nothing here is about a GPU"),
               methods=[])
    ok = True
    for m in a.methods.split(","):
        r = one_method(a, m, dev, dtype, cfg)
        out["methods"].append(r)
        ok = ok and r["daemon_exit"] == 0 and r["restore_cpu_copy_bytes"] == 0
        print(f"{m:12s}: GEMM x{r['slowdown']:.2f} while loading "
              f"({r['slowdown_min']:.2f}-{r['slowdown_max']:.2f}); loads "
              f"{r['load_gbps_alone']:.2f} GB/s alone, "
              f"{r['load_gbps_shared']:.2f} shared", flush=True)
    out["ok"] = ok
    os.makedirs(a.out, exist_ok=True)
    path = os.path.join(a.out, "gpu-share.json")
    with open(path, "w") as f:
        json.dump(out, f, indent=1)
    print(f"results in {path}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
