"""What the tests share: harnesses that run a real host, the `kith` command helpers, and
the small builders several test files use. A test file imports shared code only from
here (and gets fixtures from tests/conftest.py); no test module imports another.

- :mod:`support.homes` — paths (REPO, PROTOCOLS, FIXTURE) and node homes with an identity.
- :mod:`support.cli` — ``kith`` as a real process, in process (CliRunner), and its output.
- :mod:`support.hosts` — the real Host over iroh on loopback: in this event loop
  (:class:`~support.hosts.InProcessHost`) or as a ``kith host`` process
  (:class:`~support.hosts.HostProcess`), and raw guests to drive it.
- :mod:`support.memory` — the real Host over memory pipes with a ManualClock
  (:class:`~support.memory.MemoryHost`) and a guest for it.
- :mod:`support.engines` — two session engines back to back in memory (:class:`~support.engines.EnginePair`).
- :mod:`support.community` — community-server requests, proofs, and a throwaway PostgreSQL.
- :mod:`support.waits` — bounded waits on a condition (what a test does instead of a fixed sleep).
- :mod:`support.devices`, :mod:`support.dashboard`, :mod:`support.fanout` — device pairing,
  a logged-in dashboard client, fan-out peers.

tests/test_support_layout.py keeps the rule: it fails when a test module imports another.
"""
