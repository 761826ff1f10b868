"""What typed worker events cost on the relay: dicts vs dataclasses vs pydantic vs msgspec.

    python -m bench.event_codec [--rounds N]

For the two events that dominate a duplex session's traffic (a speaking step with 1 s of 24 kHz
audio, ~128 KB of base64, and a listen step), it times, per event, in this process:
- ``decode``: Redis bytes -> the value the gateway works with (what the relay pays per event);
- ``encode``: the worker's value -> bytes (what the worker pays per event);
- ``relay``: decode, map to the client's frame (api/protocol/dialects.py) and serialise that frame:
  the gateway's whole CPU cost of one delta, without the socket.

Candidates: ``dict`` (orjson, what the relay did before streaming/events.py), ``dataclass``
(orjson + constructing the class from the dict), ``pydantic`` (BaseModel, validate_json /
model_dump_json), ``msgspec`` (Struct, a typed decoder), and ``contract``: the chosen one,
streaming/events.py itself (stdlib dataclasses, orjson encode, a pydantic TypeAdapter decode).
msgspec is only needed for this comparison (extra ``bench``); without it that row is skipped.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import time
from collections.abc import Callable
from typing import Any, Literal

import numpy as np
import orjson
import pydantic

from api.protocol.dialects import Dialect, DuplexMapper
from omnicore.audio import pcm_to_b64
from streaming import events as E


def samples() -> dict[str, E.Event]:
    """The measured events, as a worker emits them (seq and emit time set)."""
    audio = pcm_to_b64(np.random.default_rng(0).random(24_000, np.float32))
    metrics = {"kv_cache_length": 1100, "step_s": 0.3, "vision_slices": 1}
    speak = E.Speak(
        response_id="resp_0a1b2c3d4e5f",
        input_id="input_3",
        text="Hello",
        audio=audio,
        kv_cache_length=1100,
        metrics=metrics,
        seq=12,
        emitted_at=time.time(),
    )
    listen = E.Listen(
        input_id="input_4", kv_cache_length=1100, metrics=metrics, seq=13, emitted_at=time.time()
    )
    return {"speak (1 s audio)": speak, "listen": listen}


# --------------------------------------------------------------------------- the alternatives


@dataclasses.dataclass(slots=True, kw_only=True)
class _DSpeak:
    response_id: str
    input_id: str
    text: str = ""
    audio: str = ""
    end_of_turn: bool = False
    interrupted: bool = False
    kv_cache_length: int | None = None
    metrics: dict[str, Any] = dataclasses.field(default_factory=dict)
    seq: int = 0
    emitted_at: float = 0.0
    type: str = "speak"


@dataclasses.dataclass(slots=True, kw_only=True)
class _DListen:
    input_id: str
    kv_cache_length: int
    metrics: dict[str, Any] = dataclasses.field(default_factory=dict)
    seq: int = 0
    emitted_at: float = 0.0
    type: str = "listen"


_DCLASSES: dict[str, type[Any]] = {"speak": _DSpeak, "listen": _DListen}


class _PSpeak(pydantic.BaseModel):
    type: Literal["speak"] = "speak"
    response_id: str
    input_id: str
    text: str = ""
    audio: str = ""
    end_of_turn: bool = False
    interrupted: bool = False
    kv_cache_length: int | None = None
    metrics: dict[str, Any] = {}
    seq: int = 0
    emitted_at: float = 0.0


class _PListen(pydantic.BaseModel):
    type: Literal["listen"] = "listen"
    input_id: str
    kv_cache_length: int
    metrics: dict[str, Any] = {}
    seq: int = 0
    emitted_at: float = 0.0


_PADAPTER: pydantic.TypeAdapter[_PSpeak | _PListen] = pydantic.TypeAdapter(
    _PSpeak | _PListen  # discriminated by the literal type field
)


def _msgspec_codecs() -> tuple[Callable[[bytes], Any], Callable[[Any], bytes]] | None:
    try:
        import msgspec
    except ImportError:
        return None

    class MSpeak(msgspec.Struct, tag="speak", tag_field="type", kw_only=True):
        response_id: str
        input_id: str
        text: str = ""
        audio: str = ""
        end_of_turn: bool = False
        interrupted: bool = False
        kv_cache_length: int | None = None
        metrics: dict[str, Any] = {}
        seq: int = 0
        emitted_at: float = 0.0

    class MListen(msgspec.Struct, tag="listen", tag_field="type", kw_only=True):
        input_id: str
        kv_cache_length: int
        metrics: dict[str, Any] = {}
        seq: int = 0
        emitted_at: float = 0.0

    decoder = msgspec.json.Decoder(MSpeak | MListen)
    return decoder.decode, msgspec.json.Encoder().encode


# --------------------------------------------------------------------------- measuring


def _per_call_us(fn: Callable[[], object], rounds: int) -> float:
    """Median over 5 batches of the time per call, in microseconds."""
    fn()
    batches = []
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(rounds):
            fn()
        batches.append((time.perf_counter() - t0) / rounds * 1e6)
    return round(statistics.median(batches), 2)


def _old_frames(ev: dict[str, Any]) -> list[dict[str, Any]]:
    """The relay's dict mapping before streaming/events.py (current dialect)."""
    if ev["type"] == "listen":
        return [{"type": "response.output.delta", "kind": "listen", "input_id": ev["input_id"]}]
    base = {"type": "response.output.delta", "response_id": ev.get("response_id")}
    metrics = {**(ev.get("metrics") or {}), "end_of_turn": bool(ev.get("end_of_turn"))}
    frames = []
    if ev.get("text"):
        frames.append({**base, "kind": "text", "text": ev["text"], "metrics": metrics})
    if ev.get("audio"):
        frames.append({**base, "kind": "audio", "audio": ev["audio"], "metrics": metrics})
    return frames


def _measure_one(event: E.Event, rounds: int) -> dict[str, Any]:
    wire = E.encode_event(event)
    as_dict = orjson.loads(wire)
    n = rounds if len(wire) < 10_000 else max(1, rounds // 20)
    mapper = DuplexMapper(Dialect.CURRENT, "rt_bench")
    rows: dict[str, dict[str, float]] = {}
    dc = _DCLASSES[as_dict["type"]](**{k: v for k, v in as_dict.items() if k != "type"})
    rows["dict"] = {
        "decode": _per_call_us(lambda: orjson.loads(wire), n),
        "encode": _per_call_us(lambda: orjson.dumps(as_dict), n),
        "relay": _per_call_us(
            lambda: [orjson.dumps(f) for f in _old_frames(orjson.loads(wire))], n
        ),
    }

    def dc_decode() -> Any:
        d = orjson.loads(wire)
        return _DCLASSES[d.pop("type")](**d)

    rows["dataclass"] = {
        "decode": _per_call_us(dc_decode, n),
        "encode": _per_call_us(lambda: orjson.dumps(dc), n),
    }
    model = _PADAPTER.validate_json(wire)
    rows["pydantic"] = {
        "decode": _per_call_us(lambda: _PADAPTER.validate_json(wire), n),
        "encode": _per_call_us(model.model_dump_json, n),
    }
    msg = _msgspec_codecs()
    if msg is not None:
        decode, encode = msg
        struct = decode(wire)
        rows["msgspec"] = {
            "decode": _per_call_us(lambda: decode(wire), n),
            "encode": _per_call_us(lambda: encode(struct), n),
        }
    rows["contract"] = {
        "decode": _per_call_us(lambda: E.decode_event(wire), n),
        "encode": _per_call_us(lambda: E.encode_event(event), n),
        "relay": _per_call_us(
            lambda: [orjson.dumps(f) for f in mapper.frames(E.decode_event(wire))], n
        ),
    }
    return {"bytes": len(wire), "us_per_event": rows}


def measure(rounds: int) -> dict[str, Any]:
    """Every candidate on every sample event; microseconds per event."""
    return {name: _measure_one(event, rounds) for name, event in samples().items()}


def render(result: dict[str, Any]) -> str:
    """A plain-text table."""
    lines = []
    for name, data in result.items():
        lines.append(f"{name}: {data['bytes']} bytes on the wire; microseconds per event")
        lines.append(f"  {'candidate':<10} {'decode':>8} {'encode':>8} {'relay':>8}")
        for cand, r in data["us_per_event"].items():
            relay = f"{r['relay']:>8}" if "relay" in r else f"{'-':>8}"
            lines.append(f"  {cand:<10} {r['decode']:>8} {r['encode']:>8} {relay}")
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(prog="python -m bench.event_codec", description=__doc__)
    p.add_argument("--rounds", type=int, default=20_000, help="calls per batch (small events)")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    args = p.parse_args()
    result = measure(args.rounds)
    print(json.dumps(result, indent=2) if args.json else render(result))


if __name__ == "__main__":
    main()
