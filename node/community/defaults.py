"""Defaults of the community server that the ``kith community`` commands show in their
``--help`` without importing the server itself (Starlette, jsonschema). The server
(:mod:`node.community.server`) uses these same values."""

#: TCP port ``kith community serve`` listens on by default.
DEFAULT_PORT = 8787
#: How long a liveness lease holds after the host's last refresh, in seconds. The host
#: refreshes every third of it (:data:`node.community.server.LEASE_REFRESH_DIVISOR`: every 8 s by default), so
#: two refreshes may be lost before a live post drops out, and a killed host's post leaves
#: browse at most this long after its last refresh — within 24 s of the kill, inside issue
#: 30's 30 s (it was 90 s; a host that exits cleanly withdraws its post at once).
DEFAULT_LEASE_TTL_S = 24.0
#: Connections a PostgreSQL store keeps at most, per server process (PostgreSQL's
#: ``max_connections`` is the scarce part: N instances use at most N × this).
#: :mod:`node.community.store` uses it; ``kith community serve --pool-size`` shows it.
DEFAULT_POOL_SIZE = 10
