"""Where the published revisions of the model's remote code differ, and how each is driven.

Three shapes of the duplex wrapper exist (see docs/BACKENDS.md for the files read):

- the model repository's ``MiniCPMODuplex`` (``as_duplex`` -> ``from_existing_model``):
  ``prepare(prefix_system_prompt, ref_audio, prompt_wav_path, **kwargs)`` takes the raw
  system text and wraps it in chat markup itself; ``streaming_generate`` finishes the unit;
- revisions with a deferred finish: ``streaming_generate(..., length_penalty,
  force_listen_override)`` then ``finalize_unit()`` before the next ``streaming_prefill``
  (which refuses to run otherwise); a forced listen there closes the speaking turn itself;
- the MiniCPM-o-Demo's copy, whose ``prepare`` has an explicit ``suffix_system_prompt`` and
  takes the markup from its caller.

Everything here decides from the signatures and attributes it finds; nothing guesses from a
version string.
"""

from __future__ import annotations

import contextlib
import importlib
import inspect
import logging
import tempfile
from collections.abc import Callable, Iterator, Sequence
from typing import Any

log = logging.getLogger("omniserve.inference.minicpmo")

#: the model attributes that configure its streaming audio front end; ``from_existing_model``
#: overwrites them with the duplex values (``CNN_REDUNDANCY_MS`` 20 instead of 0)
STREAM_CONSTANTS = ("SAMPLE_RATE", "CHUNK_MS", "FIRST_CHUNK_MS", "CNN_REDUNDANCY_MS")

#: the chat markup of a system turn, as the remote code builds it
SYSTEM_PREFIX = "<|im_start|>system\n"
AUDIO_START = "\n<|audio_start|>"
SYSTEM_SUFFIX = "<|im_end|>"
AUDIO_SUFFIX = "<|audio_end|><|im_end|>"


# --------------------------------------------------------------------------- signatures


def _parameters(fn: Callable[..., Any]) -> dict[str, inspect.Parameter] | None:
    try:
        return dict(inspect.signature(fn).parameters)
    except (TypeError, ValueError):
        return None


def explicit(fn: Callable[..., Any], name: str) -> bool:
    """Whether ``fn`` names parameter ``name`` (``**kwargs`` does not count)."""
    params = _parameters(fn)
    return params is not None and name in params


def accepts(fn: Callable[..., Any], name: str) -> bool:
    """Whether ``fn`` can be called with keyword ``name`` (named, or through ``**kwargs``)."""
    params = _parameters(fn)
    if params is None or name in params:
        return True
    return any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())


def call(fn: Callable[..., Any], /, **kwargs: Any) -> Any:
    """Call ``fn`` with the keyword arguments it accepts; log the ones left out.

    A ``**kwargs`` catch-all accepts everything (``chat`` passes it on to generation,
    ``as_duplex`` reads its duplex parameters from it).
    """
    params = _parameters(fn)
    if params is None or any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return fn(**kwargs)
    taken = {k: v for k, v in kwargs.items() if k in params}
    dropped = sorted(set(kwargs) - set(taken))
    if dropped:
        log.debug("%s does not take %s; not passed", getattr(fn, "__qualname__", fn), dropped)
    return fn(**taken)


def resolve_loader(loader: Callable[..., Any] | str | None) -> Callable[..., Any] | None:
    """A loader callable from a callable or a ``"package.module:function"`` string."""
    if loader is None or callable(loader):
        return loader
    if isinstance(loader, str):
        module_name, sep, attr = loader.partition(":")
        if not sep or not module_name or not attr:
            raise ValueError(f"model_loader must be 'package.module:function', got {loader!r}")
        fn: object = getattr(importlib.import_module(module_name), attr)
        if not callable(fn):
            raise TypeError(f"model_loader {loader!r} is not callable")
        return fn
    raise TypeError("model_loader must be a callable or a 'module:function' string")


# --------------------------------------------------------------------------- the system prompt

#: what the model's own ``prepare`` puts before earlier content it carries into a new window
#: (its ``context_previous_marker`` default), where a revision does not name it
PREVIOUS_MARKER = "\n\nprevious: "


def previous_marker(prepare: Callable[..., Any]) -> str:
    """The wrapper's marker of earlier content: its ``prepare``'s ``context_previous_marker``
    default, else the model's usual one."""
    param = (_parameters(prepare) or {}).get("context_previous_marker")
    if param is not None and isinstance(param.default, str) and param.default:
        return param.default
    return PREVIOUS_MARKER


def primed_text(
    prepare: Callable[..., Any], system: str, previous: Sequence[tuple[str, str]]
) -> str:
    """The system text of a session that continues an earlier one (a rollover, a failover).

    The earlier conversation follows the system prompt behind the model's own marker, as the
    model lays out content it carries across a sliding window: ``system + marker + content``.
    ``previous`` is (role, text), oldest first; what the model said alone reads as its text, a
    conversation with the user's words (a transcribing front end) as labelled lines.
    """
    if not previous:
        return system
    if all(role == "assistant" for role, _ in previous):
        content = " ".join(text for _, text in previous)
    else:
        content = "\n".join(
            f"{'User' if role == 'user' else 'Assistant'}: {text}" for role, text in previous
        )
    return system + previous_marker(prepare) + content


def prepare_kwargs(
    prepare: Callable[..., Any], text: str, with_voice: bool, prompt_format: str = "auto"
) -> dict[str, Any]:
    """The system-prompt arguments of ``prepare``: the raw text, or the markup around it.

    ``auto``: a ``prepare`` that names ``suffix_system_prompt`` takes the markup from its
    caller (the demo's copy); one that does not wraps the text itself, so it gets it raw -
    wrapping it here too would put ``<|im_start|>system`` into the prompt twice.
    """
    if prompt_format == "auto":
        prompt_format = "wrapped" if explicit(prepare, "suffix_system_prompt") else "raw"
    if prompt_format == "raw":
        return {"prefix_system_prompt": text}
    if with_voice:
        return {
            "prefix_system_prompt": SYSTEM_PREFIX + text + AUDIO_START,
            "suffix_system_prompt": AUDIO_SUFFIX,
        }
    return {"prefix_system_prompt": SYSTEM_PREFIX + text, "suffix_system_prompt": SYSTEM_SUFFIX}


# --------------------------------------------------------------------------- model state


def stream_constants(model: Any) -> dict[str, Any]:
    """The model's streaming audio constants (those it has)."""
    return {name: getattr(model, name) for name in STREAM_CONSTANTS if hasattr(model, name)}


def apply_stream_constants(model: Any, values: dict[str, Any]) -> None:
    """Put back a set of streaming constants taken by ``stream_constants``."""
    for name, value in values.items():
        setattr(model, name, value)


@contextlib.contextmanager
def without_method(obj: Any, name: str) -> Iterator[None]:
    """Make ``obj.<name>()`` a no-op for the duration of the block (instance attribute).

    ``from_existing_model`` calls ``model.init_tts()`` unconditionally; on a model loaded
    without its TTS module (``init_tts=False``) that call fails, although a text-only wrapper
    (``generate_audio=False``) never uses what it would build.
    """
    had_own = name in getattr(obj, "__dict__", {})
    own = obj.__dict__.get(name) if had_own else None
    setattr(obj, name, lambda *args, **kwargs: None)
    try:
        yield
    finally:
        if had_own:
            setattr(obj, name, own)
        else:
            delattr(obj, name)


@contextlib.contextmanager
def private_tempdir() -> Iterator[str]:
    """Send the block's ``tempfile`` files to a directory of its own, deleted afterwards.

    ``init_token2wav_cache`` writes the reference voice to ``NamedTemporaryFile(delete=False)``
    and never removes it: without this, every spoken chat turn leaves a WAV in /tmp. The
    caller holds the backend lock; no other thread of a worker creates temporary files.
    """
    with tempfile.TemporaryDirectory(prefix="omniserve-minicpmo-") as path:
        saved = tempfile.tempdir
        tempfile.tempdir = path
        try:
            yield path
        finally:
            tempfile.tempdir = saved


def close_turn(duplex: Any) -> bool:
    """Close the wrapper's speaking turn as the deferred-finish revisions do on a forced listen.

    For revisions whose ``streaming_generate`` has no ``force_listen_override``: after the
    unit's prefill, feed ``<|turn_eos|>`` and reset the TTS and vocoder state, so the sequence
    reads ``<unit> audio <|turn_eos|> <|listen|> </unit>`` and the next turn starts clean.
    Returns False when the wrapper was not speaking or lacks the pieces (then nothing changed).
    """
    if getattr(duplex, "current_turn_ended", True):
        return False
    decoder = getattr(duplex, "decoder", None)
    token = getattr(duplex, "turn_eos_token_id", None)
    if decoder is None or token is None or not hasattr(decoder, "embed_token"):
        log.warning("this duplex wrapper cannot close its speaking turn; it may resume it")
        return False
    decoder.feed(decoder.embed_token(token))
    duplex.current_turn_ended = True
    for name, value in (
        ("tts_text_start_pos", 0),
        ("tts_past_key_values", None),
        ("tts_current_turn_start_time", None),
    ):
        if hasattr(duplex, name):
            setattr(duplex, name, value)
    reset = getattr(duplex, "_reset_token2wav_for_new_turn", None)
    if callable(reset):
        reset()
    return True


def kv_length(duplex: Any) -> int | None:
    """Tokens in the wrapper's KV cache (``decoder.get_cache_length()``), or None."""
    fn = getattr(getattr(duplex, "decoder", None), "get_cache_length", None)
    if fn is None:
        return None
    try:
        return int(fn())
    except Exception:  # noqa: BLE001 - a statistic, never fatal
        return None


def image_slices(processor: Any, size: tuple[int, int], max_slices: int) -> int:
    """Images the model encodes for one frame: the overview plus its HD slices.

    The same ``get_sliced_grid`` call the model's ``streaming_prefill`` makes; 1 when the
    processor does not say.
    """
    if max_slices <= 1:
        return 1
    grid_fn = getattr(getattr(processor, "image_processor", None), "get_sliced_grid", None)
    if grid_fn is None:
        return 1
    try:
        grid = grid_fn(size, max_slices, nerver_split=False)
    except Exception:  # noqa: BLE001 - a statistic, never fatal
        return 1
    return 1 + int(grid[0]) * int(grid[1]) if grid is not None else 1
