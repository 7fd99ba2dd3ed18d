"""Peak figures of the GPUs the roofline model knows (vendor data sheets, SXM parts).

These are the ceilings a kernel cannot beat, not measurements: dense bf16 tensor-core
FLOP/s (and dense FP8, --fp8's GEMMs), HBM bandwidth, memory, and the NVLink bandwidth
one GPU sends at (per direction), which bounds a ring collective.
"""
from dataclasses import dataclass


@dataclass(frozen=True)
class Device:
    name: str
    bf16_tflops: float   # dense bf16, tensor cores
    hbm_gbs: float       # GB/s (1e9 bytes)
    memory_gib: float    # device memory
    link_gbs: float      # NVLink, GB/s per direction
    fp8_tflops: float = 0.0  # dense FP8 (E4M3/E5M2), tensor cores; 0: no FP8 tensor cores

    @property
    def ridge(self) -> float:
        """FLOPs per byte above which a kernel is compute-bound."""
        return self.bf16_tflops * 1e12 / (self.hbm_gbs * 1e9)


DEVICES = {
    "h100": Device("H100 SXM 80GB", 989.0, 3350.0, 80.0, 450.0, 1979.0),
    "h200": Device("H200 SXM 141GB", 989.0, 4800.0, 141.0, 450.0, 1979.0),
    "a100": Device("A100 SXM 80GB", 312.0, 2039.0, 80.0, 300.0),
}


def device(name: str) -> Device:
    key = name.lower()
    if key not in DEVICES:
        raise ValueError(f"--gpu: expected one of {', '.join(sorted(DEVICES))}, got '{name}'")
    return DEVICES[key]
