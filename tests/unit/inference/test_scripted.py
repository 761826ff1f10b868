"""inference/scripted.py: the deterministic, model-free backend the protocol tests rely on."""

from __future__ import annotations

import numpy as np

from inference import (
    ChatDelta,
    ChatDone,
    ChatPrefilled,
    ChatRequest,
    DuplexConfig,
    DuplexInput,
    Message,
    TextPart,
    create_backend,
)


def test_scripted_backend_is_deterministic() -> None:
    b = create_backend("scripted", token_delay_s=0)
    req = ChatRequest(messages=[Message("user", [TextPart("Reply with exactly: a b")])])
    events = list(b.chat(req))
    assert isinstance(events[0], ChatPrefilled)
    assert [e.text for e in events if isinstance(e, ChatDelta)] == ["a", " b"]
    assert isinstance(events[-1], ChatDone) and events[-1].text == "a b"
    assert b.info()["label"].startswith("scripted")
    s = b.open_duplex()
    s.prepare(DuplexConfig(system_prompt="x"))
    loud, quiet = np.full(16000, 0.2, np.float32), np.zeros(16000, np.float32)
    steps = [s.step(DuplexInput(audio=a)) for a in (quiet, loud, quiet, quiet, quiet)]
    assert [st.listen for st in steps] == [True, True, False, False, True]
    assert steps[3].end_of_turn and steps[2].audio is not None and steps[2].audio.size == 24000
    kvs = [st.kv_cache_length for st in steps]
    assert kvs == sorted(kvs)


def test_a_rollover_reprime_starts_the_cache_again_from_the_prompt() -> None:
    from inference import DuplexConfig, DuplexInput, HistoryTurn
    from inference.scripted import ScriptedBackend

    b = ScriptedBackend(tokens_per_step=100)
    s = b.open_duplex()
    first = s.prepare(DuplexConfig(system_prompt="Be brief."))
    for _ in range(5):
        kv = s.step(DuplexInput(audio=np.zeros(16000, dtype=np.float32))).kv_cache_length
    assert kv == first + 500
    history = [HistoryTurn("user", "my name is Ada"), HistoryTurn("assistant", "hello Ada")]
    length = s.reprime(DuplexConfig(system_prompt="Be brief.", history=history))
    assert first < length < kv and length == 16 + b.text_tokens(
        "Be brief.\n\nThe conversation so far (continue it):\nUser: my name is Ada\n"
        "Assistant: hello Ada"
    )
    assert s.step(DuplexInput(audio=np.zeros(16000, dtype=np.float32))).kv_cache_length == (
        length + 100
    )
