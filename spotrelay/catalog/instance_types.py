"""EC2 GPU instance types.

PLACEHOLDER: being filled in with sourced figures.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class InstanceType(BaseModel):
    model_config = ConfigDict(frozen=True)

    name: str
    gpu_model: str
    gpu_count: int = Field(ge=1)
    gpu_memory_gib: float = Field(gt=0, description="memory of one GPU, GiB")
    vcpus: int = Field(ge=1)
    memory_gib: float = Field(gt=0)
    on_demand_usd_per_hour: float | None = Field(
        default=None, gt=0, description="Linux on-demand price in us-east-1; None where AWS sells none"
    )

    @property
    def family(self) -> str:
        return self.name.split(".", 1)[0]


INSTANCE_TYPES: dict[str, InstanceType] = {}
