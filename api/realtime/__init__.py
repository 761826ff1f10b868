"""The WebSocket endpoints: ``/v1/realtime`` (chat, video and audio modes, their resume
and failover) and the legacy ``/ws/chat``, on one connection base and one wait for a slot.
"""
