"""What a user types, run as written: the daemon configuration and the
vLLM and SGLang command lines of docs/ENGINES.md, and the daemon's command
line from contrib/kvtierd.service.

The blocks marked `<!-- tested: ... -->` in docs/ENGINES.md are taken out
of the file; only paths and sizes are replaced (a scratch directory for
/run/kvtier, /var/lib/kvtier and /etc/kvtier, a tiny model's config.json in
a directory named like the documented model, smaller tiers). The daemon is
started with the unit's ExecStart (its binary from this build); the engine
stand-ins' `vllm serve` and `python -m sglang.launch_server`
(tests/python/shims) parse the documented flags as the engines do. Each
command runs twice: the first stores a prompt's pages, the second finds
them all in the daemon; for vLLM under both interface generations, for
SGLang under both.
"""
from __future__ import annotations

import json
import os
import re
import shlex
import signal
import subprocess
import sys

import pytest

import kvt_testutil
import tinymodel

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = kvt_testutil.ROOT
DOC = os.path.join(ROOT, "docs", "ENGINES.md")
UNIT = os.path.join(ROOT, "contrib", "kvtierd.service")


def documented_blocks():
    """{name: text} of the fenced blocks after `<!-- tested: NAME ... -->`."""
    with open(DOC, encoding="utf-8") as f:
        text = f.read()
    out = {}
    for m in re.finditer(r"<!-- tested: (\S+)[^>]*-->\s*\n```\w*\n(.*?)```",
                         text, re.S):
        out[m.group(1)] = m.group(2)
    return out


def exec_start():
    with open(UNIT, encoding="utf-8") as f:
        for line in f:
            if line.startswith("ExecStart="):
                return shlex.split(line.split("=", 1)[1])
    raise AssertionError("no ExecStart in " + UNIT)


def command(block):
    """A documented shell command: (environment assignments, argv)."""
    argv = shlex.split(block.replace("\\\n", " "), comments=True)
    env = {}
    while argv and re.match(r"^[A-Z_]+=", argv[0]):
        k, v = argv.pop(0).split("=", 1)
        env[k] = v
    return env, argv


@pytest.fixture
def scratch(workdir):
    """Where the documented paths land, and how they are rewritten."""
    short = kvt_testutil.tmpdir("kuf")      # socket paths must be short
    run = os.path.join(short, "run", "kvtier")
    lib = os.path.join(workdir, "var", "lib", "kvtier")
    etc = os.path.join(workdir, "etc", "kvtier")
    model = os.path.join(workdir, "models", "llama-3.1-8b")
    for d in (run, lib, etc, model):
        os.makedirs(d, exist_ok=True)
    with open(os.path.join(model, "config.json"), "w") as f:
        json.dump(tinymodel.CONFIG, f)
    subs = [("/run/kvtier", run), ("/var/lib/kvtier", lib),
            ("/etc/kvtier", etc), ("/models/llama-3.1-8b", model),
            ("dram:64G", "dram:32M"), (",1T", ",64M")]

    def rewrite(text):
        for a, b in subs:
            text = text.replace(a, b)
        return text
    yield rewrite, etc, run
    import shutil
    shutil.rmtree(short, ignore_errors=True)


def run_engine(argv, env, tokens, out, gen_env, role=None):
    e = dict(os.environ, **env, **gen_env, KVT_STANDIN_TOKENS=tokens,
             KVT_STANDIN_OUT=out)
    if role:
        e["KVT_STANDIN_ROLE"] = role
    r = subprocess.run(argv, capture_output=True, text=True, timeout=60,
                       env=e)
    assert r.returncode == 0, r.stdout + r.stderr
    with open(out, encoding="utf-8") as f:
        return json.load(f)


def test_documented_flags(scratch, workdir):
    rewrite, etc, run = scratch
    blocks = documented_blocks()
    assert {"kvtierd.conf", "vllm", "sglang"} <= set(blocks), blocks.keys()
    # the daemon: the unit's ExecStart, its config file as documented
    argv = exec_start()
    assert os.path.basename(argv[0]) == "kvtierd", argv
    with open(os.path.join(etc, "kvtierd.conf"), "w") as f:
        f.write(rewrite(blocks["kvtierd.conf"]))
    argv = [os.path.join(os.path.dirname(kvt_testutil.kvtier_bin()),
                         "kvtierd")] + [rewrite(a) for a in argv[1:]]
    log = open(os.path.join(workdir, "kvtierd.log"), "w")
    d = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)
    try:
        import kvtier
        kvtier.Client.wait_daemon(os.path.join(run, "kvtierd.sock"),
                                  timeout=20)
        page = 16                   # the documented page_tokens
        toks = ",".join(str(t % 256) for t in range(5 * page + 3))
        # vLLM: `vllm serve ...` as documented, both generations
        env, cmd = command(rewrite(blocks["vllm"]))
        assert cmd[0] == "vllm" and env.get("PYTHONHASHSEED") == "0"
        vllm = [sys.executable, "-m", "vllm.entrypoints.cli.main"] + cmd[1:]
        for gen in ("v0.12", "current"):
            g = {"KVT_VLLM_GEN": gen}
            a = run_engine(vllm, env, toks, os.path.join(workdir, "va.json"),
                           g)
            b = run_engine(vllm, env, toks, os.path.join(workdir, "vb.json"),
                           g)
            # the documented config decides load or recompute (tinymodel's
            # prefill is priced at nothing: its 5 pages are recomputed)
            assert b["decisions"] >= 1 and b["invalid"] == [], (gen, a, b)
            assert b["load_pages"] + b["decided_recompute_pages"] == 5, \
                (gen, a, b)
            assert b["logits_first"] is not None
        # SGLang: `python -m sglang.launch_server ...` as documented
        env, cmd = command(rewrite(blocks["sglang"]))
        assert cmd[:3] == ["python", "-m", "sglang.launch_server"], cmd
        sgl = [sys.executable] + cmd[1:]
        stoks = ",".join(str((t * 7) % 256) for t in range(5 * page + 3))
        for gen in ("v0.5.6.post2", "current"):
            g = {"KVT_SGLANG_GEN": gen}
            a = run_engine(sgl, env, stoks, os.path.join(workdir, "sa.json"),
                           g, "store")
            assert a["stored_pages"] == 5, a
            b = run_engine(sgl, env, stoks, os.path.join(workdir, "sb.json"),
                           g, "load")
            # the documented config decides by cost: tinymodel's prefill
            # is priced at nothing, so its 5 stored pages are not worth
            # prefetching (test_decide.py has a model where they are)
            assert b["cached"] == 0, (gen, b)
    finally:
        d.send_signal(signal.SIGTERM)
        rc = d.wait(timeout=30)
        log.close()
    assert rc == 0, open(os.path.join(workdir, "kvtierd.log")).read()
