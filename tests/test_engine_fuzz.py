"""Wire fuzzer over the framer and the engine (hypothesis, fixed budget, derandomized so CI
is reproducible). ``scripts/fuzz`` runs the same properties with a larger budget.

Properties: whatever bytes arrive, in whatever splits, the engine never raises, every code
it reports or sends is registered, everything it writes is a valid JSON-Lines system or
business frame, and hooks (``MessageReceived``) only ever see messages that pass their
schema, are declared for the guest, and arrive after the handshake."""

from __future__ import annotations

import base64
import hashlib
import json
import os

import msgspec
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from node.engine import ui as UI
from node.engine.frames import SYSTEM_ACTIONS
from node.engine.session import (
    GuestConfig,
    HostConfig,
    MessageReceived,
    SessionClosed,
    SessionEngine,
    State,
    UiArtifactReceived,
)
from node.common.errors import CODES
from node.trust.identity import Identity
from node.protocol.spec import load_spec

from support.engines import POST_ID
from support.homes import PROTOCOLS

BUDGET = int(os.environ.get("KITH_FUZZ_EXAMPLES", "50"))
FUZZ = settings(max_examples=BUDGET, deadline=None, database=None, derandomize=not os.environ.get("KITH_FUZZ_RANDOM"),
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

SPECS = {n: load_spec(PROTOCOLS / n) for n in ("echo", "knowledge-query")}
HOST, GUEST = Identity(b"\x01" * 32), Identity(b"\x02" * 32)

json_leaf = st.one_of(st.none(), st.booleans(), st.integers(-2**63, 2**63), st.floats(allow_nan=False),
                      st.text(max_size=40))
json_value = st.recursive(json_leaf, lambda c: st.lists(c, max_size=4) | st.dictionaries(st.text(max_size=10), c,
                                                                                         max_size=4), max_leaves=12)


def message(spec):
    actions = sorted(spec.messages) + sorted(SYSTEM_ACTIONS) + ["", "zz", "_zz"]
    fields = sorted({k for m in spec.messages.values() for k in m.schema.get("properties", {})}) + ["zz", "code"]
    return st.builds(lambda a, extra: {"action": a, **extra}, st.sampled_from(actions),
                     st.dictionaries(st.sampled_from(fields), json_value, max_size=5))


def chunks_of(data: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({c % (len(data) + 1) for c in cuts})
    out, prev = [], 0
    for p in points + [len(data)]:
        if p > prev:
            out.append(data[prev:p])
            prev = p
    return out


def engines(spec):
    seen: set[str] = set()
    host = SessionEngine("host", spec, public_key=HOST.public_key, sign=HOST.sign,
                         host=HostConfig(remote_id=GUEST.public_key, post_protocol={POST_ID: spec.protocol_id}.get,
                                         nonce_unseen=lambda n: n not in seen and not seen.add(n)))
    guest = SessionEngine("guest", spec, public_key=GUEST.public_key, sign=GUEST.sign,
                          guest=GuestConfig(remote_id=HOST.public_key, post_id=POST_ID,
                                            host_public_key=HOST.public_key))
    return host, guest


def ready_host(spec):
    host, guest = engines(spec)
    guest.initiate()
    host.receive_data(guest.data_to_send())
    guest.receive_data(host.data_to_send())
    guest.confirm_ready()
    host.receive_data(guest.data_to_send())
    assert host.state is State.READY
    host.data_to_send()
    return host


def check_output(data: bytes) -> None:
    for line in data.splitlines():
        obj = msgspec.json.decode(line)
        assert isinstance(obj, dict) and isinstance(obj.get("action"), str)
        if obj["action"] in ("_error", "_session_reject"):
            assert obj["code"] in CODES, obj


def check_events(spec, events, was_ready: bool) -> None:
    for ev in events:
        if isinstance(ev, MessageReceived):
            assert was_ready
            m = spec.messages[ev.message["action"]]
            assert m.allowed_from("guest") and m.validator.is_valid(ev.message)
        if isinstance(ev, SessionClosed) and ev.code is not None:
            assert ev.code in CODES, ev


def feed(spec, engine, pieces) -> None:
    for piece in pieces:
        was_ready = engine.state is State.READY
        events = engine.receive_data(piece)
        check_events(spec, events, was_ready)
        check_output(engine.data_to_send())
        if engine.closed:
            assert engine.receive_data(piece) == []
            return


@FUZZ
@given(name=st.sampled_from(sorted(SPECS)), msgs=st.lists(st.one_of(message(SPECS["echo"]),
                                                                     message(SPECS["knowledge-query"])), max_size=8),
       garbage=st.lists(st.binary(max_size=64), max_size=3), cuts=st.lists(st.integers(0, 10_000), max_size=12))
def test_ready_host_survives_any_frames(name, msgs, garbage, cuts):
    spec = SPECS[name]
    host = ready_host(spec)
    data = b"".join(msgspec.json.encode(m) + b"\n" for m in msgs) + b"\n".join(garbage)
    feed(spec, host, chunks_of(data, cuts))
    check_events(spec, host.receive_eof(), host.state is State.READY)


@FUZZ
@given(name=st.sampled_from(sorted(SPECS)), first=st.one_of(message(SPECS["echo"]), st.binary(max_size=200)),
       rest=st.lists(message(SPECS["echo"]), max_size=4), cuts=st.lists(st.integers(0, 5000), max_size=8))
def test_handshake_never_crashes_and_never_reaches_hooks(name, first, rest, cuts):
    spec = SPECS[name]
    host, _ = engines(spec)
    head = first if isinstance(first, bytes) else msgspec.json.encode(first)
    data = head + b"\n" + b"".join(msgspec.json.encode(m) + b"\n" for m in rest)
    for piece in chunks_of(data, cuts):
        events = host.receive_data(piece)
        assert not any(isinstance(e, MessageReceived) for e in events)
        check_events(spec, events, False)
        check_output(host.data_to_send())
    assert host.state is not State.READY


ui_path = st.one_of(st.sampled_from(["index.html", "a.js", "../x", "/abs", "C:x", "a\\b", "d/e.css", "INDEX.html"]),
                    st.text(max_size=12))


@FUZZ
@given(files=st.lists(st.tuples(ui_path, st.binary(max_size=64), st.booleans()), max_size=4),
       total_delta=st.sampled_from([0, 0, 0, 1, -1]), extra=st.lists(st.tuples(ui_path, st.integers(0, 70),
                                                                               st.binary(max_size=16)), max_size=3),
       end=st.booleans())
def test_guest_ui_branch_only_accepts_what_the_manifest_promised(files, total_delta, extra, end):
    spec = SPECS["echo"]
    seen: set[str] = set()
    host = SessionEngine("host", spec, public_key=HOST.public_key, sign=HOST.sign,
                         host=HostConfig(remote_id=GUEST.public_key, post_protocol={POST_ID: spec.protocol_id}.get,
                                         nonce_unseen=lambda n: n not in seen and not seen.add(n),
                                         ui_bundle=UI.Bundle.from_files({"index.html": b"x"})))
    guest = SessionEngine("guest", spec, public_key=GUEST.public_key, sign=GUEST.sign,
                          guest=GuestConfig(remote_id=HOST.public_key, post_id=POST_ID, host_public_key=HOST.public_key,
                                            capabilities=[UI.CAPABILITY], want_ui=True))
    guest.initiate()
    host.receive_data(guest.data_to_send())
    proof = host.data_to_send().split(b"\n")[0] + b"\n"
    guest.receive_data(proof)
    assert b"_ui_artifact_request" in guest.data_to_send()
    manifest = [{"path": p, "size": len(b), "sha256": hashlib.sha256(b if good else b + b"!").hexdigest()}
                for p, b, good in files]
    frames = [{"action": "_ui_artifact_begin", "files": manifest,
               "total_bytes": sum(len(b) for _, b, _ in files) + total_delta}]
    frames += [{"action": "_ui_artifact_file", "path": p, "offset": 0, "data": base64.b64encode(b).decode()}
               for p, b, _ in files if b]
    frames += [{"action": "_ui_artifact_file", "path": p, "offset": o, "data": base64.b64encode(b).decode()}
               for p, o, b in extra]
    if end:
        frames.append({"action": "_ui_artifact_end"})
    events = guest.receive_data(b"".join(json.dumps(f).encode() + b"\n" for f in frames))
    check_output(guest.data_to_send())
    for ev in events:
        if isinstance(ev, UiArtifactReceived):
            want = {p: b for p, b, good in files}
            assert ev.files == want and "index.html" in want and all(g for _, _, g in files) and not extra
            for p in ev.files:
                UI.check_path(p)
        if isinstance(ev, SessionClosed):
            assert ev.code in CODES


# ------------------------------------------------------------------ compiled schema checks
# The engine validates with schemas compiled once per spec (node/protocol/schema_check.py);
# their verdict must be jsonschema's on every message, valid or not.
_likely = st.one_of(st.sampled_from(["q1", "q1\n", "", "x" * 65, "ok", "query", "results", "end", "shutdown",
                                     "no-verified-results", "é", "/kb/**"]),
                    st.integers(-3, 25), st.sampled_from([0, 1, 5.0, 5.5, 20, 21, 600000, 600001, 2**70, True, False]),
                    st.lists(st.sampled_from(["a", "", "x" * 300]), max_size=34),
                    st.dictionaries(st.sampled_from(["from", "to", "zz"]), st.sampled_from(["2026", 3, ""]), max_size=3))


def _instances(mspec):
    props = sorted(mspec.schema.get("properties", {})) + ["zz"]
    return st.one_of(
        json_value,
        st.builds(lambda extra, keep_action: ({"action": mspec.action} if keep_action else {}) | extra,
                  st.dictionaries(st.sampled_from(props), st.one_of(_likely, json_value), max_size=6),
                  st.booleans()))


MESSAGE_SPECS = [(n, m) for n, spec in SPECS.items() for m in spec.messages.values()]


@FUZZ
@given(data=st.data())
def test_compiled_schema_checks_agree_with_jsonschema(data):
    name, mspec = data.draw(st.sampled_from(MESSAGE_SPECS))
    assert mspec.check is not None, f"{name}/{mspec.action}: the shipped schemas compile"
    instance = data.draw(_instances(mspec))
    assert mspec.check(instance) == mspec.validator.is_valid(instance), (name, mspec.action, instance)


KEYWORDS_SCHEMA = {
    "type": "object", "required": ["a"], "additionalProperties": {"type": ["integer", "null"]},
    "minProperties": 1, "maxProperties": 4,
    "properties": {
        "a": {"enum": ["x", "y", 3]}, "b": {"const": 2}, "c": {"type": "number", "exclusiveMinimum": 0,
                                                                 "exclusiveMaximum": 10},
        "d": {"type": "string", "pattern": "^[a-z]+$", "minLength": 2, "maxLength": 4},
        "e": {"type": "array", "items": {"type": "boolean"}, "minItems": 1, "maxItems": 2},
        "f": {"minimum": -1, "maximum": 1}, "g": False, "h": True, "i": {"type": "object", "properties": {}},
    },
}


@FUZZ
@given(instance=st.one_of(json_value, st.dictionaries(st.sampled_from("abcdefghiz"), st.one_of(_likely, json_value),
                                                      max_size=5)))
def test_every_compiled_keyword_agrees_with_jsonschema(instance):
    import jsonschema

    from node.protocol.schema_check import compile_check

    check = compile_check(KEYWORDS_SCHEMA)
    assert check is not None
    assert check(instance) == jsonschema.Draft202012Validator(KEYWORDS_SCHEMA).is_valid(instance), instance


def test_schemas_with_other_keywords_are_left_to_jsonschema():
    from node.protocol.schema_check import compile_check

    for schema in ({"$ref": "#/$defs/x", "$defs": {"x": {}}}, {"type": "string", "format": "email"},
                   {"patternProperties": {"^x": {}}}, {"prefixItems": [{}]}, {"allOf": [{}]},
                   {"const": [1]}, {"enum": [{"a": 1}]}, {"properties": {"a": {"not": {}}}}, {"oneOf": []}):
        assert compile_check(schema) is None, schema
