"""docs/CONFIGURATION.md says what ``Settings`` is: every field, its variable, type, default and
description, as ``python -m omnicore.settings_doc`` renders them; and every field has a
description to render."""

from __future__ import annotations

import difflib
from pathlib import Path

from omnicore.settings import Settings
from omnicore.settings_doc import COMMAND, DOC, MARKER, document, main, undocumented
from tests.support.in_process_cli import run_main

FIX = f"run `{COMMAND}` (from the repository root, in the project's virtualenv)"


def test_every_setting_has_a_description() -> None:
    missing = undocumented()
    assert not missing, (
        f"settings without Field(description=...): {', '.join(missing)}; describe each in "
        f"omnicore/settings.py, then {FIX}"
    )


def test_the_document_is_what_the_settings_render() -> None:
    current = DOC.read_text(encoding="utf-8")
    wanted = document(current)
    diff = "".join(
        difflib.unified_diff(
            current.splitlines(keepends=True),
            wanted.splitlines(keepends=True),
            "docs/CONFIGURATION.md",
            "rendered from omnicore/settings.py",
            n=0,
        )
    )
    assert current == wanted, f"docs/CONFIGURATION.md is out of date: {FIX}\n{diff[:4000]}"


def test_every_field_and_variable_is_in_the_generated_part() -> None:
    generated = DOC.read_text(encoding="utf-8").partition(MARKER)[2]
    for name in Settings.model_fields:
        assert f"| `{name}` | `OMNISERVE_{name.upper()}`" in generated, name
    assert "`REDIS_URL`" in generated


def test_the_command_keeps_the_introduction_and_rewrites_the_tables(tmp_path: Path) -> None:
    intro = "# Configuration\n\nA hand-written introduction.\n\n"
    stale = tmp_path / "CONFIGURATION.md"
    stale.write_text(intro + MARKER + "\n\n| `gone_field` | ... |\n", encoding="utf-8")
    check = run_main(main, ["--check", str(stale)])
    assert check.returncode == 1, check
    assert COMMAND in check.stdout
    assert "gone_field" in stale.read_text(encoding="utf-8"), "--check changed the file"

    write = run_main(main, [str(stale)])
    assert write.returncode == 0, write
    text = stale.read_text(encoding="utf-8")
    assert text.startswith(intro + MARKER)
    assert "gone_field" not in text
    assert "| `gateway_port` | `OMNISERVE_GATEWAY_PORT` | integer | `8006` |" in text
    again = run_main(main, ["--check", str(stale)])
    assert again.returncode == 0, again
