"""streaming/controls.py: the gateway -> worker control events."""

from __future__ import annotations

import pytest

from streaming.controls import (
    BadControl,
    CloseControl,
    Control,
    DetachedControl,
    ForceListenControl,
    InitControl,
    decode_control,
    encode_control,
)


@pytest.mark.parametrize(
    "control",
    [
        InitControl(system_prompt="Hi", ref_audio="AAAA", config={"a": 1}, max_slice_nums=2),
        InitControl(),
        CloseControl(reason="user_stop"),
        CloseControl(),
        ForceListenControl(input_id="input_3"),
        DetachedControl(),
    ],
    ids=lambda c: type(c).__name__,
)
def test_round_trip(control: Control) -> None:
    assert decode_control(encode_control(control)) == control


@pytest.mark.parametrize("data", [b'{"type": "reboot"}', b'{"type": "force_listen"}', b"{"])
def test_what_is_not_a_control_is_refused(data: bytes) -> None:
    with pytest.raises(BadControl):
        decode_control(data)
