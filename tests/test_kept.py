"""The one rule of the tables the answer path keeps in memory (node/common/kept.py):
bounded, emptied when full, never iterated."""

from __future__ import annotations

from node.common.kept import keep, make_room


def test_a_kept_table_never_holds_more_than_its_limit_and_starts_over_when_full() -> None:
    table: dict[int, str] = {}
    for i in range(10):
        assert keep(table, i, str(i), 4) == str(i)
        assert len(table) <= 4
    assert table == {8: "8", 9: "9"}  # emptied at the 4th new key, twice
    keep(table, 10, "10", 3)
    keep(table, 10, "ten", 3)  # a key it holds is replaced without emptying
    assert table == {8: "8", 9: "9", 10: "ten"}


def test_room_is_made_before_a_batch_that_would_pass_the_limit() -> None:
    table = {i: i for i in range(3)}
    make_room(table, 1, 4)
    assert len(table) == 3
    make_room(table, 2, 4)
    assert table == {}
