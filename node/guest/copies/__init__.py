"""The peer side of copies a peer may keep (issue 33; specs/copies.md is normative), in parts:
:mod:`.store` (the folder on disk and the open-index cache), :mod:`.checks` (pure checks of
what a host sent), :mod:`.sync` (the pull over a session), :mod:`.lifecycle` (a copy's end),
:mod:`.search` (answering from a copy) and :mod:`.task` (the runner's background re-sync).
Import the part you use; this package re-exports nothing.

``<home>/copies/<peer>/`` holds one host's copy:

- ``manifest.json`` — the copy's committed state, written atomically (0600):
  ``{"v": 1, "peer", "hostKey", "syncedAt" (the last complete sync, RFC 3339 UTC or null),
  "maxBytes", "indexed" (the copy's index holds every document listed), "documents": {source: {"version", "bytes", "textSha256", "file", "citation", "mtimeNs"}}}``;
- ``docs/`` — one file per document, named by the peer (``<sha256(source)[:32]>-<version[:12]>``
  and ``.md``/``.rst``/``.txt``), never by anything the host sent, so a hostile host cannot
  write outside the folder; a file not in the manifest (a sync killed before its commit) is
  deleted by the next sync and never answered from;
- ``grant.json`` — the host's last handshake's word on the grant (``{"stamp", "until",
  "seenAt"}``, :func:`take_copy_state`);
- ``corpus/`` — the copy's own index, made by the same corpus code as the owner's
  (:class:`node.corpus.store.Corpus` with ``docs/`` as its one root): the peer's own
  corpus is another record and is never touched.

:func:`.sync.sync_copy` pulls over a pooled knowledge-query session (iroh, handshake, quotas,
audit: the host's ordinary path): ``copy_list`` → the manifest; what the manifest no longer
lists is deleted at once (the grant narrowed or ended; ``copy-not-granted`` deletes the
whole copy); then ``copy_fetch`` batches of what changed. Each document is checked before
it is written — in the batch asked, its version and text hash those of the manifest, its
``kith-citation-v1`` citation over the whole text verified as the host's
(:func:`node.answer.citation.verify_citation`) — and the manifest is committed after each
batch, so a killed sync resumes where it stopped and the previous copy stays whole. Any
fault aborts with a code and leaves the last committed copy.

Ending a copy (specs/copies.md §5.1): every session's handshake tells the grant's state
(:func:`take_copy_state`: not granted → the copy is deleted now; a new stamp → the runner
re-syncs it), a copy past its ``until`` is deleted by this node without asking
(:func:`expire_copies`, :func:`search_copy`), and ``kith peers remove`` / a revoked device
delete the copies held from that host (:func:`end_copies`); each says so
to the ``notify`` its caller passes (:data:`.lifecycle.Notify`; stderr by default).

:func:`search_copy` answers a question from a copy (``kith ask --peer NAME --copy``, and
the fallback when the host is unreachable): the same answer service as the owner's own
search, the copy's results named by the host's source ids. A copy is never served to
anyone else: nothing here is reachable from a session this node hosts.
"""
