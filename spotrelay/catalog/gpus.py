"""GPU models and their relative training throughput.

PLACEHOLDER: being filled in with sourced figures.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class GpuModel(BaseModel):
    model_config = ConfigDict(frozen=True)

    name: str
    memory_gib: float = Field(gt=0)
    dense_tflops: float = Field(gt=0, description="FP16/BF16 dense tensor-core TFLOPS (see module doc)")
    relative_speed: float = Field(gt=0, description="dense_tflops / the reference GPU's dense_tflops")


REFERENCE_GPU = "V100"
GPU_MODELS: dict[str, GpuModel] = {}
