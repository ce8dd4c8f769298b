"""The whole Kith error taxonomy: one table, one class per category.

Every refusal Kith can produce is a :class:`KithError` carrying a stable kebab-case
``code``, a one-line human ``message`` and an optional ``hint`` saying what to do about it.
:data:`CODES` states each code's category, default message and default hint ONCE (the pip
``exceptions.py`` habit); ``specs/error-codes.md`` documents the same table. Each category
has one class (``category`` → class in :data:`CATEGORY_CLASSES`): constructing a class with
a code of another category is a programming error (``ValueError``), so a raise site cannot
disagree with the table; :func:`error_for` builds the right class for a code only known at
run time (a code a peer or the community server sent). ``tests/test_error_table.py`` scans
``node/`` for raise sites and codes that the table does not hold.

The CLI maps these to messages and exit codes in one place (``node/cli/main.py``); peers
see only ``code`` and ``message`` (never exception text, hosts, keys or real paths).

This module imports nothing else from Kith.

To add a refusal: add its code to :data:`CODES` (code → category, default message,
optional default hint) and a row to ``specs/error-codes.md`` under that category;
``tests/test_docs.py`` checks both stay in step.
"""

from __future__ import annotations

from typing import ClassVar, NamedTuple


class Code(NamedTuple):
    """One row of the error table.

    Attributes:
        category: the ``## section`` of ``specs/error-codes.md`` and the class raised
            (:data:`CATEGORY_CLASSES`).
        message: the default one-line message (what a peer is told for this code).
        hint: the default advice shown by the CLI, or None.
    """

    category: str
    message: str
    hint: str | None = None


# code -> (category, default one-line message[, default hint]); a raise site may pass its
# own message (with the detail it knows) and, rarely, its own hint.
_ROWS: dict[str, tuple[str, ...]] = {
    # --- usage / configuration -------------------------------------------------------
    "usage": ("usage", "The command line is not valid."),
    "grant-bad-until": ("usage", "--until is not a date (YYYY-MM-DD), an RFC 3339 UTC time or a duration (30m, 12h, 7d, 2w), or it is not ahead."),
    "ask-too-many-peers": ("usage", "One ask names more peers than it may (16)."),
    "pin-name-taken": ("usage", "That name is already pinned to another host; choose another --pin NAME."),
    "outbox-keep-invalid": ("usage", "--keep is not a duration from 1 minute to 30 days (30m, 12h, 7d, 2w)."),
    "transport-mode-invalid": ("usage", "The transport options are not valid (--relay, --relay-only, --lan, --discovery, --offline)."),
    "presence-invalid": ("usage", "The host's presence setting is not open or granted."),
    "config-invalid": ("config", "A configuration file is not valid.",
                       "fix the file the message names, or move it aside (mv FILE FILE.bad) and set again what it held"),
    "audit-line-invalid": ("config", "A line of the audit log is not a valid record; it was skipped."),
    "home-not-initialized": ("config", "This path is not an initialised Kith home; run `kith init`."),
    "home-not-a-folder": ("config", "The Kith home given is a file, not a folder."),
    "no-server": ("config", "No community server is configured; pass --server URL."),
    "file-not-found": ("config", "The file does not exist."),
    "io-error": ("config", "A local file or folder could not be read or written."),
    "disk-full": ("config", "A write to the Kith home failed: the disk (or your quota, or the process's file-size limit) is full.",
                  "free some space (or raise the limit), then run the command again: what was written before the failure is kept whole, the rest was rolled back"),
    "answer-invalid": ("config", "The file is not a saved Kith answer (not JSON or JSON lines, not UTF-8, or larger than 8 MiB)."),
    "home-in-use": ("config", "Another `kith host` is already serving this home."),
    "copy-disk-full": ("config", "The copy could not be written: the disk, the quota or the file-size limit is full; the previous copy is intact.", "free some space and sync again (`kith copies sync NAME`)"),
    "copy-removed": ("config", "The copy was removed while this sync ran; nothing of it is kept.", "`kith copies sync NAME` makes it again if the host still grants it"),
    "copy-sync-running": ("config", "Another process of this home is syncing that copy now; nothing was asked or changed.", "wait for it to end; `kith copies list` then shows the copy as it synced"),
    "copy-not-found": ("config", "No copy of that peer is kept here.", "`kith copies list` shows the copies; `kith copies sync NAME` makes one"),
    "outbox-full": ("config", "The outbox is full; nothing was kept.", "remove answered questions: `kith outbox remove --done`"),
    "outbox-not-found": ("config", "No question in the outbox has that id.", "`kith outbox list` shows the ids"),
    "outbox-id-ambiguous": ("config", "Several outbox questions start with that id; give more of it."),
    "outbox-corrupt": ("config", "The outbox file is not a readable outbox.", "move <home>/outbox.sqlite aside; nothing else in the home depends on it"),
    "host-not-running": ("config", "No `kith host` is running for this home.", "start one with `kith host`"),
    "control-dir-unsafe": ("config", "The control folder <home>/run is not a 0700 directory of yours."),
    "control-forbidden": ("config", "The host's control channel refused this client.",
                          "run the command as the user who runs `kith host` for this home; its control folder "
                          "<home>/run must be that user's, mode 0700 (`chmod 700 <home>/run`)"),
    "live-session-not-found": ("config", "No live session of the running host has that id."),
    "live-session-ambiguous": ("config", "Several live sessions start with that id prefix; give more digits."),
    # --- identity / signing ----------------------------------------------------------
    "identity-corrupt": ("identity", "The identity key file is unreadable or malformed.",
                         "restore identity.key from a backup; without one, move it aside and run `kith init` "
                         "(a new identity: peers must pin the new key)"),
    "device-no-person-key": ("config", "This device does not hold the person key; run `kith device add` on the one that does."),
    "device-has-person": ("config", "This home already has a person; `kith device join` is for a new home."),
    "pairing-code-invalid": ("usage", "The device pairing code is not <16 base32 characters>@<ticket>."),
    "pairing-code-wrong": ("identity", "The device pairing code is wrong (3 tries per code)."),
    "pairing-too-many-tries": ("identity", "The device pairing code was tried 3 times wrongly; it no longer works."),
    "pairing-expired": ("identity", "The device pairing code expired (10 minutes); run `kith device add` again."),
    "pairing-used": ("identity", "The device pairing code was already used."),
    "pairing-not-confirmed": ("identity", "The owner did not confirm the pairing words; nothing was bound."),
    "pairing-bad-name": ("identity", "The new device's name is not 1 to 64 printable characters."),
    "pairing-device-known": ("identity", "That device is this device, or one its person revoked."),
    "pairing-person-rotated": ("identity", "The person key was rotated while this pairing waited; nothing was bound. Run `kith device add` again."),
    "pairing-failed": ("identity", "Device pairing failed: the other device answered nothing usable."),
    "person-recovery-wrong": ("config", "These recovery words are not this person's recovery secret."),
    "person-rotate-unconfirmed": ("config", "The person key was not rotated: nobody confirmed it (at a terminal, or with --yes).",
                                  "run it again with --yes to rotate without being asked (`kith person rotate --yes`)"),
    "person-last-device": ("config", "A rotation must keep this device bound (--without names it, or every device)."),
    "person-not-successor": ("config", "That person record does not descend from this home's person key by a rotation (or is not newer)."),
    "person-device-unbound": ("config", "That person record does not bind this device."),
    "device-not-found": ("config", "This person has bound no device of that name."),
    "device-revoke-this": ("config", "This device holds the person key and cannot revoke itself."),
    "revocation-malformed": ("identity", "The revocation list is not one (wrong fields or types, malformed hex, too many keys, larger than 4 KiB)."),
    "revocation-forged": ("identity", "The revocation list's signature does not verify by its person key."),
    "revocation-wrong-person": ("identity", "The revocation list is signed by another person key."),
    "revocation-not-found": ("community", "The community server keeps no revocation list of that person key."),
    "revocation-stale": ("identity", "A newer revocation list of that person is kept already; an older one never replaces it."),
    "card-malformed": ("identity", "The device card is not one (wrong fields or types, malformed hex, chain or invitation, larger than 16 KiB)."),
    "card-forged": ("identity", "A signature of the device card (its binding chain, its invitation or the card itself) does not verify."),
    "card-wrong-device": ("identity", "The device card is of another device than the one that sent it, or its chain or invitation names another device."),
    "card-wrong-person": ("identity", "The device card's device is bound by a person this home has not pinned with --devices."),
    "card-device-revoked": ("identity", "The device card's device was revoked by its person; its card is ignored."),
    "card-stale": ("identity", "A newer card of that device is kept already; an older one never replaces it."),
    "card-not-found": ("community", "The community server keeps no card of that person key."),
    "sealed-malformed": ("identity", "The sealed record is not one (wrong fields or types, malformed hex or base64, a lifetime over 30 days, or inner bytes that are not a record)."),
    "sealed-wrong-size": ("identity", "The sealed record's size is not one of the size buckets, or it does not match its bucket."),
    "sealed-expired": ("identity", "The sealed record has expired, or is dated ahead of this clock."),
    "sealed-not-for-me": ("identity", "The sealed record is not sealed to this device's key."),
    "sealed-forged": ("identity", "The sealed record does not open, or its signature, binding chain or outer fields do not verify."),
    "sealed-replayed": ("identity", "This sealed record was delivered here before."),
    "sealed-reply-foreign": ("identity", "The sealed question asks for its answer to be sealed to a key that is not the asker's device, nor a device its chain's person bound."),
    "bad-hex": ("signing", "A key, signature or nonce is not strict lowercase hex of the exact length."),
    "bad-signature": ("signing", "A signature does not verify."),
    "bad-payload-value": ("signing", "A signed payload value contains a newline or is malformed."),
    # --- invitations (join refusals) ---------------------------------------------------
    "invitation-malformed": ("invitation", "The invitation is not a valid invitation document."),
    "invitation-bad-signature": ("invitation", "The invitation's transport binding signature does not verify."),
    "invitation-ticket-mismatch": ("invitation", "The invitation's iroh_ticket differs from transport_info.ticket."),
    "invitation-endpoint-mismatch": ("invitation", "The ticket's endpoint id, transport_info.endpoint_id and host_public_key differ."),
    "invitation-bad-ticket": ("invitation", "The invitation's iroh ticket cannot be parsed."),
    "invitation-expired": ("invitation", "The invitation has expired.", "ask the host for a new invitation"),
    "invitation-protocol-mismatch": ("invitation", "The invitation's protocol differs from the local protocol of that name."),
    "invitation-unknown-protocol": ("invitation", "The invitation names a protocol that is not installed here."),
    "invitation-bad-hex": ("invitation", "A key or signature in the invitation is not strict lowercase hex of the exact length."),
    "invitation-not-found": ("invitation", "No invitation with that post_id exists on the server."),
    "invitation-gone": ("invitation", "The host no longer honours this invitation (it restarted without it, withdrew it, used it up or it expired there); ask the host for a new one."),
    "host-key-changed": ("handshake", "The host key differs from the key pinned for that peer name."),
    "ask-peer-blocked": ("handshake", "That peer name is blocked; it is not asked."),
    "host-not-trusted": ("invitation", "The host key is not trusted; pass --trust or answer yes at the prompt."),
    "ask-protocol-unsupported": ("invitation", "That peer's invitation is for another protocol than knowledge-query; it cannot be asked."),
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
    "handshake-peer-busy": ("handshake", "This peer already has the maximum number of sessions open with the host.",
                            "sessions of a killed process count until the host times them out; try again in a minute"),
    "handshake-peer-blocked": ("handshake", "This peer's key is blocked by the host."),
    "handshake-post-expired": ("handshake", "The invitation has expired on this host."),
    "handshake-too-many-failures": ("handshake", "Too many failed handshakes from this key; try again after the cool-down."),
    "handshake-chain-too-long": ("handshake", "The binding chain has more than 4 links."),
    "handshake-binding-malformed": ("handshake", "A link of the binding chain has missing or extra fields, wrong types or malformed hex."),
    "handshake-binding-forged": ("handshake", "A signature in the binding chain does not verify."),
    "handshake-binding-wrong-person": ("handshake", "A link of the binding chain is signed by another person's key."),
    "handshake-binding-wrong-device": ("handshake", "The device binding is for another device key."),
    "handshake-chain-loop": ("handshake", "A person key appears twice in the binding chain."),
    "handshake-chain-gap": ("handshake", "A rotation link of the binding chain does not continue from the key the previous link names."),
    "handshake-rotation-unknown-key": ("handshake", "A recovery rotation is signed by a recovery key its person key never vouched for."),
    "handshake-rotation-revoked-key": ("handshake", "The chain rotates a person key this host saw rotated to another key."),
    "handshake-person-key-retired": ("handshake", "This device's binding is signed by a person key that was rotated; take the new record with `kith person import`."),
    "handshake-device-revoked": ("handshake", "This device was revoked by its person; the host refuses it."),
    "handshake-person-not-pinned": ("handshake", "The host admits only pinned peers, and this device's person is not pinned with --devices."),
    "handshake-revocation-malformed": ("handshake", "The revocation list in _session_ready is malformed or larger than 4 KiB."),
    "handshake-revocation-forged": ("handshake", "The revocation list's signature does not verify."),
    "handshake-revocation-wrong-person": ("handshake", "The revocation list is signed by a person other than this device's."),
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
    "session-revoked": ("session", "The host revoked this peer's access and ended the session."),
    "session-grant-expired": ("session", "A grant of this peer ended (its `until` passed); the host ended the session."),
    "session-device-revoked": ("session", "The host learnt that this device was revoked by its person and ended the session."),
    "outbox-expired": ("session", "The question was kept until its expiry and the peer did not answer it in time."),
    "session-evicted": ("session", "The host ended this idle session to make room for another guest (an anonymous one's) or for a newer session of the same key; join again."),
    "session-ended-by-owner": ("session", "The host's owner ended this session."),
    "questions-unanswered": ("session", "The host did not answer every question (rate-limited, pending approval, refused, ...; the status of each is shown)."),
    "ask-pool-full": ("session", "Every pooled peer session is busy; the peer was not asked."),
    "peer-answer-invalid": ("session", "The peer's answer has a malformed result; none of its results were used."),
    # --- protocol specs / hooks --------------------------------------------------------
    "spec-invalid": ("spec", "The protocol's spec.json is not valid."),
    "protocol-not-found": ("spec", "No protocol with that name is installed."),
    "hooks-invalid": ("spec", "The protocol's hooks.py cannot be loaded."),
    "hook-failed": ("hook", "A protocol hook raised an error."),
    "hook-timeout": ("hook", "A protocol hook did not finish in time."),
    "hook-output-invalid": ("hook", "A protocol hook produced a message that does not match the protocol."),
    "egress-leak": ("egress", "An outgoing message contained a real path and was refused."),
    "protocol-test-failed": ("spec", "The protocol test did not pass."),
    # --- transport -----------------------------------------------------------------------
    "transport-bind-failed": ("transport", "The iroh endpoint could not be bound."),
    "transport-connect-failed": ("transport", "Could not connect to the peer.",
                                 "the host may be stopped, asleep or not reachable from this network (the same "
                                 "--offline / --lan / --relay as the host?); try again once it is back"),
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
    "server-not-public": ("community", "Refusing to serve on a non-loopback address without --public.",
                          "pass --public to serve beyond this machine (behind TLS)"),
    "rate-limited": ("community", "Too many requests; retry after the Retry-After delay."),
    "invitation-withdrawn": ("community", "The host withdrew this invitation."),
    "invitation-consumed": ("community", "The invitation's max_sessions were all used."),
    "session-not-found": ("community", "No session with that session_id was recorded."),
    "feedback-duplicate": ("community", "This participant already rated this session."),
    "identity-not-found": ("community", "No identity with that public key is registered."),
    "protocol-id-not-found": ("community", "No protocol spec with that protocol_id was published."),
    "database-url-invalid": ("community", "The database URL is not postgresql://, postgres:// or sqlite:///."),
    "database-unavailable": ("community", "The community database cannot be opened or reached."),
    "database-driver-missing": ("community", "The PostgreSQL driver is not installed (the postgres extra).",
                                "from the kith checkout: scripts/setup --postgres, or pip install '.[postgres]'"),
    "database-schema-old": ("community", "The community database's schema is older than this server's; run kith community migrate."),
    "database-schema-newer": ("community", "The community database's schema is newer than this server's; upgrade kith-node."),
    "database-foreign": ("community", "The database holds tables but is not a Kith community database.",
                         "give --database-url an empty database or one a Kith community server made; "
                         "Kith never creates its tables among another application's"),
    "database-in-use": ("community", "Another server process is using this SQLite database."),
    "database-timeout": ("community", "A database statement took too long and was cancelled."),
    "invitation-host-offline": ("community", "The host of this invitation is not refreshing its lease (offline)."),
    "display-name-taken": ("community", "Another identity already uses a display name that looks like this one."),
    "mailbox-off": ("community", "This community server keeps no mailbox (it runs without --mailbox)."),
    "mailbox-full": ("community", "The community server's mailbox is full; nothing was kept."),
    "mailbox-sender-full": ("community", "This sender has as many sealed records waiting in the mailbox as it may."),
    "mailbox-recipient-full": ("community", "A recipient has as many sealed records waiting in the mailbox as it may."),
    "mailbox-conflict": ("community", "A different sealed record with that id is kept already."),
    "mailbox-not-accepted": ("community", "The host's card kept by this server does not say it takes sealed questions."),
    "mailbox-not-held": ("community", "This holder keeps mail only to or from its own person's devices."),
    "take-cursor-invalid": ("community", "The take's after is not a next cursor a take of this holder answered."),
    "mail-frame-invalid": ("community", "A frame on the mailbox's iroh protocol is not a put, take or ack request."),
    # --- corpus ---------------------------------------------------------------------------
    "root-not-found": ("corpus", "The folder to index does not exist or is not a directory."),
    "root-path-invalid": ("corpus", "The folder's path is not valid UTF-8.",
                          "rename the folder (or the folder above it) to a UTF-8 name, then add it"),
    "root-exists": ("corpus", "That folder is already a source root."),
    "index-locked": ("corpus", "Another process is writing the index."),
    "index-unavailable": ("corpus", "The index is missing or unreadable.",
                          "run `kith index sync`: it rebuilds a missing or unreadable index from the corpus "
                          "record (`kith index add FOLDER` first when no folder is added)"),
    "corpus-corrupt": ("corpus", "The corpus database (corpus/corpus.sqlite3) is not a readable SQLite database."),
    "query-invalid": ("corpus", "The search request is not valid."),
    "corpus-readonly": ("corpus", "This corpus handle is read-only; it can only search."),
    "chunking-invalid": ("corpus", "The chunker settings are not valid."),
    "sync-mode-invalid": ("corpus", "The sync mode is not one of new_only, update_only, full."),
    "root-unknown": ("corpus", "No source root has that prefix."),
    "copy-rate-limited": ("policy", "The host's quota for this peer is used up: its copy requests (charged like "
                          "queries, by bytes) are refused until it refills; its session goes on.",
                          "sync again later (`kith copies sync NAME`); the background re-sync retries on its own"),
    "root-is-copy": ("corpus", "That folder is in <home>/copies/, where this node keeps copies of peers' corpora; a copy is "
                     "never this node's own corpus.", "add the folder your own files are in"),
    "root-too-broad": ("corpus", "That folder is the filesystem root or your home directory.",
                       "index the folders you mean to share, or pass --force (the default "
                       "excludes and .kithignore still apply)"),
    "root-name-invalid": ("corpus", "A root prefix must be 1-64 of A-Z a-z 0-9 . _ -, starting with a letter or digit."),
    "root-name-taken": ("corpus", "That prefix is in use or was used by a removed root."),
    "import-invalid": ("corpus", "The datasource import is not valid."),
    "import-not-found": ("corpus", "The file to import does not exist or cannot be read."),
    "budget-exhausted": ("corpus", "The search budget (time or number of searches) is used up."),
    "api-read-only": ("corpus", "The local API is read-only; this route or method changes nothing."),
    "api-loopback-only": ("corpus", "The local API answers loopback clients only."),
    "api-bad-host": ("corpus", "The local API answers only a loopback Host/Origin with its own port."),
    "api-content-type": ("corpus", "POST /search on the local API takes Content-Type: application/json."),
    "peer-search-failed": ("corpus", "The search over a joined peer did not complete."),
    "dense-unavailable": ("corpus", "The optional dense pass (the hybrid extra) is not installed."),
    "dashboard-loopback-only": ("corpus", "The dashboard binds and answers loopback only."),
    "dashboard-bad-host": ("corpus", "The dashboard answers only a loopback Host/Origin with its own port."),
    "dashboard-login-required": ("corpus", "Open the dashboard's login URL first (it works once)."),
    "dashboard-login-invalid": ("corpus", "The dashboard login token is wrong or was used already."),
    "dashboard-not-running": ("corpus", "No `kith dashboard` is running for this home."),
    "dashboard-csrf": ("corpus", "The dashboard form's CSRF token is missing or wrong."),
    "dashboard-form-invalid": ("corpus", "The dashboard form is not valid."),
    # --- policy ---------------------------------------------------------------------------
    "policy-invalid": ("policy", "The policy file is not valid.",
                       "fix policy.toml where the message says (`kith policy list` reads it again); a running "
                       "`kith host` keeps serving its last good policy meanwhile"),
    "policy-bad-glob": ("policy", "The policy glob is not valid."),
    "policy-bad-tier": ("policy", "The policy tier is not one of public, peers, ask, private, never."),
    "scrub-bad-kind": ("policy", "A scrub kind is not one of email, phone, card, iban, secret."),
    "scrub-would-lapse": ("policy", "The change would serve sources unscrubbed that a scrub entry covers; confirm it (or --yes)."),
    "policy-changed": ("policy", "policy.toml changed while the command ran; nothing was written, run it again."),
    "approval-not-found": ("policy", "No approval request with that id exists."),
    "approval-decided": ("policy", "That approval request was already decided."),
    "approval-id-ambiguous": ("policy", "That id prefix matches more than one approval request; type more of the id."),
    "peer-bad-name": ("policy", "A peer name is 1-64 of [A-Za-z0-9_.-], starting with a letter or digit."),
    "peer-exists": ("policy", "A peer with that name is already pinned."),
    "peer-key-pinned": ("policy", "That public key is already pinned under another name."),
    "peer-not-found": ("policy", "No peer with that name is in the registry."),
    "copy-not-granted": ("policy", "The host grants this peer no copy (or the grant ended); the copy was deleted."),
    "copy-expired": ("policy", "The copy's grant ended (its until passed); this node deleted the copy without asking its host."),
    "copy-over-budget": ("policy", "The copy would hold more bytes than its grant's budget; nothing new was copied, the previous copy is intact."),
    "copy-outside-grant": ("signing", "The host sent a document its manifest does not list for this copy; the sync stopped, the previous copy is intact."),
    "copy-bad-signature": ("signing", "A copied document's signature does not verify as the host's over its whole text; the sync stopped, the previous copy is intact."),
    "copy-version-mismatch": ("signing", "A copied document's version, size or text hash is not the one its manifest and signature name; the sync stopped, the previous copy is intact."),
    "copy-manifest-invalid": ("protocol", "The host's copy manifest or documents answer is ill-formed; the sync stopped, the previous copy is intact."),
    "copy-device-changed": ("protocol", "Another device of the person answered in the middle of the copy's sync; the sync stopped, what was committed is kept.", "sync again (`kith copies sync NAME`): the sync is then with one device"),
    "copy-state-invalid": ("protocol", "The host's copy_state in its handshake is not {granted, stamp, until}; it was ignored, the copy is unchanged."),
    "outbox-peer-changed": ("policy", "The peer's name is now pinned to another key; the kept question is not sent to it."),
    "group-not-found": ("policy", "No group with that name is in policy.toml."),
    "group-member-not-found": ("policy", "That peer is not a member of the group."),
    "peer-not-blocked": ("policy", "That peer's key is not blocked."),
    "peer-key-changed": ("handshake", "This peer claims a pinned name but presents a different key."),
    "outbound-held": ("egress", "The outbound gate held the question: it carries private text, a personal value or a secret; nothing was sent.", "`kith sent --json` shows what was held and why; rephrase without it, or `kith agent set NAME --outbound ask|allow`"),
    "outbound-needs-confirmation": ("egress", "The outbound gate held the question and nobody could confirm it here; nothing was sent.", "`kith sent approve ID` lets the same question through once; at a terminal, `--yes` sends it"),
    "outbound-not-pending": ("egress", "No held question with that id is waiting (its time ran out: it was denied).", "`kith sent --json` shows the held questions"),
    # --- agents (issue 41, specs/agents.md) ----------------------------------------------
    "agent-token-required": ("agent", "This door needs an agent token: `Authorization: Bearer TOKEN` on the local API, KITH_AGENT_TOKEN for `kith mcp`.", "`kith agent rotate default` prints a new token of the default agent; `kith agent add NAME` makes a narrower one"),
    "agent-token-invalid": ("agent", "The agent token is not one this home issued (wrong, rotated or removed).", "`kith agent list` shows the agents; `kith agent rotate NAME` prints a new token"),
    "agent-expired": ("agent", "The agent's credential has expired.", "`kith agent set NAME --until …` extends it, or `--until never`"),
    "agent-scope": ("agent", "The agent's scope does not allow this.", "`kith agent show NAME` shows its scope; `kith agent set NAME …` widens it"),
    "agent-invalid": ("usage", "An agent name or scope value is not valid."),
    "agent-exists": ("config", "An agent of that name exists already.", "`kith agent rotate NAME` gives it a new token; `kith agent set NAME` changes its scope"),
    "agent-not-found": ("config", "No agent has that name.", "`kith agent list` shows the agents"),
    "agents-read-only": ("agent", "This home has no agents (it was made before them) and is read-only for you: no agent can be made in it, so no token is accepted.", "make the home writable for you (`chmod -R u+w HOME`, or work on a copy you own); the next kith command then creates the agent 'default', and `kith agent rotate default` prints its token"),
    "agents-file-invalid": ("config", "<home>/agents.json is not a readable agents file.", "restore it from a backup, or move it aside: the next command creates the `default` agent again"),
    # --- generic ----------------------------------------------------------------------------
    "internal-error": ("internal", "An internal error occurred."),
}

CODES: dict[str, Code] = {code: Code(*row) for code, row in _ROWS.items()}
"""code → :class:`Code` (category, default message, default hint): the one error table."""


class KithError(Exception):
    """A typed refusal with a stable code.

    Raise the class of the code's category (:data:`CATEGORY_CLASSES`); ``KithError`` itself
    accepts any code, and :func:`error_for` picks the class when the code is only known at
    run time.

    Args:
        code: a key of :data:`CODES` (kebab-case, stable; documented in specs/).
        message: one line for a human; defaults to the code's default message. Must not
            contain secrets or real paths when it can reach a peer.
        hint: advice on what to do next (shown by the CLI); defaults to the code's hint.
        exit_code: CLI exit status (1 failure, 2 usage); defaults to the class's.
        status: the HTTP status when the refusal is answered (or was received) over HTTP
            (the community server, the local API); 400 unless given.

    Attributes:
        category: the code's category from :data:`CODES` (never stated at the raise site).

    Raises:
        ValueError: if ``code`` is not registered in :data:`CODES`, or belongs to another
            category than the class raised (a programming error).
    """

    _category: ClassVar[str | None] = None  # the category a subclass stands for; None: any
    exit_code = 1

    def __init__(self, code: str, message: str | None = None, *, hint: str | None = None,
                 exit_code: int | None = None, status: int = 400) -> None:
        row = CODES.get(code)
        if row is None:
            raise ValueError(f"unregistered error code {code!r}")
        if self._category is not None and self._category != row.category:
            raise ValueError(f"{code!r} is a {row.category!r} code; raise it as "
                             f"{CATEGORY_CLASSES[row.category].__name__}, not {type(self).__name__}")
        self.code = code
        self.message = message or row.message
        self.hint = hint or row.hint
        self.status = status
        if exit_code is not None:
            self.exit_code = exit_code
        super().__init__(f"[{code}] {self.message}")

    @property
    def category(self) -> str:
        """The code's category, from :data:`CODES`."""
        return CODES[self.code].category

    def to_dict(self) -> dict[str, str]:
        """Return ``{"code": ..., "message": ...}`` (plus ``hint`` when set) for JSON output."""
        out = {"code": self.code, "message": self.message}
        if self.hint:
            out["hint"] = self.hint
        return out


class UsageError(KithError):
    """Bad command-line usage (exit status 2)."""

    _category = "usage"
    exit_code = 2


class ConfigError(KithError):
    """A missing or invalid local configuration, home or file."""

    _category = "config"


class SigningError(KithError):
    """Strict-hex or signature verification failure (DESIGN §4)."""

    _category = "signing"


class InvitationError(KithError):
    """An invitation that ``kith join`` refuses (DESIGN §5)."""

    _category = "invitation"


class HandshakeError(KithError):
    """A handshake refusal; its code travels in ``_session_reject`` (DESIGN §6)."""

    _category = "handshake"


class ProtocolViolation(KithError):
    """A frame or message that breaks framing, the spec or the session rules (DESIGN §7)."""

    _category = "protocol"


class SessionAborted(KithError):
    """The session ended abnormally (peer gone, unresponsive, idle, remote error)."""

    _category = "session"


class SpecError(KithError):
    """A protocol directory whose spec.json or hooks.py cannot be used."""

    _category = "spec"


class HookError(KithError):
    """A protocol hook failed, timed out, or produced an invalid message."""

    _category = "hook"


class EgressRefused(KithError):
    """The egress gate refused an outgoing message (DESIGN §10)."""

    _category = "egress"


class TransportError(KithError):
    """An iroh/memory transport failure, translated in one place (node/transport)."""

    _category = "transport"


class CommunityError(KithError):
    """A community-server refusal or an unreachable server.

    ``status`` is the HTTP status the server answers with (or received by the client).
    """

    _category = "community"


class CorpusError(KithError):
    """A corpus/index refusal (roots, sync, search requests)."""

    _category = "corpus"


class PolicyError(KithError):
    """An invalid policy file, glob or tier."""

    _category = "policy"


class AgentError(KithError):
    """A refusal of an agent credential or scope at a local door (node/local/agents.py):
    ``status`` 401 for a missing, unknown or expired credential, 403 for an operation
    outside the agent's scope."""

    _category = "agent"


CATEGORY_CLASSES: dict[str, type[KithError]] = {
    "internal": KithError,
    "identity": KithError,
    **{cls._category: cls for cls in (UsageError, ConfigError, SigningError, InvitationError,
                                      HandshakeError, ProtocolViolation, SessionAborted,
                                      SpecError, HookError, EgressRefused, TransportError,
                                      CommunityError, CorpusError, PolicyError, AgentError)
       if cls._category is not None},
}
"""category → the one class raised for its codes (``internal`` and ``identity`` codes have no
class of their own: they are raised as ``KithError``)."""


def error_for(code: str, message: str | None = None, *, hint: str | None = None,
              exit_code: int | None = None, status: int = 400) -> KithError:
    """The refusal for a code known only at run time, as the class of its category.

    Args:
        code: a key of :data:`CODES` (e.g. a code the community server or a peer sent,
            already checked to be registered).
        message, hint, exit_code, status: as for :class:`KithError`.

    Returns:
        An instance of ``CATEGORY_CLASSES[CODES[code].category]`` (``KithError`` when the
        category has no class of its own).

    Raises:
        ValueError: if ``code`` is not registered.
    """
    row = CODES.get(code)
    if row is None:
        raise ValueError(f"unregistered error code {code!r}")
    cls = CATEGORY_CLASSES.get(row.category, KithError)
    return cls(code, message, hint=hint, exit_code=exit_code, status=status)
