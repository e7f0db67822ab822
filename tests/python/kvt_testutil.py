"""Helpers for the Python tests: start and stop a real kvtier daemon.

KVTIER_BIN names the kvtier binary (ctest sets it; else ../../build/kvtier
from this file); KVTIER_LIB the library (read by the kvtier package).
"""
from __future__ import annotations

import contextlib
import glob
import json
import mmap
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from typing import Iterator, Optional, Sequence

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.normpath(os.path.join(HERE, "..", ".."))


def kvtier_bin() -> str:
    path = os.environ.get("KVTIER_BIN") or os.path.join(ROOT, "build",
                                                        "kvtier")
    if not os.access(path, os.X_OK):
        raise RuntimeError(f"no kvtier binary at {path} (set KVTIER_BIN)")
    return path


def tmpdir(prefix: str = "kvt-py-") -> str:
    """A fresh directory under $KVT_TEST_TMP (the build dir, set by ctest)
    or the system's temporary directory. Short, for socket paths."""
    return tempfile.mkdtemp(prefix=prefix, dir=os.environ.get("KVT_TEST_TMP"))


class Daemon(str):
    """The daemon's socket path (a str), with its process: .proc, .kill()."""
    proc: subprocess.Popen
    killed = False

    def kill(self) -> None:
        """SIGKILL it (a test of what clients see when it dies)."""
        self.killed = True
        self.proc.kill()
        self.proc.wait()


@contextlib.contextmanager
def daemon(workdir: str, model_config: dict, page_tokens: int = 4,
           tiers: str = "dram:64M", args: Sequence[str] = (),
           socket: Optional[str] = None) -> Iterator[Daemon]:
    """Run `kvtier serve` for the duration of the block; yields its socket
    (a Daemon: a str with .proc and .kill()).

    The model's config.json is written into @workdir; the daemon's output
    goes to @workdir/kvtierd.log (printed if it fails to start or does not
    exit cleanly on SIGTERM, which is then an error)."""
    # sockets have a 108-byte path limit: keep it short
    sockdir = None if socket else tempfile.mkdtemp(prefix="kvs", dir="/tmp")
    sock = socket or os.path.join(sockdir, "d.sock")
    cfg = os.path.join(workdir, "config.json")
    with open(cfg, "w", encoding="utf-8") as f:
        json.dump(model_config, f)
    log_path = os.path.join(workdir, "kvtierd.log")
    log = open(log_path, "w", encoding="utf-8")
    cmd = [kvtier_bin(), "serve", "--socket", sock, "--model", cfg,
           "--page-tokens", str(page_tokens), "--tiers", tiers, *args]
    d: Optional[Daemon] = None
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
    try:
        import kvtier
        try:
            kvtier.Client.wait_daemon(sock, timeout=20)
        except Exception:
            proc.kill()
            proc.wait()
            with open(log_path, encoding="utf-8") as f:
                sys.stderr.write(f.read())
            raise
        d = Daemon(sock)
        d.proc = proc
        yield d
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                rc = proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
                rc = -9
        else:
            rc = proc.returncode
        log.close()
        if sockdir:
            shutil.rmtree(sockdir, ignore_errors=True)
        if rc != 0 and not (d is not None and d.killed):
            with open(log_path, encoding="utf-8") as f:
                sys.stderr.write(f.read())
            raise RuntimeError(f"kvtierd exited with {rc} (log above)")


def corrupt_page(ssd_dir, needle):
    """Overwrite, in the daemon's ssd slot files, the bytes @needle (one
    stored chunk of a page): what the daemon holds for that page is then
    wrong. Returns how many places were overwritten."""
    hits = 0
    for path in glob.glob(os.path.join(ssd_dir, "kvtier-ssd-*.kvt")):
        with open(path, "r+b") as f:
            mm = mmap.mmap(f.fileno(), 0)
            at = mm.find(needle)
            while at >= 0:
                mm[at:at + 64] = b"\x5a" * 64
                hits += 1
                at = mm.find(needle, at + 1)
            mm.flush()
            mm.close()
            os.fsync(f.fileno())
    return hits


class FakeCudart:
    """torch.cuda.cudart() of a machine whose cudaHostRegister answers
    @code (2: cudaErrorMemoryAllocation); the calls it saw."""

    def __init__(self, code):
        self.code, self.calls = code, []

    def cudaHostRegister(self, addr, nbytes, flags):
        self.calls.append(("register", addr, nbytes))
        return self.code

    def cudaHostUnregister(self, addr):
        self.calls.append(("unregister", addr))
        return 0
