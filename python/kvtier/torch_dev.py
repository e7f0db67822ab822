"""PyTorch CUDA tensors as the daemon opens them: IPC handles and offsets.

PyTorch shares a CUDA storage with another process by the CUDA IPC handle
of the caching allocator's segment holding it and the storage's offset in
that segment (torch.multiprocessing's storage sharing, through
UntypedStorage._share_cuda_()). The daemon does the same: it opens each
segment once in its own context on the same GPU (found by UUID: ordinals
differ between processes) and reaches layer l at its offset.

Untested on a GPU in this repository's CI (no GPU there): scripts/gpu-e2e
runs it on one (scripts/gpu-check).
"""
from __future__ import annotations

import uuid as _uuid
from typing import Any, List, Optional, Sequence, Tuple

from . import _lib


def device_uuid(index: int) -> Optional[bytes]:
    """The 16 bytes of GPU @index's UUID, or None when this PyTorch does
    not say (the daemon then takes the ordinal)."""
    import torch
    u = getattr(torch.cuda.get_device_properties(index), "uuid", None)
    if u is None:
        return None
    raw = getattr(u, "bytes", None)
    if isinstance(raw, (bytes, bytearray)) and len(raw) == 16:
        return bytes(raw)
    try:
        return _uuid.UUID(str(u).replace("GPU-", "")).bytes
    except ValueError:
        return None


def ipc_layout(tensors: Sequence[Any], geometry: Any, layout: Any = None
               ) -> Tuple[int, Optional[bytes], List[Tuple[int, int, int, bytes]],
                          List[int], List[int], int, int, int, int]:
    """(device, uuid, segments, layer_seg, layer_off, block_stride,
    kv_stride, token_stride, nblocks) of per-layer CUDA KV tensors shaped
    (2, num_blocks, P, H, D) — or, given @layout (a packed
    kvtier.layout.Layout derived from these tensors), in that layout."""
    g = geometry
    if len(tensors) != g.layers:
        raise ValueError(f"kvtier: {len(tensors)} KV tensors for a model of "
                         f"{g.layers} layers")
    t0 = tensors[0]
    if t0.device.type != "cuda":
        raise ValueError("kvtier: register_torch takes CUDA tensors")
    want = (2, t0.shape[1], g.page_tokens, g.kv_heads, g.head_dim)
    if layout is not None:
        if layout.rows:
            raise ValueError("kvtier: the device path moves packed chunks; "
                             "this layout keeps a page's tokens in rows")
        want = tuple(t0.shape)
    segs: List[Tuple[int, int, int, bytes]] = []
    lseg: List[int] = []
    loff: List[int] = []
    for i, t in enumerate(tensors):
        if tuple(t.shape) != want or t.stride() != t0.stride() or \
                t.device != t0.device or t.element_size() != g.dtype_bytes:
            raise ValueError(
                f"kvtier: layer {i}: a KV tensor of shape {tuple(t.shape)} "
                f"on {t.device}; expected {want} of {g.dtype_bytes}-byte "
                f"elements on {t0.device}, strides like layer 0's")
        st = t.untyped_storage()
        try:
            shared = st._share_cuda_()
        except RuntimeError as e:  # expandable segments cannot be shared
            raise ValueError(
                "kvtier: PyTorch cannot share this CUDA storage by IPC "
                f"handle ({e}); run without "
                "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True, or "
                "register device pointers (Client.register_device)") from e
        handle, size, offset = bytes(shared[1]), int(shared[2]), int(shared[3])
        off = offset + t.storage_offset() * t.element_size()
        if layout is not None:   # block 0's first chunk, from the tensor's
            off += layout.addrs[i] - t.data_ptr()
        for k, s in enumerate(segs):
            if s[3] == handle:
                segs[k] = (s[0], s[1], max(s[2], offset + size), handle)
                break
        else:
            k = len(segs)
            segs.append((_lib.SEG_CUDA_IPC, -1, offset + size, handle))
        lseg.append(k)
        loff.append(off)
    e = t0.element_size()
    if layout is not None:
        index = t0.device.index if t0.device.index is not None else 0
        return (index, device_uuid(index), segs, lseg, loff,
                layout.block_stride, layout.kv_stride, layout.token_stride,
                layout.nblocks)
    kv_stride, block_stride, token_stride = (t0.stride()[0] * e,
                                             t0.stride()[1] * e,
                                             t0.stride()[2] * e)
    if t0.stride()[3] * e != g.head_dim * e or t0.stride()[4] != 1:
        raise ValueError("kvtier: each token's heads must be contiguous")
    index = t0.device.index if t0.device.index is not None else 0
    return (index, device_uuid(index), segs, lseg, loff, block_stride,
            kv_stride, token_stride, int(t0.shape[1]))


def ipc_event(client: Any, stream: Any = None) -> Tuple[Any, int]:
    """A torch.cuda.Event(interprocess=True) registered with the daemon:
    (event, id). Record it on the compute stream after the KV writes and
    pass the id to Client.store(event=)."""
    import torch
    ev = torch.cuda.Event(interprocess=True, enable_timing=False)
    ev.record(stream or torch.cuda.current_stream())  # an IPC handle needs one
    index = torch.cuda.current_device()
    eid = client.register_event(index, device_uuid(index),
                                _lib.EVENT_CUDA_IPC, bytes(ev.ipc_handle()))
    return ev, eid
