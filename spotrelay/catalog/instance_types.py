"""EC2 GPU instance types.

Every size of the NVIDIA GPU families spotrelay places on: g4dn (T4), g5 (A10G), g6 and gr6 (L4),
g6e (L40S), p3 and p3dn (V100), p4d and p4de (A100), p5 (H100), p5e and p5en (H200), p6-b200 (B200).

Fields, per type:
- `gpu_memory_gib`: nominal memory of one GPU, as on AWS's instance-type pages; see
  `spotrelay.catalog.gpus` for how it relates to what DescribeInstanceTypes reports.
- `vcpus`, `memory_gib`: as AWS lists them.
- `on_demand_usd_per_hour`: Linux, us-east-1; None where AWS sells no on-demand capacity.

The facts are transcribed from the sources named above each family; nothing is read at run time.
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


# (instance type, GPUs, vCPUs, RAM GiB, on-demand USD/h Linux us-east-1 or None)
_Row = tuple[str, int, int, float, float | None]


def _family(gpu_model: str, gpu_memory_mib: int, rows: tuple[_Row, ...]) -> list[InstanceType]:
    """One family's rows; every size of a family carries the same GPU model and per-GPU memory."""
    return [
        InstanceType(
            name=name,
            gpu_model=gpu_model,
            gpu_count=gpus,
            gpu_memory_gib=gpu_memory_mib / 1024,
            vcpus=vcpus,
            memory_gib=memory_gib,
            on_demand_usd_per_hour=price,
        )
        for name, gpus, vcpus, memory_gib, price in rows
    ]


# Sources, looked up 2026-11-30:
# [SPOT]  vCPUs and RAM: /work/shared/data/aws-spot-advisor/spot_advisor_gpu_linux_2025-06-28.csv
#         (columns vcpus, ram_gb), from alexei-led/spotinfo's copy of the AWS Spot Instance Advisor feed
#         (https://aws.amazon.com/ec2/spot/instance-advisor/), commit 5bdc33ce, 2025-06-28.
# [SKY]   GPU model, count, per-GPU MiB (DescribeInstanceTypes GpuInfo) and us-east-1 Linux on-demand
#         price: SkyPilot AWS catalog, skypilot-org/skypilot-catalog catalogs/v8/aws/vms.csv @ 00148f2a
#         (https://github.com/skypilot-org/skypilot-catalog). p-family rows are in
#         /work/shared/data/skypilot-catalog/aws-gpu-p-family-instance-specs.csv and aws-vms-p-family.csv.
# [PRICE] g-family Linux on-demand prices, US East (N. Virginia), as AWS lists them on
#         https://aws.amazon.com/ec2/pricing/on-demand/ (the page renders prices in JavaScript, so the
#         figures were read from a public table transcribed from the AWS console, a GitHub markdown note
#         "AWS GPU Instances and RT Hardware Support"). Where a row is also marked [SKY], the SkyPilot
#         catalog's us-east-1 price was read and agrees to the last digit; the other g-family prices
#         rest on that one transcription.
# Instance-type pages: https://aws.amazon.com/ec2/instance-types/{g4,g5,g6,g6e,p3,p4,p5,p6}/ and
# https://docs.aws.amazon.com/ec2/latest/instancetypes/ac.html.
_TYPES: list[InstanceType] = [
    # g4dn, NVIDIA T4 16,384 MiB. vCPU/RAM [SPOT]; GPU [SKY]; prices [PRICE], g4dn.12xlarge also [SKY].
    *_family(
        "T4",
        16_384,
        (
            ("g4dn.xlarge", 1, 4, 16, 0.526),
            ("g4dn.2xlarge", 1, 8, 32, 0.752),
            ("g4dn.4xlarge", 1, 16, 64, 1.204),
            ("g4dn.8xlarge", 1, 32, 128, 2.176),
            ("g4dn.16xlarge", 1, 64, 256, 4.352),
            ("g4dn.12xlarge", 4, 48, 192, 3.912),
            ("g4dn.metal", 8, 96, 384, 7.824),
        ),
    ),
    # g5, NVIDIA A10G 24 GiB. vCPU/RAM [SPOT]; GPU [SKY]; prices [PRICE], g5.8xlarge also [SKY].
    *_family(
        "A10G",
        24_576,
        (
            ("g5.xlarge", 1, 4, 16, 1.006),
            ("g5.2xlarge", 1, 8, 32, 1.212),
            ("g5.4xlarge", 1, 16, 64, 1.624),
            ("g5.8xlarge", 1, 32, 128, 2.448),
            ("g5.16xlarge", 1, 64, 256, 4.096),
            ("g5.12xlarge", 4, 48, 192, 5.672),
            ("g5.24xlarge", 4, 96, 384, 8.144),
            ("g5.48xlarge", 8, 192, 768, 16.288),
        ),
    ),
    # g6, NVIDIA L4 24 GiB. vCPU/RAM [SPOT]; GPU [SKY]; prices [PRICE], g6.4xlarge and g6.48xlarge
    # also [SKY].
    *_family(
        "L4",
        24_576,
        (
            ("g6.xlarge", 1, 4, 16, 0.8048),
            ("g6.2xlarge", 1, 8, 32, 0.9776),
            ("g6.4xlarge", 1, 16, 64, 1.3232),
            ("g6.8xlarge", 1, 32, 128, 2.0144),
            ("g6.16xlarge", 1, 64, 256, 3.3968),
            ("g6.12xlarge", 4, 48, 192, 4.6016),
            ("g6.24xlarge", 4, 96, 384, 6.6752),
            ("g6.48xlarge", 8, 192, 768, 13.3504),
        ),
    ),
    # gr6 (high-RAM g6), NVIDIA L4 24 GiB. vCPU/RAM [SPOT]; GPU [SKY]; prices [PRICE],
    # gr6.4xlarge also [SKY].
    *_family(
        "L4",
        24_576,
        (
            ("gr6.4xlarge", 1, 16, 128, 1.5392),
            ("gr6.8xlarge", 1, 32, 256, 2.4464),
        ),
    ),
    # g6e, NVIDIA L40S 48 GiB. vCPU/RAM [SPOT]; GPU [SKY]; prices [PRICE], g6e.2xlarge, g6e.4xlarge
    # and g6e.48xlarge also [SKY].
    *_family(
        "L40S",
        49_152,
        (
            ("g6e.xlarge", 1, 4, 32, 1.861),
            ("g6e.2xlarge", 1, 8, 64, 2.24208),
            ("g6e.4xlarge", 1, 16, 128, 3.00424),
            ("g6e.8xlarge", 1, 32, 256, 4.52856),
            ("g6e.16xlarge", 1, 64, 512, 7.57719),
            ("g6e.12xlarge", 4, 48, 384, 10.49264),
            ("g6e.24xlarge", 4, 96, 768, 15.06559),
            ("g6e.48xlarge", 8, 192, 1536, 30.13118),
        ),
    ),
    # p3, NVIDIA V100 16,384 MiB. All fields [SKY] (aws-gpu-p-family-instance-specs.csv); vCPU/RAM
    # agree with [SPOT].
    *_family(
        "V100",
        16_384,
        (
            ("p3.2xlarge", 1, 8, 61, 3.06),
            ("p3.8xlarge", 4, 32, 244, 12.24),
            ("p3.16xlarge", 8, 64, 488, 24.48),
        ),
    ),
    # p3dn, NVIDIA V100 32,768 MiB. All fields [SKY]; vCPU/RAM agree with [SPOT].
    *_family("V100-32GB", 32_768, (("p3dn.24xlarge", 8, 96, 768, 31.212),)),
    # p4d, NVIDIA A100 40,960 MiB. All fields [SKY]; vCPU/RAM agree with [SPOT].
    *_family("A100", 40_960, (("p4d.24xlarge", 8, 96, 1152, 21.957642),)),
    # p4de, NVIDIA A100 81,920 MiB. All fields [SKY]; vCPU/RAM agree with [SPOT].
    *_family("A100-80GB", 81_920, (("p4de.24xlarge", 8, 96, 1152, 27.44705),)),
    # p5, NVIDIA H100 81,920 MiB. All fields [SKY]; p5.48xlarge vCPU/RAM agree with [SPOT] (the advisor
    # snapshot predates p5.4xlarge).
    *_family(
        "H100",
        81_920,
        (
            ("p5.4xlarge", 1, 16, 256, 6.88),
            ("p5.48xlarge", 8, 192, 2048, 55.04),
        ),
    ),
    # p5e, NVIDIA H200 144,384 MiB. All fields [SKY]. No on-demand price: sold through EC2 Capacity
    # Blocks for ML only (empty Price on every SkyPilot row).
    *_family("H200", 144_384, (("p5e.48xlarge", 8, 192, 2048, None),)),
    # p5en, NVIDIA H200 144,384 MiB. All fields [SKY]; vCPU/RAM agree with [SPOT].
    *_family("H200", 144_384, (("p5en.48xlarge", 8, 192, 2048, 63.296),)),
    # p6-b200, NVIDIA B200 183,359 MiB. All fields [SKY]. Launched (2025-05) as Capacity Blocks only;
    # the SkyPilot catalog now lists a us-east-1 on-demand price.
    *_family("B200", 183_359, (("p6-b200.48xlarge", 8, 192, 2048, 113.9328),)),
]

INSTANCE_TYPES: dict[str, InstanceType] = {t.name: t for t in _TYPES}
if len(INSTANCE_TYPES) != len(_TYPES):
    raise ValueError("duplicate instance type name in the catalog table")
