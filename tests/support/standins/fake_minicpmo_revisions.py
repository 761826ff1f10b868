"""The three revisions of the stand-in's duplex wrapper (see fake_minicpmo_duplex.py)."""

from __future__ import annotations

from typing import Any

import numpy as np

from tests.support.standins.fake_minicpmo_decoder import MARKUP, Embedding, StandInFault
from tests.support.standins.fake_minicpmo_duplex import DuplexCore


class PublishedDuplex(DuplexCore):
    """The repository's wrapper with the deferred finish (``finalize_unit``)."""

    def prepare(
        self,
        prefix_system_prompt: str | None = None,
        ref_audio: np.ndarray | None = None,
        prompt_wav_path: str | None = None,
        context_previous_marker: str = "\n\nprevious: ",
        **kwargs: Any,
    ) -> str:
        text = prefix_system_prompt or "Streaming Omni Conversation."
        self._record("prepare", prefix_system_prompt=text, kwargs=sorted(kwargs))
        if any(m in text for m in MARKUP):
            raise StandInFault(f"system prompt wrapped twice: {text[:60]!r}")
        prefix, suffix = "<|im_start|>system\n" + text, "<|im_end|>"
        if isinstance(ref_audio, np.ndarray):
            prefix, suffix = prefix + "\n<|audio_start|>", "<|audio_end|>" + suffix
        return self._prepare(prefix, suffix, ref_audio, prompt_wav_path)

    @property
    def needs_finalize(self) -> bool:
        return self._pending_finalize is not None

    def streaming_prefill(
        self,
        audio_waveform: np.ndarray | None = None,
        frame_list: list | None = None,
        max_slice_nums: int | list[int] = 1,
        batch_vision_feed: bool = False,
    ) -> dict[str, Any]:
        if self.needs_finalize:
            raise RuntimeError("streaming_prefill called before finalize_unit()!")
        self._record(
            "streaming_prefill",
            audio=None if audio_waveform is None else len(audio_waveform),
            frames=len(frame_list or []),
            max_slice_nums=max_slice_nums,
        )
        return self._prefill(audio_waveform, frame_list, max_slice_nums)

    def streaming_generate(
        self,
        prompt_wav_path: str | None = None,
        max_new_speak_tokens_per_chunk: int = 20,
        decode_mode: str = "sampling",
        temperature: float = 0.7,
        top_k: int = 20,
        top_p: float = 0.8,
        listen_prob_scale: float = 1.0,
        listen_top_k: int | None = None,
        text_repetition_penalty: float = 1.05,
        text_repetition_window_size: int = 512,
        length_penalty: float = 1.1,
        force_listen_override: bool = False,
    ) -> dict[str, Any]:
        self._record(
            "streaming_generate",
            prompt_wav_path=prompt_wav_path,
            max_new_speak_tokens_per_chunk=max_new_speak_tokens_per_chunk,
            decode_mode=decode_mode,
            temperature=temperature,
            top_k=top_k,
            top_p=top_p,
            length_penalty=length_penalty,
            force_listen_override=force_listen_override,
        )
        if self.is_session_stop_set():
            self._pending_finalize = None
            return self._silent_result(True)
        if self.pending_logits is None:
            self._pending_finalize = None
            return self._silent_result(False)
        self.pending_logits = None
        forced = self._streaming_generate_count < self.force_listen_count or force_listen_override
        self._streaming_generate_count += 1
        if force_listen_override:
            self._close_turn_for_listen()
        out, terminator = self._generate(max_new_speak_tokens_per_chunk, forced)
        self._pending_finalize = terminator
        return out

    def finalize_unit(self) -> None:
        self._record("finalize_unit")
        if self._pending_finalize is None:
            return  # the real one logs a warning
        self.decoder.feed(Embedding([self._pending_finalize, "</unit>"]))
        self._pending_finalize = None


class DemoDuplex(PublishedDuplex):
    """The MiniCPM-o-Demo's copy: ``prepare`` takes the chat markup from its caller."""

    reports_vision_images = True

    def prepare(  # type: ignore[override]
        self,
        prefix_system_prompt: str | None = None,
        suffix_system_prompt: str | None = None,
        ref_audio: np.ndarray | None = None,
        prompt_wav_path: str | None = None,
        context_previous_marker: str = "\n\nprevious: ",
    ) -> str:
        prefix, suffix = prefix_system_prompt or "", suffix_system_prompt or ""
        self._record("prepare", prefix_system_prompt=prefix, suffix_system_prompt=suffix)
        if not prefix.startswith("<|im_start|>system\n") or not suffix.endswith("<|im_end|>"):
            raise StandInFault("this prepare needs the system prompt in chat markup")
        return self._prepare(prefix, suffix, ref_audio, prompt_wav_path)


class LegacyDuplex(DuplexCore):
    """The older repository wrapper: no deferred finish, no per-call forced listen."""

    prepare = PublishedDuplex.prepare

    def streaming_prefill(
        self,
        audio_waveform: np.ndarray | None = None,
        frame_list: list | None = None,
        text_list: list | None = None,
        max_slice_nums: int | list[int] = 1,
        batch_vision_feed: bool = False,
    ) -> dict[str, Any]:
        self._record(
            "streaming_prefill",
            audio=None if audio_waveform is None else len(audio_waveform),
            frames=len(frame_list or []),
            max_slice_nums=max_slice_nums,
        )
        return self._prefill(audio_waveform, frame_list, max_slice_nums)

    def streaming_generate(
        self,
        prompt_wav_path: str | None = None,
        max_new_speak_tokens_per_chunk: int = 20,
        decode_mode: str = "sampling",
        temperature: float = 0.7,
        top_k: int = 100,
        top_p: float = 0.8,
        listen_prob_scale: float = 1.0,
        listen_top_k: int | None = None,
        text_repetition_penalty: float = 1.05,
        text_repetition_window_size: int = 512,
    ) -> dict[str, Any]:
        self._record(
            "streaming_generate",
            prompt_wav_path=prompt_wav_path,
            max_new_speak_tokens_per_chunk=max_new_speak_tokens_per_chunk,
            decode_mode=decode_mode,
            temperature=temperature,
            top_k=top_k,
            top_p=top_p,
        )
        if self.is_session_stop_set() or self.is_break_set():
            return self._silent_result(True)
        if self.pending_logits is None:
            return self._silent_result(False)
        self.pending_logits = None
        forced = self._streaming_generate_count < self.force_listen_count
        self._streaming_generate_count += 1
        out, terminator = self._generate(max_new_speak_tokens_per_chunk, forced)
        self.decoder.feed(Embedding([terminator, "</unit>"]))
        return out


REVISIONS: dict[str, type[DuplexCore]] = {
    "published": PublishedDuplex,
    "legacy": LegacyDuplex,
    "demo": DemoDuplex,
}
