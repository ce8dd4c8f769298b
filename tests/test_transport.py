"""Both transports honour one stream contract; iroh binds with the identity key; the
send-path patch is correct and version-gated."""

from __future__ import annotations

import os
import socket
from contextlib import asynccontextmanager

import anyio
import pytest

from node.runtime.driver import run_session
from node.engine.session import GuestConfig, HostConfig, SessionEngine
from node.runtime.hooks import HookContext, PeerInfo, load_hooks
from node.protocol.spec import load_spec
from node.transport import iroh_patch
from node.transport.base import ByteStream
from node.transport.iroh import bind_node, ticket_endpoint_id
from node.transport.memory import memory_pipe

from support.engines import POST_ID
from support.homes import PROTOCOLS, new_identity

ALPN = b"kith/test/1"


@asynccontextmanager
async def iroh_pair():
    """(client_stream, server_stream, server_id, client_id) over real iroh on loopback."""
    a, b = new_identity(), new_identity()
    async with bind_node(a.secret, ALPN, local=True) as server, bind_node(b.secret, ALPN, local=True) as client:
        accepted = {}

        async def accept():
            s_conn = await server.accept()
            accepted["stream"] = await server.accept_stream(s_conn)

        async with anyio.create_task_group() as tg:
            tg.start_soon(accept)
            conn = await client.connect(server.ticket())
            c_stream = await client.open_stream(conn)
            await c_stream.send(b"x")  # QUIC streams open on the first write
        s_stream = accepted["stream"]
        assert await s_stream.receive(1) == b"x"
        yield c_stream, s_stream, a, b


@asynccontextmanager
async def memory_streams():
    a, b = new_identity(), new_identity()
    c, s = memory_pipe(b.public_key, a.public_key)
    yield c, s, a, b


async def check_stream_contract(factory) -> None:
    async with factory() as (client, server, server_id, client_id):
        assert isinstance(client, ByteStream) and isinstance(server, ByteStream)
        assert client.remote_id == server_id.public_key
        assert server.remote_id == client_id.public_key
        payload = os.urandom(300_000)
        async with anyio.create_task_group() as tg:
            tg.start_soon(client.send, payload)
            got = bytearray()
            while len(got) < len(payload):
                chunk = await server.receive(65536)
                assert chunk, "early EOF"
                assert len(chunk) <= 65536
                got += chunk
        assert bytes(got) == payload
        await server.send(b"reply\n")
        assert await client.receive() == b"reply\n"
        await client.send_eof()
        assert await server.receive() == b""  # EOF is b""
        await server.aclose()
        await client.aclose()


@pytest.mark.parametrize("name", ["memory", pytest.param("iroh", marks=pytest.mark.iroh)])
def test_stream_contract(name):
    factory = memory_streams if name == "memory" else iroh_pair

    async def main():
        with anyio.fail_after(30):
            await check_stream_contract(factory)

    anyio.run(main, backend="asyncio")


@pytest.mark.iroh
def test_endpoint_id_is_the_identity_key_and_ticket_names_it():
    ident = new_identity()

    async def main():
        async with bind_node(ident.secret, ALPN, local=True) as node:
            assert node.endpoint_id == ident.public_key
            ticket = node.ticket()
            assert ticket_endpoint_id(ticket) == ident.public_key
            return ticket

    ticket = anyio.run(main, backend="asyncio")
    with pytest.raises(ValueError):
        ticket_endpoint_id(ticket[:-3] + "zzz")


@pytest.mark.iroh
def test_connect_to_a_closed_endpoint_fails_cleanly():
    from node.common.errors import TransportError

    async def main():
        async with bind_node(new_identity().secret, ALPN, local=True) as gone:
            ticket = gone.ticket()
        async with bind_node(new_identity().secret, ALPN, local=True) as client:
            with pytest.raises(TransportError) as exc:
                await client.connect(ticket, timeout_s=3)
            return exc.value.code

    assert anyio.run(main, backend="asyncio") == "transport-connect-failed"


@pytest.mark.iroh
def test_quic_remote_id_check_refuses_a_guest_claiming_another_key():
    """The host compares `_session_init.guest_public_key` with the QUIC-proven remote id."""
    spec = load_spec(PROTOCOLS / "echo")
    host_id, guest_id, impostor = new_identity(), new_identity(), new_identity()

    async def main():
        async with bind_node(host_id.secret, spec.alpn, local=True) as h, \
                bind_node(guest_id.secret, spec.alpn, local=True) as g:
            # the guest claims to be `impostor` but its QUIC identity is guest_id
            g_eng = SessionEngine("guest", spec, public_key=impostor.public_key, sign=impostor.sign,
                                  guest=GuestConfig(remote_id=host_id.public_key, post_id=POST_ID,
                                                    host_public_key=host_id.public_key))
            out = {}

            async def host_side():
                s_conn = await h.accept()
                s_stream = await h.accept_stream(s_conn)
                eng = SessionEngine("host", spec, public_key=host_id.public_key, sign=host_id.sign,
                                    host=HostConfig(remote_id=s_stream.remote_id,
                                                    post_protocol={POST_ID: spec.protocol_id}.get,
                                                    nonce_unseen=lambda n: True))
                out["host"] = await run_session(s_stream, eng, load_hooks(PROTOCOLS / "echo"),
                                                make_context=lambda ev: HookContext("host", ev.session_id,
                                                                                    PeerInfo(ev.peer_public_key)))

            async def guest_side():
                conn = await g.connect(h.ticket())
                g_stream = await g.open_stream(conn)
                out["guest"] = await run_session(g_stream, g_eng, load_hooks(PROTOCOLS / "echo"),
                                                 make_context=lambda ev: HookContext("guest", ev.session_id,
                                                                                     PeerInfo(ev.peer_public_key)))

            with anyio.fail_after(20):
                async with anyio.create_task_group() as tg:
                    tg.start_soon(host_side)
                    tg.start_soon(guest_side)
            return out

    out = anyio.run(main, backend="asyncio")
    assert out["host"].code == "handshake-key-mismatch"
    assert out["guest"].code == "handshake-key-mismatch"


# --------------------------------------------------------------------------- the patch
def test_patch_is_active_on_the_verified_iroh_version():
    assert iroh_patch.iroh_version() in iroh_patch.VERIFIED_VERSIONS
    assert iroh_patch.is_applied()


def test_patch_is_not_applied_on_an_unverified_version(monkeypatch):
    iroh_patch.revert()
    try:
        monkeypatch.setattr(iroh_patch, "iroh_version", lambda: "9.9.9")
        assert iroh_patch.apply() is False
        assert not iroh_patch.is_applied()
    finally:
        monkeypatch.undo()
        assert iroh_patch.apply() is True


def test_patched_buffer_writes_the_same_bytes():
    from iroh import iroh_ffi

    data = os.urandom(100_003)
    results = []
    for patched in (False, True):
        iroh_patch.revert() if not patched else iroh_patch.apply()
        builder = iroh_ffi._UniffiRustBufferBuilder()
        builder.write(b"head")
        builder.write(data)
        builder.write(bytearray(b"tail"))
        rbuf = builder.finalize()
        results.append(bytes(rbuf.data[: rbuf.len]))
        rbuf.free()
    assert iroh_patch.is_applied()
    assert results[0] == results[1] == b"head" + data + b"tail"


def test_patched_lowering_of_a_frame_is_the_same_buffer_from_one_allocation(monkeypatch):
    """A frame handed to ``write_all`` is lowered into a Rust buffer of the same bytes
    (uniffi's i32 length prefix + the frame) with one FFI allocation and no reserve."""
    from iroh import iroh_ffi

    lib = iroh_ffi._UniffiLib
    names = ("ffi_iroh_ffi_rustbuffer_alloc", "ffi_iroh_ffi_rustbuffer_reserve")
    for frame in (b"", b'{"action":"results"}\n', bytearray(os.urandom(70_001)), memoryview(b"x\n")):
        got = []
        for patched in (False, True):
            iroh_patch.revert() if not patched else iroh_patch.apply()
            calls = []
            for name in names:
                real = getattr(lib, name)
                monkeypatch.setattr(lib, name, lambda *a, _r=real, _n=name: (calls.append(_n), _r(*a))[1])
            rbuf = iroh_ffi._UniffiFfiConverterBytes.lower(frame)
            monkeypatch.undo()
            got.append((bytes(rbuf.data[: rbuf.len]), calls))
            rbuf.free()
        assert iroh_patch.is_applied()
        assert got[0][0] == got[1][0] == len(frame).to_bytes(4, "big") + bytes(frame)
        assert got[1][1] == ["ffi_iroh_ffi_rustbuffer_alloc"]  # patched: one allocation, no reserve
        assert len(got[0][1]) > 1 or len(frame) <= 12  # unpatched: grown by reserve past 16 bytes


def test_async_calls_resolved_on_the_loop_thread_carry_the_same_bytes_with_fewer_wakeups():
    """The continuation part of the patch: over real iroh, round trips give the same bytes
    with uniffi's own continuation callback and with the patched one — reads that wait for
    the peer (woken from iroh's threads) and reads of bytes already there (resolved on the
    loop's thread) — and the patched one hands fewer callbacks to the loop through
    ``call_soon_threadsafe`` (a wake-up pipe write and a loop turn each)."""
    from iroh import iroh_ffi

    async def main() -> dict[bool, tuple[list[bytes], int]]:
        out: dict[bool, tuple[list[bytes], int]] = {}
        async with iroh_pair() as (client, server, _a, _b):
            loop = asyncio.get_running_loop()
            real = loop.call_soon_threadsafe
            for patched in (False, True):
                iroh_patch.apply()
                if not patched:  # uniffi's own callback, the send path still patched
                    iroh_ffi._uniffi_continuation_callback = iroh_patch._state["continuation"]
                wakeups = [0]

                def counted(*a, **kw):
                    wakeups[0] += 1
                    return real(*a, **kw)

                loop.call_soon_threadsafe = counted
                try:
                    got = []
                    for i in range(40):
                        question = f"question {i}\n".encode() * (i + 1)
                        await client.send(question)
                        heard = b""
                        while len(heard) < len(question):
                            heard += await server.receive()
                        await server.send(heard[::-1])
                        back = b""
                        while len(back) < len(question):
                            back += await client.receive()
                        got.append(back[::-1])
                        assert heard == question
                finally:
                    del loop.call_soon_threadsafe
                    iroh_patch.revert()
                    iroh_patch.apply()
                out[patched] = (got, wakeups[0])
        return out

    import asyncio

    out = anyio.run(main)
    assert out[False][0] == out[True][0] == [f"question {i}\n".encode() * (i + 1) for i in range(40)]
    assert out[True][1] < out[False][1], out
    assert iroh_patch.is_applied()


def _held_port() -> socket.socket:
    """A loopback UDP socket holding a free port (another process's, as far as a host sees)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.bind(("127.0.0.1", 0))
    return sock


def test_a_kept_port_taken_once_is_tried_again_and_bound():
    """A one-off clash (specs/transport.md §7): the kept port is taken at the first try and
    freed before the next one — the node binds it after all and says nothing was taken."""
    squatter = _held_port()
    port = squatter.getsockname()[1]
    tries: list[int] = []

    def freed(taken: int) -> None:  # after the first try found it taken, the holder lets go
        tries.append(taken)
        squatter.close()

    async def main() -> tuple[int | None, int | None]:
        async with bind_node(new_identity().secret, ALPN, local=True, port=port, on_port_taken=freed) as node:
            return node.bound_port, node.port_taken

    bound, taken = anyio.run(main)
    assert tries == [port] and (bound, taken) == (port, None)


def test_a_kept_port_that_stays_taken_binds_another_and_says_which(monkeypatch):
    import node.transport.iroh as iroh_mod

    monkeypatch.setattr(iroh_mod, "KEPT_PORT_RETRY_S", 0.3)
    squatter = _held_port()
    port = squatter.getsockname()[1]
    tries: list[int] = []

    async def main() -> tuple[int | None, int | None]:
        async with bind_node(new_identity().secret, ALPN, local=True, port=port, on_port_taken=tries.append) as node:
            return node.bound_port, node.port_taken

    try:
        bound, taken = anyio.run(main)
    finally:
        squatter.close()
    assert taken == port and bound not in (None, port) and len(tries) >= 2
