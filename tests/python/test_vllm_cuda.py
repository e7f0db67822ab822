"""kvtier.vllm.KvtierConnector's device path against the vLLM stand-ins
(tests/python/shims/vllm) with GPU KV caches: torch CUDA tensors,
registered with the daemon by CUDA IPC handle (kvtier.torch_dev), loads
async and layer by layer (the engine's stream waits on the client's wait
words), stores ordered by an IPC event recorded on the compute stream —
and, as its twin in CI, the same flow with the caches in the emulated
device's memory ("device": "emu"). Engine A stores a prompt, engine B
(fresh caches) restores it: every restored position is checked (the
"model" sums K over all of them, and the sum is compared with a full
recompute's), B loaded every page, none failed, and the daemon's own
counters say no CPU thread copied a page byte into engine memory.

Without a GPU (or torch with CUDA) the cuda cases skip. As a script
(scripts/gpu-check runs it so) it runs these tests and prints one JSON
object on stdout: each case's outcome and what it measured; exit 0 when
every case passed, 77 when the CUDA cases all skipped and the rest passed,
1 otherwise."""
from __future__ import annotations

import json
import os
import sys
import time
from typing import Any, Dict

import pytest

import kvtier
import kvt_testutil
import tinymodel
import vllm_engine as ve
from test_vllm_shim import fake_forward, reference

P = ve.P
RESULTS: Dict[str, Dict[str, Any]] = {}   # case -> what it measured


def cuda_ok() -> str:
    """'' when torch sees a GPU, else why not."""
    try:
        import torch
    except ImportError:
        return "no torch"
    if not torch.cuda.is_available():
        return f"torch {torch.__version__} sees no GPU"
    return ""


@pytest.fixture(autouse=True)
def hash_seed(monkeypatch):
    monkeypatch.setenv("PYTHONHASHSEED", "0")


def layer_kv(engine: ve.Engine, l: int):
    """Layer @l's K and V as [blocks, P, H, D] views: NumPy (host or
    emulated device memory) or torch (GPU)."""
    t = engine.kv[engine.runner.layer_names[l]]
    if not hasattr(t, "is_cuda") or not t.is_cuda:
        return engine.layer(l)
    a = t.permute(*[engine.roles.index(r) for r in
                    ("kv", "block", "token", "head", "dim")])
    return a[0], a[1]


def forward(engine: ve.Engine):
    """test_vllm_shim's model (K = h(prefix) + layer, V = -h(prefix); the
    token sums K over every position, restored ones too) over NumPy or
    torch views (on a GPU each read is an .item(): it follows the
    stream's waits)."""
    return fake_forward(engine, lambda l: layer_kv(engine, l))


CASES = [("cuda", "async"), ("cuda", "layerwise"), ("emu", "async"),
         ("emu", "layerwise")]


@pytest.mark.parametrize("device,mode", CASES,
                         ids=[f"{d}-{m}" for d, m in CASES])
def test_device_round_trip(workdir, device, mode):
    if device == "cuda" and cuda_ok():
        pytest.skip(cuda_ok())
    ext: Dict[str, Any] = {"socket": None}
    kw: Dict[str, Any] = {}
    if device == "emu":
        ext["device"] = "emu"
        kw["emu"] = True
    else:
        kw.update(use_torch=True, torch_device="cuda:0")
    with kvt_testutil.daemon(workdir, tinymodel.CONFIG, page_tokens=P) as s:
        ext["socket"] = s
        import numpy as np
        a = [int(t) for t in np.random.default_rng(5).integers(0, 256,
                                                                5 * P + 2)]
        ea = ve.Engine(dict(ext), **kw)
        assert ea.worker_conn._dev is not None  # the device path
        assert ea.worker_conn._torch_dev == (device == "cuda")
        ea.add("a", a, 1)
        ea.run(forward(ea))
        assert ea.stats["store_pages"] == 5
        ea.shutdown()
        eb = ve.Engine(dict(ext, save=False, load_mode=mode), **kw)
        req = eb.add("b", a + [1, 2, 3], 1)
        t0 = time.monotonic()
        eb.run(forward(eb))
        took = time.monotonic() - t0
        assert eb.stats["load_pages"] == 5 and eb.invalid == []
        assert req.output_token_ids == [reference(a + [1, 2, 3])]
        name = eb.worker_conn._dev.name
        eb.shutdown()
        g = kvtier.Geometry.from_config(tinymodel.CONFIG, page_tokens=P)
        with kvtier.Client(g, socket=s) as cl:
            dp = cl.stats()["datapath"]
        restore = {b["mover"]: b["bytes"] for b in dp["bytes"]
                   if b["flow"] == "restore"}
        assert dp["restore_cpu_copy_bytes"] == 0
        assert restore.get("cpu", 0) == 0
        assert restore.get("kernel", 0) + restore.get("copy_engine", 0) >= \
            5 * g.page_bytes
        RESULTS[f"{device}-{mode}"] = dict(
            device=name, load_pages=eb.stats["load_pages"],
            store_pages=5, restore_cpu_copy_bytes=dp["restore_cpu_copy_bytes"],
            restore_bytes_by_mover=restore,
            device_hashed_restore=dp["device_hashed"]["restore"],
            restored_step_s=round(took, 4))


class _Outcomes:
    """A pytest plugin counting each case's outcome."""

    def __init__(self) -> None:
        self.cases: Dict[str, Dict[str, Any]] = {}

    def pytest_runtest_logreport(self, report: Any) -> None:
        name = report.nodeid.split("[")[-1].rstrip("]")
        if report.when == "call" or report.outcome != "passed":
            c = self.cases.setdefault(name, {})
            if "outcome" not in c or report.outcome != "passed":
                c["outcome"] = report.outcome
                c["seconds"] = round(report.duration, 3)
                if report.outcome == "skipped" and \
                        isinstance(report.longrepr, tuple):
                    c["why"] = report.longrepr[2]
                elif report.outcome == "failed":
                    c["error"] = str(report.longrepr)[-2000:]


def main() -> int:
    out = _Outcomes()
    stdout = sys.stdout
    sys.stdout = sys.stderr  # pytest's output: stderr; the JSON: stdout
    try:
        rc = pytest.main(["-q", "-p", "no:cacheprovider", "-rs",
                          os.path.abspath(__file__)], plugins=[out])
    finally:
        sys.stdout = stdout
    # pytest imported this file as a module of its own
    mod = sys.modules.get("test_vllm_cuda")
    for k, v in getattr(mod, "RESULTS", RESULTS).items():
        out.cases.setdefault(k, {}).update(measured=v)
    counts = {o: sum(c.get("outcome") == o for c in out.cases.values())
              for o in ("passed", "failed", "skipped")}
    cuda = [c for k, c in out.cases.items() if k.startswith("cuda")]
    code = 1 if rc not in (0, 5) or counts["failed"] or not out.cases else \
        77 if all(c.get("outcome") == "skipped" for c in cuda) else 0
    json.dump({"test": "tests/python/test_vllm_cuda.py",
               "cuda": cuda_ok() or "available", "counts": counts,
               "cases": out.cases, "exit": code}, stdout, indent=1)
    stdout.write("\n")
    if code == 77:
        print(f"skip: the CUDA cases: {cuda_ok()} (the emulated device's "
              f"ran)", file=sys.stderr)
    return code


if __name__ == "__main__":
    sys.exit(main())
