"""USG — Unified Serving Graph."""

from usg.specs import Modality, TensorSpec

__all__ = ["Modality", "TensorSpec"]
__version__ = "0.1.0"
