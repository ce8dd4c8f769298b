"""The whole Kith error taxonomy.

Every refusal Kith can produce is a :class:`KithError` carrying a stable kebab-case
``code`` (listed in :data:`CODES` and documented in ``specs/error-codes.md``), a one-line
human ``message`` and an optional ``hint`` saying what to do about it. The CLI maps these
to messages and exit codes in one place (``node/cli/main.py``); peers see only ``code`` and
``message`` (never exception text, hosts, keys or real paths).

This module imports nothing else from Kith (the pip ``exceptions.py`` habit).

To add a refusal: add its code to :data:`CODES` (code → category, default message) and a
line to ``specs/error-codes.md``; ``tests/test_docs.py`` checks both stay in step.
"""

from __future__ import annotations

# code -> (category, default one-line message)
CODES: dict[str, tuple[str, str]] = {
    # --- usage / configuration -------------------------------------------------------
    "usage": ("usage", "The command line is not valid."),
    "config-invalid": ("config", "A configuration file is not valid."),
    "home-not-initialized": ("config", "This Kith home has no identity yet; run `kith init`."),
    "no-server": ("config", "No community server is configured; pass --server URL."),
    "file-not-found": ("config", "The file does not exist."),
    "io-error": ("config", "A local file or folder could not be read or written."),
    # --- identity / signing ----------------------------------------------------------
    "identity-corrupt": ("identity", "The identity key file is unreadable or malformed."),
    "bad-hex": ("signing", "A key, signature or nonce is not strict lowercase hex of the exact length."),
    "bad-signature": ("signing", "A signature does not verify."),
    "bad-payload-value": ("signing", "A signed payload value contains a newline or is malformed."),
    # --- invitations (join refusals) ---------------------------------------------------
    "invitation-malformed": ("invitation", "The invitation is not a valid invitation document."),
    "invitation-bad-signature": ("invitation", "The invitation's transport binding signature does not verify."),
    "invitation-ticket-mismatch": ("invitation", "The invitation's iroh_ticket differs from transport_info.ticket."),
    "invitation-endpoint-mismatch": ("invitation", "The ticket's endpoint id, transport_info.endpoint_id and host_public_key differ."),
    "invitation-bad-ticket": ("invitation", "The invitation's iroh ticket cannot be parsed."),
    "invitation-expired": ("invitation", "The invitation has expired."),
    "invitation-protocol-mismatch": ("invitation", "The invitation's protocol differs from the local protocol of that name."),
    "invitation-unknown-protocol": ("invitation", "The invitation names a protocol that is not installed here."),
    "invitation-bad-hex": ("invitation", "A key or signature in the invitation is not strict lowercase hex of the exact length."),
    "invitation-not-found": ("invitation", "No invitation with that post_id exists on the server."),
    "host-key-changed": ("invitation", "The host key differs from the key pinned for that peer name."),
    "host-not-trusted": ("invitation", "The host key is not trusted; pass --trust or answer yes at the prompt."),
    # --- handshake (_session_reject codes) -----------------------------------------
    "handshake-first-frame": ("handshake", "The first frame of a session must be _session_init."),
    "handshake-timeout": ("handshake", "A handshake step did not complete in time."),
    "handshake-key-mismatch": ("handshake", "The claimed public key differs from the QUIC remote id."),
    "handshake-unknown-post": ("handshake", "The invitation is not live on this host."),
    "handshake-protocol-mismatch": ("handshake", "The session's protocol differs from the invitation's."),
    "handshake-bad-nonce": ("handshake", "A handshake nonce is malformed."),
    "handshake-nonce-reused": ("handshake", "A handshake nonce was already used."),
    "handshake-bad-signature": ("handshake", "A handshake signature does not verify."),
    "handshake-session-mismatch": ("handshake", "The session_id does not match the recomputed session payload."),
    "handshake-not-admitted": ("handshake", "This peer is not admitted by the host."),
    "handshake-malformed": ("handshake", "A handshake frame is missing fields or has wrong types."),
    "handshake-rejected": ("handshake", "The peer refused the session."),
    "handshake-unexpected-frame": ("handshake", "A frame arrived out of order during the handshake."),
    "handshake-host-busy": ("handshake", "The host is serving its maximum number of sessions; try again later."),
    "handshake-peer-busy": ("handshake", "This peer already has the maximum number of sessions open with the host."),
    "ui-path-invalid": ("handshake", "A UI bundle path is absolute, names a drive, escapes the bundle or is unsafe."),
    "ui-link-refused": ("handshake", "A UI bundle entry is a link or another non-regular file."),
    "ui-too-large": ("handshake", "A UI bundle has too many files, a file too large, or is too large in total."),
    "ui-hash-mismatch": ("handshake", "A UI bundle file does not match its SHA-256."),
    "ui-manifest-mismatch": ("handshake", "The UI transfer does not match its manifest."),
    "ui-no-index": ("handshake", "The UI bundle has no top-level index.html."),
    "ui-not-offered": ("handshake", "A UI was requested but the host offered none."),
    "ui-not-requested": ("handshake", "The host sent UI data the guest did not request."),
    "ui-bundle-invalid": ("handshake", "The protocol's local ui/ folder cannot be shared as a UI bundle."),
    "ui-install-failed": ("handshake", "The received UI bundle could not be installed under the guest's home."),
    # --- framing / session protocol --------------------------------------------------
    "frame-too-large": ("protocol", "A JSON-Lines frame exceeds the maximum line size."),
    "frame-invalid-utf8": ("protocol", "A frame is not valid UTF-8."),
    "frame-invalid-json": ("protocol", "A frame is not a JSON object."),
    "frame-truncated": ("protocol", "The stream ended in the middle of a frame."),
    "frame-missing-action": ("protocol", "A frame has no string action."),
    "message-undeclared-action": ("protocol", "The message action is not declared by the protocol."),
    "message-wrong-direction": ("protocol", "The message action is not allowed in this direction."),
    "message-schema-invalid": ("protocol", "The message does not match its schema."),
    "message-unexpected-system-frame": ("protocol", "A system frame is not allowed at this point."),
    "message-before-ready": ("protocol", "A business message arrived before the session was ready."),
    "message-out-of-turn": ("protocol", "The message breaks the protocol's turn rules."),
    "message-limit-exceeded": ("protocol", "The session exceeded the protocol's message limit."),
    "too-many-invalid": ("protocol", "Too many invalid messages; the session was aborted."),
    "session-closed": ("protocol", "The session has already ended."),
    "peer-disconnected": ("session", "The peer disconnected."),
    "peer-unresponsive": ("session", "The peer stopped responding."),
    "idle-timeout": ("session", "The session was idle for too long."),
    "remote-error": ("session", "The peer reported an error."),
    "session-shutdown": ("session", "The session ended because the node is shutting down."),
    # --- protocol specs / hooks --------------------------------------------------------
    "spec-invalid": ("spec", "The protocol's spec.json is not valid."),
    "protocol-not-found": ("spec", "No protocol with that name is installed."),
    "hooks-invalid": ("hook", "The protocol's hooks.py cannot be loaded."),
    "hook-failed": ("hook", "A protocol hook raised an error."),
    "hook-timeout": ("hook", "A protocol hook did not finish in time."),
    "hook-output-invalid": ("hook", "A protocol hook produced a message that does not match the protocol."),
    "egress-leak": ("egress", "An outgoing message contained a real path and was refused."),
    "protocol-test-failed": ("spec", "The protocol test did not pass."),
    # --- transport -----------------------------------------------------------------------
    "transport-bind-failed": ("transport", "The iroh endpoint could not be bound."),
    "transport-connect-failed": ("transport", "Could not connect to the peer."),
    "transport-io": ("transport", "The connection failed while sending or receiving."),
    # --- community server ----------------------------------------------------------------
    "server-unreachable": ("community", "The community server cannot be reached."),
    "server-error": ("community", "The community server answered with an error."),
    "request-unsigned": ("community", "The request is missing signature headers."),
    "request-bad-signature": ("community", "The request signature does not verify."),
    "request-stale": ("community", "The request timestamp is outside the accepted window."),
    "request-replayed": ("community", "The request nonce was already used."),
    "request-too-large": ("community", "The request body is too large."),
    "request-invalid": ("community", "The request body is not valid."),
    "not-found": ("community", "Not found."),
    "forbidden": ("community", "The signing key may not do this."),
    "session-duplicate": ("community", "That session proof was already recorded."),
    "session-invalid": ("community", "The session proof does not verify."),
    "invitation-duplicate": ("community", "An invitation with that post_id already exists."),
    "method-not-allowed": ("community", "That HTTP method is not allowed on this route."),
    "server-start-failed": ("community", "The community server could not listen on that address."),
    "server-not-public": ("community", "Refusing to serve on a non-loopback address without --public."),
    "rate-limited": ("community", "Too many requests; retry after the Retry-After delay."),
    "invitation-withdrawn": ("community", "The host withdrew this invitation."),
    "invitation-consumed": ("community", "The invitation's max_sessions were all used."),
    "session-not-found": ("community", "No session with that session_id was recorded."),
    "feedback-duplicate": ("community", "This participant already rated this session."),
    "identity-not-found": ("community", "No identity with that public key is registered."),
    "protocol-id-not-found": ("community", "No protocol spec with that protocol_id was published."),
    "database-url-invalid": ("community", "The database URL is not postgresql://, postgres:// or sqlite:///."),
    "database-unavailable": ("community", "The community database cannot be opened or reached."),
    "database-driver-missing": ("community", "The PostgreSQL driver is not installed (kith-node[postgres])."),
    "database-schema-old": ("community", "The community database's schema is older than this server's; run kith community migrate."),
    "database-schema-newer": ("community", "The community database's schema is newer than this server's; upgrade kith-node."),
    "database-in-use": ("community", "Another server process is using this SQLite database."),
    "database-timeout": ("community", "A database statement took too long and was cancelled."),
    "invitation-host-offline": ("community", "The host of this invitation is not refreshing its lease (offline)."),
    "display-name-taken": ("community", "Another identity already uses a display name that looks like this one."),
    # --- corpus ---------------------------------------------------------------------------
    "root-not-found": ("corpus", "The folder to index does not exist or is not a directory."),
    "root-exists": ("corpus", "That folder is already a source root."),
    "index-locked": ("corpus", "Another process is writing the index."),
    "index-unavailable": ("corpus", "The index is missing or unreadable."),
    "query-invalid": ("corpus", "The search request is not valid."),
    "corpus-readonly": ("corpus", "This corpus handle is read-only; it can only search."),
    "chunking-invalid": ("corpus", "The chunker settings are not valid."),
    "sync-mode-invalid": ("corpus", "The sync mode is not one of new_only, update_only, full."),
    "root-unknown": ("corpus", "No source root has that prefix."),
    "import-invalid": ("corpus", "The datasource import is not valid."),
    "import-not-found": ("corpus", "The file to import does not exist or cannot be read."),
    "budget-exhausted": ("corpus", "The search budget (time or number of searches) is used up."),
    "api-read-only": ("corpus", "The local API is read-only; this route or method changes nothing."),
    "api-loopback-only": ("corpus", "The local API answers loopback clients only."),
    "api-bad-host": ("corpus", "The local API answers only a loopback Host/Origin with its own port."),
    "api-content-type": ("corpus", "POST /search on the local API takes Content-Type: application/json."),
    "peer-search-failed": ("corpus", "The search over a joined peer did not complete."),
    "dense-unavailable": ("corpus", "The optional dense pass (kith-node[hybrid]) is not installed."),
    # --- policy ---------------------------------------------------------------------------
    "policy-invalid": ("policy", "The policy file is not valid."),
    "policy-bad-glob": ("policy", "The policy glob is not valid."),
    "policy-bad-tier": ("policy", "The policy tier is not one of public, peers, ask, private, never."),
    "approval-not-found": ("policy", "No approval request with that id exists."),
    "approval-decided": ("policy", "That approval request was already decided."),
    "peer-bad-name": ("policy", "A peer name is 1-64 of [A-Za-z0-9_.-], starting with a letter or digit."),
    "peer-exists": ("policy", "A peer with that name is already pinned."),
    "peer-key-pinned": ("policy", "That public key is already pinned under another name."),
    "peer-not-found": ("policy", "No peer with that name is in the registry."),
    "peer-key-changed": ("policy", "This peer claims a pinned name but presents a different key."),
    # --- generic ----------------------------------------------------------------------------
    "internal-error": ("internal", "An internal error occurred."),
}


class KithError(Exception):
    """A typed refusal with a stable code.

    Args:
        code: a key of :data:`CODES` (kebab-case, stable; documented in specs/).
        message: one line for a human; defaults to the code's default message. Must not
            contain secrets or real paths when it can reach a peer.
        hint: optional advice on what to do next (shown by the CLI).
        exit_code: CLI exit status (1 failure, 2 usage).

    Raises:
        ValueError: if ``code`` is not registered in :data:`CODES` (a programming error).
    """

    category = "internal"
    exit_code = 1

    def __init__(self, code: str, message: str | None = None, *, hint: str | None = None,
                 exit_code: int | None = None) -> None:
        if code not in CODES:
            raise ValueError(f"unregistered error code {code!r}")
        self.code = code
        self.message = message or CODES[code][1]
        self.hint = hint
        if exit_code is not None:
            self.exit_code = exit_code
        super().__init__(f"[{code}] {self.message}")

    def to_dict(self) -> dict[str, str]:
        """Return ``{"code": ..., "message": ...}`` (plus ``hint`` when set) for JSON output."""
        out = {"code": self.code, "message": self.message}
        if self.hint:
            out["hint"] = self.hint
        return out


class UsageError(KithError):
    """Bad command-line usage (exit status 2)."""

    category = "usage"
    exit_code = 2


class ConfigError(KithError):
    """A missing or invalid local configuration, home or file."""

    category = "config"


class SigningError(KithError):
    """Strict-hex or signature verification failure (DESIGN §4)."""

    category = "signing"


class InvitationError(KithError):
    """An invitation that ``kith join`` refuses (DESIGN §5)."""

    category = "invitation"


class HandshakeError(KithError):
    """A handshake refusal; its code travels in ``_session_reject`` (DESIGN §6)."""

    category = "handshake"


class ProtocolViolation(KithError):
    """A frame or message that breaks framing, the spec or the session rules (DESIGN §7)."""

    category = "protocol"


class SessionAborted(KithError):
    """The session ended abnormally (peer gone, unresponsive, idle, remote error)."""

    category = "session"


class SpecError(KithError):
    """A protocol directory whose spec.json or hooks.py cannot be used."""

    category = "spec"


class HookError(KithError):
    """A protocol hook failed, timed out, or produced an invalid message."""

    category = "hook"


class EgressRefused(KithError):
    """The egress gate refused an outgoing message (DESIGN §10)."""

    category = "egress"


class TransportError(KithError):
    """An iroh/memory transport failure, translated in one place (node/transport)."""

    category = "transport"


class CommunityError(KithError):
    """A community-server refusal or an unreachable server.

    ``status`` is the HTTP status the server answers with (or received by the client).
    """

    category = "community"

    def __init__(self, code: str, message: str | None = None, *, status: int = 400,
                 hint: str | None = None) -> None:
        super().__init__(code, message, hint=hint)
        self.status = status


class CorpusError(KithError):
    """A corpus/index refusal (roots, sync, search requests)."""

    category = "corpus"


class PolicyError(KithError):
    """An invalid policy file, glob or tier."""

    category = "policy"
