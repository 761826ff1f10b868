"""tasks/units.py: client chunks of any length into exact duplex units."""

from __future__ import annotations

import numpy as np
import pytest

from tasks.units import UnitAssembler

UNIT = 16_000


def ramp(start: int, n: int) -> np.ndarray:
    """Samples numbered start..start+n-1 (so a unit's content shows where it came from)."""
    return np.arange(start, start + n, dtype=np.float32)


def test_quarter_second_chunks_make_one_second_units():
    a = UnitAssembler(UNIT)
    got = []
    for i in range(9):
        got += a.push(ramp(i * 4000, 4000), f"in{i}")
    assert [u.input_id for u in got] == ["in3", "in7"]  # the chunk that completed each unit
    assert all(u.audio.size == UNIT for u in got)
    np.testing.assert_array_equal(np.concatenate([u.audio for u in got]), ramp(0, 2 * UNIT))
    assert a.pending_samples == 4000


@pytest.mark.parametrize("size", [4000, 4001, 6000, 9999, 16000, 16001, 24000, 40000])
def test_any_chunk_size_keeps_every_sample_in_order(size):
    a = UnitAssembler(UNIT)
    total = 5 * UNIT + 123
    units = []
    for i, start in enumerate(range(0, total, size)):
        units += a.push(ramp(start, min(size, total - start)), f"in{i}")
    assert all(u.audio.size == UNIT for u in units)
    assert len(units) == 5 and a.pending_samples == 123
    np.testing.assert_array_equal(np.concatenate([u.audio for u in units]), ramp(0, 5 * UNIT))


def test_a_long_chunk_completes_several_units():
    a = UnitAssembler(UNIT)
    units = a.push(ramp(0, 2 * UNIT + 500), "big", frames=[b"f"], force_listen=True)
    assert [u.input_id for u in units] == ["big", "big"]
    assert units[0].frames == [b"f"] and units[0].force_listen
    assert units[1].frames == [] and not units[1].force_listen  # both apply once
    assert a.pending_samples == 500


def test_frames_go_with_the_unit_their_chunk_starts_in_newest_kept():
    a = UnitAssembler(UNIT, max_frames=3)
    assert a.push(ramp(0, 8000), "a", frames=[b"1", b"2"], max_slice_nums=2) == []
    (u1,) = a.push(ramp(8000, 12000), "b", frames=[b"3", b"4"], max_slice_nums=4)
    assert u1.frames == [b"2", b"3", b"4"] and u1.max_slice_nums == 4
    (u2,) = a.push(ramp(20000, 12000), "c")
    assert u2.frames == [] and u2.max_slice_nums == 1


def test_interrupt_marks_the_unit_being_filled():
    a = UnitAssembler(UNIT)
    assert a.push(ramp(0, 4000), "a") == []
    a.interrupt()
    (u1,) = a.push(ramp(4000, 12000), "b")
    (u2,) = a.push(ramp(16000, 16000), "c")
    assert u1.force_listen and not u2.force_listen


def test_force_listen_on_a_chunk_marks_its_unit():
    a = UnitAssembler(UNIT)
    a.push(ramp(0, 4000), "a")
    a.push(ramp(4000, 4000), "b", force_listen=True)
    (u,) = a.push(ramp(8000, 8000), "c")
    assert u.force_listen


def test_without_a_unit_size_every_chunk_is_a_unit():
    a = UnitAssembler(None)
    (u,) = a.push(ramp(0, 4000), "a", frames=[b"x"], force_listen=True, max_slice_nums=3)
    assert u.audio.size == 4000 and u.frames == [b"x"] and u.force_listen
    assert u.max_slice_nums == 3 and a.pending_samples == 0


def test_unit_size_must_be_positive():
    with pytest.raises(ValueError):
        UnitAssembler(0)
