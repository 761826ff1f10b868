"""The baseline: the same ScriptedBackend driven in-process by a bare WebSocket server, no Redis.

It speaks the subset of the Realtime API the benchmarks use (dialect ``current``): queue_done at
once, session.init -> session.created, input.append -> one backend step (duplex) or one streamed
chat turn. Each output frame carries ``t_emit`` (wall clock when the backend's output was ready),
the same point the stack's tap stamps ("worker emit").

    python -m bench.baseline PORT      (started as a child by the benchmarks)
"""

from __future__ import annotations

import asyncio
import sys
import time
from typing import Any
from urllib.parse import parse_qs, urlsplit

import numpy as np
import orjson
import websockets
from websockets.asyncio.server import ServerConnection, serve

from api.protocol.events import ClientEvent, DeltaKind, ServerEvent
from inference.base import (
    ChatDelta,
    ChatDone,
    ChatRequest,
    DuplexConfig,
    DuplexInput,
    GenerationConfig,
    Message,
    TextPart,
)
from inference.scripted import ScriptedBackend
from omnicore.audio import b64_to_pcm, pcm_to_b64

BACKEND = ScriptedBackend(trigger="always", token_delay_s=0.01)


def _b64(pcm: np.ndarray | None) -> str:
    return pcm_to_b64(pcm)


async def duplex(ws: ServerConnection, sid: str) -> None:
    """One audio full-duplex session: a backend step per input chunk, in a thread."""
    session = BACKEND.open_duplex()
    n = 0
    async for raw in ws:
        ev = orjson.loads(raw)
        kind = ev.get("type")
        if kind == ClientEvent.SESSION_INIT:
            prompt = session.prepare(DuplexConfig(system_prompt="bench"))
            await ws.send(
                orjson.dumps(
                    {
                        "type": ServerEvent.SESSION_CREATED,
                        "session_id": sid,
                        "mode": "full_duplex",
                        "prompt_length": prompt,
                    }
                ).decode()
            )
        elif kind == ClientEvent.INPUT_APPEND:
            n += 1
            pcm = b64_to_pcm(ev["input"]["audio"])
            step = await asyncio.to_thread(session.step, DuplexInput(audio=pcm))
            base = {
                "type": ServerEvent.RESPONSE_OUTPUT_DELTA,
                "session_id": sid,
                "input_id": f"input_{n}",
            }
            if step.listen:
                frames = [{**base, "kind": DeltaKind.LISTEN, "t_emit": time.time()}]
            else:
                audio = _b64(step.audio)
                t = time.time()
                frames = [
                    {**base, "kind": DeltaKind.TEXT, "text": step.text, "t_emit": t},
                    {**base, "kind": DeltaKind.AUDIO, "audio": audio, "t_emit": t},
                ]
            for f in frames:
                await ws.send(orjson.dumps(f).decode())
        elif kind == ClientEvent.SESSION_CLOSE:
            await ws.send(
                orjson.dumps(
                    {"type": ServerEvent.SESSION_CLOSED, "session_id": sid, "reason": "user_stop"}
                ).decode()
            )
            return


def chat_request(inp: dict[str, Any]) -> ChatRequest:
    """The backend request for a text-only chat input (all the benchmark sends)."""
    msgs = [Message(role=m["role"], content=[TextPart(m["content"])]) for m in inp["messages"]]
    gen = GenerationConfig(max_new_tokens=int(inp.get("generation", {}).get("max_new_tokens", 256)))
    return ChatRequest(messages=msgs, streaming=True, generation=gen)


def _chat_thread(
    request: dict[str, Any], loop: asyncio.AbstractEventLoop, q: asyncio.Queue[Any]
) -> None:
    for item in BACKEND.chat(chat_request(request)):
        loop.call_soon_threadsafe(q.put_nowait, item)
    loop.call_soon_threadsafe(q.put_nowait, None)


async def chat(ws: ServerConnection, sid: str) -> None:
    """Chat mode: each input.append is one streamed turn."""
    loop = asyncio.get_running_loop()
    async for raw in ws:
        ev = orjson.loads(raw)
        kind = ev.get("type")
        if kind == ClientEvent.SESSION_INIT:
            await ws.send(
                orjson.dumps(
                    {"type": ServerEvent.SESSION_CREATED, "session_id": sid, "mode": "turn_based"}
                ).decode()
            )
        elif kind == ClientEvent.INPUT_APPEND:
            q: asyncio.Queue[Any] = asyncio.Queue()
            worker = loop.run_in_executor(None, _chat_thread, ev["input"], loop, q)
            base = {"session_id": sid, "response_id": "resp_baseline"}
            while (item := await q.get()) is not None:
                if isinstance(item, ChatDelta) and item.text:
                    await ws.send(
                        orjson.dumps(
                            {
                                "type": ServerEvent.RESPONSE_OUTPUT_DELTA,
                                "kind": DeltaKind.TEXT,
                                **base,
                                "text": item.text,
                            }
                        ).decode()
                    )
                elif isinstance(item, ChatDone):
                    await ws.send(
                        orjson.dumps(
                            {
                                "type": ServerEvent.RESPONSE_DONE,
                                **base,
                                "text": item.text,
                                "reason": "turn_end",
                            }
                        ).decode()
                    )
            await worker
        elif kind == ClientEvent.SESSION_CLOSE:
            await ws.send(
                orjson.dumps(
                    {"type": ServerEvent.SESSION_CLOSED, "session_id": sid, "reason": "user_stop"}
                ).decode()
            )
            return


async def handler(ws: ServerConnection) -> None:
    assert ws.request is not None  # (the handshake is done when the handler runs)
    mode = parse_qs(urlsplit(ws.request.path).query).get("mode", ["audio"])[0]
    sid = f"base_{id(ws):x}"
    await ws.send(
        orjson.dumps({"type": ServerEvent.SESSION_QUEUE_DONE, "session_id": sid}).decode()
    )
    try:
        await (chat(ws, sid) if mode == "chat" else duplex(ws, sid))
    except websockets.ConnectionClosed:
        pass


async def main(port: int, deflate: bool = False) -> None:
    loop = asyncio.get_running_loop()
    from concurrent.futures import ThreadPoolExecutor

    loop.set_default_executor(ThreadPoolExecutor(max_workers=512))
    async with serve(
        handler,
        "127.0.0.1",
        port,
        max_size=None,
        ping_interval=None,
        compression="deflate" if deflate else None,
    ):
        await asyncio.Future()


if __name__ == "__main__":
    asyncio.run(main(int(sys.argv[1]), len(sys.argv) > 2 and sys.argv[2] == "deflate"))
