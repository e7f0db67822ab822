"""What every kvtier object shares: the error types and the library's
codes, the checks of a C call's return value, timeouts in the C form, and
the closable base of every handle (context manager and finalizer).

KvtierError carries the C library's negative code, its symbolic name and
kvt_errdetail()'s text; a daemon that went away is ConnectionLost, a
request it did not answer in time RequestTimeout (kvtier.client's
docstring says what the caller does about each). Re-exported by
kvtier.client and kvtier; nothing here holds state.
"""
from __future__ import annotations

import errno
from typing import Optional, TypeVar

from ._lib import lib

_KVT_CODES = {
    -31900: "KVT_EFULL", -31901: "KVT_ESPEC", -31902: "KVT_EPRESET",
    -31903: "KVT_ECONFIG", -31904: "KVT_ENODEV", -31905: "KVT_ECORRUPT",
    -31906: "KVT_EGEOM", -31907: "KVT_ENOTBUILT", -31908: "KVT_ENOTFOUND",
    -31909: "KVT_EBUSY", -31910: "KVT_EPROTO",
}
KVT_EFULL, KVT_ESPEC, KVT_EPRESET, KVT_ECONFIG = -31900, -31901, -31902, -31903
KVT_ENODEV, KVT_ECORRUPT, KVT_EGEOM, KVT_ENOTBUILT = -31904, -31905, -31906, -31907
KVT_ENOTFOUND, KVT_EBUSY, KVT_EPROTO = -31908, -31909, -31910
# a job's codes for "this block could not be supplied" (failed blocks)
_BLOCK_FAILURES = (KVT_ENOTFOUND, KVT_EBUSY, KVT_ECORRUPT, -errno.EIO,
                   -errno.ECANCELED, -errno.ECONNRESET, -errno.EPIPE)
# the daemon went away: every block of the client's jobs failed
_GONE = (-errno.ECONNRESET, -errno.EPIPE)


_T = TypeVar("_T")


def _code_name(code: int) -> str:
    if code in _KVT_CODES:
        return _KVT_CODES[code]
    return errno.errorcode.get(-code, str(code))


class KvtierError(Exception):
    """An error of the kvtier library or daemon.

    code:   the negative C code (-errno or a KVT_E* value);
    name:   its symbolic name ("KVT_ENOTFOUND", "ECONNREFUSED", ...);
    detail: kvt_errdetail(): what failed and why, in the library's words.
    """

    def __init__(self, code: int, what: str, detail: str = "") -> None:
        self.code = code
        self.name = _code_name(code)
        self.detail = detail
        msg = lib.kvt_strerror(code).decode()
        text = f"{what}: {msg} ({self.name})"
        if detail and detail != msg:
            text += f": {detail}"
        super().__init__(text)


class ConnectionLost(KvtierError):
    """The daemon went away (-ECONNRESET / -EPIPE), or the connection was
    dropped: every job of the client failed with it (its waits return
    every block failed once the daemon has let go); reconnect with a new
    Client."""


class RequestTimeout(ConnectionLost, TimeoutError):
    """A request got no reply within the client's timeout_ms. The
    connection is dropped (a late reply would put every later one out of
    step): later calls raise ConnectionLost; connect again. For a load or
    store the call returned only once the daemon had let go of this
    client's memory (released True), or after lease_ms + timeout_ms with
    the daemon still holding it (released False: it is hung, and the
    request's blocks may still be written)."""

    def __init__(self, code: int, what: str, detail: str = "") -> None:
        super().__init__(code, what, detail)
        self.released = "may still be written" not in detail


def _raise(code: int, what: str, request: bool = True) -> None:
    """Raise for @code. @request: the call was a request to the daemon (a
    timeout drops the connection), not a wait with a timeout of its own."""
    detail = (lib.kvt_errdetail() or b"").decode(errors="replace")
    if code in (-errno.ECONNRESET, -errno.EPIPE):
        raise ConnectionLost(code, what, detail)
    if code == -errno.ETIMEDOUT:
        if request:
            raise RequestTimeout(code, what, detail)
        raise TimeoutError(f"{what}: timed out")
    raise KvtierError(code, what, detail)


def _check(code: int, what: str) -> int:
    if code < 0:
        _raise(code, what)
    return code


def _timeout_ns(timeout: Optional[float]) -> int:
    if timeout is None:
        return -1
    if timeout < 0:
        raise ValueError("kvtier: timeout must be >= 0 seconds or None")
    return int(timeout * 1e9)


class _Closable:
    """Context manager and finalizer over close()."""

    def close(self) -> None:
        raise NotImplementedError

    def __enter__(self: _T) -> _T:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass
