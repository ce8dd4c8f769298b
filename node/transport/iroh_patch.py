"""Version-gated work-around for the iroh 1.2.0 wheel's slow send path (DESIGN §3).

The generated uniffi binding copies every outgoing byte into the Rust buffer in a Python
loop (``_UniffiRustBufferBuilder.write``; iroh-ffi issue #229, fixed upstream by uniffi-rs
PR #2824 but not in this wheel). That caps sends at a few MB/s per process. We replace
that one method with a single ``ctypes.memmove`` — same bytes, same buffer growth
(``_reserve``) — only on the iroh versions it was verified against. On any other version
nothing is patched and :func:`apply` returns False.

Measured with ``scripts/bench`` (``send throughput`` rows, patched vs. unpatched).
"""

from __future__ import annotations

import ctypes
from pathlib import Path

#: iroh versions whose generated binding was read and found to have the copy loop.
VERIFIED_VERSIONS = frozenset({"1.2.0"})

_state = {"applied": False, "original": None}


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


def apply() -> bool:
    """Patch the send path if the installed iroh version is verified; idempotent.

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
    _state["applied"] = True
    return True


def revert() -> None:
    """Undo :func:`apply` (benchmarks measure both paths in one run)."""
    if not _state["applied"]:
        return
    from iroh import iroh_ffi

    iroh_ffi._UniffiRustBufferBuilder.write = _state["original"]
    _state["applied"] = False


def is_applied() -> bool:
    """True while the fast send path is installed."""
    return bool(_state["applied"])
