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


class Keys(Sequence[bytes]):
    """Page keys held as one buffer of 16-byte keys (what hash_tokens()
    returns): a sequence of bytes like a list of keys, that crosses into C
    as the buffer itself — a 32k-token prompt's 2,048 keys are one copy,
    not 2,048 Python objects. Slicing gives Keys; + joins with Keys or any
    sequence of keys; == compares with any sequence of keys."""

    __slots__ = ("buf",)

    def __init__(self, buf: Union[bytes, bytearray, memoryview] = b""):
        buf = bytes(buf)
        if len(buf) % KEY_BYTES:
            raise ValueError(f"kvtier: {len(buf)} bytes is not a whole "
                             f"number of {KEY_BYTES}-byte keys")
        self.buf = buf

    def __len__(self) -> int:
        return len(self.buf) // KEY_BYTES

    def __getitem__(self, i):  # type: ignore[override]
        n = len(self)
        if isinstance(i, slice):
            start, stop, step = i.indices(n)
            if step == 1:
                return Keys(self.buf[start * KEY_BYTES:
                                     max(start, stop) * KEY_BYTES])
            return Keys(b"".join(self[j] for j in range(start, stop, step)))
        if i < 0:
            i += n
        if not 0 <= i < n:
            raise IndexError("kvtier: key index out of range")
        return self.buf[i * KEY_BYTES:(i + 1) * KEY_BYTES]

    def __iter__(self):
        b = self.buf
        return (b[i:i + KEY_BYTES] for i in range(0, len(b), KEY_BYTES))

    def __add__(self, other: Sequence[bytes]) -> "Keys":
        return Keys(self.buf + _joined(other))

    def __radd__(self, other: Sequence[bytes]) -> "Keys":
        return Keys(_joined(other) + self.buf)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Keys):
            return self.buf == other.buf
        try:
            return len(other) == len(self) and \
                self.buf == _joined(other)  # type: ignore[arg-type]
        except (TypeError, ValueError):
            return NotImplemented

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"kvtier.Keys({len(self)} keys)"


def _joined(keys: Sequence[bytes]) -> bytes:
    """@keys as one buffer, each checked to be 16 bytes (C-level loops:
    no Python work per key)."""
    if isinstance(keys, Keys):
        return keys.buf
    try:
        if not any(map(KEY_BYTES.__ne__, map(len, keys))):
            return b"".join(keys)
    except TypeError:
        pass
    i = next(i for i, k in enumerate(keys)
             if not isinstance(k, (bytes, bytearray)) or len(k) != KEY_BYTES)
    raise ValueError(f"kvtier: key {i} is not 16 bytes")


def to_c(keys: Sequence[bytes]) -> "ctypes.Array[_lib.PageKey]":
    """The keys as a C array of kvt_page_key (checked: 16 bytes each), in
    one copy of one buffer."""
    n = len(keys)
    if not n:
        return (_lib.PageKey * 1)()
    return (_lib.PageKey * n).from_buffer_copy(_joined(keys))


def from_c(arr: "ctypes.Array[_lib.PageKey]", n: int) -> Keys:
    """n C keys, as Keys (one buffer)."""
    return Keys(memoryview(arr).cast("B")[:n * KEY_BYTES])
