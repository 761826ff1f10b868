"""The ``minicpmo`` backend: MiniCPM-o 4.5 through transformers (trust_remote_code, local weights).

torch and transformers are imported only when a model is loaded, so importing this package (and
``inference.registry``) stays light. Modules: ``backend`` (the Backend), ``loading`` (weights,
vocoder, the one duplex wrapper), ``options`` (duplex settings), ``messages`` (chat content),
``chat`` (chat turns), ``duplex`` (duplex sessions), ``compat`` (remote-code revisions).
"""

from inference.minicpmo.backend import MiniCPMOBackend
from inference.minicpmo.duplex import MiniCPMODuplexSession

__all__ = ["MiniCPMOBackend", "MiniCPMODuplexSession"]
