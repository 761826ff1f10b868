"""Who may connect and who may look: API keys, origins, per-client limits, the admin token,
and how many client sockets one gateway process holds.

Imports nothing else of api: every endpoint asks it before a client gets anything.
"""
