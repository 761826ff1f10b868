"""A call far longer than the context window, on the scripted backend: ``python -m bench
rollover``.

    python -m bench rollover [--minutes 30] [--kv-tokens 0] [--turn-s 20] [--json]

One gateway and one scripted worker (16 tokens per one-second step, about MiniCPM-o's rate
for audio) on the benchmark's private Redis. One audio client sends ``--minutes`` of input in
one-second chunks, each as soon as the previous one is answered (a fast clock: a minute of call
in well under a minute), as a conversation: every ``--turn-s`` seconds of input 3 s of speech
then silence, which the model answers. The worker's rollover settings are the defaults unless
``--kv-tokens`` sets the budget. Printed: the rollovers, any ``context_full`` or error, the
output gap across each rollover (from the answer before it to the answer after it) beside the
gap between two ordinary steps (p50/p99), the rollover's own prepare time, and the worker's
memory (RSS of its processes) at the first rollover and at the end.

    python -m bench rollover --backend pocket [--minutes 10] [--turn-s 20] [--kv-tokens 400]

The same call in real time on the ``pocket`` backend (real speech: the user's turns are
synthesised by its own Piper voice and sent one second of audio per second). The first turn
gives the user's name; the first turn after each rollover asks for it, and whether the spoken
answer's text holds the name is printed beside the figures above, and beside it the floor:
the same language model asked with the greeting just before the question and no rollover.
The gap here is each chunk's latency, from sending it to the first output for it, ordinary
against the steps a rollover came in.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import math
import statistics
import time
from typing import Any

import numpy as np
import orjson
import psutil
import websockets

from api.protocol.events import ClientEvent, ServerEvent
from bench.stack import Stack, install_cleanup, kill_all, shared_redis

SPEECH_S = 3
TRANSCRIPT = "my name is Ada and I like long calls"


def chunk(voiced: bool) -> str:
    """One second of 16 kHz float32 audio, base64: a tone, or silence."""
    t = np.arange(16000, dtype=np.float32) / 16000
    pcm = (0.2 * np.sin(2 * math.pi * 300 * t)) if voiced else np.zeros(16000)
    return base64.b64encode(pcm.astype(np.float32).tobytes()).decode()


def worker_rss_mib(stack: Stack) -> float:
    """RSS of the worker processes (the node and its pool), MiB."""
    total = 0
    for p in stack.workers:
        proc = psutil.Process(p.pid)
        for q in [proc, *proc.children(recursive=True)]:
            try:
                total += q.memory_info().rss
            except psutil.Error:
                continue
    return total / 2**20


def pct(values: list[float], q: float) -> float:
    """The ``q`` quantile (0..1) of ``values``, nearest rank."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]


async def call(stack: Stack, seconds: int, turn_s: int) -> dict[str, Any]:
    """One long call; the figures of the module docstring."""
    voiced, quiet = chunk(True), chunk(False)
    async with websockets.connect(f"{stack.url}/v1/realtime?mode=audio", max_size=None) as ws:

        async def until(*types: str) -> dict[str, Any]:
            while True:
                ev: dict[str, Any] = orjson.loads(await asyncio.wait_for(ws.recv(), 60))
                if ev["type"] in types:
                    return ev

        await until(ServerEvent.SESSION_QUEUE_DONE)
        await ws.send(orjson.dumps({"type": ClientEvent.SESSION_INIT, "payload": {}}).decode())
        await until(ServerEvent.SESSION_CREATED)
        gaps: list[float] = []  # between consecutive answers, without a rollover
        rollover_gaps: list[float] = []
        prepare_s: list[float] = []
        kv_before: list[int] = []
        kv_after: list[int] = []
        max_kv = 0
        problems: list[dict[str, Any]] = []
        rss: list[float] = []
        last = time.perf_counter()
        for i in range(seconds):
            audio = voiced if i % turn_s < SPEECH_S else quiet
            await ws.send(
                orjson.dumps({"type": ClientEvent.INPUT_APPEND, "input": {"audio": audio}}).decode()
            )
            rolled = False
            while True:
                ev = orjson.loads(await asyncio.wait_for(ws.recv(), 60))
                kind = ev["type"]
                if kind == ServerEvent.SESSION_ROLLOVER:
                    rolled = True
                    prepare_s.append(float(ev["metrics"]["prepare_s"]))
                    kv_before.append(int(ev["metrics"]["kv_cache_length_before"]))
                    kv_after.append(int(ev["kv_cache_length"]))
                    if not rss:
                        rss.append(worker_rss_mib(stack))
                elif kind in (ServerEvent.ERROR, ServerEvent.SESSION_CLOSED):
                    problems.append(ev)
                    if kind == ServerEvent.SESSION_CLOSED:
                        raise RuntimeError(f"the call ended after {i} s: {ev}")
                elif (
                    kind == ServerEvent.RESPONSE_OUTPUT_DELTA and ev["input_id"] == f"input_{i + 1}"
                ):
                    max_kv = max(max_kv, int(ev["metrics"].get("kv_cache_length", 0)))
                    break
            now = time.perf_counter()
            (rollover_gaps if rolled else gaps).append(now - last)
            last = now
        rss.append(worker_rss_mib(stack))
        await ws.send(orjson.dumps({"type": ClientEvent.SESSION_CLOSE}).decode())
        closed = await until(ServerEvent.SESSION_CLOSED)
    ms = 1000.0
    return {
        "call_s": seconds,
        "rollovers": len(rollover_gaps),
        "context_full": closed["reason"] == "context_full"
        or any(p.get("reason") == "context_full" for p in problems),
        "errors": [p for p in problems if p["type"] == ServerEvent.ERROR],
        "max_kv_cache_length": max_kv,
        "kv_before_rollover": kv_before,
        "kv_after_rollover": kv_after,
        "gap_ms": {"p50": round(pct(gaps, 0.5) * ms, 2), "p99": round(pct(gaps, 0.99) * ms, 2)},
        "rollover_gap_ms": {
            "p50": round(pct(rollover_gaps, 0.5) * ms, 2) if rollover_gaps else None,
            "p99": round(pct(rollover_gaps, 0.99) * ms, 2) if rollover_gaps else None,
        },
        "rollover_prepare_ms_median": round(statistics.median(prepare_s) * ms, 2)
        if prepare_s
        else None,
        "worker_rss_mib": {"first_rollover": round(rss[0], 1), "end": round(rss[-1], 1)},
    }


NAME = "Ada"
SYSTEM_PROMPT = "You are a friendly assistant. Answer in one short sentence."
GREETING = f"Hello! My name is {NAME}. Nice to meet you."
ASK = "Do you remember my name? What did I say my name was?"
SMALL_TALK = (
    "What is the capital of France?",
    "Tell me something about the sea.",
    "What colour is the sky?",
    "Name a big animal.",
    "What do cats like to eat?",
    "How many days are in a week?",
)


async def pocket_call(stack: Stack, seconds: int, turn_s: int) -> dict[str, Any]:
    """A real-time spoken call on pocket; the figures of the module docstring."""
    from inference.pocket.assets import default_piper_voice
    from inference.pocket.tts import Speaker
    from omnicore.audio import resample

    speaker = Speaker(default_piper_voice())
    spoken: dict[str, list[np.ndarray]] = {}

    def utterance(text: str) -> list[np.ndarray]:
        """``text`` in Piper's voice as one-second 16 kHz chunks (cached)."""
        if text not in spoken:
            audio = resample(speaker.synthesize(text, varied=False), 24_000, 16_000)
            audio = audio.astype(np.float32)
            pad = (-audio.size) % 16_000
            audio = np.pad(audio, (0, pad))
            spoken[text] = [audio[i : i + 16_000] for i in range(0, audio.size, 16_000)]
        return spoken[text]

    silence = np.zeros(16_000, dtype=np.float32)
    sent_at: dict[int, float] = {}
    first_out: dict[int, float] = {}
    rolled_at: list[int] = []  # the chunk whose step rolled over (the last one sent then)
    rollovers: list[dict[str, Any]] = []
    problems: list[dict[str, Any]] = []
    answers: dict[int, str] = {}  # turn -> the reply's text
    asks: list[int] = []  # turns that asked for the name
    rss: list[float] = []
    turn_of_chunk: dict[int, int] = {}
    state = {"turn": -1, "sent": 0, "ask_next": False}
    async with websockets.connect(f"{stack.url}/v1/realtime?mode=audio", max_size=None) as ws:

        async def until(*types: str) -> dict[str, Any]:
            while True:
                ev: dict[str, Any] = orjson.loads(await asyncio.wait_for(ws.recv(), 120))
                if ev["type"] in types:
                    return ev

        await until("session.queue_done")
        payload = {"system_prompt": SYSTEM_PROMPT}
        await ws.send(orjson.dumps({"type": "session.init", "payload": payload}).decode())
        await until("session.created")
        start_rss = worker_rss_mib(stack)

        async def sender() -> None:
            loop = asyncio.get_running_loop()
            t0 = loop.time()
            queue: list[np.ndarray] = []
            for i in range(seconds):
                if i % turn_s == 0:
                    state["turn"] += 1
                    turn = state["turn"]
                    if turn == 0:
                        text = GREETING
                    elif state["ask_next"]:
                        text, state["ask_next"] = ASK, False
                        asks.append(turn)
                    else:
                        text = SMALL_TALK[turn % len(SMALL_TALK)]
                    queue = list(utterance(text))
                chunk_ = queue.pop(0) if queue else silence
                await asyncio.sleep(max(0.0, t0 + i - loop.time()))
                n = i + 1
                sent_at[n], turn_of_chunk[n] = time.perf_counter(), state["turn"]
                state["sent"] = n
                audio = base64.b64encode(chunk_.tobytes()).decode()
                await ws.send(
                    orjson.dumps({"type": "input.append", "input": {"audio": audio}}).decode()
                )

        send = asyncio.create_task(sender())
        try:
            while not (send.done() and len(first_out) >= state["sent"]):
                try:
                    raw = await asyncio.wait_for(ws.recv(), 5)
                except TimeoutError:
                    if send.done():
                        break
                    continue
                ev = orjson.loads(raw)
                kind = ev["type"]
                if kind == "session.rollover":
                    rollovers.append(ev)
                    rolled_at.append(state["sent"])
                    state["ask_next"] = True
                    if not rss:
                        rss.append(worker_rss_mib(stack))
                elif kind in ("error", "session.closed"):
                    problems.append(ev)
                    if kind == "session.closed":
                        raise RuntimeError(f"the call ended: {ev}")
                elif kind == "response.output.delta" and ev.get("input_id"):
                    n = int(ev["input_id"].split("_")[1])
                    first_out.setdefault(n, time.perf_counter())
                    if ev["kind"] == "text":
                        turn = turn_of_chunk.get(n, 0)
                        answers[turn] = answers.get(turn, "") + ev["text"]
        finally:
            send.cancel()
        rss.append(worker_rss_mib(stack))
        await ws.send(orjson.dumps({"type": "session.close"}).decode())
        closed = await until("session.closed")
    latency = {n: first_out[n] - sent_at[n] for n in first_out if n in sent_at}
    rolled = set(rolled_at)
    ordinary = [v for n, v in latency.items() if n not in rolled]
    across = [v for n, v in latency.items() if n in rolled]
    ms = 1000.0
    knew = [NAME.lower() in answers.get(t, "").lower() for t in asks]
    return {
        "call_s": seconds,
        "rollovers": len(rollovers),
        "context_full": closed["reason"] == "context_full",
        "errors": [p for p in problems if p["type"] == "error"],
        "kv_before_rollover": [int(r["metrics"]["kv_cache_length_before"]) for r in rollovers],
        "kv_after_rollover": [int(r["kv_cache_length"]) for r in rollovers],
        "gap_ms": {
            "p50": round(pct(ordinary, 0.5) * ms, 1),
            "p99": round(pct(ordinary, 0.99) * ms, 1),
        },
        "rollover_gap_ms": {
            "p50": round(pct(across, 0.5) * ms, 1) if across else None,
            "p99": round(pct(across, 0.99) * ms, 1) if across else None,
        },
        "rollover_prepare_ms_median": round(
            statistics.median(float(r["metrics"]["prepare_s"]) for r in rollovers) * ms, 1
        )
        if rollovers
        else None,
        "max_kv_cache_length": max(
            [0, *(int(r["metrics"]["kv_cache_length_before"]) for r in rollovers)]
        ),
        "name_asked_after_rollover": len(asks),
        "name_known_after_rollover": sum(knew),
        "answers_to_name": [answers.get(t, "") for t in asks],
        "worker_rss_mib": {
            "start": round(start_rss, 1),
            "first_rollover": round(rss[0], 1) if len(rss) > 1 else None,
            "end": round(rss[-1], 1),
        },
    }


def name_floor() -> str:
    """The floor under the name check: pocket's language model asked for the name with the
    greeting right before the question in its prompt, no rollover at all."""
    from inference.pocket import llm_convert
    from inference.pocket.assets import default_llm_gguf
    from inference.pocket.llm import LanguageModel

    lm = LanguageModel(default_llm_gguf(), cache_dir=llm_convert.default_cache_dir())
    messages = [
        {"role": "system", "content": SYSTEM_PROMPT},
        {"role": "user", "content": GREETING},
        {"role": "assistant", "content": "Nice to meet you too!"},
        {"role": "user", "content": ASK},
    ]
    return "".join(lm.stream(messages, 64))


def measure_pocket(
    minutes: float, kv_tokens: int, prime_tokens: int, turn_s: int
) -> dict[str, Any]:
    """Start a pocket stack, run the real-time call, stop the stack."""
    env = {
        "OMNISERVE_AUDIO_DURATION_S": str(minutes * 60 + 300),
        "OMNISERVE_ROLLOVER_KV_TOKENS": str(kv_tokens or 400),
    }
    if prime_tokens:
        env["OMNISERVE_ROLLOVER_PRIME_TOKENS"] = str(prime_tokens)
    stack = Stack(shared_redis(), env=env)
    try:
        stack.start_worker(1, "{}", backend="pocket")
        stack.start_gateway()
        out = asyncio.run(pocket_call(stack, round(minutes * 60), turn_s))
    finally:
        stack.stop()
    floor = name_floor()
    out["name_floor_answer"] = floor
    out["name_floor_known"] = NAME.lower() in floor.lower()
    return out


def measure(minutes: float, kv_tokens: int, turn_s: int) -> dict[str, Any]:
    """Start the stack, run the call, stop the stack."""
    env = {
        "OMNISERVE_AUDIO_DURATION_S": str(minutes * 60 * 4 + 600),  # wall time is shorter
        "OMNISERVE_INPUT_MAX_PENDING": "4",
    }
    if kv_tokens:
        env["OMNISERVE_ROLLOVER_KV_TOKENS"] = str(kv_tokens)
    stack = Stack(shared_redis(), env=env)
    try:
        stack.start_worker(1, orjson.dumps({"transcript": TRANSCRIPT}).decode())
        stack.start_gateway()
        return asyncio.run(call(stack, round(minutes * 60), turn_s))
    finally:
        stack.stop()


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(
        prog="python -m bench rollover", description=__doc__.splitlines()[0]
    )
    p.add_argument("--backend", choices=("scripted", "pocket"), default="scripted")
    p.add_argument("--minutes", type=float, help="minutes of call audio (scripted: 30, pocket: 10)")
    p.add_argument(
        "--kv-tokens", type=int, default=0, help="rollover budget (0: the default; pocket: 400)"
    )
    p.add_argument("--prime-tokens", type=int, default=0, help="prime budget (0: the default)")
    p.add_argument("--turn-s", type=int, default=20, help="seconds between the user's turns")
    p.add_argument("--json", action="store_true", help="print the figures as one JSON object")
    args = p.parse_args(argv)
    install_cleanup()
    t0 = time.perf_counter()
    try:
        if args.backend == "pocket":
            args.minutes = args.minutes or 10.0
            out = measure_pocket(args.minutes, args.kv_tokens, args.prime_tokens, args.turn_s)
        else:
            args.minutes = args.minutes or 30.0
            out = measure(args.minutes, args.kv_tokens, args.turn_s)
    finally:
        kill_all()
    out["elapsed_s"] = round(time.perf_counter() - t0, 1)
    if args.json:
        print(orjson.dumps(out).decode())
        return 0 if out["rollovers"] and not out["context_full"] else 1
    print(
        f"rollover: a {args.minutes:g}-minute audio call ({args.backend}, {out['elapsed_s']} s "
        "wall): "
        f"{out['rollovers']} rollovers, context_full: {out['context_full']}, "
        f"errors: {len(out['errors'])}, largest KV cache {out['max_kv_cache_length']}"
    )
    print(f"  KV at each rollover {out['kv_before_rollover']} -> {out['kv_after_rollover']}")
    g, r = out["gap_ms"], out["rollover_gap_ms"]
    print(f"  output gap, ordinary step   p50 {g['p50']} ms  p99 {g['p99']} ms")
    print(f"  output gap, across rollover p50 {r['p50']} ms  p99 {r['p99']} ms")
    print(f"  rollover prepare (median)   {out['rollover_prepare_ms_median']} ms")
    m = out["worker_rss_mib"]
    start = f"at the start {m['start']} MiB, " if "start" in m else ""
    print(
        f"  worker RSS: {start}at the first rollover {m['first_rollover']} MiB, end {m['end']} MiB"
    )
    if "name_asked_after_rollover" in out:
        print(
            f"  the user's name, asked after a rollover: known {out['name_known_after_rollover']}"
            f" of {out['name_asked_after_rollover']} times; answers {out['answers_to_name']}"
        )
        print(
            f"  floor, no rollover (the greeting just before the question in the prompt): "
            f"known {out['name_floor_known']}; answer {out['name_floor_answer']!r}"
        )
    return 0 if out["rollovers"] and not out["context_full"] else 1
