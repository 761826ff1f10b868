"""``omniserve doctor``: load the configured backend in this process and prove it serves.

For an operator on a GPU machine with the weights, in one command
(``omniserve doctor --backend minicpmo --model DIR``): load the model, run one chat turn, one
spoken chat turn and ten duplex units of a bundled speech sample (a question, then silence),
and print pass/fail per check with the time to first audio and the real-time factor of every
unit (step time / unit duration: below 1 keeps up with a live speaker). Exit status 0 when
every check passes. Nothing goes through Redis or a gateway: this is the backend alone.
"""

from __future__ import annotations

import json
import logging
import time
import traceback
from dataclasses import asdict, dataclass, field
from importlib import resources
from typing import Any

import numpy as np

from inference import (
    Backend,
    ChatDelta,
    ChatDone,
    ChatRequest,
    DuplexConfig,
    DuplexInput,
    GenerationConfig,
    Message,
    TextPart,
    TTSConfig,
    UnsupportedInput,
    create_backend,
)
from inference.base import INPUT_SAMPLE_RATE, OUTPUT_SAMPLE_RATE
from omnicore.audio import load_voice
from omnicore.settings import Settings

log = logging.getLogger("omniserve.doctor")

SAMPLE = "doctor_speech_16k.wav"  # Piper en_US-joe-medium: a short spoken question
CHAT_PROMPT = "In one short sentence: what is the capital of France?"
SYSTEM_PROMPT = "You are a helpful assistant. Answer briefly."


@dataclass
class Check:
    """One line of the report."""

    name: str
    status: str  # "pass", "fail" or "skip"
    seconds: float = 0.0
    summary: str = ""
    details: dict[str, Any] = field(default_factory=dict)


def bundled_sample() -> np.ndarray:
    """The bundled speech sample, 16 kHz mono float32."""
    return load_voice(resources.files("omniserve").joinpath("data", SAMPLE).read_bytes())


def backend_options(s: Settings) -> dict[str, Any]:
    """The configured backend's constructor options (as a worker would build them)."""
    options: dict[str, Any] = {}
    if s.backend == "minicpmo":
        options = {"model_path": s.model_path, "device": s.device}
    elif s.backend == "llama_omni":
        options = {"backend_url": s.backend_url}
    options.update(s.backend_options)
    return options


def _failed(name: str, t0: float, exc: BaseException) -> Check:
    log.debug("%s failed", name, exc_info=True)
    detail = "".join(traceback.format_exception_only(type(exc), exc)).strip()
    return Check(name, "fail", time.monotonic() - t0, detail)


def check_load(s: Settings) -> tuple[Backend | None, Check]:
    t0 = time.monotonic()
    try:
        backend = create_backend(s.backend, **backend_options(s))
    except Exception as exc:  # noqa: BLE001 - reported as the check's failure
        return None, _failed("load", t0, exc)
    info = backend.info()
    gpu = (info.get("gpu_memory") or {}).get("gpu_memory_allocated_bytes")
    memory = f", GPU memory {gpu / 2**30:.1f} GiB" if gpu else ""
    return backend, Check("load", "pass", time.monotonic() - t0, f"{s.backend}{memory}", info)


def check_chat(backend: Backend, voice: np.ndarray | None, spoken: bool) -> Check:
    """One streaming chat turn, with speech when ``spoken``."""
    name = "spoken chat" if spoken else "chat"
    request = ChatRequest(
        messages=[Message(role="user", content=[TextPart(CHAT_PROMPT)])],
        generation=GenerationConfig(max_new_tokens=64),
        tts=TTSConfig(enabled=spoken, ref_audio=voice if spoken else None),
    )
    t0 = time.monotonic()
    first_text = first_audio = None
    done: ChatDone | None = None
    try:
        for event in backend.chat(request):
            now = time.monotonic() - t0
            if isinstance(event, ChatDelta):
                if event.text and first_text is None:
                    first_text = now
                if event.audio is not None and event.audio.size and first_audio is None:
                    first_audio = now
            elif isinstance(event, ChatDone):
                done = event
    except UnsupportedInput as exc:
        if spoken:  # e.g. a text-only worker
            return Check(name, "skip", time.monotonic() - t0, f"not available: {exc}")
        return _failed(name, t0, exc)
    except Exception as exc:  # noqa: BLE001 - reported as the check's failure
        return _failed(name, t0, exc)
    total = time.monotonic() - t0
    if done is None or not done.text.strip():
        return Check(name, "fail", total, "no answer text")
    details: dict[str, Any] = {"text": done.text, "first_text_s": first_text}
    summary = f"first text {_s(first_text)}, {done.generated_tokens} tokens: {done.text!r}"
    if spoken:
        seconds = 0.0 if done.audio is None else done.audio.size / OUTPUT_SAMPLE_RATE
        if not seconds:
            return Check(name, "fail", total, "no speech in the answer", details)
        details.update(first_audio_s=first_audio, audio_s=seconds, rtf=total / seconds)
        summary = (
            f"first audio {_s(first_audio)}, {seconds:.1f} s of speech, RTF {total / seconds:.2f}"
        )
    return Check(name, "pass", total, summary, details)


def check_duplex(
    backend: Backend, sample: np.ndarray, voice: np.ndarray | None, n_units: int
) -> tuple[Check, Check]:
    """``n_units`` duplex steps over the sample then silence; (duplex check, answered check)."""
    unit = int(backend.unit_samples or INPUT_SAMPLE_RATE)
    unit_s = unit / INPUT_SAMPLE_RATE
    audio = np.zeros(unit * n_units, dtype=np.float32)
    audio[: min(sample.size, audio.size)] = sample[: audio.size]
    speech_units = -(-sample.size // unit)
    rows: list[dict[str, Any]] = []
    t0 = time.monotonic()
    try:
        session = backend.open_duplex()
        try:
            prompt = session.prepare(DuplexConfig(system_prompt=SYSTEM_PROMPT, ref_audio=voice))
            prepare_s = time.monotonic() - t0
            for i in range(n_units):
                t1 = time.monotonic()
                step = session.step(DuplexInput(audio=audio[i * unit : (i + 1) * unit]))
                step_s = time.monotonic() - t1
                out_s = 0.0 if step.audio is None else step.audio.size / OUTPUT_SAMPLE_RATE
                rows.append(
                    {
                        "unit": i + 1,
                        "input": "speech" if i < speech_units else "silence",
                        "output": "listen" if step.listen else "speak",
                        "text": step.text,
                        "audio_s": out_s,
                        "step_s": step_s,
                        "rtf": step_s / unit_s,
                        "kv_cache_length": step.kv_cache_length,
                    }
                )
        finally:
            session.close()
    except Exception as exc:  # noqa: BLE001 - reported as the check's failure
        failed = _failed("duplex", t0, exc)
        failed.details["units"] = rows
        return failed, Check("answered", "fail", 0.0, "the duplex run did not finish")
    total = time.monotonic() - t0
    worst = max(r["rtf"] for r in rows)
    details = {"prompt_length": prompt, "prepare_s": prepare_s, "units": rows, "max_rtf": worst}
    status = "pass" if worst < 1.0 else "fail"
    summary = f"{n_units} units, prepare {_s(prepare_s)}, max RTF {worst:.2f}"
    duplex = Check("duplex", status, total, summary, details)
    spoken = [r for r in rows if r["output"] == "speak"]
    if not spoken:
        return duplex, Check("answered", "fail", 0.0, f"no speech within {n_units} units")
    first = next((r for r in spoken if r["audio_s"]), spoken[0])
    text = "".join(r["text"] for r in spoken)
    after = max(0, first["unit"] - speech_units)
    summary = (
        f"first audio at unit {first['unit']} ({after} s after the question), ready "
        f"{_s(first['step_s'])} after its input; said {text!r}"
    )
    answered = Check("answered", "pass", first["step_s"], summary, {"first_audio": first})
    return duplex, answered


def _s(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds:.3f} s"


def run(s: Settings, n_units: int = 10, voice_path: str | None = None) -> list[Check]:
    """Every check, in order; later ones are skipped when the backend does not load."""
    sample = bundled_sample()
    voice = load_voice(voice_path) if voice_path else sample
    backend, loaded = check_load(s)
    if backend is None:
        return [loaded]
    try:
        checks = [loaded, check_chat(backend, voice, False), check_chat(backend, voice, True)]
        checks.extend(check_duplex(backend, sample, voice, n_units))
        return checks
    finally:
        backend.close()


def report(checks: list[Check]) -> str:
    """The human-readable report."""
    lines = []
    for c in checks:
        lines.append(f"{c.status.upper():5} {c.name:12} {c.seconds:8.3f} s  {c.summary}")
        if c.name == "duplex" and c.details.get("units"):
            lines.append("      unit  input    output  step       RTF   text")
            lines.extend(
                f"      {r['unit']:>4}  {r['input']:<8} {r['output']:<7} "
                f"{r['step_s']:7.3f} s  {r['rtf']:5.2f}  {r['text']}"
                for r in c.details["units"]
            )
    failed = [c.name for c in checks if c.status == "fail"]
    lines.append("result: " + (f"FAIL ({', '.join(failed)})" if failed else "PASS"))
    return "\n".join(lines)


def settings_for(args: Any) -> Settings:
    """The settings (``OMNISERVE_*``) with the command line's backend options on top."""
    from omnicore.settings import get_settings

    overrides = {
        field_name: getattr(args, attr)
        for attr, field_name in (
            ("backend", "backend"),
            ("model", "model_path"),
            ("backend_url", "backend_url"),
            ("device", "device"),
            ("backend_options", "backend_options"),
        )
        if getattr(args, attr, None) is not None
    }
    return get_settings().model_copy(update=overrides)


def cli(args: Any) -> int:
    """``omniserve doctor`` (arguments parsed by omniserve/cli.py)."""
    from omnicore.logs import setup_logging

    setup_logging("info" if args.verbose else "warning")
    return main(settings_for(args), args.units, args.voice, args.json)


def main(s: Settings, n_units: int, voice_path: str | None, as_json: bool) -> int:
    """Run, print, and return the exit status (0: every check passed or was skipped)."""
    if n_units < 1:
        raise ValueError("--units must be at least 1")
    checks = run(s, n_units, voice_path)
    if as_json:
        print(json.dumps([asdict(c) for c in checks], default=str, indent=2))
    else:
        print(report(checks))
    return 1 if any(c.status == "fail" for c in checks) else 0
