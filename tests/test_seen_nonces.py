"""The seen-nonce table (node/trust/seen_nonces.py) bounded in rows and age, with a fake
clock and a real SQLite file; reservations of handshakes in progress."""

from __future__ import annotations

from node.trust.seen_nonces import MAX_AGE_S, SeenNonces


class Clock:
    def __init__(self) -> None:
        self.t = 1_000_000.0

    def __call__(self) -> float:
        return self.t


def n(i: int) -> str:
    return f"{i:064x}"


def test_a_reservation_blocks_a_concurrent_replay_and_only_a_commit_persists(tmp_path):
    table = SeenNonces(tmp_path, clock=Clock())
    assert table.reserve(n(1))
    assert not table.reserve(n(1))  # a second handshake with the same nonce, concurrently
    table.release(n(1))  # that handshake never became ready: nothing was recorded
    assert len(table) == 0 and table.reserved == 0
    assert table.reserve(n(1))
    assert table.commit("post", n(1), 2_000_000.0)
    assert not table.reserve(n(1)) and len(table) == 1 and table.reserved == 0
    table.close()
    again = SeenNonces(tmp_path, clock=Clock())  # a host restart
    assert not again.reserve(n(1))
    again.close()


def test_rows_are_bounded_in_count_and_age(tmp_path):
    clock = Clock()
    table = SeenNonces(tmp_path, clock=clock, max_rows=100)
    for i in range(1000):
        assert table.record("post", n(i), clock.t + 10 + i)
        assert len(table) <= 100
    assert n(999) in table and n(0) not in table  # the rows closest to expiry went first
    assert table.record("post", n(5000), clock.t + 10 * MAX_AGE_S)  # capped at MAX_AGE_S
    before = len(table)
    clock.t += MAX_AGE_S + 1
    assert table.purge() == before  # every row is past its expiry or the age bound
    assert len(table) == 0
    table.close()
    reopened = SeenNonces(tmp_path, clock=clock, max_rows=100)
    assert len(reopened) == 0
    reopened.close()
