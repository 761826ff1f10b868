"""The public client protocol: client events validated, worker events rendered per dialect,
the error frame and its codes.

Pure functions and data of the protocol (docs/PROTOCOL.md); nothing else of api, so every
endpoint and every test can use it without a gateway.
"""
