"""Message schemas compiled once into plain Python checks (the hot path of DESIGN §7).

``jsonschema`` interprets a schema on every call: each subschema it descends into builds
a new validator and a ``referencing`` resource, about 60-100 µs for a knowledge-query
message, twice per message (sender and receiver). :func:`compile_check` turns a schema
that uses only the common keywords below into a tree of closures built once per spec
load, that answers valid / invalid in a few µs.

The verdict never differs from ``jsonschema``'s where it matters:

- a schema with any keyword outside :data:`SUPPORTED` (``$ref``, ``format``,
  ``patternProperties``, ``prefixItems``, ``allOf``, ...) is not compiled at all
  (:func:`compile_check` returns None) and ``jsonschema`` checks it as before;
- each supported keyword repeats ``jsonschema``'s own rule for Draft 2020-12 (types as
  its type checker defines them — ``1.0`` is an integer, ``true`` is not a number —
  ``pattern`` with :func:`re.search`, lengths in code points, ``const``/``enum`` of
  strings or integers only);
- an instance the compiled check calls invalid is handed to ``jsonschema`` for the
  error (path and keyword) — and if ``jsonschema`` finds none, it is valid.

``tests/test_engine_fuzz.py`` compares both verdicts on generated messages for every
shipped protocol's schemas.
"""

from __future__ import annotations

import re
from typing import Any, Callable

Check = Callable[[Any], bool]

#: Keywords :func:`compile_check` understands; annotations are accepted and ignored.
SUPPORTED = frozenset({
    "type", "const", "enum", "properties", "required", "additionalProperties", "pattern",
    "minLength", "maxLength", "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum",
    "minItems", "maxItems", "items", "minProperties", "maxProperties", "oneOf", "anyOf",
})
ANNOTATIONS = frozenset({"description", "title", "default", "examples", "$comment", "deprecated",
                         "readOnly", "writeOnly"})


class _Unsupported(Exception):
    pass


def _is_number(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def _is_integer(x: Any) -> bool:
    if isinstance(x, bool):
        return False
    return isinstance(x, int) or (isinstance(x, float) and x.is_integer())


_TYPES: dict[str, Check] = {
    "object": lambda x: isinstance(x, dict),
    "array": lambda x: isinstance(x, list),
    "string": lambda x: isinstance(x, str),
    "boolean": lambda x: isinstance(x, bool),
    "null": lambda x: x is None,
    "number": _is_number,
    "integer": _is_integer,
}


def _equal_check(value: Any) -> Check:
    """``const``/``enum`` equality as jsonschema's ``equal``, for strings and integers."""
    if isinstance(value, str):
        return lambda x: isinstance(x, str) and x == value
    if isinstance(value, int) and not isinstance(value, bool):
        return lambda x: _is_number(x) and x == value
    raise _Unsupported


def _compile(schema: Any) -> Check:
    if schema is True:
        return lambda x: True
    if schema is False:
        return lambda x: False
    if not isinstance(schema, dict):
        raise _Unsupported
    for key in schema:
        if key not in SUPPORTED and key not in ANNOTATIONS:
            raise _Unsupported
    checks: list[Check] = []
    if "type" in schema:
        names = schema["type"] if isinstance(schema["type"], list) else [schema["type"]]
        if not names or any(not isinstance(n, str) or n not in _TYPES for n in names):
            raise _Unsupported
        preds = [_TYPES[n] for n in names]
        checks.append(preds[0] if len(preds) == 1 else (lambda x: any(p(x) for p in preds)))
    if "const" in schema:
        checks.append(_equal_check(schema["const"]))
    if "enum" in schema:
        if not isinstance(schema["enum"], list):
            raise _Unsupported
        eqs = [_equal_check(v) for v in schema["enum"]]
        if all(isinstance(v, str) for v in schema["enum"]):
            names = frozenset(schema["enum"])
            checks.append(lambda x: isinstance(x, str) and x in names)
        else:
            checks.append(lambda x: any(eq(x) for eq in eqs))
    checks.extend(_object_checks(schema))
    checks.extend(_string_checks(schema))
    checks.extend(_number_checks(schema))
    checks.extend(_array_checks(schema))
    for key in ("anyOf", "oneOf"):
        if key in schema:
            subs = schema[key]
            if not isinstance(subs, list) or not subs:
                raise _Unsupported
            branches = tuple(_compile(s) for s in subs)
            if key == "anyOf":
                checks.append(lambda x, b=branches: any(c(x) for c in b))
            else:  # exactly one branch (JSON Schema 2020-12 §10.2.1.3)
                checks.append(lambda x, b=branches: sum(1 for c in b if c(x)) == 1)
    return _all(checks)


def _all(checks: list[Check]) -> Check:
    """One check that passes when every one of ``checks`` does (plain loops: this runs
    for every message)."""
    if not checks:
        return lambda x: True
    if len(checks) == 1:
        return checks[0]
    if len(checks) == 2:
        a, b = checks
        return lambda x: a(x) and b(x)
    seq = tuple(checks)

    def every(x: Any) -> bool:
        for c in seq:
            if not c(x):
                return False
        return True

    return every


def _object_checks(schema: dict[str, Any]) -> list[Check]:
    props = schema.get("properties", {})
    if not isinstance(props, dict):
        raise _Unsupported
    compiled = {k: _compile(v) for k, v in props.items()}
    required = schema.get("required", [])
    if not isinstance(required, list) or not all(isinstance(r, str) for r in required):
        raise _Unsupported
    extra = _compile(schema["additionalProperties"]) if "additionalProperties" in schema else None
    low = _count(schema["minProperties"]) if "minProperties" in schema else None
    high = _count(schema["maxProperties"]) if "maxProperties" in schema else None
    if not compiled and not required and extra is None and low is None and high is None:
        return []
    req = tuple(required)

    def check_object(x: Any) -> bool:
        if not isinstance(x, dict):
            return True
        for r in req:
            if r not in x:
                return False
        if low is not None and len(x) < low or high is not None and len(x) > high:
            return False
        for k, v in x.items():
            c = compiled.get(k)
            if c is not None:
                if not c(v):
                    return False
            elif extra is not None and not extra(v):
                return False
        return True

    return [check_object]


def _string_checks(schema: dict[str, Any]) -> list[Check]:
    out: list[Check] = []
    if "pattern" in schema:
        if not isinstance(schema["pattern"], str):
            raise _Unsupported
        rx = re.compile(schema["pattern"])
        out.append(lambda x: not isinstance(x, str) or rx.search(x) is not None)
    for key, op in (("minLength", lambda n, m: n >= m), ("maxLength", lambda n, m: n <= m)):
        if key in schema:
            m = _count(schema[key])
            out.append(lambda x, m=m, op=op: not isinstance(x, str) or op(len(x), m))
    return out


def _number_checks(schema: dict[str, Any]) -> list[Check]:
    out: list[Check] = []
    ops = {"minimum": lambda v, b: v >= b, "maximum": lambda v, b: v <= b,
           "exclusiveMinimum": lambda v, b: v > b, "exclusiveMaximum": lambda v, b: v < b}
    for key, op in ops.items():
        if key in schema:
            bound = schema[key]
            if not _is_number(bound):
                raise _Unsupported
            out.append(lambda x, b=bound, op=op: not _is_number(x) or op(x, b))
    return out


def _array_checks(schema: dict[str, Any]) -> list[Check]:
    out: list[Check] = []
    if "items" in schema:
        item = _compile(schema["items"])

        def check_items(x: Any) -> bool:
            if isinstance(x, list):
                for v in x:
                    if not item(v):
                        return False
            return True

        out.append(check_items)
    for key, op in (("minItems", lambda n, m: n >= m), ("maxItems", lambda n, m: n <= m)):
        if key in schema:
            m = _count(schema[key])
            out.append(lambda x, m=m, op=op: not isinstance(x, list) or op(len(x), m))
    return out


def _count(value: Any) -> int:
    if not _is_integer(value) or value < 0:
        raise _Unsupported
    return int(value)


def compile_check(schema: Any) -> Check | None:
    """Compile a (meta-schema-checked) Draft 2020-12 schema into ``instance → bool``.

    Returns:
        The check, or None when the schema uses anything outside :data:`SUPPORTED` and
        :data:`ANNOTATIONS` (or a bound, pattern or ``const`` of an unusual kind): the
        caller then validates with ``jsonschema`` alone.
    """
    try:
        return _compile(schema)
    except (_Unsupported, re.error):
        return None
