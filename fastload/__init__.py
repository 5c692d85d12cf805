"""fastload: JPEG batches for PyTorch training, decoded only where the crop is and finished on the GPU."""
from . import ops
from .errors import DecodeError

__version__ = "0.1.0"
__all__ = ["ops", "DecodeError", "__version__"]
