"""The TPU chips zoo compiles for, with the figures the report sets a program against. Each figure is the
chip's published one (Cloud TPU's system-architecture pages, named per chip); bandwidths are bytes per second.

GPUs (measured 2026-11-28 with jax 0.10.2): the CUDA plugin (`jax-cuda12-plugin` + `jax-cuda12-pjrt`, 182 MB) does
create compile-only devices on a host with no GPU when given a `target_config` (XLA's GpuTargetConfigProto as text:
the device's SM count, memory, compute capability) and a `topology` ("1x1x8"), and compiles a plain sharded matmul
there (memory_analysis answers; cost_analysis returns None). What blocks `--compile-for h100:8` today: cuDNN's
fused attention checks the cuDNN library's version while tracing (`RuntimeError: cuDNN not found` without
nvidia-cudnn, a ~700 MB wheel), and zoo would have to ship H100/H200 target descriptions of its own; jax's
`jax_mock_gpu_topology` only mocks other hosts around real local GPUs.

`ici_bytes_per_s` is the chip's inter-chip interconnect bandwidth as published (bidirectional, all ports
together): the roofline charges collectives against it, which is optimistic for rings that use fewer ports.
"""

from __future__ import annotations

import dataclasses

GB = 1e9
GIB = 1024 ** 3


@dataclasses.dataclass(frozen=True)
class Chip:
    name: str  # zoo's name for the generation: v4, v5e, v5p, v6e
    device_kind: str  # what jax's devices call it (device.device_kind)
    hbm_bytes: float  # HBM per chip
    bf16_flops: float  # peak dense bf16 FLOP/s per chip
    hbm_bytes_per_s: float  # HBM bandwidth per chip
    ici_bytes_per_s: float  # inter-chip interconnect, bidirectional, per chip
    cores_per_chip: int  # TensorCores a chip has: a v4/v5p slice's name counts cores (v5p-16 = 8 chips)
    source: str


CHIPS = {
    "v4": Chip("v4", "TPU v4", 32 * GIB, 275e12, 1200 * GB, 300 * GB, 2, "https://cloud.google.com/tpu/docs/v4"),
    "v5e": Chip("v5e", "TPU v5 lite", 16 * GB, 197e12, 819 * GB, 400 * GB, 1, "https://cloud.google.com/tpu/docs/v5e"),
    "v5p": Chip("v5p", "TPU v5", 95 * GB, 459e12, 2765 * GB, 600 * GB, 2, "https://cloud.google.com/tpu/docs/v5p"),
    "v6e": Chip("v6e", "TPU v6 lite", 32 * GB, 918e12, 1640 * GB, 400 * GB, 1, "https://cloud.google.com/tpu/docs/v6e"),
}


def chip_of(device_kind: str) -> Chip | None:
    """The table's chip whose device kind this is (None: a chip the table does not know)."""
    for chip in CHIPS.values():
        if chip.device_kind.lower() == device_kind.lower():
            return chip
    return None
