"""Recordings of every session: what the client sent and received, with times.

- ``recorder``: the hooks a connection calls (``SessionRecording``), cheap on the relay path, and
  the gateway's one background thread that decodes and writes them (``Recorder``);
- ``spool``: one recording being written (WAV, JPEG, timeline, transcript, metadata);
- ``store``: finished recordings in a local directory or any fsspec URL, with retention;
- ``routes``: ``GET /v1/recordings``, ``/v1/recordings/{id}``, its files and its zip.
"""
