"""Address hygiene (issue 23 §5, specs/transport.md §5): what is dialled of a ticket, what
a public post's ticket should not carry, and that a host says so."""

from __future__ import annotations

import anyio
import pytest

from node.transport.hygiene import MAX_DIAL_ADDRS, dialable, private_addresses

from test_transport_session import InProcessHost, _home


def test_only_real_unicast_addresses_are_dialled_and_only_a_few():
    hostile = ["0.0.0.0:9", "[::]:9", "224.0.0.251:5353", "255.255.255.255:9", "[ff02::1]:9", "240.0.0.1:9",
               "192.0.2.7:0", "not-an-address", "192.0.2.7:4433", "192.0.2.7:4433", "[2001:db8::1]:4433"]
    assert dialable(hostile) == ["192.0.2.7:4433", "[2001:db8::1]:4433"]
    many = [f"198.51.100.{i}:4433" for i in range(1, 40)]
    assert len(dialable(many)) == MAX_DIAL_ADDRS


def test_private_link_local_loopback_and_cgnat_addresses_are_flagged():
    addrs = ["192.168.1.20:5000", "10.0.0.2:5000", "169.254.3.4:5000", "[fe80::1]:5000", "127.0.0.1:5000",
             "100.64.1.2:5000", "[fd00::2]:5000", "203.0.113.9:5000", "[2001:db8::1]:5000"]
    assert private_addresses(addrs) == addrs[:7]


@pytest.mark.iroh
def test_a_host_publishing_to_a_server_warns_about_private_addresses_in_its_ticket(tmp_path):
    """The offline host's ticket carries 127.0.0.1; published to a community server (a
    public post) the owner is warned once. The server is real, on loopback."""
    from node.community.ratelimit import RateLimit, RateLimits
    from node.community.server import run_server_in_thread

    limits = RateLimits(per_key=RateLimit(0, 1), per_address=RateLimit(0, 1))
    warnings: list[str] = []

    async def scenario(url: str) -> None:
        host = InProcessHost(_home(tmp_path, "host"), tmp_path, server_url=url, invite_file=None)

        async def run() -> None:
            from node.runtime.host import Host
            from node.trust.identity import load_identity

            def on_inv(inv):
                host.invitation = inv
                host.ready.set()

            host.host = Host(host.home, host.opts, load_identity(host.home), on_invitation=on_inv,
                             on_event=host.events.append, warn=warnings.append, stop=host.stop, clock=host.clock)
            await host.host.run()

        async with anyio.create_task_group() as tg:
            tg.start_soon(run)
            with anyio.fail_after(30):
                await host.ready.wait()
            host.stop.set()

    with run_server_in_thread(tmp_path / "srv" / "community.sqlite3", rate_limits=limits) as url:
        anyio.run(scenario, url, backend="asyncio")
    flagged = [w for w in warnings if "private or link-local address" in w]
    assert len(flagged) == 1 and "127.0.0.1:" in flagged[0] and "--relay-only" in flagged[0]
