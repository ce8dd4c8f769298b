"""LAN mode and mDNS discovery (issue 23 §3, specs/transport.md §6) across a veth pair
between two network namespaces this test creates (loopback has no multicast). Needs root
with ``ip``; skips with the reason otherwise. Nothing leaves the two namespaces: they
have no other interface and no route."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

from support.cli import KITH, lines_until as _lines_until, stop as _stop
from support.homes import node_home as _home
from support.hosts import ENV

pytestmark = pytest.mark.iroh

RESOLVE = ("import sys, asyncio; from node.transport.lan import resolve; "
           "print(' '.join(asyncio.run(resolve(sys.argv[1], 3.0))))")


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, timeout=30)


@pytest.fixture
def lan():
    """Two namespaces ``a`` (10.R.0.1/24) and ``b`` (10.R.0.2/24) joined by a veth pair;
    yields ``(run_in_a, run_in_b, host_ip)`` argv prefixes. Removed afterwards."""
    if os.geteuid() != 0 or shutil.which("ip") is None:
        pytest.skip("needs root and iproute2 to create network namespaces and a veth pair")
    tag = os.urandom(3).hex()
    a, b = f"kith-{tag}-a", f"kith-{tag}-b"
    net = 10 + int(tag[:2], 16) % 200
    try:
        _ip("netns", "add", a)
        _ip("netns", "add", b)
        _ip("link", "add", f"ka{tag}", "type", "veth", "peer", "name", f"kb{tag}")
        _ip("link", "set", f"ka{tag}", "netns", a)
        _ip("link", "set", f"kb{tag}", "netns", b)
        for ns, dev, host in ((a, f"ka{tag}", 1), (b, f"kb{tag}", 2)):
            _ip("-n", ns, "addr", "add", f"10.{net}.0.{host}/24", "dev", dev)
            _ip("-n", ns, "link", "set", dev, "up", "multicast", "on")
            _ip("-n", ns, "link", "set", "lo", "up")
    except subprocess.CalledProcessError as exc:
        for ns in (a, b):
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)
        pytest.skip(f"cannot create network namespaces here: {exc.stderr.decode(errors='replace')[:200]}")
    try:
        yield ["ip", "netns", "exec", a], ["ip", "netns", "exec", b], f"10.{net}.0.1"
    finally:
        for ns in (a, b):
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)


def _host(prefix, home, invite, discovery):
    proc = subprocess.Popen([*prefix, *KITH, "--home", str(home), "host", "--lan", "--discovery", discovery,
                             "--invite-file", str(invite), "--json"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=ENV)
    inv = json.loads(_lines_until(proc, proc.stdout, lambda line: line.startswith("{"), 60)[-1])
    return proc, inv


def test_a_guest_resolves_a_lan_host_over_mdns_and_joins_it_directly(tmp_path, lan):
    in_a, in_b, host_ip = lan
    host_home, guest_home = _home(tmp_path, "host"), _home(tmp_path, "guest")
    invite = tmp_path / "inv.json"
    proc, inv = _host(in_a, host_home, invite, "on")
    try:
        status = json.loads(subprocess.run([*KITH, "--home", str(host_home), "status", "--json"],
                                           capture_output=True, text=True, env=ENV, timeout=60, check=True).stdout)
        found = subprocess.run([*in_b, sys.executable, "-c", RESOLVE, inv["host_public_key"]], capture_output=True,
                               text=True, env=ENV, timeout=60)
        joined = subprocess.run([*in_b, *KITH, "--home", str(guest_home), "join", str(invite), "--lan",
                                 "--discovery", "resolve", "--trust", "--query", "hello"],
                                capture_output=True, text=True, env=ENV, timeout=120)
    finally:
        _stop(proc)
    transport = status["host"]["transport"]
    assert (transport["mode"], transport["discovery"], transport["advertising"]) == ("lan", "on", True)
    assert transport["relayMap"] == []
    port = next(s for s in transport["sockets"] if s.startswith("0.0.0.0:")).rsplit(":", 1)[1]
    assert found.stdout.split() == [f"{host_ip}:{port}"], found.stderr
    assert f"path: direct ({host_ip}:{port})" in joined.stderr, joined.stderr


def test_resolve_never_advertises(tmp_path, lan):
    in_a, in_b, _host_ip = lan
    host_home = _home(tmp_path, "host")
    proc, inv = _host(in_a, host_home, tmp_path / "inv.json", "resolve")
    try:
        status = json.loads(subprocess.run([*KITH, "--home", str(host_home), "status", "--json"],
                                           capture_output=True, text=True, env=ENV, timeout=60, check=True).stdout)
        found = subprocess.run([*in_b, sys.executable, "-c", RESOLVE, inv["host_public_key"]], capture_output=True,
                               text=True, env=ENV, timeout=60)
    finally:
        _stop(proc)
    assert status["host"]["transport"]["advertising"] is False
    assert found.returncode == 0 and found.stdout.strip() == "", found.stdout
