"""Protocol specs: load and check ``spec.json``, compile validators once, ``protocol_id``.

A protocol is a directory with ``spec.json`` and ``hooks.py`` (DESIGN §7). Its
``protocol_id`` is the SHA-256 hex of the spec's RFC 8785 canonical JSON (DESIGN §4).
The meta-schema is :data:`META_SCHEMA`, published as ``specs/protocol-spec.schema.json``
(a test keeps the two identical).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any, Callable

import rfc8785

from node.common.errors import SpecError
from node.protocol.schema_check import compile_check

MAX_SPEC_BYTES = 1024 * 1024
#: ``protocol_id`` of each shipped ``protocols/*/spec.json`` that passes every check of
#: :func:`parse_spec`. The id is the SHA-256 of the spec's canonical JSON, so a spec with
#: one of these ids is those same bytes and gets the same verdict: :func:`parse_spec`
#: skips only the ``jsonschema`` checks for it (the meta-schema and ``check_schema``,
#: ~50 ms of import at every ``kith join``, issue 19); the rule checks below still run.
#: A changed spec takes the full path; ``tests/test_specs.py`` keeps this set in step.
VERIFIED_PROTOCOL_IDS = frozenset({
    "881064ea76bf118308771df7b8b7f94454d77b91f93ab5ad90661539e98b28e6",  # echo
    "60975ffabf78b5887e9bc016e5e96250fa19aa7725bdc92f8f5024e32f30cc5d",  # knowledge-query
})
DEFAULT_MAX_MESSAGE_BYTES = 1024 * 1024
DIRECTIONS = ("guest_to_host", "host_to_guest", "both")
ROLES = ("guest", "host")

#: JSON Schema (Draft 2020-12) every spec.json must satisfy; the same document is
#: published as ``specs/protocol-spec.schema.json`` (a test keeps the two identical).
META_SCHEMA: dict[str, Any] = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "$id": "https://kith.invalid/specs/protocol-spec.schema.json",
    "title": "Kith protocol spec.json",
    "type": "object",
    "required": ["spec_version", "name", "version", "description", "flow", "messages", "limits"],
    "additionalProperties": False,
    "properties": {
        "spec_version": {"const": 1},
        "name": {"type": "string", "pattern": "^[a-z0-9][a-z0-9-]{0,62}$"},
        "version": {"type": "string", "minLength": 1, "maxLength": 32},
        "description": {"type": "string", "maxLength": 4000},
        "flow": {
            "type": "object",
            "required": ["mode", "first"],
            "additionalProperties": False,
            "properties": {
                "mode": {"enum": ["request_response", "session_loop", "free"]},
                "first": {"enum": ["guest", "host"]},
            },
        },
        "messages": {
            "type": "object",
            "minProperties": 1,
            "propertyNames": {"pattern": "^[A-Za-z][A-Za-z0-9_.-]{0,63}$"},
            "additionalProperties": {
                "type": "object",
                "required": ["direction", "terminal", "schema"],
                "additionalProperties": False,
                "properties": {
                    "direction": {"enum": list(DIRECTIONS)},
                    "terminal": {"type": "boolean"},
                    "description": {"type": "string"},
                    "schema": {"type": "object"},
                },
            },
        },
        "limits": {
            "type": "object",
            "additionalProperties": False,
            "properties": {
                "max_message_bytes": {"type": "integer", "minimum": 256, "maximum": 16777216},
                "max_messages": {"type": "integer", "minimum": 1, "maximum": 1000000},
                "idle_timeout_s": {"type": "number", "exclusiveMinimum": 0, "maximum": 86400},
                "hook_timeout_s": {"type": "number", "exclusiveMinimum": 0, "maximum": 3600},
                "max_invalid": {"type": "integer", "minimum": 0, "maximum": 1000},
            },
        },
    },
}


@dataclass(frozen=True)
class Limits:
    """Per-protocol limits (DESIGN §7). Units: bytes, messages, seconds."""

    max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES
    max_messages: int = 1000
    idle_timeout_s: float = 300.0
    hook_timeout_s: float = 30.0
    max_invalid: int = 3


@dataclass(frozen=True)
class MessageSpec:
    """One declared business message: who may send it, whether it ends the session, and
    its Draft 2020-12 validator, both built once when the spec loads.

    Attributes:
        check: the schema compiled to plain Python by
            :func:`node.protocol.schema_check.compile_check` (instance → valid?), or None
            when the schema uses keywords it does not compile.
    """

    action: str
    direction: str
    terminal: bool
    schema: dict[str, Any]
    check: Callable[[Any], bool] | None = field(default=None, repr=False, compare=False)
    _validator: list[Any] = field(default_factory=list, repr=False, compare=False)

    @property
    def validator(self) -> Any:
        """The ``jsonschema`` Draft 2020-12 validator of :attr:`schema` (the reference;
        gives the error path), built (and ``jsonschema`` imported) on first use."""
        if not self._validator:
            import jsonschema

            self._validator.append(jsonschema.Draft202012Validator(self.schema))
        return self._validator[0]

    def allowed_from(self, role: str) -> bool:
        """True if ``role`` (``guest``/``host``) may send this message."""
        return self.direction == "both" or self.direction == f"{role}_to_{_other(role)}"

    def first_error(self, instance: Any) -> Any:
        """The first schema error of ``instance`` (a ``jsonschema.ValidationError``), or
        None when it is valid.

        The compiled :attr:`check` answers valid messages; an instance it refuses (or
        every instance, without it) goes to :attr:`validator`, whose verdict and error
        are the reference."""
        if self.check is not None and self.check(instance):
            return None
        return next(iter(self.validator.iter_errors(instance)), None)


def _other(role: str) -> str:
    return "host" if role == "guest" else "guest"


@dataclass(frozen=True)
class ProtocolSpec:
    """A loaded, checked protocol spec.

    Attributes:
        name, version, description: from spec.json.
        protocol_id: SHA-256 hex of the RFC 8785 canonical JSON of spec.json.
        flow_mode: ``request_response`` | ``session_loop`` | ``free``.
        first: the role that sends the first business message.
        messages: action → :class:`MessageSpec`.
        limits: :class:`Limits`.
        raw: the decoded spec.json.
    """

    name: str
    version: str
    description: str
    protocol_id: str
    flow_mode: str
    first: str
    messages: dict[str, MessageSpec]
    limits: Limits
    raw: dict[str, Any] = field(repr=False, compare=False)

    @property
    def alpn(self) -> bytes:
        """The iroh ALPN for this protocol: ``kith/<name>/1`` (DESIGN §3)."""
        return f"kith/{self.name}/1".encode()


def protocol_id_of(spec: dict[str, Any]) -> str:
    """SHA-256 hex of the RFC 8785 canonical JSON of ``spec`` (DESIGN §4)."""
    return hashlib.sha256(rfc8785.dumps(spec)).hexdigest()


def parse_spec(raw: dict[str, Any], *, origin: str = "spec.json") -> ProtocolSpec:
    """Check a decoded spec against the meta-schema and the loading rules of DESIGN §7.

    Refuses: a spec that fails the meta-schema; declared actions starting with ``_``;
    message schemas that fail ``check_schema``; a message schema that does not pin
    ``action`` to its own name (``properties.action.const`` and ``action`` required).
    A spec whose ``protocol_id`` is in :data:`VERIFIED_PROTOCOL_IDS` (a shipped one, byte
    for byte) has passed the two ``jsonschema`` checks already: only the rule checks run.

    Raises:
        SpecError: ``spec-invalid`` naming ``origin`` and the offending key.
    """
    try:
        protocol_id: str | None = protocol_id_of(raw)
    except (rfc8785.CanonicalizationError, TypeError):  # not canonical JSON: the checks say why
        protocol_id = None
    verified = protocol_id in VERIFIED_PROTOCOL_IDS
    if not verified:
        import jsonschema

        try:
            jsonschema.Draft202012Validator(META_SCHEMA).validate(raw)
        except jsonschema.ValidationError as exc:
            where = "/".join(str(p) for p in exc.absolute_path) or "(top level)"
            raise SpecError("spec-invalid", f"{origin}: at {where}: {exc.message}") from None
    messages: dict[str, MessageSpec] = {}
    for action, m in raw["messages"].items():
        if action.startswith("_"):
            raise SpecError("spec-invalid", f"{origin}: action {action!r} starts with '_' (reserved for system frames)")
        schema = m["schema"]
        if not verified:
            try:
                jsonschema.Draft202012Validator.check_schema(schema)
            except jsonschema.SchemaError as exc:
                raise SpecError("spec-invalid", f"{origin}: schema of {action!r} is not valid: {exc.message}") from None
        props = schema.get("properties", {})
        if (schema.get("type") != "object" or props.get("action", {}).get("const") != action
                or "action" not in schema.get("required", [])):
            raise SpecError("spec-invalid", f"{origin}: schema of {action!r} must be an object schema that "
                                            f"requires 'action' and pins it with const {action!r}")
        messages[action] = MessageSpec(
            action=action, direction=m["direction"], terminal=m["terminal"], schema=schema,
            check=compile_check(schema),
        )
    limits = Limits(**raw.get("limits", {}))
    return ProtocolSpec(
        name=raw["name"], version=raw["version"], description=raw["description"],
        protocol_id=protocol_id or protocol_id_of(raw), flow_mode=raw["flow"]["mode"], first=raw["flow"]["first"],
        messages=messages, limits=limits, raw=raw,
    )


def load_spec(protocol_dir: Path) -> ProtocolSpec:
    """Load ``<protocol_dir>/spec.json``.

    Raises:
        SpecError: ``protocol-not-found`` if the file is missing, ``spec-invalid`` if it is
            too large (> 1 MiB), not JSON, or breaks the rules of :func:`parse_spec`.
    """
    path = Path(protocol_dir) / "spec.json"
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise SpecError("protocol-not-found", f"no spec.json in protocol folder {Path(protocol_dir).name!r}") from None
    if len(data) > MAX_SPEC_BYTES:
        raise SpecError("spec-invalid", f"{path.name}: larger than 1 MiB")
    try:
        raw = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise SpecError("spec-invalid", f"{Path(protocol_dir).name}/spec.json is not valid JSON ({type(exc).__name__})") from None
    if not isinstance(raw, dict):
        raise SpecError("spec-invalid", f"{Path(protocol_dir).name}/spec.json must be a JSON object")
    return parse_spec(raw, origin=f"{Path(protocol_dir).name}/spec.json")


def bundled_protocols_dir() -> Path:
    """The folder of protocols shipped inside the installed package (package data)."""
    return Path(str(resources.files("node.bundled_protocols")))


def find_protocol_dir(name: str, home: Path | None) -> Path | None:
    """Find a protocol folder by name: ``<home>/protocols/<name>`` first, then the
    bundled protocols (DESIGN §7). Returns None if neither has a ``spec.json``."""
    if not name or "/" in name or "\\" in name or name.startswith("."):
        return None
    candidates = []
    if home is not None:
        candidates.append(Path(home) / "protocols" / name)
    candidates.append(bundled_protocols_dir() / name)
    for c in candidates:
        if (c / "spec.json").is_file():
            return c
    return None


def resolve_protocol_dir(target: str | Path, home: Path | None) -> Path:
    """A protocol folder given as a path (a folder with ``spec.json``) or as a name (the
    home's ``protocols/<name>``, then the bundled ones, :func:`find_protocol_dir`) — what
    ``kith protocol test|id``, ``kith host --protocol`` and ``community publish-protocol``
    accept.

    Raises:
        SpecError: ``protocol-not-found`` naming ``target``.
    """
    path = Path(target)
    if (path / "spec.json").is_file():
        return path
    found = find_protocol_dir(str(target), home)
    if found is None:
        raise SpecError("protocol-not-found",
                        f"{str(target)!r} is neither a protocol folder (with spec.json) nor an "
                        "installed or bundled protocol name")
    return found

