"""The OpenAI Realtime protocol (GA) on ``/v1/realtime?model=...``: what the ``openai`` SDK's
``client.realtime`` and the clients built on it (Pipecat, the Agents SDK) speak, mapped onto the
audio duplex sessions and the chat turns of ``api/realtime``."""
