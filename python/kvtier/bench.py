"""kvtier.bench: the Python package's own latency against a running daemon.

    python -m kvtier.bench --socket S --model M --page-tokens P \\
        [--tokens 32768] [--reps 2000]

Stores one prompt of --tokens tokens (hashed by the daemon) out of memory
of this process, then times, back to back, HASH of its tokens, LOOKUP of
one key and LOOKUP of all its keys — each call as an engine connector
makes it (Client.hash_tokens, Client.lookup on the Keys it returned, and
on the same keys as a list of bytes). Prints one JSON object: per figure
the p50 and p99 in microseconds. `kvtier bench server --python PY` runs
it against its own daemon and carries the object in its JSON.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Callable, Dict, List

from .client import Client, Geometry


def _quantiles(f: Callable[[], object], reps: int) -> Dict[str, float]:
    v: List[float] = []
    for _ in range(reps):
        t0 = time.perf_counter_ns()
        f()
        v.append((time.perf_counter_ns() - t0) / 1e3)
    v.sort()
    return {"us_p50": v[len(v) // 2], "us_p99": v[min(len(v) - 1,
                                                    int(len(v) * 0.99))]}


def main(argv: List[str]) -> int:
    ap = argparse.ArgumentParser(prog="python -m kvtier.bench")
    ap.add_argument("--socket", required=True)
    ap.add_argument("--model", required=True,
                    help="a preset or a config.json path (the daemon's)")
    ap.add_argument("--page-tokens", type=int, required=True)
    ap.add_argument("--tokens", type=int, default=32768)
    ap.add_argument("--reps", type=int, default=2000)
    a = ap.parse_args(argv)
    if "/" in a.model:
        geom = Geometry.from_config(a.model, a.page_tokens)
    else:
        geom = Geometry.from_preset(a.model, a.page_tokens)
    tokens = [(i * 2654435761 ^ 11) & 0xFFFFFFFF for i in range(a.tokens)]
    with Client(geom, socket=a.socket) as cl:
        keys = cl.hash_tokens(tokens)
        n = len(keys)
        mem = cl.alloc(n)
        job = cl.store(mem, keys, list(range(n)))
        job.wait()
        job.close()
        found = cl.lookup(keys, touch=False).pages
        if found != n:
            print(json.dumps({"skipped": f"the prompt's lookup found "
                                         f"{found} of {n} pages"}))
            return 1
        as_list = list(keys)
        one = keys[:1]
        out = {
            "tokens": a.tokens, "keys": n, "reps": a.reps,
            "python": sys.version.split()[0],
            "hash_32k_tokens": _quantiles(lambda: cl.hash_tokens(tokens),
                                          a.reps),
            "lookup_1_key": _quantiles(lambda: cl.lookup(one, touch=False),
                                       a.reps),
            "lookup_32k_prompt": _quantiles(
                lambda: cl.lookup(keys, touch=False), a.reps),
            "lookup_32k_prompt_list": _quantiles(
                lambda: cl.lookup(as_list, touch=False), a.reps),
        }
        # the field the C benchmark's goal reads
        out["lookup_32k_prompt"]["lookup_us_p50"] = \
            out["lookup_32k_prompt"]["us_p50"]
        mem.close()
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
