"""The one error table (``node.common.errors.CODES``) and the code that raises from it.

A code's category, message and hint are stated once, in the table; each category has one
class. Two guards keep raise sites from disagreeing with it:

- at run time, constructing a class with another category's code raises ``ValueError``;
- statically, an AST scan of ``node/`` finds every raise site with a literal code (the
  first argument of a ``KithError`` class or of ``error_for``) and every other place a
  literal code leaves the node (``code=`` keywords, ``CODES[...]``, ``error_response``,
  ``engine.abort``, the engine's ``_close`` and the host's ``refuse``), so a wrong class or
  an unregistered code fails here even on a path no other test exercises.
"""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Iterator

import pytest

from node.common import errors
from node.common.errors import (
    CATEGORY_CLASSES,
    CODES,
    CommunityError,
    HandshakeError,
    InvitationError,
    KithError,
    ProtocolViolation,
    UsageError,
    error_for,
)

NODE = Path(__file__).resolve().parents[1] / "node"

# every KithError class defined in node.common.errors, by name
CLASSES: dict[str, type[KithError]] = {
    name: obj for name, obj in vars(errors).items()
    if isinstance(obj, type) and issubclass(obj, KithError)
}
# calls whose argument at this position is a code (besides the KithError classes)
CODE_ARG = {"error_for": 0, "error_response": 0, "abort": 0, "_close": 1, "refuse": 1}


def _name(func: ast.expr) -> str | None:
    if isinstance(func, ast.Name):
        return func.id
    if isinstance(func, ast.Attribute):
        return func.attr
    return None


def _literal(node: ast.expr | None) -> str | None:
    return node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else None


def _sites() -> Iterator[tuple[str, str | None, str]]:
    """``(where, class name or None, code)`` for every literal code in ``node/``."""
    for path in sorted(NODE.rglob("*.py")):
        tree = ast.parse(path.read_text("utf-8"), filename=str(path))
        # classes defined in this file that subclass a KithError class (RateLimited, ...)
        local: dict[str, str] = {}
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef):
                for base in node.bases:
                    if _name(base) in CLASSES:
                        local[node.name] = _name(base)  # type: ignore[assignment]
        for cls_node in [n for n in ast.walk(tree) if isinstance(n, ast.ClassDef) and n.name in local]:
            for node in ast.walk(cls_node):
                if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                        and node.func.attr == "__init__" and isinstance(node.func.value, ast.Call)
                        and _name(node.func.value.func) == "super" and node.args):
                    code = _literal(node.args[0])
                    if code is not None:
                        yield f"{path.relative_to(NODE.parent)}:{node.lineno}", local[cls_node.name], code
        for node in ast.walk(tree):
            where = f"{path.relative_to(NODE.parent)}:{getattr(node, 'lineno', 0)}"
            if isinstance(node, ast.Call):
                name = _name(node.func)
                if name in CLASSES and node.args:
                    code = _literal(node.args[0])
                    if code is not None:
                        yield where, name, code
                elif name in CODE_ARG and len(node.args) > CODE_ARG[name]:
                    code = _literal(node.args[CODE_ARG[name]])
                    if code is not None:
                        yield where, None, code
                for kw in node.keywords:
                    if kw.arg == "code" and _literal(kw.value) is not None:
                        yield where, None, _literal(kw.value)  # type: ignore[misc]
            elif (isinstance(node, ast.Subscript) and _name(node.value) == "CODES"
                  and _literal(node.slice) is not None):
                yield where, None, _literal(node.slice)  # type: ignore[misc]


SITES = list(_sites())


def test_the_scan_sees_the_raise_sites():
    # guards the scanner itself: a scan that finds nothing would pass everything
    classes = {cls for _, cls, _ in SITES if cls}
    assert len(SITES) > 300 and {"KithError", "CorpusError", "HandshakeError",
                                 "CommunityError", "PolicyError"} <= classes


def test_every_literal_code_in_node_is_in_the_table():
    unknown = sorted({f"{where} {code!r}" for where, _, code in SITES if code not in CODES})
    assert not unknown, f"codes used in node/ but not in node.common.errors.CODES: {unknown}"


def test_every_raise_site_uses_the_class_of_its_codes_category():
    wrong = []
    for where, cls, code in SITES:
        if cls is None or code not in CODES:
            continue
        want = CATEGORY_CLASSES[CODES[code].category]
        if not issubclass(CLASSES[cls], want) or (cls == "KithError" and want is not KithError):
            wrong.append(f"{where} {cls}({code!r}): the table says {CODES[code].category!r} "
                         f"→ {want.__name__}")
    assert not wrong, "raise sites that disagree with the error table:\n" + "\n".join(wrong)


def test_every_category_has_one_class():
    assert {row.category for row in CODES.values()} <= set(CATEGORY_CLASSES)
    for category, cls in CATEGORY_CLASSES.items():
        assert cls is KithError or cls._category == category


def test_a_class_refuses_a_code_of_another_category():
    with pytest.raises(ValueError, match="raise it as InvitationError"):
        CommunityError("invitation-not-found")
    with pytest.raises(ValueError, match="unregistered"):
        UsageError("no-such-code")
    err = HandshakeError("handshake-malformed")
    assert err.category == "handshake" and err.message == CODES["handshake-malformed"].message


def test_the_table_gives_message_hint_and_category():
    err = KithError("io-error")  # the base class takes any code, for codes known at run time
    assert (err.category, err.message, err.hint) == CODES["io-error"]
    err = CommunityError("database-driver-missing", "a postgresql:// database needs psycopg 3")
    assert err.hint == CODES["database-driver-missing"].hint == ("from the kith checkout: scripts/setup --postgres, "
                                                                  "or pip install '.[postgres]'")
    assert KithError("io-error", "m", hint="h").to_dict() == {"code": "io-error", "message": "m",
                                                             "hint": "h"}


@pytest.mark.parametrize("code, cls", [("invitation-not-found", InvitationError),
                                       ("session-closed", ProtocolViolation),
                                       ("server-error", CommunityError),
                                       ("internal-error", KithError)])
def test_error_for_builds_the_class_of_the_codes_category(code, cls):
    err = error_for(code, "from the server", status=404)
    assert type(err) is cls and err.code == code and err.status == 404
    assert err.message == "from the server"


def test_error_for_refuses_an_unregistered_code():
    with pytest.raises(ValueError):
        error_for("not-a-code")
