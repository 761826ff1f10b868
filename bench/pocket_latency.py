"""Pocket first audio after the end of user speech, through the real stack, with each stage's share.

    python -m bench pocket [--rounds 4] [--chunks 1,0.25] [--max-seconds 900]
                           [--backend-options JSON] [--output NAME]

A private redis-server, the gateway and one pocket worker start on 127.0.0.1. For every chunk
size, each spoken question (Piper's voice, 16 kHz) is sent by a WebSocket client in real time,
in a fresh audio-duplex session: chunk ``i`` holds signal ``[i*c, (i+1)*c)`` and is sent at
``t0 + (i+1)*c``, the moment a microphone would have filled it, followed by silence. The
question's true end (its last 10 ms frame above -40 dBFS) is put at ``--rounds`` evenly spread
places inside a chunk, so turns whose end-of-speech decision needs the next chunk are counted in
their real proportion. Per turn:

- ``from_chunk_s``: first audio frame received - send time of the chunk whose step answered,
  i.e. the chunk in which the end of speech was found (the issue's figure);
- ``from_true_end_chunk_s``: the same, from the send of the chunk holding the true end (longer
  by a chunk when the end of speech is decided in the next one);
- ``from_true_end_s``: first audio frame received - the true end of speech (wall clock);
- stages, from the worker's step metrics in that frame: VAD decision (``vad_s``), ASR
  (``asr_s``), LLM to the first clause (``llm_first_clause_s``: prompt to a finished clause),
  TTS of that clause (``tts_first_clause_s``), relay (``from_chunk_s - step_s``: client ->
  gateway -> Redis -> worker and back, JSON and base64 included) and the rest (hand-offs, token
  counting). When the answer was begun at a pause in an earlier chunk (``speculative``), part of
  that work was done before the chunk was sent: ``head_start_s``. The stages add up to
  ``from_chunk_s + head_start_s``.

Shares are of that sum, by means (they add up); medians and the 10th-90th percentile give the
spread. The 1-min load average is sampled at every turn: the 2 cores are shared. Writes
bench/results/NAME.json (``pocket_latency`` unless ``--output`` names another), as
``python -m bench --output NAME`` does. Every process started is killed on exit.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import os
import statistics
import sys
import time
from typing import Any

import numpy as np
import orjson
import websockets

from api.protocol.events import ClientEvent, DeltaKind, ServerEvent
from bench.report import RESULTS
from bench.stack import Stack, install_cleanup, kill_all, shared_redis, spawn, tail

RATE = 16_000
QUESTIONS = [
    "What is the capital of France?",
    "Can you tell me something interesting about the moon?",
    "How do I make a cup of tea?",
    "What is two plus two?",
]
STAGES = [
    ("vad_s", "VAD decision (streaming Silero, whole chunk)"),
    ("asr_s", "ASR (Whisper tiny.en, short window)"),
    ("llm_first_clause_s", "LLM to the first clause (SmolLM2, CT2 int8)"),
    ("tts_first_clause_s", "TTS of the first clause (Piper)"),
    ("other_s", "rest in the worker (hand-offs, token counts)"),
    ("relay_s", "relay: client -> worker -> client"),
]
HEAD_START = ("head_start_s", "  done before the chunk was sent (at a pause)")


def true_end(audio: np.ndarray, frame: int = 160, level: float = 0.01) -> int:
    """Samples up to the end of the last 10 ms frame louder than ``level`` RMS."""
    n = audio.size // frame
    rms = np.sqrt(np.mean(audio[: n * frame].reshape(n, frame) ** 2, axis=1))
    loud = np.nonzero(rms > level)[0]
    return int((loud[-1] + 1) * frame) if loud.size else audio.size


def place(speech: np.ndarray, chunk: int, fraction: float) -> tuple[np.ndarray, int]:
    """Silence, the speech, silence: the true end lands at ``fraction`` of a chunk."""
    end = true_end(speech)
    lead = int((fraction * chunk - end) % chunk) + chunk  # at least one chunk of silence first
    signal = np.concatenate(
        [np.zeros(lead, np.float32), speech, np.zeros(4 * RATE, np.float32)]
    ).astype(np.float32)
    return signal, lead + end


async def one_turn(url: str, signal: np.ndarray, end: int, chunk: int) -> dict[str, Any]:
    """Stream ``signal`` in real time into a new session; time the first audio frame."""
    ws = await websockets.connect(
        f"{url}/v1/realtime?mode=audio", max_size=None, ping_interval=None, open_timeout=60
    )
    try:
        while (
            orjson.loads(await asyncio.wait_for(ws.recv(), 300))["type"]
            != ServerEvent.SESSION_QUEUE_DONE
        ):
            pass
        await ws.send(orjson.dumps({"type": ClientEvent.SESSION_INIT, "payload": {}}).decode())
        while (
            orjson.loads(await asyncio.wait_for(ws.recv(), 60))["type"]
            != ServerEvent.SESSION_CREATED
        ):
            pass
        loop = asyncio.get_running_loop()
        sent: dict[int, float] = {}
        chunks = [signal[i : i + chunk] for i in range(0, signal.size - chunk + 1, chunk)]
        t0 = loop.time() + 0.05

        async def sender() -> None:
            for i, piece in enumerate(chunks):
                await asyncio.sleep(max(0.0, t0 + (i + 1) * chunk / RATE - loop.time()))
                audio = base64.b64encode(piece.astype("<f4").tobytes()).decode()
                sent[i + 1] = loop.time()
                await ws.send(
                    orjson.dumps(
                        {"type": ClientEvent.INPUT_APPEND, "input": {"audio": audio}}
                    ).decode()
                )

        task = asyncio.create_task(sender())
        first_text = ""
        try:
            deadline = t0 + signal.size / RATE + 30
            while True:
                ev = orjson.loads(await asyncio.wait_for(ws.recv(), deadline - loop.time()))
                if ev.get("type") == ServerEvent.ERROR:
                    raise RuntimeError(f"error from the server: {ev}")
                if (
                    ev.get("type") == ServerEvent.RESPONSE_OUTPUT_DELTA
                    and ev.get("kind") == DeltaKind.TEXT
                ):
                    first_text = first_text or str(ev.get("text") or "")
                if (
                    ev.get("type") == ServerEvent.RESPONSE_OUTPUT_DELTA
                    and ev.get("kind") == DeltaKind.AUDIO
                ):
                    received = loop.time()
                    break
        finally:
            task.cancel()
        answered = int(str(ev["input_id"]).split("_")[1])
        m = ev.get("metrics") or {}
        from_chunk = received - sent[answered]
        row: dict[str, Any] = {
            "chunk_s": chunk / RATE,
            "end_in_chunk_s": round((end % chunk) / RATE, 3),
            "answered_chunk": answered,
            "true_end_chunk": -(-end // chunk),
            "from_chunk_s": from_chunk,
            "from_true_end_s": received - (t0 + end / RATE),
            "transcript": m.get("transcript"),
            "first_text": first_text,
            "step_s": m.get("step_s"),
            "first_audio_s": m.get("first_audio_s"),
            "relay_s": from_chunk - float(m.get("step_s") or 0.0),
            "llm_prefill_s": m.get("llm_prefill_s"),
            "asr_window_s": m.get("asr_window_s"),
            "asr_audio_s": m.get("asr_audio_s"),
            "speech_end_before_chunk_end_s": m.get("speech_end_before_chunk_end_s"),
            "load_1m": os.getloadavg()[0],
        }
        for key in ("vad_s", "asr_s", "llm_first_clause_s", "tts_first_clause_s"):
            row[key] = float(m.get(key) or 0.0)
        row["speculative"] = bool(m.get("speculative"))
        row["head_start_s"] = min(
            float(m.get("prepared_before_step_s") or 0.0), float(m.get("first_audio_s") or 0.0)
        )
        row["from_true_end_chunk_s"] = received - sent[row["true_end_chunk"]]
        row["other_s"] = (
            from_chunk
            + row["head_start_s"]
            - sum(row[k] for k in ("vad_s", "asr_s", "llm_first_clause_s", "tts_first_clause_s"))
            - row["relay_s"]
        )
        # the VAD's own error: where it put the end vs the true end (+ = later)
        if m.get("speech_end_before_chunk_end_s") is not None:
            detected = answered * chunk - m["speech_end_before_chunk_end_s"] * RATE
            row["vad_end_error_s"] = round((detected - end) / RATE, 3)
        await ws.send(
            orjson.dumps({"type": ClientEvent.SESSION_CLOSE, "reason": "user_stop"}).decode()
        )
        return row
    finally:
        await ws.close()


def start_pocket_worker(stack: Stack, options: dict[str, Any]) -> None:
    """One pocket worker (1 slot); waits until its models are loaded and its slot is offered."""
    argv = [sys.executable, "-m", "omniserve", "worker", "--backend", "pocket", "--slots", "1"]
    if options:
        argv += ["--backend-options", json.dumps(options)]
    p, log = spawn(f"{stack.prefix}-pocket-worker", argv, stack.base_env())
    stack.workers.append(p)
    stack.slots += 1
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        if p.poll() is not None:
            raise RuntimeError(f"pocket worker exited:\n{tail(log)}")
        if stack.free_slots() >= 1:
            return
        time.sleep(0.2)
    raise RuntimeError(f"pocket worker not ready:\n{tail(log)}")


def summarize(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Medians, spread and mean-based shares of one chunk size's turns."""

    def stats(key: str) -> dict[str, float]:
        v = sorted(float(r[key]) for r in rows if r.get(key) is not None)
        if not v:
            return {}
        q = statistics.quantiles(v, n=10) if len(v) > 1 else [v[0]] * 9
        return {
            "median": round(statistics.median(v), 3),
            "p10": round(q[0], 3),
            "p90": round(q[-1], 3),
            "min": round(v[0], 3),
            "max": round(v[-1], 3),
            "mean": round(statistics.fmean(v), 4),
        }

    work = statistics.fmean(r["from_chunk_s"] + r["head_start_s"] for r in rows)
    stages = {}
    for key, _label in [*STAGES, HEAD_START]:
        s = stats(key)
        s["share"] = round(s["mean"] / work, 3) if work else 0.0
        stages[key] = s
    return {
        "turns": len(rows),
        "speculative": sum(r["speculative"] for r in rows),
        "from_chunk_s": stats("from_chunk_s"),
        "from_true_end_chunk_s": stats("from_true_end_chunk_s"),
        "from_true_end_s": stats("from_true_end_s"),
        "under_0_7_s": sum(r["from_chunk_s"] < 0.7 for r in rows),
        "decided_in_next_chunk": sum(r["answered_chunk"] > r["true_end_chunk"] for r in rows),
        "wait_after_true_end_s": stats("wait_after_true_end_s"),
        "vad_end_error_s": stats("vad_end_error_s"),
        "stages": stages,
        "load_1m": stats("load_1m"),
    }


def run(args: argparse.Namespace) -> dict[str, Any]:
    install_cleanup()
    from inference.pocket.assets import default_piper_voice
    from inference.pocket.tts import Speaker
    from omnicore.audio import resample

    speaker = Speaker(default_piper_voice(), threads=1)
    questions = {
        q: resample(speaker.synthesize(q, varied=False), 24_000, RATE).astype(np.float32)
        for q in QUESTIONS
    }
    del speaker
    stack = Stack(shared_redis())
    started = time.perf_counter()
    out: dict[str, Any] = {"by_chunk": {}}
    try:
        stack.start_gateway()
        start_pocket_worker(stack, args.backend_options)
        out["worker_ready_s"] = round(time.perf_counter() - started, 1)
        _progress(f"gateway and pocket worker ready in {out['worker_ready_s']} s")
        warm, end = place(questions[QUESTIONS[0]], RATE, 0.5)
        asyncio.run(one_turn(stack.url, warm, end, RATE))  # loads lazily-built state; not counted
        for chunk_s in args.chunks:
            chunk = round(chunk_s * RATE)
            rows: list[dict[str, Any]] = []
            for r in range(args.rounds):
                for q, speech in questions.items():
                    if time.perf_counter() - started > args.max_seconds:
                        break
                    signal, end = place(speech, chunk, (r + 0.5) / args.rounds)
                    row = asyncio.run(one_turn(stack.url, signal, end, chunk))
                    row["question"] = q
                    row["wait_after_true_end_s"] = row["from_true_end_s"] - row["from_chunk_s"]
                    rows.append(row)
                    _progress(
                        f"{chunk_s:g} s chunks: {row['from_chunk_s']:.3f} s from the chunk, "
                        f"{row['from_true_end_s']:.3f} s from the true end "
                        f"(load {row['load_1m']:.1f}) {q!r}"
                    )
            if rows:
                out["by_chunk"][f"{chunk_s:g}"] = {"summary": summarize(rows), "rows": rows}
    finally:
        stack.stop()
        kill_all()
    out["elapsed_s"] = round(time.perf_counter() - started, 1)
    return out


def _progress(msg: str) -> None:
    print(f"  .. {msg}", file=sys.stderr, flush=True)


def _fmt(s: dict[str, float], key: str = "median") -> str:
    return "-" if not s else f"{s[key]:.3f}"


def render(out: dict[str, Any]) -> str:
    """The report as printed and pasted into docs/BENCHMARKS.md."""
    sizes = list(out["by_chunk"])
    head = f"{'':<46}" + "".join(f"{s + ' s chunks':>24}" for s in sizes)
    lines = [head, f"{'':<46}" + "".join(f"{'median (p10-p90)':>24}" for _ in sizes)]

    def row(label: str, get) -> None:  # type: ignore[no-untyped-def]
        cells = []
        for s in sizes:
            st = get(out["by_chunk"][s]["summary"])
            cells.append(f"{_fmt(st)} ({_fmt(st, 'p10')}-{_fmt(st, 'p90')})" if st else "-")
        lines.append(f"{label:<46}" + "".join(f"{c:>24}" for c in cells))

    row("first audio after the chunk with the end [s]", lambda s: s["from_chunk_s"])
    row("  after the chunk with the true end [s]", lambda s: s["from_true_end_chunk_s"])
    row("first audio after the true end of speech [s]", lambda s: s["from_true_end_s"])
    row("  of which waiting for the chunk [s]", lambda s: s["wait_after_true_end_s"])
    row("VAD end vs true end [s]", lambda s: s["vad_end_error_s"])
    lines.append("")
    lines.append(
        f"{'stage (share of the work, by means)':<46}"
        + "".join(f"{'median  share':>24}" for _ in sizes)
    )
    for key, label in [*STAGES, HEAD_START]:
        cells = []
        for s in sizes:
            st = out["by_chunk"][s]["summary"]["stages"][key]
            cells.append(f"{_fmt(st)}  {100 * st['share']:5.1f} %" if st else "-")
        lines.append(f"{label:<46}" + "".join(f"{c:>24}" for c in cells))
    lines.append("")
    for s in sizes:
        sm = out["by_chunk"][s]["summary"]
        lines.append(
            f"{s} s chunks: {sm['turns']} turns, {sm['under_0_7_s']} under 0.7 s from the chunk; "
            f"{sm['decided_in_next_chunk']} decided in a chunk after the true end's; "
            f"{sm['speculative']} begun at a pause in an earlier chunk; "
            f"1-min load average {_fmt(sm['load_1m'])} (min {_fmt(sm['load_1m'], 'min')}, "
            f"max {_fmt(sm['load_1m'], 'max')}) on {os.cpu_count()} CPUs"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench pocket", description=(__doc__ or "").splitlines()[0]
    )
    parser.add_argument("--rounds", type=int, default=4, help="end positions per question")
    parser.add_argument(
        "--chunks",
        type=lambda s: [float(x) for x in s.split(",")],
        default=[1.0, 0.25],
        help="client chunk sizes in seconds (comma list; the spec allows 0.25 to 1)",
    )
    parser.add_argument("--max-seconds", type=float, default=900.0, help="stop starting turns")
    parser.add_argument(
        "--backend-options", type=json.loads, default={}, help="JSON for the pocket worker"
    )
    parser.add_argument(
        "--output", default="pocket_latency", help="results file name (bench/results/NAME.json)"
    )
    args = parser.parse_args(argv)
    out = run(args)
    out.update(
        {
            "benchmark": "pocket_latency",
            "command": "python -m bench pocket " + " ".join(argv or sys.argv[1:]),
            "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "cpus": os.cpu_count(),
            "backend_options": args.backend_options,
        }
    )
    text = render(out)
    print(text)
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f"{args.output}.json"
    path.write_text(json.dumps(out, indent=2, default=float))  # numpy scalars among the figures
    print(f"\nwrote {path} ({out['elapsed_s']} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
