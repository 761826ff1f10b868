"""The ``minicpmo`` backend: MiniCPM-o 4.5 through transformers (trust_remote_code, local weights).

torch and transformers are imported only when a model is loaded, so importing this package (and
``inference.registry``) stays light.
"""

from inference.minicpmo.backend import MiniCPMOBackend, MiniCPMODuplexSession

__all__ = ["MiniCPMOBackend", "MiniCPMODuplexSession"]
