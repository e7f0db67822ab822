"""kvtier: Python client of the kvtier node daemon, and engine connectors.

    import kvtier
    geo = kvtier.Geometry.from_preset("llama-3.1-8b", page_tokens=16)
    with kvtier.Client(geo) as cl: ...

Device memory: kvtier.Device ("cuda:N", or "emu": the emulated device),
Client.register_torch() / register_device(), Client.event(), and
Job.stream_wait(): the daemon DMAs pages straight between its tiers and
the engine's GPU memory, verified on the device.

Submodules (imported on demand, each needs its engine or its stand-in):
  kvtier.vllm      the vLLM v1 KV connector (KvtierConnector)
  kvtier.sglang    the SGLang HiCache storage backend (KvtierStorage)
  kvtier.decide    their load-or-recompute and wait decisions (Decider:
                   kvt_sched_decide() at the daemon's measured rates)
  kvtier.staging   GPU KV through host blocks (an explicit option only)
  kvtier.torch_dev PyTorch CUDA tensors and events by IPC handle

The C library libkvtier.so is found through $KVTIER_LIB, the dynamic
loader (libkvtier.so.1, installed by `cmake --install`), or ../build of
a source checkout. See python/README.md and docs/ENGINES.md.
"""
from .client import (KVT_EBUSY, KVT_ECONFIG, KVT_ECORRUPT, KVT_EFULL,
                     KVT_EGEOM, KVT_ENODEV, KVT_ENOTBUILT, KVT_ENOTFOUND,
                     KVT_EPRESET, KVT_EPROTO, KVT_ESPEC, Client, ClientEvent,
                     ConnectionLost, Geometry, Job, JobStat, KvtierError,
                     LookupResult, Memory, Rate, RequestTimeout,
                     version)
from .device import Device, DeviceMemory, Event, Stream
from .keys import KEY_BYTES, Keys, keys_from_hashes

__all__ = [
    "Client", "ClientEvent", "ConnectionLost", "Device", "DeviceMemory",
    "Event", "Stream", "Geometry", "Job", "JobStat", "KvtierError",
    "LookupResult", "Memory", "Rate", "RequestTimeout", "KEY_BYTES", "Keys",
    "keys_from_hashes", "version",
    "KVT_EBUSY", "KVT_ECONFIG", "KVT_ECORRUPT", "KVT_EFULL", "KVT_EGEOM",
    "KVT_ENODEV", "KVT_ENOTBUILT", "KVT_ENOTFOUND", "KVT_EPRESET",
    "KVT_EPROTO", "KVT_ESPEC",
]
__version__ = "0.2.0"
