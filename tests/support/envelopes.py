"""Checking a merged ``kith ask`` envelope the two ways the project does (specs/ask.schema.json)."""

from __future__ import annotations

import json

import jsonschema

from node.protocol.schema_check import compile_check

from support.homes import REPO

ASK_SCHEMA = json.loads((REPO / "specs" / "ask.schema.json").read_text())
ASK_VALIDATOR = jsonschema.Draft202012Validator(ASK_SCHEMA)
ASK_CHECK = compile_check({k: v for k, v in ASK_SCHEMA.items() if not k.startswith("$")})


def valid_ask(env: dict) -> None:
    """The project's compiled check and jsonschema agree the ask envelope ``env`` is valid."""
    assert ASK_CHECK is not None and ASK_CHECK(env), list(ASK_VALIDATOR.iter_errors(env))[:3]
    ASK_VALIDATOR.validate(env)
