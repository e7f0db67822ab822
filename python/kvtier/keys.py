"""Page keys: what names a page of KV in kvtier.

A key is 16 bytes (a C kvt_page_key: lo then hi, little endian). A page's
key stands for the page *and everything before it* (keys are chained), so
a call names a prefix by all its keys from page 0.

Two ways to get keys:

* `Client.hash_tokens(tokens)`: the daemon's chained XXH3-128 over the
  token ids, salted with the tenant's salt.
* `keys_from_hashes(hashes, salt)`: from an engine's own chained block
  hashes (vLLM's block hashes, SGLang's page hashes), which already stand
  for their prefix. Each is folded to 16 bytes with BLAKE2b keyed by
  @salt. Deterministic in every process and after every restart — never
  Python's hash(), whose seed changes per process (the cause of "0% hits
  after a restart" reports against other stores).
"""
from __future__ import annotations

import ctypes
import hashlib
from typing import Iterable, List, Sequence, Union

from . import _lib

KEY_BYTES = 16
EngineHash = Union[bytes, bytearray, memoryview, str, int]


def _hash_bytes(h: EngineHash) -> bytes:
    if isinstance(h, (bytes, bytearray, memoryview)):
        return bytes(h)
    if isinstance(h, str):
        return h.encode("utf-8")
    if isinstance(h, int) and not isinstance(h, bool):
        # engines that keep hashes as Python ints (older vLLM): a fixed,
        # signed, 16-byte little-endian form — the same in every process
        n = max(16, (h.bit_length() + 8) // 8)
        return h.to_bytes(n, "little", signed=True)
    raise TypeError(f"kvtier: an engine hash must be bytes, str or int, "
                    f"not {type(h).__name__}")


def keys_from_hashes(hashes: Iterable[EngineHash],
                     salt: bytes = b"") -> List[bytes]:
    """16-byte kvtier keys from an engine's chained page hashes.

    @salt (at most 64 bytes) separates what must not share pages: the
    model, the tenant, the TP rank. The same hash and salt give the same
    key everywhere.
    """
    if isinstance(salt, str):
        salt = salt.encode("utf-8")
    if len(salt) > 64:
        salt = hashlib.blake2b(salt, digest_size=64).digest()
    return [hashlib.blake2b(_hash_bytes(h), digest_size=KEY_BYTES,
                            key=salt).digest() for h in hashes]


def to_c(keys: Sequence[bytes]) -> "ctypes.Array[_lib.PageKey]":
    """The keys as a C array of kvt_page_key (checked: 16 bytes each)."""
    n = len(keys)
    arr = (_lib.PageKey * n)()
    for i, k in enumerate(keys):
        if not isinstance(k, (bytes, bytearray)) or len(k) != KEY_BYTES:
            raise ValueError(f"kvtier: key {i} is not 16 bytes")
        arr[i].lo = int.from_bytes(k[:8], "little")
        arr[i].hi = int.from_bytes(k[8:], "little")
    return arr


def from_c(arr: "ctypes.Array[_lib.PageKey]", n: int) -> List[bytes]:
    """n C keys as 16-byte strings."""
    return [arr[i].lo.to_bytes(8, "little") + arr[i].hi.to_bytes(8, "little")
            for i in range(n)]
