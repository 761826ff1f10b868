"""The recordings writer and store in one process, on fsspec's real ``memory://`` and ``file://``
filesystems, and the ``omniserve recordings`` CLI on a store the writer filled."""

from __future__ import annotations

import io
import json
import time
import uuid
import zipfile
from pathlib import Path

import fsspec
import numpy as np
import pytest
import soundfile

from api.recordings.recorder import OFF, Recorder
from api.recordings.store import BadName, RecordingStore, check_file_name, check_id
from omnicore.settings import Settings
from omniserve.cli import main
from tests.support.client import decode_audio, jpeg_b64, pcm_b64, speech
from tests.support.in_process_cli import Ran, run_main


def recorder(url: str, spool: Path, **overrides: object) -> Recorder:
    settings = Settings(
        recordings=True, recordings_url=url, recordings_spool_dir=str(spool), **overrides
    )
    r = Recorder(settings, "gw1")
    r.start()
    return r


def record_session(r: Recorder, rid: str) -> tuple[np.ndarray, np.ndarray]:
    """One audio session through the hooks; returns the audio sent and the audio received."""
    rec = r.open(rid, "audio", endpoint="/v1/realtime")
    sent = [speech(1.0), speech(0.25)]
    heard = [pcm_b64(np.full(2400, 0.25, np.float32)), pcm_b64(np.full(1200, -0.5, np.float32))]
    rec.sent({"type": "session.queue_done", "session_id": rid})
    rec.admitted("worker-a|0")
    rec.client_event({"type": "session.init", "payload": {"system_prompt": "hi"}})
    rec.sent({"type": "session.created", "session_id": rid, "recording_id": rid})
    rec.client_event(
        {"type": "input.append", "input": {"audio": sent[0], "video_frames": [jpeg_b64()]}}
    )
    rec.client_event({"type": "input.append", "input": {"audio": "not base64!"}})
    rec.client_event({"type": "input.append", "input": {"audio": sent[1]}})
    for i, audio in enumerate(heard):
        base = {"type": "response.output.delta", "response_id": "r1", "input_id": "input_1"}
        rec.sent({**base, "kind": "text", "text": ["Hello ", "there."][i]})
        rec.sent({**base, "kind": "audio", "audio": audio})
    rec.sent({"type": "session.closed", "session_id": rid, "reason": "user_stop"})
    rec.finish(session_id=rid, dialect="current")
    return (
        np.concatenate([decode_audio(a) for a in sent]),
        np.concatenate([decode_audio(a) for a in heard]),
    )


def test_a_session_in_a_memory_store(tmp_path: Path) -> None:
    url = f"memory://rec-{uuid.uuid4().hex[:8]}"
    r = recorder(url, tmp_path / "spool")
    sent, heard = record_session(r, "rt_1_a")
    r.stop()
    assert r.written == 1 and not list((tmp_path / "spool").iterdir())  # uploaded, spool gone
    store = RecordingStore(url)
    meta = store.meta("rt_1_a")
    assert meta is not None
    assert meta["close_reason"] == "user_stop" and meta["workers"] == ["worker-a"]
    assert meta["input"]["audio_samples"] == sent.size and meta["output"]["audio_samples"] == 3600
    assert meta["unrecorded"] == 1  # the bad chunk is noted, nothing crashed
    names = store.file_names("rt_1_a")
    assert set(names) == {
        "input.wav", "output.wav", "frame_000001.jpg", "timeline.jsonl", "transcript.txt",
        "meta.json",
    }  # fmt: skip
    pcm, rate = soundfile.read(io.BytesIO(store.read("rt_1_a", "input.wav")), dtype="float32")
    assert rate == 16000 and np.abs(pcm - sent).max() < 1e-3
    pcm, rate = soundfile.read(io.BytesIO(store.read("rt_1_a", "output.wav")), dtype="float32")
    assert rate == 24000 and np.abs(pcm - heard).max() < 1e-3
    assert "assistant: Hello there." in store.read("rt_1_a", "transcript.txt").decode()
    with zipfile.ZipFile(io.BytesIO(store.zip_bytes("rt_1_a"))) as zf:
        assert sorted(zf.namelist()) == sorted(f"rt_1_a/{n}" for n in names)
    assert [m["id"] for m in store.metas()] == ["rt_1_a"]
    assert store.remove("rt_1_a") and not store.remove("rt_1_a") and store.metas() == []


def test_retention_on_an_object_store() -> None:
    url = f"memory://rec-{uuid.uuid4().hex[:8]}"
    fs = fsspec.filesystem("memory")
    store = RecordingStore(url)
    now = time.time()
    for rid, age, size in (("old", 8 * 86400, 10), ("a", 300, 600), ("b", 200, 600), ("c", 1, 10)):
        fs.pipe(f"{store.root}/{rid}/meta.json", json.dumps(
            {"id": rid, "started_at": now - age, "ended_at": now - age, "bytes": size}
        ).encode())  # fmt: skip
    fs.pipe(f"{store.root}/partial/input.wav", b"x")  # being committed: no metadata yet
    pruned = store.prune(max_age_s=7 * 86400, max_bytes=1000, now=now)
    assert pruned.by_age == ["old"] and pruned.by_size == ["a"]
    assert sorted(store.ids()) == ["b", "c", "partial"]
    assert store.prune(0, 0, now=now + 365 * 86400).by_age == []  # 0: the rule is off


@pytest.mark.parametrize(
    "bad", ["", ".", "..", ".hidden", "a/b", "a\\b", "a.b", "../x", "x" * 129, "é", "a b"]
)
def test_ids_that_could_leave_the_store_are_refused(bad: str) -> None:
    with pytest.raises(BadName):
        check_id(bad)
    store = RecordingStore("memory://anywhere")
    with pytest.raises(BadName):
        store.meta(bad)
    with pytest.raises(BadName):
        store.remove(bad)


@pytest.mark.parametrize("bad", ["", "..", "../meta.json", ".meta.json", "a/b.wav", "meta"])
def test_file_names_are_checked(bad: str) -> None:
    with pytest.raises(BadName):
        check_file_name(bad)


def test_off_means_no_thread_and_no_files(tmp_path: Path) -> None:
    r = Recorder(Settings(recordings=False, recordings_url=str(tmp_path / "s")), "gw")
    r.start()
    assert r.open("rt_x", "audio") is OFF and r.store is None
    OFF.client_event({"type": "input.append"})
    OFF.finish()
    r.stop()
    assert not (tmp_path / "s").exists()


def cli(*args: str, **env: str) -> Ran:
    """``omniserve recordings ARGS``, its ``main`` run in process."""
    return run_main(main, ["recordings", *args], **env)


def test_the_cli_lists_gets_and_removes(tmp_path: Path) -> None:
    store = tmp_path / "store"
    url = store.as_uri()
    r = recorder(url, tmp_path / "unused")  # a local store spools inside itself
    record_session(r, "rt_2_b")
    r.stop()
    listed = cli("--url", url, "ls")
    assert listed.returncode == 0 and "rt_2_b" in listed.stdout and "user_stop" in listed.stdout
    assert json.loads(cli("--url", url, "ls", "--json").stdout)[0]["id"] == "rt_2_b"
    assert json.loads(cli("--url", url, "get", "rt_2_b").stdout)["mode"] == "audio"
    out = tmp_path / "r.zip"
    assert cli("--url", url, "get", "rt_2_b", "-o", str(out)).returncode == 0
    assert "rt_2_b/input.wav" in zipfile.ZipFile(out).namelist()
    assert cli("--url", url, "get", "rt_2_b", "-o", str(tmp_path / "dir")).returncode == 0
    assert (tmp_path / "dir" / "output.wav").read_bytes() == (
        store / "rt_2_b" / "output.wav"
    ).read_bytes()
    bad = cli("--url", url, "get", "../store")
    assert bad.returncode == 2 and "not a recording id" in bad.stderr
    assert cli("--url", url, "rm", "rt_2_b").returncode == 0
    assert not (store / "rt_2_b").exists()
    assert cli("--url", url, "rm", "rt_2_b").returncode == 1
    r = recorder(url, tmp_path / "unused")
    record_session(r, "rt_2_c")
    r.stop()
    kept = cli("prune", OMNISERVE_RECORDINGS_URL=url)  # the store from the environment
    assert kept.stdout.strip() == "pruned 0 by age, 0 by size" and (store / "rt_2_c").exists()
    time.sleep(1.1)
    gone = cli("prune", OMNISERVE_RECORDINGS_URL=url, OMNISERVE_RECORDINGS_MAX_AGE_S="1")
    assert gone.stdout.strip() == "pruned 1 by age, 0 by size" and not (store / "rt_2_c").exists()


def test_a_chat_turn_with_audio_and_an_image(tmp_path: Path) -> None:
    from PIL import Image

    buf = io.BytesIO()
    Image.new("RGB", (8, 8), (1, 2, 3)).save(buf, format="PNG")
    png = __import__("base64").b64encode(buf.getvalue()).decode()
    voice = np.full(24000, 0.1, np.float32)  # 1 s at 24 kHz: recorded at 16 kHz
    r = recorder(str(tmp_path / "store"), tmp_path / "spool")
    rec = r.open("rt_3_c", "chat", endpoint="/v1/realtime")
    history = {"role": "user", "content": "an earlier question"}
    content = [
        {"type": "text", "text": "What is this?"},
        {"type": "audio", "data": pcm_b64(voice), "sample_rate": 24000},
        {"type": "image", "data": png},
    ]
    turn = {
        "messages": [
            history,
            {"role": "assistant", "content": "ok"},
            {"role": "user", "content": content},
        ]
    }
    rec.client_event({"type": "input.append", "input": turn})
    rec.admitted("worker-b|1")
    rec.sent({"type": "response.output.delta", "kind": "text", "response_id": "r", "text": "A "})
    rec.sent({"type": "response.done", "response_id": "r", "text": "A square.", "metrics": {}})
    rec.finish()
    r.stop()
    store = RecordingStore(str(tmp_path / "store"))
    meta = store.meta("rt_3_c")
    assert meta is not None and meta["input"]["audio_samples"] == 16000
    assert "frame_000001.png" in store.file_names("rt_3_c")
    transcript = store.read("rt_3_c", "transcript.txt").decode()
    assert "user: What is this?" in transcript and "an earlier question" not in transcript
    assert "assistant: A square." in transcript and transcript.count("assistant") == 1


def test_a_store_outage_keeps_the_recording_until_it_can_be_stored(tmp_path: Path) -> None:
    """The object store refuses the upload (fsspec raises, as s3fs does when S3 is away): the
    finished recording stays in the spool and is stored by a later housekeeping pass."""
    url = f"memory://rec-{uuid.uuid4().hex[:8]}"
    r = recorder(url, tmp_path / "spool", recordings_prune_interval_s=0.2)
    assert r.store is not None
    fs = r.store.fs
    real_put = fs.put_file
    outage = {"on": True}

    def put_file(lpath: str, rpath: str, **kw: object) -> None:
        if outage["on"]:
            raise ConnectionError("store unreachable")
        real_put(lpath, rpath, **kw)

    fs.put_file = put_file
    try:
        record_session(r, "rt_4_d")
        deadline = time.monotonic() + 10
        while not (tmp_path / "spool" / "rt_4_d" / "meta.json").exists():
            assert time.monotonic() < deadline
            time.sleep(0.05)
        time.sleep(0.5)  # a couple of failed retries
        assert RecordingStore(url).meta("rt_4_d") is None and r.written == 0
        outage["on"] = False
        while RecordingStore(url).meta("rt_4_d") is None:
            assert time.monotonic() < deadline, "not stored after the store came back"
            time.sleep(0.05)
    finally:
        r.stop()
        fs.put_file = real_put
    assert r.written == 1 and not (tmp_path / "spool" / "rt_4_d").exists()


def test_a_second_recording_of_an_id_is_kept_beside_the_first(tmp_path: Path) -> None:
    """A session id recorded twice (a second connection of a resumed session) overwrites
    nothing: the second is stored as ``<id>-2``."""
    url = str(tmp_path / "store")
    for _ in range(2):
        r = recorder(url, tmp_path / "spool")
        record_session(r, "rt_5_e")
        r.stop()
    store = RecordingStore(url)
    assert sorted(store.ids()) == ["rt_5_e", "rt_5_e-2"]
    assert [m["id"] for m in sorted(store.metas(), key=lambda m: m["id"])] == ["rt_5_e", "rt_5_e-2"]


def test_listing_reads_each_metadata_file_once(tmp_path: Path) -> None:
    """Retention runs every minute over a store of many thousand recordings: a listing reads
    only the metadata it has not seen (metadata never changes once written)."""
    url = f"memory://rec-{uuid.uuid4().hex[:8]}"
    r = recorder(url, tmp_path / "spool")
    record_session(r, "rt_6_a")
    record_session(r, "rt_6_b")
    r.stop()
    store = RecordingStore(url)
    read: list[list[str]] = []
    real_cat = store.fs.cat

    def cat(paths: list[str], **kw: object) -> object:
        read.append(list(paths))
        return real_cat(paths, **kw)

    store.fs.cat = cat
    try:
        assert {m["id"] for m in store.metas()} == {"rt_6_a", "rt_6_b"}
        assert len(read) == 1 and len(read[0]) == 2
        assert len(store.metas()) == 2 and len(read) == 1  # nothing new: nothing read
        assert store.remove("rt_6_a")
        assert [m["id"] for m in store.metas()] == ["rt_6_b"] and len(read) == 1
    finally:
        store.fs.cat = real_cat
