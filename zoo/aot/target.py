"""A compile target: "v5e:2x2" (generation:topology, as jax's topology API names it), "v5e-8" (Cloud TPU's slice
name: v5e/v6e count chips, v4/v5p count TensorCores, so v5p-16 is 8 chips) or either with "/N" for N slices
joined by the data-center network ("v5e:2x2/2"). `devices(name)` returns the target's compile-only devices,
which libtpu's client gives on any host, TPU or not (zoo.runtime.quiet_libtpu keeps its start-up lines off the
console where no TPU is attached).
"""

from __future__ import annotations

import dataclasses
import math
import re

from zoo import runtime
from zoo.aot.chips import CHIPS, Chip
from zoo.errors import ConfigError

# The slice shapes Cloud TPU sells, chips -> topology, for names like v5e-8 (v5e and v6e: 2-D; v4 and v5p: 3-D).
SHAPES_2D = {1: "1x1", 4: "2x2", 8: "2x4", 16: "4x4", 32: "4x8", 64: "8x8", 128: "8x16", 256: "16x16"}
SHAPES_3D = {4: "2x2x1", 8: "2x2x2", 16: "2x2x4", 32: "2x4x4", 64: "4x4x4", 128: "4x4x8", 256: "4x8x8", 512: "8x8x8"}


@dataclasses.dataclass(frozen=True)
class Target:
    name: str  # as the user wrote it
    chip: Chip
    topology: str  # jax's topology_name, e.g. "v5e:2x2"
    slices: int  # slices joined by the data-center network (1: one ICI domain)

    @property
    def chips(self) -> int:
        dims = self.topology.split(":")[1].split("x")
        return math.prod(int(d) for d in dims) * self.slices


def parse(name: str) -> Target:
    """"v5e:2x2" | "v5e-8" | either + "/N" -> Target; anything else is one line naming the valid forms."""
    valid = f"GENERATION:TOPOLOGY (v5e:2x2, v5p:2x2x1) or a slice name (v5e-8, v5p-16), /N for N slices; generations: {', '.join(CHIPS)}"
    m = re.fullmatch(r"\s*(v\w+?)(?::(\d+(?:x\d+)+)|-(\d+))(?:/(\d+))?\s*", name or "")
    if not m or m.group(1) not in CHIPS:
        raise ConfigError(f"--compile-for {name!r} is not a target zoo knows: {valid}")
    gen, topo, count, slices = m.group(1), m.group(2), m.group(3), int(m.group(4) or 1)
    chip = CHIPS[gen]
    if topo is None:
        chips, rest = divmod(int(count), chip.cores_per_chip)
        topo = (SHAPES_2D if chip.cores_per_chip == 1 else SHAPES_3D).get(chips)
        if rest or topo is None:
            raise ConfigError(f"--compile-for {name!r}: {gen}-{count} is not a slice Cloud TPU sells ({gen}-N counts "
                              f"{'TensorCores, 2 a chip' if chip.cores_per_chip == 2 else 'chips'}); give the "
                              f"topology instead, e.g. {gen}:{'2x2x1' if chip.cores_per_chip == 2 else '2x2'}")
    dims = 3 if chip.cores_per_chip == 2 else 2
    if len(topo.split("x")) != dims:
        raise ConfigError(f"--compile-for {name!r}: a {gen} topology has {dims} dimensions "
                          f"(e.g. {gen}:{'2x2x1' if dims == 3 else '2x2'})")
    if slices < 1:
        raise ConfigError(f"--compile-for {name!r}: the number of slices must be at least 1")
    return Target(name, chip, f"{gen}:{topo}", slices)


def devices(target: Target) -> list:
    """The target's compile-only devices (libtpu's client): one line where libtpu is missing or refuses it."""
    runtime.quiet_libtpu()
    try:
        import libtpu  # noqa: F401
    except ImportError:
        raise ConfigError(f"--compile-for {target.name}: compiling for a TPU needs libtpu: pip install 'zoo[tpu]' "
                          f"(libtpu, the version jax[tpu] pins for this jax)") from None
    from jax.experimental import topologies
    kwargs = {"num_slices": target.slices} if target.slices > 1 else {}
    try:
        topo = topologies.get_topology_desc(topology_name=target.topology, platform="tpu", **kwargs)
    except Exception as e:  # libtpu's own words: an unknown or impossible topology
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise ConfigError(f"--compile-for {target.name}: libtpu cannot describe topology {target.topology} "
                          f"({first})") from None
    return list(topo.devices)
