"""Version-gated work-arounds for the iroh 1.2.0 wheel's slow send path and async calls (DESIGN §3).

The generated uniffi binding copies every outgoing byte into the Rust buffer in a Python
loop (``_UniffiRustBufferBuilder.write``; iroh-ffi issue #229, fixed upstream by uniffi-rs
PR #2824 but not in this wheel). That caps sends at a few MB/s per process. We replace
that one method with a single ``ctypes.memmove`` — same bytes, same buffer growth
(``_reserve``) — only on the iroh versions it was verified against. On any other version
nothing is patched and :func:`apply` returns False.

The same patch lowers a ``bytes`` argument (every ``write_all`` of a frame) into a Rust
buffer allocated once at its final size — the length prefix and the bytes each one
``memmove`` — instead of a 16-byte buffer grown by a second FFI call
(``rustbuffer_reserve``) after the prefix is packed byte by byte: one crossing less per
frame sent, and no copy of a ``bytes`` frame on the Python side.

A third part resolves an async call's continuation on the event loop's own thread at
once. uniffi's ``_uniffi_continuation_callback`` always hands the poll result to the loop
with ``call_soon_threadsafe`` — a write to the loop's wake-up pipe, an epoll wake-up and
one more loop turn — although two of every three callbacks of a request/response round
trip arrive synchronously, inside the ``ffi_poll`` the loop's own thread is making (a
read whose bytes are buffered, a write the stream has room for). There the future is
resolved directly: ``await`` then returns without yielding. A callback from any other
thread (iroh's runtime waking a pending read) still goes through
``call_soon_threadsafe``. Measured in process, two endpoints on loopback, 80 B request →
5.5 KB answer: 525 → 459 µs of CPU per round trip, both ends together.

Measured with ``scripts/bench`` (``send throughput`` rows, patched vs. unpatched; the
``frames`` rows: time and FFI calls per frame).
"""

from __future__ import annotations

import ctypes
import struct
import threading
from pathlib import Path

#: iroh versions whose generated binding was read and found to have the copy loop.
VERIFIED_VERSIONS = frozenset({"1.2.0"})

#: ``continuation``: uniffi's own callback while ours is installed; ``fast``: ours, made
#: once and kept here (a ctypes callback object must outlive every call into Rust).
_state = {"applied": False, "original": None, "lower": None, "continuation": None, "fast": None}


def iroh_version() -> str | None:
    """The installed iroh distribution version, or None if it is not installed.

    Read from the ``iroh-<version>.dist-info`` folder beside the ``iroh`` package when
    there is exactly one (a wheel install: no ``importlib.metadata``, whose imports cost
    ~15 ms of every ``kith join``'s start, issue 19); else from ``importlib.metadata``."""
    import importlib.util

    spec = importlib.util.find_spec("iroh")
    if spec is not None and spec.origin:
        infos = list(Path(spec.origin).parent.parent.glob("iroh-*.dist-info"))
        if len(infos) == 1:
            return infos[0].name[len("iroh-"):-len(".dist-info")]
    from importlib import metadata

    try:
        return metadata.version("iroh")
    except metadata.PackageNotFoundError:
        return None


def _fast_write(self, value) -> None:  # type: ignore[no-untyped-def]
    n = len(value)
    with self._reserve(n):
        dst = ctypes.cast(self.rbuf.data, ctypes.c_void_p).value + self.rbuf.len
        ctypes.memmove(dst, bytes(value), n)


def _fast_lower_bytes(value):  # type: ignore[no-untyped-def]
    from iroh import iroh_ffi

    data = value if isinstance(value, bytes) else bytes(value)
    n = len(data)
    rbuf = iroh_ffi._UniffiRustBuffer.alloc(n + 4)  # one allocation at the final size
    base = ctypes.cast(rbuf.data, ctypes.c_void_p).value
    ctypes.memmove(base, struct.pack(">i", n), 4)  # uniffi's big-endian i32 length prefix
    ctypes.memmove(base + 4, data, n)
    rbuf.len = n + 4
    return rbuf


def _make_continuation(iroh_ffi):  # type: ignore[no-untyped-def]
    """A continuation callback of uniffi's own C type that resolves the future at once
    when it runs on the future's event loop thread (module docstring), and hands it over
    with ``call_soon_threadsafe`` otherwise — uniffi's behaviour."""
    handles = iroh_ffi._UniffiContinuationHandleMap
    set_result = iroh_ffi._uniffi_set_future_result
    get_ident = threading.get_ident

    @iroh_ffi._UNIFFI_RUST_FUTURE_CONTINUATION_CALLBACK
    def continuation(future_ptr, poll_code):  # type: ignore[no-untyped-def]
        eventloop, future = handles.remove(future_ptr)
        if getattr(eventloop, "_thread_id", None) == get_ident():
            if not future.cancelled():
                future.set_result(poll_code)
        else:
            eventloop.call_soon_threadsafe(set_result, future, poll_code)

    return continuation


def apply() -> bool:
    """Patch the send path and the async continuation (module docstring) if the installed
    iroh version is verified; idempotent.

    Returns:
        True if the patch is active after the call, False if this version is not verified
        (the binding is then left untouched).
    """
    if _state["applied"]:
        return True
    if iroh_version() not in VERIFIED_VERSIONS:
        return False
    from iroh import iroh_ffi

    builder = getattr(iroh_ffi, "_UniffiRustBufferBuilder", None)
    if builder is None or not hasattr(builder, "_reserve"):
        return False
    _state["original"] = builder.write
    builder.write = _fast_write
    conv = getattr(iroh_ffi, "_UniffiFfiConverterBytes", None)
    if conv is not None and hasattr(iroh_ffi, "_UniffiRustBuffer"):
        _state["lower"] = conv.__dict__.get("lower")  # None: inherited from the base class
        conv.lower = staticmethod(_fast_lower_bytes)
    if all(hasattr(iroh_ffi, n) for n in ("_uniffi_continuation_callback", "_UniffiContinuationHandleMap",
                                          "_uniffi_set_future_result", "_UNIFFI_RUST_FUTURE_CONTINUATION_CALLBACK")):
        if _state["fast"] is None:
            _state["fast"] = _make_continuation(iroh_ffi)
        _state["continuation"] = iroh_ffi._uniffi_continuation_callback
        iroh_ffi._uniffi_continuation_callback = _state["fast"]
    _state["applied"] = True
    return True


def revert() -> None:
    """Undo :func:`apply` (benchmarks measure both paths in one run)."""
    if not _state["applied"]:
        return
    from iroh import iroh_ffi

    iroh_ffi._UniffiRustBufferBuilder.write = _state["original"]
    conv = iroh_ffi._UniffiFfiConverterBytes
    if _state["lower"] is None:
        if "lower" in conv.__dict__:
            del conv.lower
    else:
        conv.lower = _state["lower"]
    if _state["continuation"] is not None:
        iroh_ffi._uniffi_continuation_callback = _state["continuation"]
        _state["continuation"] = None
    _state["applied"] = False


def is_applied() -> bool:
    """True while the fast send path is installed."""
    return bool(_state["applied"])
