"""``kith protocol test DIR --adversarial`` (DESIGN §7): send malformed variants of every
declared guest→host message to a real host (engine + driver + the protocol's own host
hooks, over the memory pipe, after a real handshake) and require each to be refused with
the right stable code **before** any hook sees it.

Variants per guest→host message: ``unknown-field``, ``missing-field``, ``wrong-type``,
``out-of-range``. Per protocol: ``undeclared-action``, ``wrong-direction`` (a
host→guest message sent by the guest), ``system-frame-mid-session`` (``_session_init``
and ``_ui_artifact_begin`` after the handshake), ``oversize-line``, ``invalid-utf8``,
``invalid-json``, ``non-object-json``, ``missing-action``. A variant that does not apply
(no range constraint, no host→guest message) is reported as ``n/a`` and not counted.

When the protocol's ``max_invalid`` is 0, the first invalid message already aborts the
session with ``too-many-invalid`` (specs/session.md §6.3), so that code is a correct
refusal of every variant whose own code is not fatal by itself (framing errors like
``frame-too-large`` keep their code). It must still come before any hook.
"""

from __future__ import annotations

import copy
import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio

from node.runtime.driver import run_session
from node.engine.framing import LineFramer
from node.engine.business import FATAL_FRAME_CODES
from node.engine.session import GuestConfig, HostConfig, SessionEngine
from node.runtime.hooks import HookContext, Hooks, PeerInfo, load_hooks
from node.trust.identity import Identity
from node.protocol.spec import ProtocolSpec, load_spec
from node.transport.memory import memory_pipe

POST_ID = "adversarial-post"
VARIANT_TIMEOUT_S = 10.0
_SCHEMA_INVALID = {"message-schema-invalid"}


@dataclass
class Variant:
    """One malformed line and the codes that count as a correct refusal."""

    name: str
    message: str  # the action it is derived from, or "-" for protocol-level variants
    line: bytes
    expect: frozenset[str]
    applicable: bool = True
    note: str = ""


@dataclass
class VariantResult:
    """What the host did with one variant."""

    variant: str
    message: str
    expected: list[str]
    got: str | None
    reached_hook: bool
    passed: bool
    note: str = ""


@dataclass
class AdversarialReport:
    """The table ``--adversarial`` prints. ``passed``: every applicable variant refused
    with an expected code and no hook saw a malformed message."""

    protocol: str
    rows: list[VariantResult] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return bool(self.rows) and all(r.passed for r in self.rows)

    def to_dict(self) -> dict[str, Any]:
        return {"protocol": self.protocol, "passed": self.passed, "rows": [r.__dict__ for r in self.rows]}


# ----------------------------------------------------------------------------- instances
#: ... and a 64-hex digest (keys, hashes: knowledge-query's ``check`` versions)
_STRING_CANDIDATES = ("x", "q1", "a", "abc", "0", "a-1", "2024-01-01", "x@example.org", "0" * 64)


def minimal_instance(schema: dict[str, Any]) -> Any:
    """A small value valid for the common JSON Schema keywords of ``schema`` (required
    properties only). The caller validates it; None when no guess fits."""
    if "const" in schema:
        return schema["const"]
    if "enum" in schema:
        return schema["enum"][0]
    if "default" in schema:
        return schema["default"]
    t = schema.get("type")
    if isinstance(t, list):
        t = t[0]
    if t == "object" or "properties" in schema:
        props = schema.get("properties", {})
        return {k: minimal_instance(props.get(k, {})) for k in schema.get("required", [])}
    if t == "array":
        return [minimal_instance(schema.get("items", {})) for _ in range(schema.get("minItems", 0))]
    if t in ("integer", "number"):
        lo = schema.get("minimum", schema.get("exclusiveMinimum", -1) + 1)
        return int(lo) if t == "integer" else float(lo)
    if t == "boolean":
        return True
    if t == "null":
        return None
    n = max(1, schema.get("minLength", 1))
    pat = schema.get("pattern")
    for cand in _STRING_CANDIDATES:
        s = (cand * n)[: max(n, len(cand))]
        if pat is None or re.search(pat, s):
            return s
    return "x" * n


def _wrong_type_value(prop: dict[str, Any]) -> Any:
    t = prop.get("type")
    if t in ("string", None) and not isinstance(prop.get("const"), (int, float)):
        return 12345
    if t in ("integer", "number"):
        return "not-a-number"
    if t == "array":
        return "not-an-array"
    if t == "object":
        return ["not-an-object"]
    return "wrong-type"


def _out_of_range(prop: dict[str, Any]) -> tuple[bool, Any]:
    if "maximum" in prop:
        return True, prop["maximum"] + 1
    if "minimum" in prop:
        return True, prop["minimum"] - 1
    if "maxLength" in prop:
        return True, "x" * (prop["maxLength"] + 1)
    if prop.get("minLength", 0) > 0:
        return True, ""
    if "maxItems" in prop:
        return True, [minimal_instance(prop.get("items", {}))] * (prop["maxItems"] + 1)
    if prop.get("minItems", 0) > 0:
        return True, []
    if "enum" in prop:
        return True, "zz-not-in-enum"
    if "pattern" in prop:
        return True, "\u0000 bad pattern \u0000"
    return False, None


def _line(obj: Any) -> bytes:
    return json.dumps(obj, separators=(",", ":")).encode()


def build_variants(spec: ProtocolSpec) -> list[Variant]:
    """Every malformed variant for ``spec`` (see the module docstring).

    Raises:
        ValueError: when no valid base message can be built for a guest→host message
            (the report shows it as a failed row instead; see :func:`run_adversarial`).
    """
    out: list[Variant] = []
    for action, m in spec.messages.items():
        if not m.allowed_from("guest"):
            continue
        base = minimal_instance(m.schema)
        if not isinstance(base, dict) or not m.validator.is_valid(base):
            out.append(Variant("valid-base", action, b"", frozenset(), applicable=False,
                               note="could not build a valid base message; variants derived from it skipped"))
            continue
        props = m.schema.get("properties", {})
        out.append(Variant("unknown-field", action, _line({**base, "zz_unknown_field": 1}), frozenset(_SCHEMA_INVALID)))
        req = [k for k in m.schema.get("required", []) if k != "action"]
        if req:
            missing = {k: v for k, v in base.items() if k != req[0]}
            out.append(Variant("missing-field", action, _line(missing), frozenset(_SCHEMA_INVALID), note=req[0]))
        else:
            out.append(Variant("missing-field", action, _line({k: v for k, v in base.items() if k != "action"}),
                               frozenset({"frame-missing-action"}), note="action"))
        typed = [k for k, p in props.items() if k != "action" and isinstance(p, dict)]
        if typed:
            k = typed[0]
            out.append(Variant("wrong-type", action, _line({**base, k: _wrong_type_value(props[k])}),
                               frozenset(_SCHEMA_INVALID), note=k))
        else:
            out.append(Variant("wrong-type", action, _line({**base, "action": 123}),
                               frozenset({"frame-missing-action"}), note="action"))
        numeric_first = sorted(props.items(), key=lambda kv: not (isinstance(kv[1], dict) and
                                                                  ("minimum" in kv[1] or "maximum" in kv[1])))
        for k, p in numeric_first:
            if k == "action" or not isinstance(p, dict):
                continue
            ok, value = _out_of_range(p)
            if ok:
                out.append(Variant("out-of-range", action, _line({**base, k: value}), frozenset(_SCHEMA_INVALID),
                                   note=k))
                break
        else:
            out.append(Variant("out-of-range", action, b"", frozenset(), applicable=False,
                               note="no range constraint in the schema"))
    out.append(Variant("undeclared-action", "-", _line({"action": "zz_undeclared_action"}),
                       frozenset({"message-undeclared-action"})))
    host_only = [(a, m) for a, m in spec.messages.items() if not m.allowed_from("guest")]
    if host_only:
        a, m = host_only[0]
        inst = minimal_instance(m.schema)
        out.append(Variant("wrong-direction", a, _line(inst if isinstance(inst, dict) else {"action": a}),
                           frozenset({"message-wrong-direction"})))
    else:
        out.append(Variant("wrong-direction", "-", b"", frozenset(), applicable=False,
                           note="every message may be sent by the guest"))
    init = {"action": "_session_init", "post_id": POST_ID, "protocol_id": spec.protocol_id,
            "guest_public_key": "0" * 64, "guest_nonce": "1" * 64}
    out.append(Variant("system-frame-mid-session", "_session_init", _line(init),
                       frozenset({"message-unexpected-system-frame"})))
    out.append(Variant("system-frame-mid-session", "_ui_artifact_begin",
                       _line({"action": "_ui_artifact_begin", "files": [], "total_bytes": 0}),
                       frozenset({"message-unexpected-system-frame"})))
    limit = spec.limits.max_message_bytes
    out.append(Variant("oversize-line", "-", b'{"action":"' + b"x" * (limit + 16) + b'"}', frozenset({"frame-too-large"})))
    out.append(Variant("invalid-utf8", "-", b'{"action":"\xff\xfe"}', frozenset({"frame-invalid-utf8"})))
    out.append(Variant("invalid-json", "-", b'{"action": "x",', frozenset({"frame-invalid-json"})))
    out.append(Variant("non-object-json", "-", b"[1,2,3]", frozenset({"frame-invalid-json"})))
    out.append(Variant("missing-action", "-", b'{"query":"x"}', frozenset({"frame-missing-action"})))
    if spec.limits.max_invalid == 0:  # the first invalid message aborts: too-many-invalid
        for v in out:
            if v.applicable and not v.expect <= FATAL_FRAME_CODES:
                v.expect = v.expect | {"too-many-invalid"}
    return out


# ----------------------------------------------------------------------------- runner
async def _one(spec: ProtocolSpec, pdir: Path, variant: Variant) -> VariantResult:
    host_id, guest_id = Identity(os.urandom(32)), Identity(os.urandom(32))
    base_hooks = load_hooks(pdir)
    seen_by_hooks: list[dict[str, Any]] = []

    def spy(ctx: HookContext, message: dict[str, Any]) -> Any:
        seen_by_hooks.append(copy.deepcopy(message))
        return base_hooks.on_message(ctx, message) if base_hooks.on_message else None

    hooks = Hooks(on_start=base_hooks.on_start, on_message=spy, on_end=base_hooks.on_end, module=base_hooks.module)
    g_stream, h_stream = memory_pipe(guest_id.public_key, host_id.public_key)
    nonces: set[str] = set()
    host = SessionEngine("host", spec, public_key=host_id.public_key, sign=host_id.sign,
                         host=HostConfig(remote_id=guest_id.public_key, post_protocol={POST_ID: spec.protocol_id}.get,
                                         nonce_unseen=lambda n: n not in nonces and not nonces.add(n)))
    guest = SessionEngine("guest", spec, public_key=guest_id.public_key, sign=guest_id.sign,
                          guest=GuestConfig(remote_id=host_id.public_key, post_id=POST_ID,
                                            host_public_key=host_id.public_key))

    def make_context(ev: Any) -> HookContext:
        return HookContext(role="host", session_id=ev.session_id, peer=PeerInfo(ev.peer_public_key))

    got: list[str] = []

    async def raw_guest() -> None:
        guest.initiate()
        await g_stream.send(guest.data_to_send())
        while guest.state.value == "handshake":
            data = await g_stream.receive()
            if not data:
                return
            guest.receive_data(data)
        if guest.state.value != "await-confirm":
            return
        guest.confirm_ready()
        await g_stream.send(guest.data_to_send())
        await anyio.sleep(0.01)  # let host-first protocols speak; their messages are ignored
        await g_stream.send(variant.line + b"\n")
        framer = LineFramer(1 << 24)

        async def read_refusal() -> None:
            while not got:
                data = await g_stream.receive()
                if not data:
                    return
                for line in framer.feed(data):
                    obj = json.loads(line)
                    if obj.get("action") in ("_error", "_session_reject"):
                        got.append(str(obj.get("code")))

        async with anyio.create_task_group() as inner:
            inner.start_soon(read_refusal)
            while not got and not seen_by_hooks:  # refused, or accepted (a hook saw it)
                await anyio.sleep(0.005)
            inner.cancel_scope.cancel()
        await g_stream.aclose()

    with anyio.move_on_after(VARIANT_TIMEOUT_S):
        async with anyio.create_task_group() as tg:
            tg.start_soon(raw_guest)
            await run_session(h_stream, host, hooks, make_context=make_context, heartbeat=None)
            tg.cancel_scope.cancel()
    code = got[0] if got else None
    reached = bool(seen_by_hooks)
    return VariantResult(variant.name, variant.message, sorted(variant.expect), code, reached,
                         passed=code in variant.expect and not reached, note=variant.note)


async def run_adversarial(pdir: Path) -> AdversarialReport:
    """Run every variant of :func:`build_variants` against the protocol in ``pdir``.

    Raises:
        SpecError: the protocol cannot be loaded.
    """
    pdir = Path(pdir)
    spec = load_spec(pdir)
    report = AdversarialReport(spec.name)
    for v in build_variants(spec):
        if not v.applicable:
            passed = v.name != "valid-base"
            report.rows.append(VariantResult(v.name, v.message, [], None, False, passed, note="n/a: " + v.note))
            continue
        report.rows.append(await _one(spec, pdir, v))
    return report


def render_table(report: AdversarialReport) -> list[str]:
    """The report as aligned text rows (variant, message, expected, got, hooks, verdict)."""
    rows = [("variant", "message", "expected code", "refused with", "reached hooks", "")]
    for r in report.rows:
        rows.append((r.variant + (f" ({r.note})" if r.note and not r.note.startswith("n/a") else ""), r.message,
                     "/".join(r.expected) or "-", r.got or ("n/a" if r.note.startswith("n/a") else "NOT REFUSED"),
                     "yes" if r.reached_hook else "no", "PASS" if r.passed else "FAIL"))
    widths = [max(len(row[i]) for row in rows) for i in range(6)]
    return ["  ".join(c.ljust(widths[i]) for i, c in enumerate(row)).rstrip() for row in rows]
