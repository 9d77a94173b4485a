"""Device mesh from config, and the one table mapping logical axis names to mesh axes.

Data parallel by default (`data=-1` fills the devices): the batch is split over `data`, `fsdp` and
`expert`, params are split over `fsdp` (along `embed`) and `tensor` (heads, MLP width, vocabulary), and a
mixture of experts' kernels over `expert` (along the expert axis, zoo.nn.moe; other params are
replicated over it, as over `data`). A dim that a mesh axis does not divide is left unsplit on that axis
rather than failing.
"""

from __future__ import annotations

import contextlib
import math

import flax.linen as nn
import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from zoo.configuration import MeshConfig
from zoo.errors import ConfigError
from zoo.nn import layers

AXES = ("data", "fsdp", "tensor", "expert")
DATA_AXES = layers.DATA_AXES  # the axes the batch is split over
RULES = (
    ("batch", DATA_AXES),
    ("expert", "expert"),
    ("embed", "fsdp"),
    ("mlp", "tensor"),
    ("heads", "tensor"),
    ("vocab", "tensor"),
    ("kv", None),
    ("length", None),
    ("layers", None),
)


def mesh_shape(cfg: MeshConfig, num_devices: int) -> tuple[int, int, int, int]:
    sizes = [cfg.data, cfg.fsdp, cfg.tensor, cfg.expert]
    known = math.prod(s for s in sizes if s != -1)
    if -1 in sizes:
        if num_devices % known:
            raise ConfigError(f"mesh: {num_devices} devices cannot be split with fixed axes of size {known} "
                              f"(mesh.data/fsdp/tensor/expert={tuple(sizes)})")
        sizes[sizes.index(-1)] = num_devices // known
    if math.prod(sizes) != num_devices:
        raise ConfigError(f"mesh: data*fsdp*tensor*expert = {'*'.join(map(str, sizes))} = {math.prod(sizes)} "
                          f"but {num_devices} devices are available")
    return tuple(sizes)


def make_mesh(cfg: MeshConfig, devices=None) -> Mesh:
    devices = list(jax.devices() if devices is None else devices)
    shape = mesh_shape(cfg, len(devices))
    return Mesh(np.asarray(devices).reshape(shape), AXES)


def data_parallel_size(mesh: Mesh) -> int:
    return math.prod(mesh.shape[a] for a in DATA_AXES)


def batch_sharding(mesh: Mesh) -> NamedSharding:
    return NamedSharding(mesh, P(DATA_AXES))


def replicated(mesh: Mesh) -> NamedSharding:
    return NamedSharding(mesh, P())


def _fit(spec: P, shape, mesh: Mesh) -> P:
    """Drop mesh axes that do not divide their dim (e.g. vocab 50257 over tensor=2)."""
    out = []
    for dim, axes in zip(shape, tuple(spec) + (None,) * (len(shape) - len(spec))):
        names = (axes,) if isinstance(axes, str) else tuple(axes or ())
        names = tuple(n for n in names if mesh.shape[n] > 1)
        if names and dim % math.prod(mesh.shape[n] for n in names):
            names = ()
        out.append(names[0] if len(names) == 1 else (names or None))
    return P(*out)


def shardings(boxed_abstract, mesh: Mesh):
    """NamedSharding per leaf of an abstract tree whose params are boxed (nn.Partitioned: logical axis
    names attached), e.g. the whole TrainState with the optimizer state built by `tx.init` on boxed
    params, so its moments carry the params' names. Unboxed leaves (step, rng, counts) are replicated.
    The result has the unboxed tree's structure."""
    specs = nn.logical_to_mesh(nn.get_partition_spec(boxed_abstract), RULES)
    return jax.tree.map(lambda s, a: NamedSharding(mesh, _fit(s, a.shape, mesh)), specs, nn.unbox(boxed_abstract),
                        is_leaf=lambda x: isinstance(x, P))


def kernels_mesh(mesh):
    """On a TPU the steps are traced under their mesh (jax.set_mesh), so zoo.nn's Pallas kernels (splash attention,
    grouped experts: zoo.nn.tpu_kernels) run per shard in shard_map rather than on gathered arrays; elsewhere
    nothing changes (CPU and GPU paths pick their backends as before)."""
    if mesh.devices.flat[0].platform != "tpu":
        return contextlib.nullcontext()
    return jax.set_mesh(mesh)
