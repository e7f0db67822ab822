"""The kvtier Python package against a real daemon: every call, its errors,
and bytes checked end to end."""
from __future__ import annotations

import errno
import os
import select
import subprocess
import sys

import numpy as np
import pytest

import kvtier
import kvt_testutil
import tinymodel
from tinymodel import PagedKV

P = 4


def geo(**over):
    cfg = dict(tinymodel.CONFIG, **over)
    return kvtier.Geometry.from_config(cfg, page_tokens=P)


def fill(kv: PagedKV, layers: int, blocks, seed: int) -> None:
    rng = np.random.default_rng(seed)
    for l in range(layers):
        for b in blocks:
            kv.k(l)[b] = rng.standard_normal(kv.k(l)[b].shape)
            kv.v(l)[b] = rng.standard_normal(kv.v(l)[b].shape)


def same(a: PagedKV, ab, b: PagedKV, bb, layers: int) -> bool:
    return all(np.array_equal(a.k(l)[x], b.k(l)[y]) and
               np.array_equal(a.v(l)[x], b.v(l)[y])
               for l in range(layers) for x, y in zip(ab, bb))


def test_geometry_and_errors(tiny_daemon):
    g = geo()
    assert (g.layers, g.kv_heads, g.head_dim, g.dtype_bytes) == (4, 2, 16, 4)
    assert g.chunk_bytes == P * 2 * 16 * 4
    assert g.page_bytes == g.chunk_bytes * 2 * 4
    with pytest.raises(kvtier.KvtierError) as e:
        kvtier.Geometry.from_config({"hidden_size": 8}, page_tokens=P)
    assert e.value.code == kvtier.KVT_ECONFIG and e.value.detail
    with pytest.raises(kvtier.KvtierError) as e:
        kvtier.Geometry.from_preset("no-such-model", page_tokens=P)
    assert e.value.name == "KVT_EPRESET" and "llama-3.1-8b" in e.value.detail
    # a geometry other than the namespace's is refused, with the reason
    with pytest.raises(kvtier.KvtierError) as e:
        kvtier.Client(geo(num_hidden_layers=3), socket=tiny_daemon)
    assert e.value.code == kvtier.KVT_EGEOM and "differs" in e.value.detail
    with pytest.raises(kvtier.KvtierError) as e:
        kvtier.Client(g, socket=tiny_daemon, ns="other")
    assert e.value.code == kvtier.KVT_ENOTFOUND
    with pytest.raises(kvtier.KvtierError) as e:
        kvtier.Client(g, socket=tiny_daemon + ".none")
    assert e.value.code == -errno.ENOENT
    with kvtier.Client(g, socket=tiny_daemon) as cl:
        assert cl.geometry.layers == 4
    with pytest.raises(ValueError):
        cl.lookup([b"\0" * 16])  # closed


def test_keys(tiny_daemon):
    g = geo()
    toks = list(range(1, 4 * P + 3))
    with kvtier.Client(g, socket=tiny_daemon) as a, \
            kvtier.Client(g, socket=tiny_daemon) as b:
        ka = a.hash_tokens(toks)
        assert len(ka) == 4 and all(len(k) == 16 for k in ka)
        assert ka == b.hash_tokens(toks)
        # chained: a different first page changes every key after it
        kc = a.hash_tokens([0] + toks[1:])
        assert all(x != y for x, y in zip(ka, kc))
        assert a.hash_tokens(toks[:P - 1]) == []
    # engine hashes: the same in another process (no hash seed), salted
    hs = [b"\x01" * 32, "abc", 12345, -7]
    k1 = kvtier.keys_from_hashes(hs, salt=b"m")
    code = ("import kvtier; print(kvtier.keys_from_hashes("
            "[b'\\x01' * 32, 'abc', 12345, -7], salt=b'm')[3].hex())")
    out = subprocess.run([sys.executable, "-c", code], check=True,
                         capture_output=True, text=True,
                         env=dict(os.environ, PYTHONHASHSEED="123"))
    assert out.stdout.strip() == k1[3].hex()
    assert kvtier.keys_from_hashes(hs, salt=b"n") != k1
    assert len(set(k1)) == 4
    with pytest.raises(TypeError):
        kvtier.keys_from_hashes([1.5])


def test_store_lookup_load_bytes(tiny_daemon):
    g = geo()
    toks = list(range(100, 100 + 6 * P))
    with kvtier.Client(g, socket=tiny_daemon) as a, \
            kvtier.Client(g, socket=tiny_daemon) as b:
        ma, mb = a.alloc(16), b.alloc(8)
        kva, kvb = PagedKV.from_memory(ma, g), PagedKV.from_memory(mb, g)
        keys = a.hash_tokens(toks)
        src = [3, 9, 1, 15, 4, 7]
        fill(kva, 4, src, seed=1)
        assert a.lookup(keys).pages == 0
        with a.store(ma, keys[:4], src[:4]) as job:
            assert job.wait() == [] and job.result == 0
            st = job.stat()
            assert st.copied == 4 and st.pages == 4
        # the rest of the prefix, from page 4 on (its parents are cached)
        with a.store(ma, keys, src[4:], first=4) as job:
            assert job.wait() == []
        r = b.lookup(keys)
        assert r.pages == 6 and r.tier_pages["dram"] == 6 and r.inflight == 0
        dst = [7, 0, 5, 2, 6, 1]
        with b.load(mb, keys, dst) as job:
            for l in range(g.layers):
                assert job.wait_layer(l, timeout=10)
            assert job.wait() == []
            st = job.stat()
            assert st.copied == 6 and st.verified == 6
            assert st.from_tier["dram"] == 6
        assert same(kva, src, kvb, dst, 4)
        # a suffix load: pages 2..5 only
        fill(kvb, 4, dst, seed=9)
        with b.load(mb, keys, dst[2:], first=2) as job:
            assert job.wait() == []
        assert same(kva, src[2:], kvb, dst[2:], 4)


def test_absent_pages_are_failed_blocks(tiny_daemon):
    g = geo()
    with kvtier.Client(g, socket=tiny_daemon) as cl:
        m = cl.alloc(4)
        kv = PagedKV.from_memory(m, g)
        keys = cl.hash_tokens(list(range(3 * P)))
        kv.k(0)[2] = 5.0
        with cl.load(m, keys, [2, 0, 1]) as job:
            assert job.wait_layer(0, timeout=10) is False
            assert job.wait() == [2, 0, 1]
            assert job.result == kvtier.KVT_ENOTFOUND
        assert (kv.k(0)[2] == 5.0).all()  # nothing written to a failed block
        # a store whose parents are not cached is refused, naming the page
        with pytest.raises(kvtier.KvtierError) as e:
            cl.store(m, keys, [0], first=2)
        assert e.value.code == kvtier.KVT_ENOTFOUND


def test_bad_arguments(tiny_daemon):
    g = geo()
    with kvtier.Client(g, socket=tiny_daemon) as cl:
        m = cl.alloc(4)
        keys = cl.hash_tokens(list(range(2 * P)))
        with pytest.raises(ValueError, match="blocks for pages"):
            cl.load(m, keys, [0])
        with pytest.raises(ValueError, match="outside the 4 registered"):
            cl.load(m, keys, [0, 4])
        with pytest.raises(ValueError, match="16 bytes"):
            cl.lookup([b"short"])
        with pytest.raises(ValueError, match="first="):
            cl.store(m, keys, [], first=3)
        with pytest.raises(ValueError, match="out of range"):
            cl.hash_tokens([-1] * P)
        with pytest.raises(ValueError, match="layer offsets"):
            cl.register_fd(0, [0], 1, 1, 1, 1)
        with kvtier.Client(g, socket=tiny_daemon) as other:
            with pytest.raises(ValueError, match="not registered by"):
                other.load(m, keys, [0, 1])
        with cl.load(m, keys, [0, 1]) as job:
            job.wait()
            with pytest.raises(IndexError):
                job.wait_layer(4)
        m.free()
        with pytest.raises(ValueError, match="freed"):
            cl.load(m, keys, [0, 1])


def test_strided_layout_and_gpu_refusal(tiny_daemon):
    """Memory in a block-outer layout (SGLang's page_first_direct: per
    block, per layer, K then V) exchanges pages with vLLM-layout memory."""
    g = geo()
    c = g.chunk_bytes
    nb, L = 6, g.layers
    block_stride, kv_stride = 2 * L * c, c
    offs = [l * 2 * c for l in range(L)]
    with kvtier.Client(g, socket=tiny_daemon) as cl:
        mv = cl.alloc(8)
        kvv = PagedKV.from_memory(mv, g)
        ms = cl.alloc_memfd(nb * block_stride, offs, nb, block_stride,
                            kv_stride, g.kv_heads * g.head_dim * 4)
        kvs = PagedKV.from_strided(ms.buffer, offs, nb, block_stride,
                                   kv_stride, g.kv_heads * g.head_dim * 4,
                                   P, g.kv_heads, g.head_dim)
        keys = cl.hash_tokens(list(range(500, 500 + 3 * P)))
        fill(kvs, L, [5, 0, 3], seed=3)
        with cl.store(ms, keys, [5, 0, 3]) as j:
            assert j.wait() == []
        with cl.load(mv, keys, [1, 2, 7]) as j:
            assert j.wait() == []
        assert same(kvs, [5, 0, 3], kvv, [1, 2, 7], L)
        # overlapping chunks are refused with the stride named
        with pytest.raises(kvtier.KvtierError) as e:
            cl.alloc_memfd(nb * block_stride, offs, nb, c // 2, kv_stride,
                           g.kv_heads * g.head_dim * 4)
        assert e.value.code in (kvtier.KVT_EGEOM, -errno.EINVAL)
        # a memfd is host memory: device memory comes by handle
        # (register_device), and a memfd said to be on a GPU is refused
        fd = os.memfd_create("x", os.MFD_ALLOW_SEALING)
        try:
            with pytest.raises(kvtier.KvtierError) as e:
                cl.register_fd(fd, offs, nb, block_stride, kv_stride,
                               g.kv_heads * g.head_dim * 4, device=0)
            assert e.value.code == -errno.EINVAL
            assert "register_dev" in e.value.detail
        finally:
            os.close(fd)


def test_fileno_poll_cancel_stats(tiny_daemon):
    g = geo()
    with kvtier.Client(g, socket=tiny_daemon) as cl:
        m = cl.alloc(64)
        keys = cl.hash_tokens(list(range(64 * P)))
        job = cl.store(m, keys, list(range(64)))
        r, _, _ = select.select([cl], [], [], 10)
        assert r == [cl]
        os.read(cl.fileno(), 8)
        while not job.poll():
            select.select([job], [], [], 1)
        assert job.wait() == [] and job.cancel() is False
        job.close()
        st = cl.stats()
        assert st["format"] == 1 and st["gauges"]["clients"] >= 1
        assert [t["tier"] for t in st["tiers"]] == ["dram"]
        cl.quiesce()


def test_daemon_gone_is_connection_lost(workdir):
    """The daemon killed under a client: its next request raises
    ConnectionLost; a job is not an exception — it ends with every block
    failed (or done, if it finished before the kill)."""
    g = geo()
    with kvt_testutil.daemon(workdir, tinymodel.CONFIG, page_tokens=P) as d:
        cl = kvtier.Client(g, socket=d)
        n = 4096
        m = cl.alloc(n)
        keys = cl.hash_tokens(list(range(n * P)))
        assert cl.store(m, keys, list(range(n))).wait() == []
        job = cl.load(m, keys, list(range(n)))
        d.kill()
        failed = job.wait(timeout=10)
        assert (failed, job.result) == ([], 0) or (
            failed == list(range(n)) and
            job.result in (-errno.ECONNRESET, -errno.EPIPE)), job.result
        with pytest.raises(kvtier.ConnectionLost) as e:
            cl.lookup(keys)
        assert e.value.code in (-errno.ECONNRESET, -errno.EPIPE)
        cl.close()  # after the daemon died: no hang, no crash
        assert job.wait() == failed  # what it had: the client is closed
        job.close()
        with pytest.raises(ValueError):
            job.wait()


def test_library_lookup():
    """$KVTIER_LIB that does not load is an error naming it (no fallback);
    without it, the dynamic loader finds libkvtier.so.1 (as installed)."""
    lib = os.environ["KVTIER_LIB"]
    env = dict(os.environ, KVTIER_LIB="/nonexistent/libkvtier.so")
    r = subprocess.run([sys.executable, "-c", "import kvtier"], env=env,
                       capture_output=True, text=True)
    assert r.returncode != 0 and "/nonexistent/libkvtier.so" in r.stderr
    assert "KVTIER_LIB" in r.stderr
    env = {k: v for k, v in os.environ.items() if k != "KVTIER_LIB"}
    env["LD_LIBRARY_PATH"] = os.path.dirname(os.path.realpath(lib))
    if env.get("PYTHONPATH"):  # run from the source tree: keep it findable
        env["PYTHONPATH"] = os.pathsep.join(
            os.path.abspath(x) for x in env["PYTHONPATH"].split(os.pathsep))
    r = subprocess.run([sys.executable, "-c",
                        "import kvtier; print(kvtier.version())"], env=env,
                       capture_output=True, text=True, cwd="/")
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == kvtier.version()


def test_jobs_not_closed_are_collected(tiny_daemon):
    """Jobs dropped without close() are freed by the garbage collector, so
    a loop that never closes them does not run into the client's job
    limit (1024)."""
    import gc
    g = geo()
    with kvtier.Client(g, socket=tiny_daemon) as cl:
        m = cl.alloc(2)
        keys = cl.hash_tokens(list(range(2 * P)))
        cl.store(m, keys, [0, 1]).wait()
        for _ in range(1100):
            assert cl.load(m, keys, [0, 1]).wait() == []
        gc.collect()
        assert len(cl._jobs) == 0


def test_lookup_each(tiny_daemon):
    """each=True: every key a one-page prefix of its own (SGLang's pages):
    the leading run of keys each cached, in one request."""
    g = geo()
    with kvtier.Client(g, socket=tiny_daemon) as cl:
        m = cl.alloc(8)
        keys = kvtier.keys_from_hashes([f"page{i}" for i in range(6)])
        for i in (0, 1, 2, 4):
            assert cl.store(m, [keys[i]], [i]).wait() == []
        r = cl.lookup(keys, each=True)
        assert (r.pages, r.tier_pages["dram"], r.inflight) == (3, 3, 0)
        assert cl.lookup(keys).pages == 1     # as a chain: page 0 only
        assert cl.lookup(keys[4:], each=True).pages == 1
        assert cl.lookup(keys[3:], each=True, touch=False).pages == 0


def test_each_jobs(tiny_daemon):
    """each=True jobs: many one-page prefixes in one request; a page that
    is absent fails alone."""
    g = geo()
    with kvtier.Client(g, socket=tiny_daemon) as cl:
        m = cl.alloc(16)
        kv = PagedKV.from_memory(m, g)
        keys = kvtier.keys_from_hashes([f"p{i}" for i in range(5)], b"t")
        fill(kv, 4, range(5), seed=5)
        with cl.store(m, keys, list(range(5)), each=True) as j:
            assert j.wait() == [] and j.stat().copied == 5
        assert cl.lookup(keys, each=True).pages == 5
        other = kvtier.keys_from_hashes(["absent"], b"t")
        ks = [keys[3], other[0], keys[0]]
        with cl.load(m, ks, [10, 11, 12], each=True) as j:
            assert j.wait() == [11]
            st = j.stat()  # why it failed: no copy (not being stored)
            assert (st.failed, st.absent, st.busy) == (1, 1, 0)
        assert same(kv, [3, 0], kv, [10, 12], 4)
        with pytest.raises(ValueError, match="must be 0"):
            cl.load(m, keys, [1], first=4, each=True)


def _stopped(proc):
    """SIGSTOP @proc until the block ends (then SIGCONT)."""
    import contextlib
    import signal

    @contextlib.contextmanager
    def cm():
        os.kill(proc.pid, signal.SIGSTOP)
        try:
            yield
        finally:
            os.kill(proc.pid, signal.SIGCONT)
    return cm()


def test_request_timeout_drops_the_connection(tiny_daemon):
    """A request the daemon does not answer in timeout_ms raises
    RequestTimeout — a ConnectionLost and a TimeoutError — once; then
    ConnectionLost, never a protocol error from a reply out of step (issue
    21: TimeoutError once, then KVT_EPROTO forever). A load whose reply
    did not come returns once the daemon let go (released)."""
    import time
    g = geo()
    cl = kvtier.Client(g, socket=tiny_daemon, timeout_ms=300)
    m = cl.alloc(2)
    keys = cl.hash_tokens(list(range(2 * P)))
    assert cl.store(m, keys, [0, 1]).wait() == []
    with _stopped(tiny_daemon.proc):
        time.sleep(0.05)
        with pytest.raises(kvtier.RequestTimeout) as e:
            cl.lookup(keys)
    assert isinstance(e.value, kvtier.ConnectionLost)
    assert isinstance(e.value, TimeoutError)
    time.sleep(0.2)  # the late reply is there: it must not be read
    for _ in range(3):
        with pytest.raises(kvtier.ConnectionLost) as e2:
            cl.lookup(keys)
        assert e2.value.code == -errno.ECONNRESET, e2.value
    cl.close()
    cl = kvtier.Client(g, socket=tiny_daemon, timeout_ms=300)
    m = cl.alloc(2)
    import threading
    t = threading.Timer(0.6, lambda: os.kill(tiny_daemon.proc.pid, 18))
    os.kill(tiny_daemon.proc.pid, 19)  # SIGSTOP; SIGCONT from the timer
    time.sleep(0.05)
    t.start()
    with pytest.raises(kvtier.RequestTimeout) as e3:
        cl.load(m, keys, [0, 1])
    t.join()
    assert e3.value.released, e3.value
    cl.close()
    with kvtier.Client(g, socket=tiny_daemon) as c2:
        assert c2.lookup(keys).pages == 2


_RACE = r"""
import sys, threading, kvtier
sys.path.insert(0, {here!r})
import tinymodel
g = kvtier.Geometry.from_config(tinymodel.CONFIG, page_tokens=4)
for i in range(30):
    cl = kvtier.Client(g, socket={sock!r})
    m = cl.alloc(256)
    keys = cl.hash_tokens(list(range(256 * 4)))
    cl.store(m, keys, list(range(256))).wait()
    jobs = [cl.load(m, keys, list(range(256))) for _ in range(4)]
    out = []
    ts = [threading.Thread(target=lambda j=j: out.append(j.wait()))
          for j in jobs]
    for t in ts:
        t.start()
    cl.close()  # while the waits run
    for t in ts:
        t.join(30)
        assert not t.is_alive(), "a wait outlived close()"
    assert len(out) == 4 and all(isinstance(f, list) for f in out)
    for j in jobs:
        j.close()
print("ok")
"""


def test_close_races_wait(tiny_daemon):
    """Client.close() in one thread while Job.wait() runs in others, 30
    times (issue 21: a use-after-free in the C client, segfaults and a
    hang): every wait returns, nothing crashes."""
    here = os.path.dirname(os.path.abspath(__file__))
    r = subprocess.run([sys.executable, "-c",
                        _RACE.format(here=here, sock=str(tiny_daemon))],
                       capture_output=True, text=True, timeout=240)
    assert r.returncode == 0 and r.stdout.strip() == "ok", \
        (r.returncode, r.stderr[-2000:])


_GC = r"""
import sys, kvtier
sys.path.insert(0, {here!r})
import tinymodel
g = kvtier.Geometry.from_config(tinymodel.CONFIG, page_tokens=4)
cl = kvtier.Client(g, socket={sock!r})
m = cl.alloc(2)
keys = cl.hash_tokens(list(range(8)))
job = cl.store(m, keys, [0, 1])
job.wait()
# a cycle holding the client, collected with the job in one pass
cycle = [cl, job]
cycle.append(cycle)
"""


def test_client_and_job_collected_together(tiny_daemon):
    """A plain script with a module-level client and finished job exits
    cleanly (issue 21: Client.__del__ freed every C job, then Job.__del__
    freed its own again: exit 139 at interpreter exit)."""
    here = os.path.dirname(os.path.abspath(__file__))
    script = _GC.format(here=here, sock=str(tiny_daemon))
    for tail in ("", "del cl, job, m, cycle\nimport gc; gc.collect()\n"):
        r = subprocess.run([sys.executable, "-c", script + tail],
                           capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, (r.returncode, r.stderr[-2000:])
