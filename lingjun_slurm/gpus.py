"""GPUs the planner knows: memory and dense BF16 peak, each value with where it comes from.

memory_mib is the framebuffer total nvidia-smi reports (`FB Memory Usage / Total`), which is what
the CUDA driver manages; a few hundred MiB of it are reserved by the driver (the "Reserved" line)
and the CUDA context, NCCL and the caching allocator take more: that is the planner's margin
(planning.margin). peak_bf16_tflops is NVIDIA's dense (no sparsity) BF16 tensor-core figure; the
values agree with train/metrics.py PEAK_BF16_TFLOPS (the trainer's MFU, matched on the device
name, which also lists GPUs this table has no memory figure for; tests/unit/test_plan_command.py
checks the two agree).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

MIB = 1 << 20


@dataclass(frozen=True)
class GPU:
    name: str
    memory_mib: int
    peak_bf16_tflops: float
    memory_source: str
    peak_source: str

    @property
    def memory_bytes(self) -> int:
        return self.memory_mib * MIB


_DATASHEET_A100 = "NVIDIA A100 Tensor Core GPU datasheet: BF16 tensor core 312 TFLOPS (624 with sparsity)"
_DATASHEET_H100 = "NVIDIA H100 Tensor Core GPU datasheet, H100 SXM: BF16 tensor core 1,979 TFLOPS with sparsity, 989 dense"
_DATASHEET_H200 = ("NVIDIA H200 Tensor Core GPU datasheet, H200 SXM: BF16 tensor core 1,979 TFLOPS with sparsity, "
                   "989 dense (allenai/open-instruct#1441 lists 989 TFLOPS BF16, 141 GB)")

GPUS: dict[str, GPU] = {gpu.name: gpu for gpu in (
    GPU("A100-40GB", 40960, 312.0,
        "nvidia-smi on NVIDIA A100-SXM4-40GB, driver 580.126.09: 40960MiB (bottlerocket-os/bottlerocket-core-kit#834)",
        _DATASHEET_A100),
    GPU("A100-80GB", 81920, 312.0,
        "nvidia-smi -q on NVIDIA A100-SXM4-80GB, driver 555.42.02: FB Total 81920 MiB, Reserved 763 MiB "
        "(thamada/nvidia-smi gls/A100SXMx4_smi.py at b09ef139)",
        _DATASHEET_A100),
    GPU("H100-80GB", 81559, 989.0,
        "nvidia-smi -q on NVIDIA H100 80GB HBM3, drivers 535.161.08 and 535.183.01: FB Total 81559 MiB, Reserved "
        "551 MiB (shared/reference/real-samples/health/nvidia-smi-q, from leptonai/gpud's testdata)",
        _DATASHEET_H100),
    GPU("H200-141GB", 143771, 989.0,
        "nvidia-smi on 8x NVIDIA H200 (SXM, 700 W), driver 570.158.01: 143771MiB per GPU (a public capture found "
        "with the code search; NVIDIA: 141 GB HBM3e)",
        _DATASHEET_H200),
)}

# Network profile -> GPU, where the profile's VM sizes all have one GPU type.
# azure-nd-a100-v4 covers Standard_ND96asr_v4 (8x A100 40GB) and Standard_ND96amsr_A100_v4
# (8x A100 80GB; kaito-project/kaito#1098): set planning.gpu there.
PROFILE_GPUS: dict[str, str] = {
    "azure-nd-h100-v5": "H100-80GB",  # Standard_ND96isr_H100_v5: 8x H100 80GB
    "azure-nd-h200-v5": "H200-141GB",  # Standard_ND96isr_H200_v5: 8x H200 141GB
}


def gpu(name: Optional[str]) -> Optional[GPU]:
    return GPUS.get(name) if name else None
