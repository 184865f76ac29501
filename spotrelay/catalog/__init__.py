"""GPU facts: every current EC2 GPU instance type and the GPU models they carry.

Pure data, no I/O. `INSTANCE_TYPES` and `GPU_MODELS` are the catalog; the helpers below answer the
questions placement and job validation ask of it.
"""

from __future__ import annotations

from spotrelay.catalog.gpus import GPU_MODELS, REFERENCE_GPU, GpuModel
from spotrelay.catalog.instance_types import INSTANCE_TYPES, InstanceType

__all__ = [
    "GPU_MODELS",
    "INSTANCE_TYPES",
    "REFERENCE_GPU",
    "GpuModel",
    "InstanceType",
    "family_of",
    "max_gpu_count",
    "max_gpu_memory_gib",
    "relative_speed",
]


def family_of(instance_type: str) -> str:
    """`g6e.12xlarge` -> `g6e`, `p6-b200.48xlarge` -> `p6-b200`."""
    return instance_type.split(".", 1)[0]


def relative_speed(instance_type: InstanceType) -> float:
    """Throughput of one of this type's GPUs relative to the reference GPU (REFERENCE_GPU = 1.0)."""
    return GPU_MODELS[instance_type.gpu_model].relative_speed


def max_gpu_count() -> int:
    return max(t.gpu_count for t in INSTANCE_TYPES.values())


def max_gpu_memory_gib() -> float:
    return max(t.gpu_memory_gib for t in INSTANCE_TYPES.values())
