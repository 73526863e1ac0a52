"""caliper-client: stream K/V, activations and weights of a running model to caliper-server and
fetch FP8 KV-cache and NVFP4 scales. See client/python/README.md."""
from ._producer import ChunkRejected, RejectedChunksError, StreamError
from ._tensors import TensorError
from .client import Client, Recipe, Scales, Session, MODES

__all__ = ["Client", "Session", "Recipe", "Scales", "TensorError", "RejectedChunksError",
           "ChunkRejected", "StreamError", "MODES"]
__version__ = "0.1.0"
