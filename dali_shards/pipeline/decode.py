"""Image decoding that uses the GPU when the pipeline has one and the CPU otherwise."""

from __future__ import annotations

from typing import Any, Optional

from nvidia.dali import fn, types
from nvidia.dali.data_node import DataNode
from nvidia.dali.pipeline import Pipeline


def pipeline_has_gpu(pipe: Optional[Pipeline] = None) -> bool:
    """True if ``pipe`` (default: the pipeline being defined) runs on a GPU."""
    pipe = pipe or Pipeline.current()
    device_id = getattr(pipe, "device_id", None)
    return device_id is not None and device_id >= 0


def decode_image(
    data: DataNode, *, output_type: Any = types.DALIImageType.RGB, device: Optional[str] = None, **kwargs: Any
) -> DataNode:
    """Decode encoded images: ``"mixed"`` (nvJPEG/nvImageCodec on the GPU) when the current
    pipeline has a device, ``"cpu"`` otherwise. Extra keywords go to ``fn.decoders.image``."""
    if device is None:
        device = "mixed" if pipeline_has_gpu() else "cpu"
    return fn.decoders.image(data, device=device, output_type=output_type, **kwargs)
