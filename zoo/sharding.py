"""Device mesh from config, and the one table mapping logical axis names to mesh axes.

Data parallel by default (`data=-1` fills the devices): the batch is split over `data` and `fsdp`,
params are split over `fsdp` (along `embed`) and `tensor` (heads, MLP width, vocabulary). A dim that
a mesh axis does not divide is left unsplit on that axis rather than failing.
"""

from __future__ import annotations

import math

import flax.linen as nn
import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from zoo.config import ConfigError, MeshConfig

AXES = ("data", "fsdp", "tensor")
RULES = (
    ("batch", ("data", "fsdp")),
    ("embed", "fsdp"),
    ("mlp", "tensor"),
    ("heads", "tensor"),
    ("vocab", "tensor"),
    ("kv", None),
    ("length", None),
    ("layers", None),
)


def mesh_shape(cfg: MeshConfig, num_devices: int) -> tuple[int, int, int]:
    sizes = [cfg.data, cfg.fsdp, cfg.tensor]
    known = math.prod(s for s in sizes if s != -1)
    if -1 in sizes:
        if num_devices % known:
            raise ConfigError(f"mesh: {num_devices} devices cannot be split with fixed axes of size {known} "
                              f"(mesh.data/fsdp/tensor={tuple(sizes)})")
        sizes[sizes.index(-1)] = num_devices // known
    if math.prod(sizes) != num_devices:
        raise ConfigError(f"mesh: data*fsdp*tensor = {'*'.join(map(str, sizes))} = {math.prod(sizes)} "
                          f"but {num_devices} devices are available")
    return tuple(sizes)


def make_mesh(cfg: MeshConfig, devices=None) -> Mesh:
    devices = list(jax.devices() if devices is None else devices)
    shape = mesh_shape(cfg, len(devices))
    return Mesh(np.asarray(devices).reshape(shape), AXES)


def data_parallel_size(mesh: Mesh) -> int:
    return mesh.shape["data"] * mesh.shape["fsdp"]


def batch_sharding(mesh: Mesh) -> NamedSharding:
    return NamedSharding(mesh, P(("data", "fsdp")))


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


def param_shardings(boxed_abstract, mesh: Mesh):
    """NamedSharding per param (unboxed tree structure) from the params' logical axis names."""
    specs = nn.get_partition_spec(boxed_abstract)
    mesh_specs = nn.logical_to_mesh(specs, RULES)
    shapes = nn.unbox(boxed_abstract)
    return jax.tree.map(lambda s, a: NamedSharding(mesh, _fit(s, a.shape, mesh)), mesh_specs, shapes,
                        is_leaf=lambda x: isinstance(x, P))


def like_params(abstract_tree, params_abstract, params_shardings, mesh: Mesh):
    """Shardings for a tree whose leaves mirror params (optimizer moments): matched by key path
    suffix and shape; everything else (counts, scalars) replicated."""
    by_path = {}
    for path, leaf in jax.tree_util.tree_flatten_with_path(params_abstract)[0]:
        by_path[jax.tree_util.keystr(path)] = leaf.shape
    sh_by_path = {jax.tree_util.keystr(p): s for p, s in
                  jax.tree_util.tree_flatten_with_path(params_shardings)[0]}

    def pick(path, leaf):
        key = jax.tree_util.keystr(path)
        for k, shape in by_path.items():
            if key.endswith(k) and tuple(leaf.shape) == tuple(shape):
                return sh_by_path[k]
        return replicated(mesh)
    return jax.tree_util.tree_map_with_path(pick, abstract_tree)
