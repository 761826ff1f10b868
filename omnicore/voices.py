"""Client-named reference voices: a name inside the operator's voices directory, nothing else.

A client may name a server-side file (``tts.ref_audio_path``). Left unchecked, that lets anyone
make a worker read any file it can reach, so the name is resolved here, by the one function the
gateway (to refuse early) and the worker (where the file is read) both call:

- no voices directory configured (``OMNISERVE_VOICES_DIR`` unset): every name is refused;
- the name is relative and spelled plainly: ``/``-separated parts of ASCII letters, digits,
  ``_``, ``-`` and ``.``, no part starting with ``.`` (so no ``..``, no hidden files), no
  backslash, colon, percent sign, NUL or other character a decoder might reinterpret;
- after every symlink is followed the file must still lie inside the directory, and be a regular
  file (not a FIFO or device that would block or stream forever).

Error messages never contain the server's own paths.
"""

from __future__ import annotations

import re
from pathlib import Path

MAX_NAME_CHARS = 255
_PART = re.compile(r"[A-Za-z0-9_-][A-Za-z0-9_.-]*")


class VoiceError(ValueError):
    """A voice name that is refused; the message is safe to show to the client."""


def check_voice_name(name: str) -> list[str]:
    """The parts of a plainly spelled relative name; VoiceError otherwise (no file access)."""
    if not isinstance(name, str) or not name:
        raise VoiceError("a voice name must be a non-empty string")
    if len(name) > MAX_NAME_CHARS:
        raise VoiceError(f"a voice name has at most {MAX_NAME_CHARS} characters")
    parts = name.split("/")
    for part in parts:
        if not _PART.fullmatch(part):
            raise VoiceError(
                "a voice name is a relative path of letters, digits, '_', '-' and '.' "
                "(no part may be empty or start with '.')"
            )
    return parts


def resolve_voice(voices_dir: str | Path | None, name: str) -> Path:
    """The real path of voice ``name`` inside ``voices_dir``; VoiceError when refused."""
    if not voices_dir:
        raise VoiceError("server-side voices are not enabled on this server")
    parts = check_voice_name(name)
    try:
        root = Path(voices_dir).resolve(strict=True)
    except OSError:
        raise VoiceError("server-side voices are not available on this server") from None
    try:
        real = root.joinpath(*parts).resolve(strict=True)
    except (OSError, RuntimeError):  # missing, unreadable, or a symlink loop
        raise VoiceError(f"no such voice: {name!r}") from None
    if real == root or not real.is_relative_to(root):
        raise VoiceError(f"no such voice: {name!r}")  # a symlink pointing out of the directory
    if not real.is_file():
        raise VoiceError(f"voice {name!r} is not a regular file")
    return real
