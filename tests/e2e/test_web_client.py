"""The browser client (api/web) in a real headless Chromium against the real stack.

Debian's chromium (installed here when missing) runs with fake media devices: the microphone
plays a WAV of synthesised speech ("What is the capital of France?", Piper when the pocket
backend is installed, espeak-ng otherwise) followed by silence, in a loop; the camera is
Chromium's generated test picture. The stack is one gateway and one worker with a single slot
(pocket where installed, scripted otherwise). The tests assert on what the page shows.

Screenshots go to ``OMNISERVE_TEST_SCREENSHOTS`` (default: the test log directory); the README's
pictures are made with ``OMNISERVE_TEST_SCREENSHOTS=docs/img``.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from api.protocol.catalog import catalog, javascript_module
from inference.registry import preflight
from omnicore.audio import read_audio, resample, write_wav
from tests.support.apt import apt_lock
from tests.support.stack import LOG_DIR, ROOT, Stack

pytestmark = [pytest.mark.slow, pytest.mark.browser]

CHROMIUM = Path("/usr/bin/chromium")
QUESTION = "What is the capital of France?"
SCREENSHOTS = Path(os.environ.get("OMNISERVE_TEST_SCREENSHOTS") or LOG_DIR / "web-screenshots")
LOOP_SILENCE_S = 16  # after the question, so a reply is heard out before the question repeats
API_KEY = "web-test-key"
WEB_TESTS = ROOT / "tests" / "web"
AXE = WEB_TESTS / "node_modules" / "axe-core" / "axe.min.js"


def _backend() -> str:
    """pocket where installed, scripted otherwise; OMNISERVE_TEST_WEB_BACKEND picks one."""
    wanted = os.environ.get("OMNISERVE_TEST_WEB_BACKEND")
    if wanted:
        return wanted
    try:
        preflight("pocket")
    except Exception:
        return "scripted"
    return "pocket"


BACKEND = _backend()

# The pocket cascade on two shared cores answers within seconds; these bounds are generous.
ANSWER_TIMEOUT_MS = 180_000
STATE_TIMEOUT_MS = 60_000


# --------------------------------------------------------------------------- setup


def _apt_install(*packages: str) -> None:
    """Install Debian packages (CI starts on a clean machine and runs as root)."""
    if os.geteuid() != 0 or not shutil.which("apt-get"):
        return
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    with apt_lock():
        subprocess.run(
            ["apt-get", "update"], env=env, capture_output=True, timeout=600, check=False
        )
        subprocess.run(
            ["apt-get", "install", "-y", *packages],
            env=env,
            capture_output=True,
            timeout=1800,
            check=False,
        )


def chromium_path() -> Path:
    if not CHROMIUM.exists():
        _apt_install("chromium")
    if not CHROMIUM.exists():
        pytest.skip(
            "Debian's chromium is not installed and could not be installed "
            "(apt-get install chromium needs root and the Debian archive)"
        )
    return CHROMIUM


def synthesise_question(rate: int = 16_000) -> tuple[np.ndarray, str]:
    """The spoken question at ``rate``: Piper's voice when installed, espeak-ng otherwise."""
    if BACKEND == "pocket":
        from inference.pocket.assets import default_piper_voice
        from inference.pocket.tts import Speaker

        speech = Speaker(default_piper_voice()).synthesize(QUESTION, varied=False)
        return resample(speech, 24_000, rate).astype(np.float32), "piper"
    if not shutil.which("espeak-ng"):
        _apt_install("espeak-ng")
    if not shutil.which("espeak-ng"):
        pytest.skip("neither the pocket backend's Piper voice nor espeak-ng is available")
    wav = subprocess.run(
        ["espeak-ng", "--stdout", QUESTION], capture_output=True, check=True, timeout=60
    ).stdout
    samples, sr = read_audio(wav)
    return resample(samples, sr, rate).astype(np.float32), "espeak-ng"


@pytest.fixture(scope="module")
def speech_wav(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """1 s of silence, the question, then silence: what the fake microphone plays (looped)."""
    rate = 16_000
    speech, _voice = synthesise_question(rate)
    silence = np.zeros(rate, dtype=np.float32)
    tail = np.zeros(rate * LOOP_SILENCE_S, dtype=np.float32)
    path = tmp_path_factory.mktemp("web") / "question.wav"
    write_wav(path, np.concatenate([silence, speech, tail]), rate)
    return path


@pytest.fixture(scope="module")
def web_stack(redis_server: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    s = Stack(redis_server)
    try:
        s.start_worker(backend=BACKEND)
        s.start_gateway(
            OMNISERVE_RECORDINGS="true",
            OMNISERVE_RECORDINGS_URL=str(tmp_path_factory.mktemp("recordings")),
        )
        yield s
    finally:
        s.stop()


@pytest.fixture(scope="module")
def browser(speech_wav: Path) -> Iterator[Any]:
    exe = chromium_path()
    sync_api = pytest.importorskip("playwright.sync_api")
    with sync_api.sync_playwright() as p:
        b = p.chromium.launch(
            executable_path=str(exe),
            headless=True,
            args=[
                "--no-sandbox",
                "--disable-gpu",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
                "--use-fake-ui-for-media-stream",
                "--use-fake-device-for-media-stream",
                f"--use-file-for-fake-audio-capture={speech_wav}",
            ],
        )
        try:
            yield b
        finally:
            b.close()


@pytest.fixture
def open_page(browser: Any) -> Iterator[Any]:
    """Open pages in fresh browser contexts; each page's JS errors fail the test."""
    contexts: list[Any] = []
    errors: list[str] = []  # uncaught exceptions and console errors of every page

    def opener(url: str, **context_args: Any) -> Any:
        ctx = browser.new_context(**{"viewport": {"width": 1280, "height": 800}, **context_args})
        contexts.append(ctx)
        page = ctx.new_page()
        page.on("pageerror", lambda exc: errors.append(f"pageerror: {exc}"))
        page.on(
            "console",
            lambda msg: errors.append(f"console: {msg.text}") if msg.type == "error" else None,
        )
        page.goto(url)
        page.wait_for_selector("body[data-ready='true'], body.ops", timeout=STATE_TIMEOUT_MS)
        return page

    yield opener
    for ctx in contexts:
        ctx.close()
    assert not errors, errors


def http(stack: Stack, i: int = 0) -> str:
    return f"http://127.0.0.1:{stack.gateways[i][1]}"


def shot(page: Any, name: str) -> None:
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SCREENSHOTS / name), full_page=True)


def number(page: Any, selector: str) -> float:
    return float(page.inner_text(selector))


def wait_number(page: Any, selector: str, at_least: float, timeout: int) -> None:
    page.wait_for_function(
        "([sel, n]) => Number(document.querySelector(sel).textContent) >= n",
        arg=[selector, at_least],
        timeout=timeout,
    )


def start_duplex(page: Any) -> None:
    page.click("#duplex-start")
    page.wait_for_selector("#state[data-state='active']", timeout=STATE_TIMEOUT_MS)


def stop_duplex(page: Any) -> None:
    page.click("#duplex-stop")
    page.wait_for_selector("#close-reason[data-reason='user_stop']", timeout=STATE_TIMEOUT_MS)


# --------------------------------------------------------------------------- browser tests


def test_audio_duplex_captions_and_speech(web_stack: Stack, open_page: Any) -> None:
    """Microphone in, captions and played speech out, the session's facts on show."""
    page = open_page(f"{http(web_stack)}/?mode=audio")
    assert page.inner_text("#duplex-title") == "Audio duplex"
    frames = record_frames(page)
    start_duplex(page)
    page.wait_for_selector(f"#backend[data-backend='{BACKEND}']", timeout=STATE_TIMEOUT_MS)
    # captions arrive from the model's text deltas
    page.wait_for_function(
        "document.querySelector('#captions').textContent.trim().length > 0",
        timeout=ANSWER_TIMEOUT_MS,
    )
    # the 24 kHz speech went through the player worklet to the audio output, all of it: the
    # listen after a finished answer does not cut it short
    wait_number(page, "#audio-received", 1.0, ANSWER_TIMEOUT_MS)
    try:
        page.wait_for_function(
            "Number(document.querySelector('#audio-played').textContent) >= "
            "Number(document.querySelector('#audio-received').textContent) - 0.2",
            timeout=STATE_TIMEOUT_MS,
        )
    except Exception as exc:
        raise AssertionError(
            f"played {page.inner_text('#audio-played')} s of "
            f"{page.inner_text('#audio-received')} s; player "
            f"{page.evaluate('({...document.querySelector(`#audio-played`).dataset})')}; "
            f"output: {output_summary(frames)}"
        ) from exc
    wait_number(page, "#audio-played", 1.0, STATE_TIMEOUT_MS)
    captions = page.inner_text("#captions")
    heard = page.locator("#captions .caption.user")
    if BACKEND == "pocket":
        assert "paris" in captions.lower(), captions
        # what the backend heard is the user's line, before the answer's caption
        assert "capital of france" in heard.first.inner_text().lower(), captions
        assert page.locator("#captions .caption.user + .caption:not(.user)").count() >= 1
    else:
        assert "Hello from the scripted backend." in captions
        assert heard.count() == 0  # a backend that does not transcribe names nothing
    assert number(page, "#chunks-sent") >= 2
    assert number(page, "#frames-sent") == 0
    assert "tokens" in page.inner_text("#kv-text")
    assert page.locator("#notice").is_hidden()
    shot(page, "audio-duplex.png")
    stop_duplex(page)
    assert page.inner_text("#close-reason") == "You ended the session."
    assert page.locator("input[name='mode']:disabled").count() == 0  # the picker is free again


def test_chat_turn_text_speech_and_voice_message(web_stack: Stack, open_page: Any) -> None:
    """A typed question gets a streamed, spoken answer; a held-to-talk question gets one too."""
    page = open_page(f"{http(web_stack)}/?mode=chat")
    assert page.is_checked("#tts") and page.is_checked("#streaming")
    page.fill("#chat-text", QUESTION)
    page.press("#chat-text", "Enter")
    answer = page.locator(".bubble.assistant").nth(0)
    answer.locator(".meta:not(:empty)").wait_for(timeout=ANSWER_TIMEOUT_MS)
    text = answer.locator(".text").inner_text()
    if BACKEND == "pocket":
        assert "paris" in text.lower(), text
    else:
        assert text == f"You said: {QUESTION}"
    assert BACKEND in answer.locator(".meta").inner_text()
    wait_number(page, "#chat-played", 0.3, ANSWER_TIMEOUT_MS)
    assert page.inner_text("#state") == "Session active"

    # hold to talk: the fake microphone restarts its file, so 5 s hold the whole question
    talk = page.locator("#chat-talk")
    talk.focus()
    page.keyboard.down(" ")
    page.wait_for_selector("#chat-talk[aria-pressed='true']")
    page.wait_for_timeout(5_000)  # the length of the recording, not a wait for the server
    page.keyboard.up(" ")
    voice = page.locator(".bubble.user").nth(1)
    voice.wait_for(timeout=STATE_TIMEOUT_MS)
    assert "Voice message" in voice.inner_text()
    second = page.locator(".bubble.assistant").nth(1)
    second.locator(".meta:not(:empty)").wait_for(timeout=ANSWER_TIMEOUT_MS)
    reply = second.locator(".text").inner_text()
    assert reply.strip(), "an empty answer to the voice message"
    if BACKEND == "pocket":
        assert "paris" in reply.lower(), reply
        # the voice message's line shows what was heard; its label stays beside it
        assert "capital of france" in voice.locator(".text").inner_text().lower()
        assert "Voice message" in voice.locator(".meta").inner_text()
    assert not page.locator(".bubble.failed").count()
    shot(page, "chat.png")
    page.click("#chat-end")
    page.wait_for_selector("#close-reason[data-reason='user_stop']", timeout=STATE_TIMEOUT_MS)


def test_switching_modes_clears_the_ended_session(web_stack: Stack, open_page: Any) -> None:
    """The chat session a mode switch ends does not leave "Session ended" on the new mode."""
    page = open_page(f"{http(web_stack)}/?mode=chat")
    page.fill("#chat-text", QUESTION)
    page.press("#chat-text", "Enter")
    page.locator(".bubble.assistant .meta:not(:empty)").wait_for(timeout=ANSWER_TIMEOUT_MS)
    assert page.inner_text("#state") == "Session active"
    page.click("label[for=mode-audio]")  # ends the chat session
    # the chat view saw its session close (after the status panel's own handler of that event)
    page.wait_for_selector("#chat-end:disabled", state="attached", timeout=STATE_TIMEOUT_MS)
    assert page.text_content("#state") == "Not connected"
    assert page.text_content("#close-reason") == "—"
    assert not page.get_attribute("#close-reason", "data-reason")
    shot(page, "mode-switch.png")
    # a duplex session started now shows its own state and, when stopped, its own ending
    start_duplex(page)
    stop_duplex(page)
    assert page.inner_text("#close-reason") == "You ended the session."


def test_operator_page_shows_a_recording(web_stack: Stack, open_page: Any) -> None:
    """A /ws/chat request is recorded; the operator page lists it and shows its transcript."""
    from websockets.sync.client import connect

    with connect(f"{web_stack.url()}/ws/chat", max_size=None) as ws:
        ws.send(json.dumps({"messages": [{"role": "user", "content": QUESTION}]}))
        while True:
            frame = json.loads(ws.recv(timeout=ANSWER_TIMEOUT_MS / 1000))
            if frame["type"] in ("done", "error"):
                break
    assert frame["type"] == "done", frame
    page = open_page(f"{http(web_stack)}/ops")
    button = page.locator(f"#recordings button:has-text('{frame['recording_session_id']}')")
    button.wait_for(timeout=STATE_TIMEOUT_MS)
    button.click()
    page.wait_for_selector("#recording:not([hidden])")
    shown = page.inner_text("#recording-body")
    assert f"user: {QUESTION}" in shown and f"assistant: {frame['text']}" in shown
    assert "output.wav" in shown and '"close_reason": "done"' in shown  # files and metadata
    assert page.is_visible("#recording-play") and page.is_visible("#recording-zip")


def test_chat_image_attachment(web_stack: Stack, open_page: Any, tmp_path: Path) -> None:
    """An attached image goes with the text; a backend that cannot see says so in a sentence."""
    from PIL import Image

    picture = tmp_path / "red.png"
    Image.new("RGB", (32, 24), (200, 30, 30)).save(picture)
    page = open_page(f"{http(web_stack)}/?mode=chat")
    page.set_input_files("#chat-image", str(picture))
    assert page.inner_text("#chat-image-name") == "red.png"
    page.fill("#chat-text", "What is this?")
    page.click("#chat-send")
    assert page.locator(".bubble.user .text").inner_text() == "What is this? [image: red.png]"
    answer = page.locator(".bubble.assistant")
    if BACKEND == "pocket":  # no vision: refused with invalid_payload, shown as a sentence
        page.wait_for_selector(".bubble.assistant.failed", timeout=ANSWER_TIMEOUT_MS)
        text = answer.locator(".text").inner_text()
        assert text.startswith("The server refused this request:") and "see" in text, text
    else:
        answer.locator(".meta:not(:empty)").wait_for(timeout=ANSWER_TIMEOUT_MS)
        assert answer.locator(".text").inner_text() == "You said: What is this?"
    assert not page.is_disabled("#chat-send")  # the conversation goes on


def test_queue_position_shows_while_the_only_worker_is_busy(
    web_stack: Stack, open_page: Any
) -> None:
    """A second user waits with a position and an estimate, then gets the slot."""
    first = open_page(f"{http(web_stack)}/?mode=audio")
    start_duplex(first)
    second = open_page(f"{http(web_stack)}/?mode=audio")
    second.click("#duplex-start")
    second.wait_for_selector("#queue:not([hidden])", timeout=STATE_TIMEOUT_MS)
    assert second.inner_text("#queue-position") == "1"
    assert second.get_attribute("#state", "data-state") == "queued"
    assert second.inner_text("#queue-wait").endswith(("s", "min"))
    shot(second, "queued.png")

    ops = open_page(f"{http(web_stack)}/ops")
    ops.wait_for_selector("body[data-loaded='true']", timeout=STATE_TIMEOUT_MS)
    ops.wait_for_selector(".slot[data-state='busy']", timeout=STATE_TIMEOUT_MS)
    ops.wait_for_function(
        "document.querySelector('#tickets').textContent.includes('ticket_')",
        timeout=STATE_TIMEOUT_MS,
    )
    assert ops.inner_text("#queue-length") == "1"
    assert "audio" in ops.inner_text("#sessions")
    shot(ops, "ops.png")

    stop_duplex(first)
    second.wait_for_selector("#state[data-state='active']", timeout=STATE_TIMEOUT_MS)
    assert second.locator("#queue").is_hidden()
    stop_duplex(second)


def record_frames(page: Any) -> list[tuple[str, dict[str, Any]]]:
    """Every WebSocket frame the page sends ("out") or receives ("in"), in order, as JSON."""
    log: list[tuple[str, dict[str, Any]]] = []

    def on_socket(ws: Any) -> None:
        ws.on("framesent", lambda payload: log.append(("out", json.loads(payload))))
        ws.on("framereceived", lambda payload: log.append(("in", json.loads(payload))))

    page.on("websocket", on_socket)
    return log


def output_summary(frames: list[tuple[str, dict[str, Any]]]) -> list[str]:
    """The duplex output a page received, one short line per delta (for failure messages)."""
    out = []
    for direction, f in frames:
        if direction != "in" or f.get("type") != "response.output.delta":
            continue
        size = len(base64.b64decode(f["audio"])) // 4 if f.get("audio") else 0
        end = (f.get("metrics") or {}).get("end_of_turn")
        out.append(
            f"{f['kind']} {f.get('input_id')} end={end} samples={size} {f.get('text', '')!r}"
        )
    return out


def test_wire_frames_follow_the_spec(web_stack: Stack, open_page: Any) -> None:
    """What the page puts on the wire: init only after queue_done, one second of 16 kHz float32
    per input.append, and force_listen on the chunk after Interrupt."""
    page = open_page(f"{http(web_stack)}/?mode=audio")
    frames = record_frames(page)
    start_duplex(page)
    wait_number(page, "#chunks-sent", 2, STATE_TIMEOUT_MS)
    sent_before = number(page, "#chunks-sent")
    page.click("#duplex-interrupt")
    wait_number(page, "#chunks-sent", sent_before + 2, STATE_TIMEOUT_MS)
    stop_duplex(page)

    kinds = [(d, f.get("type")) for d, f in frames]
    assert kinds.index(("in", "session.queue_done")) < kinds.index(("out", "session.init"))
    assert kinds.index(("in", "session.created")) < kinds.index(("out", "input.append"))
    appends = [f["input"] for d, f in frames if d == "out" and f["type"] == "input.append"]
    for chunk in appends:
        pcm = np.frombuffer(base64.b64decode(chunk["audio"]), dtype="<f4")
        assert pcm.size == 16_000 and np.isfinite(pcm).all()
        assert "video_frames" not in chunk
    assert [c.get("force_listen", False) for c in appends].count(True) == 1
    forced = next(i for i, c in enumerate(appends) if c.get("force_listen"))
    assert forced >= 2  # sent with a chunk after the click, not before
    heard = np.concatenate(
        [np.frombuffer(base64.b64decode(c["audio"]), dtype="<f4") for c in appends]
    )
    assert float(np.sqrt(np.mean(heard**2))) > 0.005  # the fake microphone's speech got through
    assert ("out", "session.close") in kinds


def test_video_duplex_sends_camera_frames(
    web_stack: Stack, open_page: Any, speech_wav: Path
) -> None:
    """Video mode previews the camera and sends a JPEG frame with every audio chunk; a reference
    voice file goes with the init (the gateway validates it)."""
    page = open_page(f"{http(web_stack)}/?mode=video")
    assert page.inner_text("#duplex-title") == "Video duplex"
    page.set_input_files("#voice-file", str(speech_wav))
    page.wait_for_function(
        "document.querySelector('#voice-info').textContent.startsWith('question.wav, ')"
    )
    frames = record_frames(page)
    start_duplex(page)
    page.wait_for_function(
        "document.querySelector('#camera-preview').videoWidth > 0", timeout=STATE_TIMEOUT_MS
    )
    wait_number(page, "#frames-sent", 3, STATE_TIMEOUT_MS)
    assert number(page, "#frames-sent") <= number(page, "#chunks-sent")
    page.wait_for_function(
        "document.querySelector('#captions').textContent.trim().length > 0",
        timeout=ANSWER_TIMEOUT_MS,
    )
    assert page.locator("#notice").is_hidden()  # the gateway accepted every frame
    shot(page, "video-duplex.png")
    stop_duplex(page)
    init = next(f for d, f in frames if d == "out" and f["type"] == "session.init")
    voice = np.frombuffer(base64.b64decode(init["payload"]["voice"]["ref_audio_base64"]), "<f4")
    assert abs(voice.size / 16_000 - (1 + LOOP_SILENCE_S + 1.5)) < 2.5  # the file, at 16 kHz
    jpegs = [
        j
        for d, f in frames
        if d == "out" and f["type"] == "input.append"
        for j in f["input"].get("video_frames", [])
    ]
    assert jpegs and all(base64.b64decode(j)[:2] == b"\xff\xd8" for j in jpegs)


def test_phone_screen_and_keyboard(web_stack: Stack, open_page: Any) -> None:
    """The page fits a phone's width, and the mode picker works from the keyboard."""
    page = open_page(
        f"{http(web_stack)}/?mode=chat",
        viewport={"width": 390, "height": 844},
        device_scale_factor=2,
        is_mobile=True,
        has_touch=True,
    )
    width = page.evaluate("document.documentElement.scrollWidth")
    assert width <= 390, f"the page is {width}px wide on a 390px screen"
    page.focus("#mode-chat")
    page.keyboard.press("ArrowRight")
    assert page.is_checked("#mode-audio")
    page.wait_for_selector("#duplex-panel:not([hidden])")
    assert page.locator("#chat-panel").is_hidden()
    for control in ("#duplex-start", "#api-key", "#system-prompt", "#voice-file"):
        label = page.evaluate(
            "(sel) => { const el = document.querySelector(sel); return el.labels?.[0]"
            "?.textContent || el.getAttribute('aria-label') || el.textContent; }",
            control,
        )
        assert label and label.strip(), f"{control} has no accessible name"
    page.keyboard.press("ArrowLeft")
    shot(page, "phone.png")


def test_api_key_refused_then_accepted(web_stack: Stack, open_page: Any) -> None:
    """Against a gateway that requires a key: a clear refusal without it, a session with it."""
    web_stack.start_gateway(OMNISERVE_API_KEYS=f'["{API_KEY}"]')
    page = open_page(f"{http(web_stack, len(web_stack.gateways) - 1)}/?mode=chat")
    assert page.locator("#api-key-hint").is_visible()
    page.fill("#chat-text", "Reply with exactly: yes")
    page.press("#chat-text", "Enter")
    page.wait_for_selector("#notice[data-code='unauthorized']", timeout=STATE_TIMEOUT_MS)
    assert "API key" in page.inner_text("#notice")
    page.wait_for_selector(".bubble.assistant.failed", timeout=STATE_TIMEOUT_MS)
    page.wait_for_selector("#close-reason[data-reason='unauthorized']", timeout=STATE_TIMEOUT_MS)
    assert page.inner_text("#close-reason") == "The server refused the API key."
    page.fill("#api-key", API_KEY)
    page.fill("#chat-text", "Reply with exactly: yes")
    page.press("#chat-text", "Enter")
    answer = page.locator(".bubble.assistant").nth(1)
    answer.locator(".meta:not(:empty)").wait_for(timeout=ANSWER_TIMEOUT_MS)
    assert answer.locator(".text").inner_text().strip()
    assert page.inner_text("#state") == "Session active"


def test_dropped_connection_without_resume_ends_clearly(web_stack: Stack, open_page: Any) -> None:
    """A server that offers no resume token (resume off): a gateway killed mid-session ends
    the session with a sentence, no reconnection is tried, and the worker slot comes back."""
    port = web_stack.start_gateway(OMNISERVE_RESUME_GRACE_S="0")
    proc = web_stack.gateways[-1][0]
    page = open_page(f"http://127.0.0.1:{port}/?mode=audio")
    start_duplex(page)
    page.evaluate(
        """() => { window.seenStates = [];
        new MutationObserver(() => window.seenStates.push(
            document.querySelector('#state').dataset.state))
          .observe(document.querySelector('#state'), {attributes: true}); }"""
    )
    proc.stop(signal.SIGKILL)
    page.wait_for_selector("#state[data-state='closed']", timeout=STATE_TIMEOUT_MS)
    assert page.get_attribute("#close-reason", "data-reason") == "connection_lost"
    assert "connection to the server was lost" in page.inner_text("#close-reason")
    assert "reconnecting" not in page.evaluate("window.seenStates")
    assert not page.is_disabled("#duplex-start")
    web_stack.wait_free(1, timeout=30)  # the worker saw its gateway die and ended the session


class ResumingServer:
    """The server side of session resume exactly as docs/PROTOCOL.md specifies it, played through
    Playwright's WebSocket routing, so the page's half is checked against the specified exchange
    with every answer on cue (the gateway's half: tests/e2e/test_resume.py). ``answer`` is what the
    second connection gets for ``session.resume``: ``resumed`` or an error code."""

    SESSION = "rt_1714200000000_resume"

    def __init__(self, answer: str = "resumed") -> None:
        self.answer = answer
        self.connections = 0
        self.resume_requests: list[dict[str, Any]] = []

    def __call__(self, ws: Any) -> None:
        self.connections += 1
        n = self.connections
        ws.on_message(lambda raw: self.on_message(ws, n, json.loads(raw)))
        if n == 1:
            self.send(ws, {"type": "session.queue_done", "session_id": self.SESSION})

    @staticmethod
    def send(ws: Any, event: dict[str, Any]) -> None:
        ws.send(json.dumps(event))

    def delta(self, seq: int, text: str, end: bool = False) -> dict[str, Any]:
        return {
            "type": "response.output.delta",
            "kind": "text",
            "session_id": self.SESSION,
            "response_id": "resp_1",
            "input_id": f"input_{seq}",
            "text": text,
            "metrics": {"kv_cache_length": 100 + seq, "end_of_turn": end},
            "seq": seq,
        }

    def on_message(self, ws: Any, n: int, ev: dict[str, Any]) -> None:
        kind = ev.get("type")
        if n == 1 and kind == "session.init":
            self.send(
                ws,
                {
                    "type": "session.created",
                    "session_id": self.SESSION,
                    "mode": "full_duplex",
                    "prompt_length": 64,
                    "metrics": {"backend": "scripted"},
                    "resume_token": "token-1",
                    "seq": 1,
                },
            )
            self.send(ws, self.delta(2, "Hello"))
            ws.close(code=1012, reason="network blip")  # seq 3 and 4 are produced meanwhile
        elif n >= 2 and kind == "session.resume":
            self.resume_requests.append(ev)
            if self.answer != "resumed":
                err = {"code": self.answer, "message": "cannot resume", "type": "client_error"}
                self.send(ws, {"type": "error", "error": err})
                ws.close(code=1008)
                return
            self.send(
                ws,
                {"type": "session.resumed", "session_id": self.SESSION, "resume_token": "token-2"},
            )
            for seq, text in ((3, " there"), (4, " again.")):
                self.send(ws, self.delta(seq, text, end=seq == 4))
        elif kind == "session.close":
            self.send(
                ws,
                {
                    "type": "session.closed",
                    "session_id": self.SESSION,
                    "reason": "user_stop",
                    "seq": 5,
                },
            )
            ws.close(code=1000)


def test_resume_after_a_dropped_connection(open_page: Any, web_stack: Stack) -> None:
    """With a resume token the client reopens the same mode, sends session.resume with the last
    seq it saw, and shows the replayed output once, in order."""
    server = ResumingServer()
    page = open_page(f"{http(web_stack)}/?mode=audio")
    page.route_web_socket("**/v1/realtime?mode=audio*", server)
    start_duplex(page)
    page.wait_for_function(
        "document.querySelector('#captions').textContent === 'Hello there again.'",
        timeout=STATE_TIMEOUT_MS,
    )
    assert server.connections == 2
    assert server.resume_requests == [
        {
            "type": "session.resume",
            "session_id": ResumingServer.SESSION,
            "resume_token": "token-1",
            "last_seq": 2,
        }
    ]
    assert page.get_attribute("#state", "data-state") == "active"
    assert page.inner_text("#kv-text").startswith("104 ")
    stop_duplex(page)


def test_resume_refused_ends_the_session_with_a_sentence(open_page: Any, web_stack: Stack) -> None:
    server = ResumingServer(answer="resume_expired")
    page = open_page(f"{http(web_stack)}/?mode=audio")
    page.route_web_socket("**/v1/realtime?mode=audio*", server)
    page.click("#duplex-start")  # active, dropped, refused: it ends in "closed"
    page.wait_for_selector("#state[data-state='closed']", timeout=STATE_TIMEOUT_MS)
    assert page.get_attribute("#close-reason", "data-reason") == "resume_failed"
    assert page.get_attribute("#notice", "data-code") == "resume_expired"
    assert "could not be resumed" in page.inner_text("#close-reason")
    assert len(server.resume_requests) == 1  # it does not retry a refused resume


def axe_script() -> Path:
    """axe-core (the accessibility rules engine), installed from tests/web/package-lock.json."""
    npm = shutil.which("npm")
    if not AXE.exists() and npm:
        subprocess.run(
            [npm, "ci", "--no-audit", "--no-fund"],
            cwd=WEB_TESTS,
            capture_output=True,
            timeout=600,
            check=False,
        )
    if not AXE.exists():
        pytest.skip("axe-core could not be installed with npm ci in tests/web")
    return AXE


@pytest.mark.parametrize("path", ["/?mode=chat", "/?mode=audio", "/?mode=video", "/ops"])
def test_pages_pass_an_accessibility_audit(web_stack: Stack, open_page: Any, path: str) -> None:
    """axe-core finds no violation (labels, roles, contrast, names, landmarks) on any page."""
    axe = axe_script()
    page = open_page(f"{http(web_stack)}{path}")
    if path == "/ops":
        page.wait_for_selector("body[data-loaded='true']", timeout=STATE_TIMEOUT_MS)
    page.add_script_tag(path=str(axe))
    violations = page.evaluate(
        """async () => (await axe.run()).violations.map((v) =>
            `${v.id} (${v.impact}): ${v.help} at ${v.nodes.map((n) => n.target.join(" "))}`)"""
    )
    assert violations == []


def test_finished_answers_play_out_and_cut_ones_are_flushed(
    open_page: Any, web_stack: Stack
) -> None:
    """The listen rule, on output shaped as omniserve sends it (docs/PROTOCOL.md): listens after
    a finished answer let it play out; a listen while an answer is unfinished flushes it."""
    routes: list[Any] = []
    sid = "rt_1714200000000_playback"

    def on_message(ws: Any, ev: dict[str, Any]) -> None:
        if ev["type"] == "session.init":
            created = {"type": "session.created", "session_id": sid, "mode": "full_duplex"}
            ws.send(json.dumps({**created, "prompt_length": 32, "metrics": {}}))
        elif ev["type"] == "session.close":
            ws.send(
                json.dumps({"type": "session.closed", "session_id": sid, "reason": "user_stop"})
            )
            ws.close(code=1000)

    def handler(ws: Any) -> None:
        routes.append(ws)
        ws.on_message(lambda raw: on_message(ws, json.loads(raw)))
        ws.send(json.dumps({"type": "session.queue_done", "session_id": sid}))

    def delta(
        kind: str, n: int, end: bool | None = None, interrupted: bool = False, **fields: Any
    ) -> str:
        metrics: dict[str, Any] = {"kv_cache_length": 40 + n}
        if end is not None:
            metrics["end_of_turn"] = end
        if interrupted:
            metrics["interrupted"] = True
        frame = {"type": "response.output.delta", "kind": kind, "session_id": sid}
        return json.dumps({**frame, "input_id": f"input_{n}", "metrics": metrics, **fields})

    def tone(seconds: float) -> str:
        t = np.arange(int(24_000 * seconds)) / 24_000
        return base64.b64encode((0.2 * np.sin(2 * np.pi * 330 * t)).astype("<f4")).decode()

    page = open_page(f"{http(web_stack)}/?mode=audio")
    page.route_web_socket("**/v1/realtime?mode=audio*", handler)
    start_duplex(page)
    (ws,) = routes
    # a finished answer (2 s, all sent at once, as a faster-than-real-time backend does) and
    # three listens right after it
    ws.send(delta("text", 5, False, text="One.", response_id="resp_a"))
    ws.send(delta("audio", 5, False, audio=tone(1.0), response_id="resp_a"))
    ws.send(delta("audio", 6, True, audio=tone(1.0), response_id="resp_a"))
    for n in (7, 8, 9):
        ws.send(delta("listen", n, text=""))
    page.wait_for_function(
        "Number(document.querySelector('#audio-played').textContent) >= 1.95",
        timeout=STATE_TIMEOUT_MS,
    )
    assert page.get_attribute("#audio-played", "data-flushes") == "0"
    # an unfinished answer (3 s queued) cut short by a listen
    ws.send(delta("text", 10, False, text=" Two", response_id="resp_b"))
    ws.send(delta("audio", 10, False, audio=tone(3.0), response_id="resp_b"))
    ws.send(delta("listen", 11, text=""))
    page.wait_for_selector("#audio-played[data-flushes='1']", timeout=STATE_TIMEOUT_MS)
    assert page.get_attribute("#audio-played", "data-last-flush").startswith(
        "listen input_11 after audio input_10"
    )
    page.wait_for_selector("#audio-played[data-queued='0.00']", timeout=STATE_TIMEOUT_MS)
    assert number(page, "#audio-received") == 5.0
    assert number(page, "#audio-played") < 4.0  # most of the cut answer was dropped
    # an answer cut short by force_listen: its flush delta (end_of_turn, interrupted, naming the
    # input of its last step) does not count as finished; the listen after it flushes
    ws.send(delta("text", 12, False, text=" Three", response_id="resp_c"))
    ws.send(delta("audio", 12, False, audio=tone(2.0), response_id="resp_c"))
    ws.send(delta("audio", 12, True, audio=tone(0.5), response_id="resp_c", interrupted=True))
    ws.send(delta("listen", 13, text=""))
    page.wait_for_selector("#audio-played[data-flushes='2']", timeout=STATE_TIMEOUT_MS)
    assert page.get_attribute("#audio-played", "data-last-flush").startswith(
        "listen input_13 after audio input_12 end=true"
    )
    captions = page.locator("#captions .caption").all_inner_texts()
    assert [c.strip() for c in captions] == ["One.", "Two", "Three"]
    stop_duplex(page)


# --------------------------------------------------------------------------- HTTP and JS units


def test_pages_assets_and_json_endpoints(web_stack: Stack) -> None:
    base = http(web_stack)
    index = httpx.get(f"{base}/")
    assert index.status_code == 200 and "text/html" in index.headers["content-type"]
    assert 'src="/web/app.js"' in index.text
    assert "http://" not in index.text and "https://" not in index.text  # no other host
    assert httpx.get(f"{base}/ops").status_code == 200
    js = httpx.get(f"{base}/web/worklets/player.js")
    assert js.status_code == 200 and "javascript" in js.headers["content-type"]
    assert httpx.get(f"{base}/web/%2e%2e/pages.py").status_code == 404
    protocol = httpx.get(f"{base}/web/protocol.js")  # the names the client imports
    assert protocol.status_code == 200 and "javascript" in protocol.headers["content-type"]
    assert protocol.text == javascript_module()
    assert httpx.get(f"{base}/v1/protocol").json() == catalog()
    config = httpx.get(f"{base}/web/config").json()
    assert config["duration_limits_s"] == {"chat": 600.0, "video": 300.0, "audio": 600.0}
    assert config["context_tokens"] == 8192 and config["api_key_required"] is False
    overview = httpx.get(f"{base}/v1/admin/overview").json()
    (worker,) = overview["workers"]
    assert worker["alive"] and worker["slot_states"][0]["state"] in ("idle", "busy")
    assert overview["queue"]["live_slots"] == 1
    assert overview["recordings"]["enabled"] is True
    assert httpx.get(f"{base}/v1/recordings/chat_123").status_code == 404


def test_web_assets_load_nothing_from_another_host() -> None:
    for path in (ROOT / "api" / "web").rglob("*"):
        if path.suffix in {".html", ".js", ".css"}:
            text = path.read_text()
            for needle in ("http://", "https://", "//cdn", "fonts.googleapis"):
                assert needle not in text, f"{path.name} refers to another host ({needle})"


def test_pcm_and_resampler_units() -> None:
    """api/web/pcm.js under node's test runner (base64 PCM, band-limited resampling)."""
    node = shutil.which("node")
    if not node:
        pytest.skip("node is not installed")
    proc = subprocess.run(
        [node, "--test", str(ROOT / "tests" / "web" / "pcm.test.mjs")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "# fail 0" in proc.stdout
