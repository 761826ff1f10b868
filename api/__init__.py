"""The gateway: FastAPI app, WebSocket endpoints, public protocol (both dialects), validation,
session state machine, queue events, recordings, health and metrics.

One subpackage per concern (docs/ARCHITECTURE.md, "Inside the gateway"). It imports the Redis
layer (streaming/) and submits work to workers by task name; it never imports worker code or an
ML stack.
"""
