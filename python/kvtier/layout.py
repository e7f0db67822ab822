"""KV layouts of engine tensors: what kvtier registers, derived from the
tensors themselves.

The daemon addresses an engine's KV memory per layer as

    layer base + block*block_stride + kv*kv_stride + token*token_stride
               + head*head_stride                  (a row of D*s bytes)

(include/kvtier/geom.h "ROWS"). Engines lay their caches out in many
ways — vLLM per attention backend and cache layout, SGLang per host-pool
layout — so nothing here assumes a shape: a tensor's dimensions are given
*roles* ("kv", "block", "token", "head", "dim", "layer", or "slot" for a
token-slot dimension that is block*P + token), and every stride comes from
the tensor's own byte strides. What cannot be registered is refused with
the reason (a head's D elements not contiguous, a dimension missing, a
size that is not the geometry's).

    roles = vllm_roles(shape, P, H, D, mla, backend)  # from the backend
    lay = derive(caches, roles, P, H, D, kv)          # one per layer
    client.register_fd(fd, lay.offsets(base), lay.nblocks, lay.block_stride,
                       lay.kv_stride, lay.token_stride,
                       head_stride=lay.head_stride)

Used by the connectors (kvtier.vllm, kvtier.sglang) and kvtier.staging, so
a layout is understood in one place. No torch or NumPy dependency: tensors
are read through describe().
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

__all__ = ["Tensor", "Layout", "LayoutError", "describe", "derive",
           "vllm_roles", "sglang_roles", "VLLM_SHAPES", "SGLANG_LAYOUTS"]


class LayoutError(ValueError):
    """A KV cache kvtier cannot register, with the reason."""


@dataclasses.dataclass(frozen=True)
class Tensor:
    """What kvtier needs of a tensor: address, shape, byte strides."""
    addr: int
    shape: Tuple[int, ...]
    strides: Tuple[int, ...]     # bytes
    itemsize: int
    dtype: str                   # "float16", "bfloat16", "uint8", ...
    device: str                  # "cpu", "cuda:0", ...
    nbytes: int                  # of the storage the tensor views

    @property
    def on_host(self) -> bool:
        return self.device == "cpu"


def _is_torch(t: Any) -> bool:
    return type(t).__module__.startswith("torch")


def describe(t: Any) -> Tensor:
    """A torch tensor's or NumPy array's address, shape and byte strides."""
    if _is_torch(t):
        isz = t.element_size()
        return Tensor(t.data_ptr(), tuple(t.shape),
                      tuple(s * isz for s in t.stride()), isz,
                      str(t.dtype).replace("torch.", ""), str(t.device),
                      t.untyped_storage().nbytes()
                      if hasattr(t, "untyped_storage")
                      else t.storage().nbytes())
    ai = getattr(t, "__array_interface__", None)
    if ai is None:
        raise TypeError(f"kvtier: a KV cache must be a torch tensor or a "
                        f"NumPy array, not {type(t).__name__}")
    strides = tuple(t.strides)
    base = t
    while getattr(base, "base", None) is not None and \
            hasattr(base.base, "__array_interface__"):
        base = base.base
    return Tensor(ai["data"][0], tuple(t.shape), strides, t.itemsize,
                  t.dtype.name, "cpu", getattr(base, "nbytes", t.nbytes))


@dataclasses.dataclass(frozen=True)
class Layout:
    """The registration of one engine's KV memory.

    addrs: per layer, the address of block 0's first chunk (K, or MLA's
    latent); nblocks blocks; strides in bytes (kv_stride 0 for MLA);
    head_stride D*s when a token's heads are packed; span: bytes from a
    layer's address to the end of its last row."""
    addrs: Tuple[int, ...]
    nblocks: int
    block_stride: int
    kv_stride: int
    token_stride: int
    head_stride: int
    span: int
    kv: int
    itemsize: int
    dtype: str
    device: str

    def offsets(self, base: int) -> List[int]:
        """Layer addresses relative to @base (a memfd mapping's start)."""
        return [a - base for a in self.addrs]

    @property
    def packed(self) -> bool:
        """True when every chunk is P*H*D*s contiguous bytes."""
        return False if self.rows else True

    rows: bool = False

    def extent(self) -> Tuple[int, int]:
        """[lowest, highest) address any layer's chunk touches."""
        return min(self.addrs), max(self.addrs) + self.span


# -- roles --------------------------------------------------------------------

# vLLM attention backends' get_kv_cache_shape(num_blocks, block_size,
# num_kv_heads, head_size), by dimension role (read upstream at the pins
# in docs/ENGINES.md): the physical layout then follows the strides.
VLLM_SHAPES: Dict[str, Tuple[str, ...]] = {
    # FlashAttention (v0.12 era) and most backends: K/V outer
    "flash_attn": ("kv", "block", "token", "head", "dim"),
    # FlashInfer, and FlashAttention in later releases: block outer
    "flashinfer": ("block", "kv", "token", "head", "dim"),
    # vLLM's CPU attention backend: heads before tokens
    "cpu": ("kv", "block", "head", "token", "dim"),
    # MLA backends: one latent (kv_lora_rank + qk_rope_head_dim) per token
    "mla": ("block", "token", "dim"),
}

# SGLang host pools (mem_cache memory_pool_host.py / pool_host/{mha,mla}.py)
SGLANG_LAYOUTS: Dict[Tuple[str, bool], Tuple[str, ...]] = {
    ("layer_first", False): ("kv", "layer", "slot", "head", "dim"),
    ("page_first", False): ("kv", "slot", "layer", "head", "dim"),
    ("page_first_direct", False): ("kv", "block", "layer", "token", "head",
                                   "dim"),
    ("page_head", False): ("kv", "block", "head", "token", "layer", "dim"),
    ("layer_first", True): ("layer", "slot", "head", "dim"),
    ("page_first", True): ("slot", "layer", "head", "dim"),
    ("page_first_direct", True): ("block", "layer", "token", "head", "dim"),
}
_SGLANG_REFUSED = {
    "page_first_kv_split":
        "page_first_kv_split (Ascend NPU pools) keeps each token's latent "
        "and its rope part in two buffers of different widths; kvtier "
        "registers one base per layer and a token's row in one piece",
}


def sglang_roles(layout: str, mla: bool) -> Tuple[str, ...]:
    """The roles of SGLang host-pool @layout's kv_buffer dimensions."""
    if layout in _SGLANG_REFUSED:
        raise LayoutError(f"kvtier: SGLang host pool layout {layout!r} is "
                          f"not supported: {_SGLANG_REFUSED[layout]}")
    roles = SGLANG_LAYOUTS.get((layout, mla))
    if roles is None:
        known = sorted({k for k, m in SGLANG_LAYOUTS if m == mla})
        raise LayoutError(f"kvtier: SGLang {'MLA ' if mla else ''}host pool "
                          f"layout {layout!r} is unknown; supported: "
                          f"{', '.join(known)}")
    return roles


# sentinel sizes for asking a backend where its dimensions go: distinct,
# none 2, block size a multiple of 16 (FlashAttention checks it)
_PROBE = {"block": 7, "token": 48, "head": 3, "dim": 5}


def _roles_from_backend(shape_fn: Callable[..., Tuple[int, ...]],
                        mla: bool) -> Optional[Tuple[str, ...]]:
    try:
        probe = tuple(shape_fn(_PROBE["block"], _PROBE["token"],
                               1 if mla else _PROBE["head"], _PROBE["dim"]))
    except Exception:   # a backend that checks its arguments harder
        return None
    by_size = {v: k for k, v in _PROBE.items()}
    if mla:
        by_size[1] = "head"
    by_size[2] = "kv"
    roles = tuple(by_size.get(int(n), "?") for n in probe)
    return None if "?" in roles else roles


def vllm_roles(shape: Sequence[int], P: int, H: int, D: int, mla: bool,
               shape_fn: Optional[Callable[..., Tuple[int, ...]]] = None
               ) -> Tuple[str, ...]:
    """The roles of a vLLM layer cache's dimensions: from the attention
    backend's own get_kv_cache_shape (@shape_fn) when it can be asked, else
    by matching @shape against the known backends' shapes. Ambiguous shapes
    (e.g. H == P with no backend to ask) are refused with the reason."""
    if shape_fn is not None:
        roles = _roles_from_backend(shape_fn, mla)
        if roles is not None and len(roles) == len(shape):
            return roles
    size = {"token": P, "head": H, "dim": D, "kv": 2}
    hits = []
    for name, roles in VLLM_SHAPES.items():
        if (name == "mla") != mla or len(roles) != len(shape):
            continue
        if all(r == "block" or size[r] == n for r, n in zip(roles, shape)):
            hits.append((name, roles))
    distinct = {r for _, r in hits}
    if len(distinct) == 1:
        return hits[0][1]
    want = " or ".join(f"{n} {_shape_text(r, P, H, D)}"
                       for n, r in VLLM_SHAPES.items() if (n == "mla") == mla)
    if not hits:
        raise LayoutError(f"kvtier: a KV cache of shape {tuple(shape)} is no "
                          f"layout kvtier knows for P={P}, H={H}, D={D}: "
                          f"expected {want}")
    raise LayoutError(f"kvtier: a KV cache of shape {tuple(shape)} fits "
                      f"several layouts ({', '.join(n for n, _ in hits)}) "
                      f"and vLLM's attention backend could not be asked "
                      f"which it is")


def _shape_text(roles: Sequence[str], P: int, H: int, D: int) -> str:
    size = {"token": "P", "head": "H", "dim": "D", "kv": "2",
            "block": "blocks", "layer": "L", "slot": "tokens"}
    return "(" + ", ".join(size[r] for r in roles) + ")"


# -- deriving the registration ------------------------------------------------

def derive(tensors: Sequence[Tensor], roles: Sequence[str], P: int, H: int,
           D: int, kv: int, layers: Optional[int] = None) -> Layout:
    """The registration of @tensors (one per layer, same shape and
    strides; or one tensor with a "layer" dimension), whose dimensions have
    @roles. P, H, D, kv: the daemon's geometry on this rank."""
    if not tensors:
        raise LayoutError("kvtier: no KV cache tensors")
    t0 = tensors[0]
    roles = tuple(roles)
    if len(roles) != len(t0.shape):
        raise LayoutError(f"kvtier: {len(t0.shape)}-dimensional KV cache "
                          f"{t0.shape} for roles {roles}")
    for t in tensors[1:]:
        if t.shape != t0.shape or t.strides != t0.strides or \
                t.itemsize != t0.itemsize:
            raise LayoutError(f"kvtier: KV cache layers differ: shape "
                              f"{t.shape} strides {t.strides} vs "
                              f"{t0.shape} {t0.strides}")
    dim = dict(zip(roles, range(len(roles))))
    n = dict(zip(roles, t0.shape))
    st = dict(zip(roles, t0.strides))
    s = t0.itemsize

    def need(role: str, size: int, what: str) -> None:
        got = n.get(role, 1)
        if got != size:
            raise LayoutError(f"kvtier: KV cache of shape {t0.shape}: {what} is "
                              f"{got}, the daemon's geometry has {size}")

    need("dim", D, "the head dimension")
    if D > 1 and "dim" in dim and st["dim"] != s:
        raise LayoutError(f"kvtier: KV cache {t0.shape} strides "
                          f"{t0.strides}: a head's {D} elements are not "
                          f"contiguous (stride {st['dim']} bytes, element "
                          f"{s}); kvtier copies rows of D elements")
    need("head", H, "the number of KV heads (per TP rank)")
    need("kv", kv, "K/V" if kv == 2 else "the latent count")
    row = D * s
    head_stride = st.get("head", row) if H > 1 else row
    if "slot" in dim:
        if "block" in dim or "token" in dim:
            raise LayoutError(f"kvtier: roles {roles}: a slot dimension "
                              f"replaces block and token")
        if n["slot"] % P:
            raise LayoutError(f"kvtier: {n['slot']} token slots are not "
                              f"whole pages of {P}")
        nblocks = n["slot"] // P
        token_stride = st["slot"]
        block_stride = P * st["slot"]
    else:
        if "block" not in dim:
            raise LayoutError(f"kvtier: roles {roles} have no block "
                              f"dimension")
        need("token", P, "the block size (the daemon's --page-tokens)")
        nblocks = n["block"]
        token_stride = st.get("token", H * row)
        block_stride = st["block"]
    kv_stride = st.get("kv", 0) if kv == 2 else 0
    if "layer" in dim:
        if len(tensors) != 1:
            raise LayoutError("kvtier: one tensor holds every layer, "
                              f"{len(tensors)} were given")
        L = n["layer"]
        if layers is not None and L != layers:
            raise LayoutError(f"kvtier: the KV cache has {L} layers, the "
                              f"daemon's model {layers}")
        addrs = tuple(t0.addr + i * st["layer"] for i in range(L))
    else:
        if layers is not None and len(tensors) != layers:
            raise LayoutError(f"kvtier: {len(tensors)} KV cache layers "
                              f"for a model of {layers} layers")
        addrs = tuple(t.addr for t in tensors)
    for nm, v in (("block", block_stride), ("token", token_stride),
                  ("head", head_stride), ("kv", kv_stride)):
        if v < 0:
            raise LayoutError(f"kvtier: negative {nm} stride {v}")
    span_row = (P - 1) * token_stride + (H - 1) * head_stride + row
    span = (nblocks - 1) * block_stride + (kv - 1) * kv_stride + span_row
    rows = head_stride != row or token_stride != H * row
    return Layout(addrs, nblocks, block_stride, kv_stride, token_stride,
                  head_stride, span, kv, s, t0.dtype, t0.device, rows)
