"""ctypes declarations of libkvtier.so's client ABI (include/kvtier/client.h).

Only what the Python package uses is declared. The structures mirror the C
headers field for field; each versioned one carries its own size, which the
library checks, so a mismatch fails loudly (-EINVAL) instead of reading junk.

Where the library comes from, first match wins:
  1. $KVTIER_LIB: a path to libkvtier.so (tests and uninstalled builds);
  2. the dynamic loader's search for libkvtier.so.1 (installed by
     `cmake --install`, ldconfig'd; or LD_LIBRARY_PATH);
  3. ../build/libkvtier.so next to this source tree (a source checkout).
"""
from __future__ import annotations

import ctypes
import ctypes.util
import os
from ctypes import (POINTER, Structure, c_char, c_char_p, c_double, c_int,
                    c_int64, c_long, c_size_t, c_uint32, c_uint64, c_void_p)

KVT_NAME_MAX = 64
KVT_TIER_COUNT = 5
TIER_NAMES = ("hbm", "fabric", "dram", "ssd", "remote")


class Geom(Structure):
    """struct kvt_geom (include/kvtier/geom.h)."""
    _fields_ = [
        ("name", c_char * KVT_NAME_MAX),
        ("layers", c_uint32),
        ("kv_heads_total", c_uint32),
        ("kv_heads", c_uint32),
        ("head_dim", c_uint32),
        ("dtype_bytes", c_uint32),
        ("page_tokens", c_uint32),
        ("tp_size", c_uint32),
        ("tp_rank", c_uint32),
        ("mla", c_uint32),
        ("q_heads", c_uint32),
        ("hidden", c_uint32),
        ("params", c_uint64),
        ("active_params", c_uint64),
    ]


class PageKey(Structure):
    """struct kvt_page_key: a 128-bit key, lo then hi."""
    _fields_ = [("lo", c_uint64), ("hi", c_uint64)]


class ClientConfig(Structure):
    """struct kvt_client_config (include/kvtier/client.h)."""
    _fields_ = [
        ("size", c_uint32),
        ("tenant", c_uint32),
        ("socket", c_char_p),
        ("ns", c_char_p),
        ("model", c_char_p),
        ("geom", POINTER(Geom)),
        ("page_tokens", c_uint32),
        ("tp_size", c_uint32),
        ("tp_rank", c_uint32),
        ("timeout_ms", c_uint32),
    ]


class LookupResult(Structure):
    """struct kvt_cache_lookup_result."""
    _fields_ = [
        ("pages", c_uint64),
        ("tier_pages", c_uint64 * KVT_TIER_COUNT),
        ("inflight", c_uint64),
    ]


class CacheRun(Structure):
    """struct kvt_cache_run: @pages leading pages in a row in @tier."""
    _fields_ = [("tier", c_uint32), ("pages", c_uint32)]


KVT_CACHE_MAX_RUNS = 8


class XferRate(Structure):
    """struct kvt_xfer_rate (include/kvtier/xfer.h)."""
    _fields_ = [
        ("gbps", c_double),
        ("bytes", c_double),
        ("busy_s", c_double),
        ("jobs", c_uint64),
        ("total_bytes", c_double),
    ]


# the scheduler's plain values (include/kvtier/sched.h)
KVT_SCHED_RUNS = 8
KVT_SREQ_WAITING = 0


class SchedReq(Structure):
    """struct kvt_sched_req."""
    _fields_ = [
        ("id", c_uint64),
        ("state", c_uint32),
        ("prompt", c_uint32),
        ("done", c_uint32),
        ("hbm", c_uint32),
        ("tier", c_uint32 * KVT_TIER_COUNT),
        ("loading", c_uint32),
        ("loading_ready", c_double),
        ("transient", c_uint32),
        ("transient_ready", c_double),
        ("reserved", c_uint32),
        ("group", c_uint64),
        ("group_tokens", c_uint32),
        ("arrival", c_double),
        ("skips", c_uint32),
        ("nruns", c_uint32),
        ("run_tier", c_uint32 * KVT_SCHED_RUNS),
        ("run_tokens", c_uint32 * KVT_SCHED_RUNS),
    ]


class SchedState(Structure):
    """struct kvt_sched_state."""
    _fields_ = [
        ("now", c_double),
        ("decodes", c_uint32),
        ("decode_ctx", c_uint64),
        ("free_pages", c_uint64),
        ("link_free_at", c_double),
        ("tier_gbps", c_double * KVT_TIER_COUNT),
        ("tier_free_at", c_double * KVT_TIER_COUNT),
    ]


class SchedHit(Structure):
    """struct kvt_sched_hit."""
    _fields_ = [
        ("load", c_uint32),
        ("recompute", c_uint32),
        ("recompute_tier", c_uint32 * KVT_TIER_COUNT),
        ("wait", c_uint32),
        ("load_s", c_double),
        ("compute_s", c_double),
        ("wait_s", c_double),
    ]


class JobStat(Structure):
    """struct kvt_cache_job_stat."""
    _fields_ = [
        ("pages", c_uint64),
        ("copied", c_uint64),
        ("skipped", c_uint64),
        ("failed", c_uint64),
        ("busy", c_uint64),
        ("absent", c_uint64),
        ("verified", c_uint64),
        ("from_", c_uint64 * KVT_TIER_COUNT),
        ("bytes", c_uint64),
        ("wait_s", c_double),
        ("layer0_s", c_double),
        ("total_s", c_double),
    ]


class ClientSeg(Structure):
    """struct kvt_client_seg: one allocation registered by handle."""
    _fields_ = [
        ("kind", c_uint32),
        ("fd", c_int),
        ("bytes", c_uint64),
        ("handle", ctypes.c_uint8 * 64),
    ]


class DevStat(Structure):
    """struct kvt_dev_stat (include/kvtier/dev.h)."""
    _fields_ = [(n, c_uint64) for n in (
        "copy_engine_bytes", "copy_engine_ops", "kernel_bytes", "kernel_ops",
        "sum_bytes", "sum_items", "faults", "imports", "releases",
        "live_imports")]


# kvt_client_seg kinds and event kinds (include/kvtier/client.h)
SEG_MEMFD, SEG_CUDA_IPC, SEG_VMM_FD, SEG_EMU_FD = 1, 2, 3, 4
EVENT_CUDA_IPC, EVENT_EMU_FD = 1, 2
DEVICE_HOST, DEVICE_EMU = -1, 0x10000

HOST_FN = ctypes.CFUNCTYPE(None, c_void_p)


def _candidates() -> list[str]:
    env = os.environ.get("KVTIER_LIB")
    if env:
        return [env]  # asked for one: no silent fallback to another
    found = ["libkvtier.so.1"]
    name = ctypes.util.find_library("kvtier")
    if name:
        found.append(name)
    here = os.path.dirname(os.path.abspath(__file__))
    found.append(os.path.join(here, "..", "..", "build", "libkvtier.so"))
    return found


def _load() -> ctypes.CDLL:
    errors = []
    for path in _candidates():
        try:
            return ctypes.CDLL(path)
        except OSError as e:
            errors.append(f"{path}: {e}")
    raise ImportError(
        "kvtier: cannot load libkvtier.so (build kvtier with CMake and "
        "`cmake --install build`, or set KVTIER_LIB to the library's path): "
        + "; ".join(errors))


lib = _load()

_u32p = POINTER(c_uint32)
_u64p = POINTER(c_uint64)
_keyp = POINTER(PageKey)

_PROTOS = {
    "kvt_version": (c_char_p, []),
    "kvt_strerror": (c_char_p, [c_int]),
    "kvt_errdetail": (c_char_p, []),
    "kvt_geom_preset": (c_int, [POINTER(Geom), c_char_p, c_uint32, c_uint32,
                                c_uint32]),
    "kvt_geom_from_json": (c_int, [POINTER(Geom), c_char_p, c_char_p,
                                   c_uint32, c_uint32, c_uint32]),
    "kvt_client_wait_daemon": (c_int, [c_char_p, c_uint32]),
    "kvt_client_connect": (c_int, [POINTER(c_void_p), POINTER(ClientConfig)]),
    "kvt_client_close": (None, [c_void_p]),
    "kvt_client_shutdown": (None, [c_void_p]),
    "kvt_client_geom": (POINTER(Geom), [c_void_p]),
    "kvt_client_mem_alloc": (c_int, [c_void_p, c_uint64, POINTER(c_void_p),
                                     _u64p, _u64p, _u64p,
                                     POINTER(c_void_p)]),
    "kvt_client_register_fd": (c_int, [c_void_p, c_int, _u64p, c_uint32,
                                       c_uint64, c_uint64, c_uint64, c_uint64,
                                       c_int, POINTER(c_void_p)]),
    "kvt_client_register_fd_rows": (c_int, [c_void_p, c_int, _u64p, c_uint32,
                                            c_uint64, c_uint64, c_uint64,
                                            c_uint64, c_uint64, c_int,
                                            POINTER(c_void_p)]),
    "kvt_client_mem_free": (None, [c_void_p]),
    "kvt_client_hash_tokens": (c_int, [c_void_p, _u32p, c_size_t, _keyp]),
    "kvt_client_lookup": (c_int, [c_void_p, _keyp, c_size_t, c_uint32,
                                  POINTER(LookupResult)]),
    "kvt_client_load": (c_int, [c_void_p, c_void_p, _keyp, c_size_t, c_size_t,
                                _u32p, POINTER(c_void_p)]),
    "kvt_client_store": (c_int, [c_void_p, c_void_p, _keyp, c_size_t,
                                 c_size_t, _u32p, POINTER(c_void_p)]),
    "kvt_client_load_ex": (c_int, [c_void_p, c_void_p, _keyp, c_size_t,
                                   c_size_t, _u32p, c_uint32,
                                   POINTER(c_void_p)]),
    "kvt_client_store_ex": (c_int, [c_void_p, c_void_p, _keyp, c_size_t,
                                    c_size_t, _u32p, c_uint32,
                                    POINTER(c_void_p)]),
    "kvt_client_job_wait_layer": (c_int, [c_void_p, c_uint32, c_int64]),
    "kvt_client_job_wait": (c_int, [c_void_p, c_int64]),
    "kvt_client_job_poll": (c_int, [c_void_p]),
    "kvt_client_job_cancel": (c_int, [c_void_p]),
    "kvt_client_job_failed": (c_long, [c_void_p, _u32p, c_size_t]),
    "kvt_client_job_stat_get": (None, [c_void_p, POINTER(JobStat)]),
    "kvt_client_job_free": (None, [c_void_p]),
    "kvt_client_fd": (c_int, [c_void_p]),
    "kvt_client_lease_ms": (c_uint32, [c_void_p]),
    "kvt_client_timeout_ms": (c_uint32, [c_void_p]),
    "kvt_client_stats": (c_int, [c_void_p, POINTER(c_void_p)]),
    "kvt_client_quiesce": (c_int, [c_void_p]),
    "kvt_client_fingerprint": (c_int, [c_void_p, c_uint32, c_char_p,
                                       POINTER(c_uint32),
                                       POINTER(c_uint64)]),
    "kvt_client_lookup_runs": (c_int, [c_void_p, _keyp, c_size_t, c_uint32,
                                       POINTER(LookupResult),
                                       POINTER(CacheRun), c_size_t,
                                       POINTER(c_size_t)]),
    "kvt_client_rates": (c_int, [c_void_p, POINTER(XferRate)]),
    "kvt_sched_open": (c_int, [POINTER(c_void_p), c_char_p, c_char_p,
                               c_char_p, POINTER(Geom)]),
    "kvt_sched_destroy": (None, [c_void_p]),
    "kvt_sched_get_cost": (c_void_p, [c_void_p]),
    "kvt_cost_prefill_s": (c_double, [c_void_p, c_uint32, c_uint32]),
    "kvt_sched_decide": (c_int, [c_void_p, POINTER(SchedState),
                                 POINTER(SchedReq), c_uint32,
                                 POINTER(SchedHit)]),
    "kvt_client_register_dev": (c_int, [c_void_p, c_int, c_void_p,
                                        POINTER(ClientSeg), c_uint32, _u32p,
                                        _u64p, c_uint32, c_uint64, c_uint64,
                                        c_uint64, c_uint64,
                                        POINTER(c_void_p)]),
    "kvt_client_register_ptrs": (c_int, [c_void_p, c_void_p,
                                         POINTER(c_void_p), c_uint32,
                                         c_uint64, c_uint64, c_uint64,
                                         c_uint64, POINTER(c_void_p)]),
    "kvt_client_event_new": (c_int, [c_void_p, c_void_p, POINTER(c_void_p)]),
    "kvt_client_event_record": (c_int, [c_void_p, c_void_p]),
    "kvt_client_event_id": (c_uint32, [c_void_p]),
    "kvt_client_event_free": (None, [c_void_p]),
    "kvt_client_event_register": (c_int, [c_void_p, c_int, c_void_p,
                                          c_uint32, c_void_p, c_int, _u32p]),
    "kvt_client_load_ev": (c_int, [c_void_p, c_void_p, _keyp, c_size_t,
                                   c_size_t, _u32p, c_uint32, c_uint32,
                                   POINTER(c_void_p)]),
    "kvt_client_store_ev": (c_int, [c_void_p, c_void_p, _keyp, c_size_t,
                                    c_size_t, _u32p, c_uint32, c_uint32,
                                    POINTER(c_void_p)]),
    "kvt_client_job_stream_wait": (c_int, [c_void_p, c_uint32, c_void_p]),
    "kvt_device_parse": (c_int, [c_char_p, POINTER(c_int)]),
    "kvt_dev_open": (c_int, [c_int, POINTER(c_void_p)]),
    "kvt_dev_close": (None, [c_void_p]),
    "kvt_dev_name": (c_char_p, [c_void_p]),
    "kvt_dev_emulated": (c_int, [c_void_p]),
    "kvt_dev_uuid": (None, [c_void_p, c_void_p]),
    "kvt_dev_alloc": (c_int, [c_void_p, c_size_t, POINTER(c_void_p)]),
    "kvt_dev_free": (None, [c_void_p, c_void_p]),
    "kvt_dev_memcpy": (c_int, [c_void_p, c_void_p, c_void_p, c_size_t]),
    "kvt_dev_stream_create": (c_int, [c_void_p, POINTER(c_void_p)]),
    "kvt_dev_stream_wrap": (c_int, [c_void_p, c_void_p, POINTER(c_void_p)]),
    "kvt_dev_stream_destroy": (None, [c_void_p]),
    "kvt_dev_stream_sync": (c_int, [c_void_p]),
    "kvt_dev_stream_host_fn": (c_int, [c_void_p, HOST_FN, c_void_p]),
    "kvt_dev_event_create": (c_int, [c_void_p, c_int, POINTER(c_void_p)]),
    "kvt_dev_event_destroy": (None, [c_void_p]),
    "kvt_dev_event_record": (c_int, [c_void_p, c_void_p]),
    "kvt_dev_event_query": (c_int, [c_void_p]),
    "kvt_dev_event_sync": (c_int, [c_void_p, c_int64]),
    "kvt_dev_stat_get": (None, [c_void_p, POINTER(DevStat)]),
    "kvt_dev_set_delay": (None, [c_void_p, c_uint64]),
}

for _name, (_res, _args) in _PROTOS.items():
    _fn = getattr(lib, _name)
    _fn.restype = _res
    _fn.argtypes = _args

# the JSON of kvt_client_stats() is malloc'd: freed with libc's free()
libc = ctypes.CDLL(None)
libc.free.argtypes = [c_void_p]
libc.free.restype = None
