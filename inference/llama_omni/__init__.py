"""The ``llama_omni`` backend: a client of the C++ ``llama-omni-server`` (llama.cpp-omni).

Modules: ``backend`` (the Backend, chat turns), ``duplex`` (duplex sessions), ``connection``
(one WebSocket session), ``protocol`` (endpoints, close reasons, wire audio).
"""

from inference.llama_omni.backend import LlamaOmniBackend
from inference.llama_omni.duplex import LlamaOmniDuplexSession
from inference.llama_omni.protocol import CLOSE_REASONS, LlamaOmniSessionClosed

__all__ = ["CLOSE_REASONS", "LlamaOmniBackend", "LlamaOmniDuplexSession", "LlamaOmniSessionClosed"]
