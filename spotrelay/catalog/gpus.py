"""GPU models and their relative training throughput.

`dense_tflops` is the vendor's peak **dense** (not 2:4-sparse) FP16/BF16 tensor-core throughput of
one GPU, in TFLOPS: the BF16 figure where the GPU has BF16, the FP16-with-FP32-accumulate
("mixed precision") figure where it has none (T4, V100). We rank GPUs by this one number because the
jobs spotrelay runs are mixed-precision training, whose time goes mostly into FP16/BF16 matrix
multiplies on the tensor cores. Sparse figures are halved back to dense (NVIDIA's own footnote:
"with sparsity; one-half lower without"), since training does not use structured sparsity.

`relative_speed` is `dense_tflops / dense_tflops[REFERENCE_GPU]`, computed below from the table, so
the V100 is 1.0 and a job's `work_hours` (measured on a V100) divides by it.

These are **peak datasheet figures, not measured benchmarks.** Real throughput depends on memory
bandwidth, interconnect, kernels and batch size: memory-bound work on an L4 (300 GB/s) runs well
below its 0.97 x V100 (900 GB/s) here, and no GPU sustains its peak. Treat `relative_speed` as a
first-order ordering and scale, not a prediction of wall-clock time.

`memory_gib` is the nominal memory of one GPU, as AWS's instance-type pages list it and as users
write it in a job spec (A10G and L4: 24 GiB; L40S: 48 GiB). DescribeInstanceTypes reports less for
the GDDR cards (`GpuInfo.Gpus[].MemoryInfo.SizeInMiB`: 22,888 MiB for A10G and L4, 45,776 MiB for
L40S); for the HBM cards the two agree. It is the figure a job's `gpu_memory_gib` is checked
against, and it equals `InstanceType.gpu_memory_gib`.
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

# Per-GPU memory: AWS DescribeInstanceTypes, transcribed from the SkyPilot AWS catalog
# (skypilot-org/skypilot-catalog, catalogs/v8/aws/vms.csv @ 00148f2a, `GpuInfo` column; p-family rows
# also in /work/shared/data/skypilot-catalog/aws-gpu-p-family-instance-specs.csv). Looked up 2026-11-30.
_GPU_TABLE: tuple[tuple[str, int, float], ...] = (
    # (name, nominal memory MiB per GPU, dense FP16/BF16 tensor TFLOPS)
    #
    # T4 (g4dn). NVIDIA T4 datasheet / https://www.nvidia.com/en-us/data-center/tesla-t4/ :
    # "Mixed Precision (FP16/FP32) 65 TFLOPS". Turing has no BF16 and no sparsity. Looked up 2026-11-30.
    ("T4", 16_384, 65.0),
    # A10G (g5). NVIDIA publishes no A10G datasheet; AWS states only "up to 250 TOPS" per GPU (INT8).
    # 70 TFLOPS is Baseten, "NVIDIA A10 vs A10G for ML model inference"
    # (https://www.baseten.co/blog/nvidia-a10-vs-a10g-for-ml-model-inference/): "A10G only has 70 TF"
    # of FP16 tensor compute. UNCERTAIN: the A10 datasheet gives 125 dense BF16 TFLOPS
    # (https://www.nvidia.com/en-us/data-center/products/a10-gpu/), and some public tables reuse that
    # for the A10G; the true peak is somewhere in 70..125 (relative_speed 0.56..1.0). Nominal memory
    # 24 GB GDDR6. Looked up 2026-11-30.
    ("A10G", 24_576, 70.0),
    # L4 (g6, gr6). NVIDIA L4 datasheet / https://www.nvidia.com/en-us/data-center/l4/ :
    # "BF16 Tensor Core 242 TFLOPS*", *with sparsity -> 121 dense. Nominal 24 GB. Looked up 2026-11-30.
    ("L4", 24_576, 121.0),
    # L40S (g6e). NVIDIA L40S datasheet / https://www.nvidia.com/en-us/data-center/l40s/ :
    # "BF16 Tensor Core 362.05 | 733* TFLOPS" (dense | sparse). Nominal 48 GB. Looked up 2026-11-30.
    ("L40S", 49_152, 362.05),
    # V100 16 GB SXM2 (p3). NVIDIA Tesla V100 datasheet / https://www.nvidia.com/en-us/data-center/v100/ :
    # "Tensor Performance 125 TFLOPS" for the SXM2 (NVLink) part (PCIe: 112). FP16 with FP32 accumulate;
    # Volta has no BF16. Looked up 2026-11-30.
    ("V100", 16_384, 125.0),
    # V100 32 GB SXM2 (p3dn). Same datasheet and figure as V100: 125 TFLOPS. Looked up 2026-11-30.
    ("V100-32GB", 32_768, 125.0),
    # A100 40 GB SXM4 (p4d). NVIDIA A100 datasheet / https://www.nvidia.com/en-us/data-center/a100/ :
    # "BFLOAT16 Tensor Core 312 TFLOPS | 624 TFLOPS*" (dense | sparse). Looked up 2026-11-30.
    ("A100", 40_960, 312.0),
    # A100 80 GB SXM4 (p4de). Same datasheet: 312 dense BF16 TFLOPS. Looked up 2026-11-30.
    ("A100-80GB", 81_920, 312.0),
    # H100 80 GB SXM5 (p5). NVIDIA H100 datasheet / https://www.nvidia.com/en-us/data-center/h100/ :
    # "BF16 Tensor Core 1,979 teraFLOPS*", *with sparsity -> 989.5 dense. Looked up 2026-11-30.
    ("H100", 81_920, 989.5),
    # H200 141 GB SXM (p5e, p5en). NVIDIA H200 datasheet / https://www.nvidia.com/en-us/data-center/h200/ :
    # "BF16 Tensor Core 1,979 TFLOPS*", *with sparsity -> 989.5 dense. Looked up 2026-11-30.
    ("H200", 144_384, 989.5),
    # B200 (p6-b200). NVIDIA HGX platform page / https://www.nvidia.com/en-us/data-center/hgx/ :
    # HGX B200 (8 GPUs) "FP16/BF16 Tensor Core 36 PFLOPS" with sparsity -> 4.5 PF sparse, 2,250 TFLOPS
    # dense per GPU. NVIDIA states 180 GB per GPU (DGX B200: 1,440 GB for 8); AWS reports 183,359 MiB.
    # Looked up 2026-11-30.
    ("B200", 183_359, 2250.0),
)


def _build(table: tuple[tuple[str, int, float], ...]) -> dict[str, GpuModel]:
    tflops = {name: dense for name, _, dense in table}
    reference = tflops[REFERENCE_GPU]
    return {
        name: GpuModel(
            name=name,
            memory_gib=memory_mib / 1024,
            dense_tflops=dense,
            relative_speed=dense / reference,
        )
        for name, memory_mib, dense in table
    }


GPU_MODELS: dict[str, GpuModel] = _build(_GPU_TABLE)
