"""Load or recompute, wait or compute: kvtier's scheduler decisions for an
engine's connector (issue 22 item 6).

An engine that forms its own batches (vLLM, SGLang) asks a connector only
how much of a request's prefix the cache will supply. Decider answers with
the SAME C code kvtier's own scheduler plans with (kvt_sched_decide() in
include/kvtier/sched.h, the RECOMPUTE and DELAYHIT policies of
kvt_sched_plan_step()), fed with:

  * the request's cached prefix as tier runs in prefix order
    (Client.lookup(runs=True): kvt_client_lookup_runs()) and the pages
    right after it that someone is storing (the lookup's "inflight") or
    computing (the connector knows its own running requests);
  * the daemon's transfer engine's MEASURED rates per tier, loads from
    tier t into the engine's memory (Client.rates(): kvt_client_rates(),
    refreshed at most every rates_every_s); a tier nothing was measured
    from yet is priced at the hardware profile's copy rate;
  * a MODELED prefill: the cost model of the hardware profile named in the
    connector's config (profiles/*.prof: "h100" by default; "testbed-b"
    is an H200, "gh200") for the daemon's model geometry. Nothing here
    measures the engine's GPU: pick the profile of the GPU it runs on.

So of each cached run only what lands before the prefill would have
computed it is loaded (a slow ssd run is recomputed, a fast dram one
loaded), and a request waits for a prefix in flight only when that is
expected sooner than computing it. Decisions are counted as the connector
acts on them (Decider.count(), Decider.stats) and logged at debug level.
"""
from __future__ import annotations

import ctypes
import logging
import threading
import time
from ctypes import byref, c_void_p
from dataclasses import dataclass, field
from typing import Any, Dict, Optional, Tuple

from . import _lib
from .client import KvtierError, _check
from ._lib import KVT_TIER_COUNT, TIER_NAMES, lib

log = logging.getLogger("kvtier.decide")

# the connectors' extra-config keys for the decision, with their defaults
CONFIG_KEYS = {
    "decide": "load or recompute by cost, wait for prefixes in flight only "
              "when cheaper (true; false: load every cached page, as before)",
    "decide_profile": "hardware profile whose cost model prices the "
                      "prefill (MODELED; \"h100\")",
    "decide_rates_s": "how often the daemon's measured rates are re-read "
                      "(0.5 s)",
}

# Decider.count()'s counters: decisions; pages it said to load and to
# recompute (in all and by the tier they were cached in); requests told to
# wait, and requests with pages in flight told not to
STAT_KEYS = ("decisions", "decided_load_pages", "decided_recompute_pages",
             *(f"decided_recompute_{t}_pages" for t in TIER_NAMES[1:]),
             "decided_waits", "decided_waits_declined")


@dataclass(frozen=True)
class Decision:
    """What to do with one request's hit, in pages after @start.

    load:      leading pages of the hit worth loading;
    recompute: cached pages after them computed instead, by tier;
    wait:      True: ask again later (the next pages are expected sooner
               than the request would compute them);
    load_s, compute_s, wait_s: the estimates behind it (seconds).
    """
    load: int
    recompute: Dict[str, int] = field(default_factory=dict)
    wait: bool = False
    load_s: float = 0.0
    compute_s: float = 0.0
    wait_s: float = 0.0
    in_flight: bool = False     # pages right after the hit were in flight


class Decider:
    """kvt_sched_decide() over one daemon connection's geometry."""

    def __init__(self, geometry: Any, *, profile: str = "h100",
                 overlap: bool = False, rates_every_s: float = 0.5,
                 what: str = "kvtier") -> None:
        """@overlap: the engine overlaps a request's load with its own
        compute layer by layer (vLLM's layerwise load mode); else the
        request waits for its load before it computes."""
        if not isinstance(profile, str) or not profile:
            raise ValueError(f"{what}: decide_profile must be a profile "
                             f"name, not {profile!r}")
        if isinstance(rates_every_s, bool) or \
                not isinstance(rates_every_s, (int, float)) or \
                rates_every_s < 0:
            raise ValueError(f"{what}: decide_rates_s must be a number of "
                             f"seconds >= 0, not {rates_every_s!r}")
        self.what = what
        self.page_tokens = geometry.page_tokens
        features = "none,recompute,delay-hit" + (",overlap" if overlap
                                                 else "")
        h = c_void_p()
        _check(lib.kvt_sched_open(byref(h), b"kvtier", features.encode(),
                                  profile.encode(), byref(geometry._g)),
               f"{what}: the decision's cost model (decide_profile "
               f"{profile!r})")
        self._h = h.value
        self._every = float(rates_every_s)
        self._gbps: Dict[str, float] = {}
        self._store_gbps = 0.0   # measured stores into the daemon's tiers
        self._page_bytes = geometry.page_bytes
        self._rates_at = -1e30
        self._lock = threading.Lock()
        self.stats: Dict[str, int] = {k: 0 for k in STAT_KEYS}

    def close(self) -> None:
        h, self._h = getattr(self, "_h", None), None
        if h:
            lib.kvt_sched_destroy(h)

    def __del__(self) -> None:
        self.close()

    def count(self, d: Decision, waited: bool) -> Dict[str, int]:
        """Count decision @d as the connector acted on it (@waited: it
        told the engine to ask again; a connector may decline a wait past
        its bound): the increments, also added to self.stats."""
        inc = dict.fromkeys(STAT_KEYS, 0)
        inc["decisions"] = 1
        if waited:
            inc["decided_waits"] = 1
        else:
            inc["decided_waits_declined"] = int(d.in_flight)
            inc["decided_load_pages"] = d.load
            inc["decided_recompute_pages"] = sum(d.recompute.values())
            for t, n in d.recompute.items():
                inc[f"decided_recompute_{t}_pages"] = n
        with self._lock:
            for k, v in inc.items():
                self.stats[k] += v
        return inc

    def prefill_s(self, tokens: int, context: int) -> float:
        """The cost model's seconds for one prefill of @tokens after
        @context cached ones (MODELED: the profile's GPU)."""
        if tokens <= 0:
            return 0.0
        return lib.kvt_cost_prefill_s(lib.kvt_sched_get_cost(self._h),
                                      min(tokens, 1 << 31),
                                      min(context, 1 << 31))

    def _rates(self, client: Any) -> Dict[str, float]:
        """Measured load rates into the engine's memory, GB/s by tier."""
        now = time.monotonic()
        if now - self._rates_at < self._every:
            return self._gbps
        self._rates_at = now
        try:
            rt = client.rates()
        except KvtierError as e:  # the lookup worked: keep the last ones
            log.warning("%s: the daemon's rates are unreadable (%s): "
                        "deciding with the last ones", self.what, e)
            return self._gbps
        self._gbps = {t: rt[(t, "hbm")].gbps for t in TIER_NAMES[1:]
                      if rt[(t, "hbm")].gbps > 0}
        self._store_gbps = max(rt[("hbm", t)].gbps for t in TIER_NAMES[1:])
        return self._gbps

    def decide(self, client: Any, found: Any, *, start: int, prompt: int,
               others: int = 0, transient: int = 0,
               transient_ready: Optional[float] = None,
               rid: str = "", before: int = 0) -> Decision:
        """The decision for a request of @prompt tokens whose first @start
        pages the engine holds itself, given @found (a LookupResult with
        runs, pages from page 0). @transient: pages right after the hit
        someone else is computing, expected home at @transient_ready
        (time.monotonic(); None: unknown). The lookup's inflight pages
        (being stored) are added here, expected once stored at the
        daemon's measured store rate (now while none was measured: the
        daemon does not know when they land). @others:
        sequences sharing the request's steps (running requests).
        @before: pages ahead of @found's page 0 the engine holds (a
        storage backend asked about a later part of a prefix)."""
        P = self.page_tokens
        req = _lib.SchedReq(state=_lib.KVT_SREQ_WAITING, prompt=prompt,
                            hbm=(before + start) * P)
        # the runs past the engine's own pages; a result without runs (a
        # lookup that did not ask) is taken fastest tier first
        runs = found.runs or tuple(
            (t, found.tier_pages.get(t, 0)) for t in TIER_NAMES
            if found.tier_pages.get(t, 0))
        skip, n = start, 0
        for tier, pages in runs:
            take = pages - min(skip, pages)
            skip -= min(skip, pages)
            if not take:
                continue
            # a daemon's own hbm tier (GPU memory it holds) is priced as
            # its fastest host tier: the scheduler's runs start at 1
            t = max(1, TIER_NAMES.index(tier))
            if n and req.run_tier[n - 1] == t:
                req.run_tokens[n - 1] += take * P
            elif n < _lib.KVT_SCHED_RUNS:
                req.run_tier[n] = t
                req.run_tokens[n] = take * P
                n += 1
            else:
                req.run_tokens[n - 1] += take * P
                t = req.run_tier[n - 1]
            req.tier[t] += take * P
        req.nruns = n
        loadable = sum(req.tier)
        storing = max(0, found.pages + found.inflight -
                      max(found.pages, start))
        now = time.monotonic()
        req.transient = min((transient + storing) * P,
                            max(0, prompt - req.hbm - loadable))
        st = _lib.SchedState(now=now, free_pages=1 << 62)
        with self._lock:
            rates = self._rates(client)
            # pages someone is storing: the daemon does not know when they
            # land; at the measured store rate, if any, else now
            ready = now
            if storing and self._store_gbps > 0:
                ready += storing * self._page_bytes / (self._store_gbps * 1e9)
            if transient_ready is not None:
                ready = max(ready, transient_ready)
            req.transient_ready = ready
            for t, g in rates.items():
                st.tier_gbps[TIER_NAMES.index(t)] = g
                st.tier_free_at[TIER_NAMES.index(t)] = now
            hit = _lib.SchedHit()
            _check(lib.kvt_sched_decide(self._h, byref(st), byref(req),
                                        others, byref(hit)),
                   f"{self.what}: decide")
            d = Decision(hit.load // P,
                         {TIER_NAMES[t]: hit.recompute_tier[t] // P
                          for t in range(KVT_TIER_COUNT)
                          if hit.recompute_tier[t]},
                         bool(hit.wait), hit.load_s, hit.compute_s,
                         hit.wait_s, req.transient > 0)
        log.debug("%s: request %s: hit %d pages after %d %s, %d in flight: "
                  "load %d (%.3f ms), recompute %s, compute %.3f ms, %s "
                  "(rates %s GB/s)", self.what, rid, loadable // P, start,
                  list(runs), req.transient // P, d.load,
                  d.load_s * 1e3, d.recompute or "none", d.compute_s * 1e3,
                  "wait %.3f ms" % (d.wait_s * 1e3) if d.wait else "no wait",
                  self._gbps or "unmeasured")
        return d
