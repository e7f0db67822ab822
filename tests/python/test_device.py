"""The Python package's device path against a real daemon, on the emulated
device (the same calls a GPU engine makes with torch CUDA tensors;
kvtier.torch_dev turns those into the handles used here): KV in device
memory registered by handle, stores ordered after the engine's writes by
an IPC event, loads with per-layer stream waits, failed blocks, the
daemon's own counters: no CPU copy or hash of a page byte on the restore
path, and a daemon killed under a waiting stream: the stream goes on, the
job fails whole."""
from __future__ import annotations

import errno
import time

import numpy as np
import pytest

import kvtier
import kvt_testutil
import tinymodel

P = 4


@pytest.fixture
def emu_daemon(workdir):
    with kvt_testutil.daemon(workdir, tinymodel.CONFIG, page_tokens=P,
                             args=("--devices", "emu")) as s:
        yield s


class EmuKV:
    """vLLM's per-layer (2, nblocks, P, H, D) KV arrays in emulated device
    memory, the engine writing them with the CPU (its "kernels")."""

    def __init__(self, cl: kvtier.Client, dev: kvtier.Device, nblocks: int):
        g = cl.geometry
        self.g, self.nblocks = g, nblocks
        self.shape = (2, nblocks, P, g.kv_heads, g.head_dim)
        self.dtype = {2: np.float16, 4: np.float32}[g.dtype_bytes]
        layer = int(np.prod(self.shape)) * g.dtype_bytes
        self.mem = dev.alloc(layer * g.layers)
        self.layers = [self.mem.array(self.dtype, self.shape, l * layer)
                       for l in range(g.layers)]
        ptrs = [self.mem.ptr + l * layer for l in range(g.layers)]
        e = g.dtype_bytes
        self.reg = cl.register_device(
            dev, ptrs, nblocks, block_stride=P * g.kv_heads * g.head_dim * e,
            kv_stride=nblocks * P * g.kv_heads * g.head_dim * e,
            token_stride=g.kv_heads * g.head_dim * e)

    def page(self, seed: int, l: int) -> np.ndarray:
        rng = np.random.default_rng(seed * 1000 + l)
        return rng.standard_normal((2,) + self.shape[2:]).astype(self.dtype)

    def write(self, block: int, seed: int) -> None:
        for l, a in enumerate(self.layers):
            a[:, block] = self.page(seed, l)

    def holds(self, block: int, seed: int, layers=None) -> bool:
        return all(np.array_equal(self.layers[l][:, block], self.page(seed, l))
                   for l in (layers if layers is not None else
                             range(self.g.layers)))


def keys_of(cl, session, n):
    rng = np.random.default_rng(session)
    return cl.hash_tokens(rng.integers(0, 1 << 30, n * P).tolist())


def test_register_store_load(emu_daemon):
    g = kvtier.Geometry.from_config(tinymodel.CONFIG, page_tokens=P)
    with kvtier.Client(g, socket=emu_daemon) as cl, \
            kvtier.Device("emu") as dev:
        assert dev.emulated and dev.name == "emu:0"
        kv = EmuKV(cl, dev, 16)
        keys = keys_of(cl, 1, 6)
        for i in range(6):
            kv.write(i, 100 + i)
        with cl.store(kv.reg, keys, list(range(6))) as j:
            assert j.wait() == []
        with cl.load(kv.reg, keys, list(range(10, 16))) as j:
            for l in range(g.layers):
                assert j.wait_layer(l)
            assert j.wait() == []
        assert all(kv.holds(10 + i, 100 + i) for i in range(6))
        # failed blocks: pages never stored
        more = keys + keys_of(cl, 2, 2)[:2]
        with cl.load(kv.reg, more, [8, 9], first=6) as j:
            assert j.wait() == [8, 9]
        dp = cl.stats()["datapath"]
        assert dp["restore_cpu_copy_bytes"] == 0
        assert dp["cpu_hashed"]["restore"] == 0
        assert dp["device_hashed"]["restore"] > 0
        restore = {b["mover"]: b["bytes"] for b in dp["bytes"]
                   if b["flow"] == "restore"}
        assert restore["kernel"] >= 6 * g.page_bytes
        assert restore["cpu"] == 0


def test_events_and_stream_waits(emu_daemon):
    g = kvtier.Geometry.from_config(tinymodel.CONFIG, page_tokens=P)
    with kvtier.Client(g, socket=emu_daemon) as cl, \
            kvtier.Device("emu") as dev:
        kv = EmuKV(cl, dev, 16)
        s = dev.stream()
        ev = cl.event(dev)
        keys = keys_of(cl, 3, 4)

        def late():  # the engine's KV writes, late on its stream
            time.sleep(0.2)
            for i in range(4):
                kv.write(i, 200 + i)

        s.host_fn(late)
        ev.record(s)
        with cl.store(kv.reg, keys, [0, 1, 2, 3], event=ev) as j:
            assert j.wait() == []
        s.sync()
        # per-layer: each layer's "attention" runs once that layer is in
        seen = {}
        with cl.load(kv.reg, keys, [8, 9, 10, 11]) as j:
            for l in range(g.layers):
                j.stream_wait(l, s)
                s.host_fn(lambda l=l: seen.__setitem__(
                    l, all(kv.holds(8 + i, 200 + i, [l]) for i in range(4))))
            s.sync()
            assert j.wait() == []
        assert seen == {l: True for l in range(g.layers)}
        assert all(kv.holds(8 + i, 200 + i) for i in range(4))
        with pytest.raises(IndexError):
            cl.load(kv.reg, keys, [8, 9, 10, 11]).stream_wait(g.layers, s)
        ev.close()
        s.close()


def test_daemon_killed_releases_stream_waits(workdir, monkeypatch):
    """kill -9 of the daemon in the middle of a load whose last layer the
    engine's stream waits for: the client library releases the wait (its
    own wait words) within a bounded time, not the emulated device's wait
    limit (10 s here); the job fails with every block."""
    g = kvtier.Geometry.from_config(tinymodel.CONFIG, page_tokens=P)
    n = 64
    # the daemon's device copies: ~150 ms a layer of the load
    per_layer = n * g.page_bytes / g.layers / (1 << 20)
    monkeypatch.setenv("KVT_EMU_DELAY_NS_PER_MIB", str(int(0.15e9 / per_layer)))
    monkeypatch.setenv("KVT_EMU_WAIT_MS", "10000")
    with kvt_testutil.daemon(workdir, tinymodel.CONFIG, page_tokens=P,
                             args=("--devices", "emu")) as d, \
            kvtier.Client(g, socket=d) as cl, kvtier.Device("emu") as dev:
        kv = EmuKV(cl, dev, 2 * n)
        keys = keys_of(cl, 4, n)
        for i in range(n):
            kv.write(i, 400 + i)
        with cl.store(kv.reg, keys, list(range(n))) as j:
            assert j.wait() == []
        s = dev.stream()
        went = []
        j = cl.load(kv.reg, keys, list(range(n, 2 * n)))
        j.stream_wait(g.layers - 1, s)
        s.host_fn(lambda: went.append(time.monotonic()))
        assert j.wait_layer(0, timeout=10)
        t = time.monotonic()
        d.kill()
        s.sync()  # raises if the wait timed out instead
        assert went and went[0] - t < 3, went
        assert j.wait(timeout=5) == list(range(n, 2 * n))
        assert j.result == -errno.ECONNRESET
        j.close()
        s.close()


def test_host_memory_cannot_claim_a_device(emu_daemon):
    g = kvtier.Geometry.from_config(tinymodel.CONFIG, page_tokens=P)
    with kvtier.Client(g, socket=emu_daemon) as cl, \
            kvtier.Device("emu") as dev:
        host = np.zeros(1 << 20, dtype=np.uint8)
        with pytest.raises(kvtier.KvtierError):
            cl.register_device(dev, [host.ctypes.data] * g.layers, 4, 64,
                               256, 16)
