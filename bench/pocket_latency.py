"""Latency of the pocket backend on this machine: end of user speech -> first audio, and the
speed of each stage.

    python -m bench.pocket_latency [--rounds 3] [--max-seconds 180]

Spoken questions (synthesised by the Piper voice, resampled to 16 kHz) are fed to a duplex
session in 1 s chunks followed by silence, exactly as a client would. Measured:

- ``first_audio_s``: wall time of the step that receives the first silent chunk after speech
  (turn detection + ASR + LLM up to the first sentence + TTS of it) until it returns audio;
  ``perceived_s`` adds the silence the VAD waits for (``silence_chunks`` x 1 s);
- ASR real-time factor (processing seconds / audio seconds), LLM tokens/s (decode only and
  including prefill), TTS real-time factor (synthesis seconds / seconds of speech).

Prints a table and writes bench/results/pocket_latency.json. Bounded by ``--max-seconds``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from pathlib import Path
from typing import Any

import numpy as np

from inference.base import INPUT_SAMPLE_RATE, OUTPUT_SAMPLE_RATE, DuplexConfig, DuplexInput
from inference.pocket import PocketBackend
from omnicore.audio import resample

QUESTIONS = [
    "What is the capital of France?",
    "Can you tell me something interesting about the moon?",
    "How do I make a cup of tea?",
    "What is two plus two?",
]
RESULTS = Path(__file__).resolve().parent / "results" / "pocket_latency.json"


def _chunks(audio: np.ndarray, silence: int) -> list[np.ndarray]:
    size = INPUT_SAMPLE_RATE
    out = [audio[i : i + size] for i in range(0, audio.size, size)]
    out[-1] = np.pad(out[-1], (0, size - out[-1].size))
    return [c.astype(np.float32) for c in out] + [np.zeros(size, np.float32)] * silence


def one_turn(backend: PocketBackend, question: str) -> dict[str, Any]:
    """Ask one spoken question in a fresh session; time the answer."""
    speech = resample(backend.speaker.synthesize(question), OUTPUT_SAMPLE_RATE, INPUT_SAMPLE_RATE)
    session = backend.open_duplex()
    session.prepare(DuplexConfig())
    steps = []
    first_audio_s = None
    for chunk in _chunks(speech, backend.silence_chunks):
        t0 = time.perf_counter()
        step = session.step(DuplexInput(audio=chunk))
        if not step.listen and first_audio_s is None:
            first_audio_s = time.perf_counter() - t0
        steps.append(step)
    first = steps[-1]
    silent = np.zeros(INPUT_SAMPLE_RATE, np.float32)
    while not steps[-1].end_of_turn and not steps[-1].listen and len(steps) < 200:
        steps.append(session.step(DuplexInput(audio=silent)))
    last = steps[-1].metrics
    session.close()
    tokens, llm_s, prefill_s = (
        last.get("llm_tokens", 0),
        last.get("llm_s", 0.0),
        last.get("llm_prefill_s", 0.0),
    )
    return {
        "question": question,
        "transcript": first.metrics.get("transcript", ""),
        "answer": " ".join(s.text for s in steps if s.text),
        "first_audio_s": first_audio_s,
        "perceived_s": None if first_audio_s is None else first_audio_s + backend.silence_chunks,
        "asr_s": first.metrics.get("asr_s"),
        "asr_audio_s": first.metrics.get("asr_audio_s"),
        "asr_rtf": first.metrics["asr_s"] / first.metrics["asr_audio_s"]
        if "asr_s" in first.metrics
        else None,
        "llm_first_token_s": last.get("llm_first_token_s"),
        "llm_tokens": tokens,
        "llm_tok_s": tokens / llm_s if llm_s else None,
        "llm_decode_tok_s": (tokens - 1) / (llm_s - prefill_s)
        if tokens > 1 and llm_s > prefill_s
        else None,
        "tts_s": last.get("tts_s"),
        "tts_audio_s": last.get("tts_audio_s"),
        "tts_rtf": last["tts_s"] / last["tts_audio_s"] if last.get("tts_audio_s") else None,
        "reply_audio_s": sum(s.audio.size for s in steps if s.audio is not None)
        / OUTPUT_SAMPLE_RATE,
    }


def _median(rows: list[dict[str, Any]], key: str) -> float | None:
    values = [r[key] for r in rows if r.get(key) is not None]
    return statistics.median(values) if values else None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2, help="passes over the question list")
    parser.add_argument(
        "--max-seconds", type=float, default=180.0, help="stop starting turns after this"
    )
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--output", type=Path, default=RESULTS)
    args = parser.parse_args()

    started = time.perf_counter()
    backend = PocketBackend(threads=args.threads)
    load_s = time.perf_counter() - started
    one_turn(backend, "Hello.")  # warm-up, not counted

    rows: list[dict[str, Any]] = []
    for _ in range(args.rounds):
        for question in QUESTIONS:
            if time.perf_counter() - started > args.max_seconds:
                break
            rows.append(one_turn(backend, question))

    keys = [
        "first_audio_s",
        "perceived_s",
        "asr_rtf",
        "llm_first_token_s",
        "llm_tok_s",
        "llm_decode_tok_s",
        "tts_rtf",
    ]
    summary = {k: _median(rows, k) for k in keys}
    summary["first_audio_s_max"] = max(
        (r["first_audio_s"] for r in rows if r["first_audio_s"]), default=None
    )
    report = {
        "benchmark": "pocket_latency",
        "machine": {
            "platform": platform.platform(),
            "python": platform.python_version(),
            "cpus": os.cpu_count(),
            "threads": args.threads or "default",
        },
        "backend": backend.info(),
        "load_s": round(load_s, 2),
        "turns": len(rows),
        "silence_chunks": backend.silence_chunks,
        "median": summary,
        "rows": rows,
    }
    _print_table(rows, summary, load_s)
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(report, indent=2, default=float))
    print(f"\nwrote {args.output}")


def _fmt(value: Any, spec: str = ".2f") -> str:
    return "-" if value is None else format(value, spec)


def _print_table(rows: list[dict[str, Any]], summary: dict[str, Any], load_s: float) -> None:
    print(f"pocket backend on {os.cpu_count()} CPUs; models loaded in {load_s:.1f} s\n")
    head = (
        f"{'question':<46} {'1st audio s':>11} {'ASR RTF':>8} {'LLM tok/s':>9} "
        f"{'TTS RTF':>8} {'tokens':>6}"
    )
    print(head)
    print("-" * len(head))
    for r in rows:
        print(
            f"{r['question'][:46]:<46} {_fmt(r['first_audio_s']):>11} "
            f"{_fmt(r['asr_rtf'], '.3f'):>8} "
            f"{_fmt(r['llm_tok_s'], '.1f'):>9} {_fmt(r['tts_rtf'], '.3f'):>8} {r['llm_tokens']:>6}"
        )
    print("-" * len(head))
    print(
        f"{'median':<46} {_fmt(summary['first_audio_s']):>11} {_fmt(summary['asr_rtf'], '.3f'):>8} "
        f"{_fmt(summary['llm_tok_s'], '.1f'):>9} {_fmt(summary['tts_rtf'], '.3f'):>8}"
    )
    lag = summary["perceived_s"] - summary["first_audio_s"] if summary["perceived_s"] else None
    print(
        f"\nend of speech -> first audio byte: median {_fmt(summary['first_audio_s'])} s "
        f"(+{_fmt(lag, '.0f')} s "
        f"of silence before the turn is detected = {_fmt(summary['perceived_s'])} s perceived)"
    )
    print(
        f"LLM decode only: {_fmt(summary['llm_decode_tok_s'], '.1f')} tok/s; "
        f"first token after {_fmt(summary['llm_first_token_s'])} s"
    )


if __name__ == "__main__":
    main()
