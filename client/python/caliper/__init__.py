"""caliper-client: stream K/V, activations and weights of a running model to caliper-server and
fetch FP8 KV-cache and NVFP4 scales. See the package README."""
from importlib import metadata as _metadata

from ._handle import Handle
from ._producer import ChunkRejected, RejectedChunksError, StreamError
from ._scales_files import WrittenFiles
from ._tensors import TensorError
from ._types import KvLayerScales, ModelInfo, ModuleScales, OutputFile, RankKvSlice, ScaleWarning
from .client import MODES, Client, LayerProgress, Recipe, Scales, Session, SessionInfo, TensorLike
from .fleets import FleetInfo, FleetWindow, InUseReport, ScalesVersion, refit

__all__ = ["Client", "Session", "SessionInfo", "LayerProgress", "ModelInfo", "Recipe", "Scales",
           "KvLayerScales", "RankKvSlice", "ModuleScales", "ScaleWarning", "OutputFile",
           "WrittenFiles", "Handle", "TensorLike", "TensorError", "RejectedChunksError",
           "ChunkRejected", "StreamError", "MODES", "FleetInfo", "FleetWindow", "InUseReport",
           "ScalesVersion", "refit", "__version__"]

try:
    __version__ = _metadata.version("caliper-client")  # from the repository's VERSION file
except _metadata.PackageNotFoundError:  # imported from a source tree, not installed
    __version__ = "0+unknown"
