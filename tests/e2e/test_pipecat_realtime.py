"""Pipecat's ``OpenAIRealtimeLLMService`` drives omniserve unchanged: in a real Pipecat pipeline
against a real gateway and scripted worker, a text context is answered in speech, and a spoken
question (a microphone's stream) is answered in speech, with no error on the way."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import numpy as np
import pytest

from tests.support.stack import Stack

pytest.importorskip("pipecat.services.openai.realtime.llm")
from pipecat.frames.frames import (
    EndFrame,
    ErrorFrame,
    Frame,
    InputAudioRawFrame,
    InterruptionFrame,
    LLMContextFrame,
    LLMFullResponseEndFrame,
    TTSAudioRawFrame,
    TTSTextFrame,
)
from pipecat.pipeline.pipeline import Pipeline
from pipecat.pipeline.runner import PipelineRunner
from pipecat.pipeline.task import PipelineParams, PipelineTask
from pipecat.processors.aggregators.llm_context import LLMContext
from pipecat.processors.frame_processor import FrameDirection, FrameProcessor
from pipecat.services.openai.realtime.llm import OpenAIRealtimeLLMService

pytestmark = [pytest.mark.asyncio, pytest.mark.slow]

RATE = 16_000  # what a Pipecat transport's microphone gives; the service resamples to 24 kHz
# a long answer: 3 words a step, 1 s of speech a step (the scripted backend's defaults)
REPLY = " ".join(["one two three"] * 8)
ANSWER_SAMPLES = 8 * 24_000  # the whole answer's speech at 24 kHz


class Collector(FrameProcessor):
    """The end of the pipeline: keeps what the service produced."""

    def __init__(self) -> None:
        super().__init__()
        self.frames: list[Frame] = []
        self.responses = 0
        self.answered = asyncio.Event()
        self.speaking = asyncio.Event()

    async def process_frame(self, frame: Frame, direction: FrameDirection) -> None:
        await super().process_frame(frame, direction)
        self.frames.append(frame)
        if isinstance(frame, TTSAudioRawFrame):
            self.speaking.set()
        if isinstance(frame, LLMFullResponseEndFrame):
            self.responses += 1
            self.answered.set()
        await self.push_frame(frame, direction)

    def audio(self) -> bytes:
        return b"".join(f.audio for f in self.frames if isinstance(f, TTSAudioRawFrame))

    def text(self) -> str:
        return "".join(f.text for f in self.frames if isinstance(f, TTSTextFrame))

    def errors(self) -> list[Frame]:
        return [f for f in self.frames if isinstance(f, ErrorFrame)]


@pytest.fixture(scope="module")
def pipecat_service(redis_server: str) -> Iterator[Stack]:
    s = Stack(redis_server)
    try:
        s.start_worker(slots=2, OMNISERVE_SCRIPTED_REPLY=REPLY)
        s.start_gateway(OMNISERVE_INPUT_MAX_PENDING="16")
        yield s
    finally:
        s.stop()


def service(stack: Stack) -> OpenAIRealtimeLLMService:
    port = stack.gateways[0][1]
    return OpenAIRealtimeLLMService(
        api_key="sk-test",
        base_url=f"ws://127.0.0.1:{port}/v1/realtime",
        settings=OpenAIRealtimeLLMService.Settings(model="minicpm-o-4.5"),
    )


def mic(seconds: float, level: float = 0.0) -> InputAudioRawFrame:
    t = np.arange(int(RATE * seconds)) / RATE
    pcm = (level * np.sin(2 * np.pi * 220 * t) * 32767).astype("<i2").tobytes()
    return InputAudioRawFrame(audio=pcm, sample_rate=RATE, num_channels=1)


async def run_pipeline(stack: Stack, drive: object) -> Collector:
    """Run the service in a pipeline while ``drive(task, collector)`` feeds it; then end it."""
    collector = Collector()
    task = PipelineTask(
        Pipeline([service(stack), collector]),
        params=PipelineParams(audio_in_sample_rate=RATE),
        idle_timeout_secs=None,
    )
    runner = PipelineRunner(handle_sigint=False)
    await runner.add_workers(task)
    running = asyncio.ensure_future(runner.run())
    try:
        await drive(task, collector)  # type: ignore[operator]
    finally:
        await task.queue_frame(EndFrame())
        await asyncio.wait_for(running, 30)
    return collector


async def test_a_context_is_answered_in_speech(pipecat_service: Stack) -> None:
    async def drive(task: PipelineTask, collector: Collector) -> None:
        context = LLMContext(
            messages=[{"role": "user", "content": "Reply with exactly: hello pipecat"}]
        )
        await task.queue_frame(LLMContextFrame(context))
        await asyncio.wait_for(collector.answered.wait(), 60)

    collector = await run_pipeline(pipecat_service, drive)
    assert not collector.errors(), collector.errors()
    assert collector.text().strip() == "hello pipecat"
    audio = collector.audio()
    assert audio and len(audio) % 2 == 0


async def test_a_spoken_question_is_answered_in_speech(pipecat_service: Stack) -> None:
    async def drive(task: PipelineTask, collector: Collector) -> None:
        await task.queue_frame(mic(1.0, 0.3))
        deadline = asyncio.get_running_loop().time() + 60
        while not collector.answered.is_set():
            assert asyncio.get_running_loop().time() < deadline, "no answer"
            await task.queue_frame(mic(0.1))
            await asyncio.sleep(0.1)

    collector = await run_pipeline(pipecat_service, drive)
    assert not collector.errors(), collector.errors()
    pcm = np.frombuffer(collector.audio(), dtype="<i2")
    assert pcm.size > 12_000 and np.abs(pcm).max() > 1000
    assert collector.text().strip() == REPLY


async def test_barge_in_stops_the_answer(pipecat_service: Stack) -> None:
    """The user speaks over the answer (Pipecat's interruption: it truncates the item being
    played); the server ends that response and no more of its audio comes, though the
    microphone goes on long enough for the rest of it."""

    async def drive(task: PipelineTask, collector: Collector) -> None:
        await task.queue_frame(mic(1.0, 0.3))
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 60
        while not collector.speaking.is_set():
            assert loop.time() < deadline, "no answer"
            await task.queue_frame(mic(0.1))
            await asyncio.sleep(0.1)
        await asyncio.sleep(0.2)  # some of it played
        await task.queue_frame(InterruptionFrame())
        for _ in range(80):  # 8 s of microphone (silence): the whole answer's time
            await task.queue_frame(mic(0.1))
            await asyncio.sleep(0.1)

    collector = await run_pipeline(pipecat_service, drive)
    assert not collector.errors(), collector.errors()
    heard = len(collector.audio()) // 2
    assert 0 < heard < ANSWER_SAMPLES // 2, f"{heard} of {ANSWER_SAMPLES} samples"
    assert len(collector.text()) < len(REPLY) // 2
