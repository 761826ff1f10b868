"""What recording every session costs the gateway: ``python -m bench.recording_cost``.

Both figures come from one run in this process with the real ``Recorder`` (writer thread,
local store in a temporary directory):

- the hook on the relay path: ``SessionRecording.sent`` / ``client_event`` per call, next to the
  ``orjson.dumps`` that ``ClientSocket.send`` already pays for the same frame;
- the writer thread: CPU seconds per second of recorded duplex session (1 s of 16 kHz input with
  a JPEG frame in, 1 s of 24 kHz speech and a text delta out, per second), i.e. how much of the
  gateway's CPU (and GIL) the background writer takes per concurrent session.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import numpy as np
import orjson

from api.protocol.events import ClientEvent, DeltaKind, ServerEvent
from api.recordings.recorder import Recorder
from omnicore.audio import pcm_to_b64
from omnicore.settings import Settings


def _frames() -> tuple[dict[str, object], dict[str, object], dict[str, object]]:
    rng = np.random.default_rng(0)
    audio_in = pcm_to_b64((0.1 * rng.standard_normal(16000)).astype(np.float32))
    audio_out = pcm_to_b64((0.1 * rng.standard_normal(24000)).astype(np.float32))
    from io import BytesIO

    from PIL import Image

    # a camera-like 640x480 frame: smooth gradients and mild noise (~40 KB at quality 75; pure
    # noise would be ~6x larger than anything a camera sends)
    y, x = np.mgrid[0:480, 0:640]
    img = np.stack([x * 255 / 640, y * 255 / 480, (x + y) * 255 / 1120], axis=-1)
    img = np.clip(img + rng.normal(0, 6, img.shape), 0, 255).astype(np.uint8)
    buf = BytesIO()
    Image.fromarray(img).save(buf, "JPEG", quality=75)
    import base64

    jpeg = base64.b64encode(buf.getvalue()).decode()
    event_in: dict[str, object] = {
        "type": ClientEvent.INPUT_APPEND,
        "input": {"audio": audio_in, "video_frames": [jpeg]},
    }
    base = {"type": ServerEvent.RESPONSE_OUTPUT_DELTA, "session_id": "rt_x", "response_id": "r1"}
    audio: dict[str, object] = {
        **base,
        "kind": DeltaKind.AUDIO,
        "input_id": "input_1",
        "audio": audio_out,
        "metrics": {},
    }
    text: dict[str, object] = {
        **base,
        "kind": DeltaKind.TEXT,
        "input_id": "input_1",
        "text": "Hello there.",
        "metrics": {},
    }
    return event_in, audio, text


def measure(seconds: int, sessions: int) -> dict[str, float]:
    """Record ``sessions`` sessions of ``seconds`` each through the real hooks, as fast as the
    hooks allow (the writer runs meanwhile, as it does beside a relay). Returns the hooks' cost
    per call and the writer thread's CPU per recorded session-second."""
    event_in, audio, text = _frames()
    hook_ns = {"client_event": 0, "sent": 0}
    calls = {"client_event": 0, "sent": 0}
    dumps_ns = 0
    with tempfile.TemporaryDirectory() as tmp:
        settings = Settings(recordings=True, recordings_url=tmp, recordings_max_pending=10**9)
        r = Recorder(settings, "bench")
        cpu0, main0, wall0 = time.process_time(), time.thread_time(), time.perf_counter()
        r.start()
        recs = [r.open(f"rt_w{i}", "video") for i in range(sessions)]
        for _ in range(seconds):
            for rec in recs:
                t0 = time.perf_counter_ns()
                rec.client_event(event_in)
                t1 = time.perf_counter_ns()
                rec.sent(text)
                rec.sent(audio)
                t2 = time.perf_counter_ns()
                orjson.dumps(audio)
                dumps_ns += time.perf_counter_ns() - t2
                hook_ns["client_event"] += t1 - t0
                hook_ns["sent"] += t2 - t1
                calls["client_event"] += 1
                calls["sent"] += 2
            time.sleep(0.001)  # a relay yields between frames; let the writer take the GIL
        for rec in recs:
            rec.finish()
        r.stop(timeout=600)
        wall = time.perf_counter() - wall0
        writer_cpu = (time.process_time() - cpu0) - (time.thread_time() - main0)
        size = sum(p.stat().st_size for p in Path(tmp).rglob("*") if p.is_file())
    session_s = seconds * sessions
    return {
        "client_event_us": hook_ns["client_event"] / calls["client_event"] / 1000,
        "sent_us": hook_ns["sent"] / calls["sent"] / 1000,
        "orjson_dumps_audio_frame_us": dumps_ns / calls["client_event"] / 1000,
        "session_seconds": session_s,
        "wall_s": wall,
        "writer_cpu_ms_per_session_s": 1000 * writer_cpu / session_s,
        "bytes_per_session_s": size / session_s,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.recording_cost", description=__doc__)
    p.add_argument("--seconds", type=int, default=60, help="length of each recorded session")
    p.add_argument("--sessions", type=int, default=10)
    args = p.parse_args(argv)
    m = measure(args.seconds, args.sessions)
    print(f"hook client_event(): {m['client_event_us']:6.2f} us per event (1 s audio + a frame)")
    print(f"hook sent():         {m['sent_us']:6.2f} us per frame")
    print(
        f"  for scale, orjson.dumps of the 1 s audio frame, paid by every send: "
        f"{m['orjson_dumps_audio_frame_us']:.2f} us"
    )
    print(
        f"writer thread: {m['writer_cpu_ms_per_session_s']:.2f} ms CPU per session-second "
        f"({m['session_seconds']} session-seconds, {m['wall_s']:.1f} s wall), "
        f"{m['bytes_per_session_s'] / 1024:.0f} KiB stored per session-second"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
