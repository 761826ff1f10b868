"""The gateway's uvicorn server: a graceful drain on SIGTERM, and the WebSocket protocol that
answers an oversized message with an ``error`` event before it closes.
"""
