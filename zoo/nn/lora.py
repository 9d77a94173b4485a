"""LoRA: low-rank adapters beside the Einsum layers every family calls, added without editing any module.

`intercept(spec, train)` is a flax method interceptor: inside it, every `Einsum` whose name (or path suffix)
is in `spec.targets` adds `scale * (x A) B` to its output, with its own params `lora_a` and `lora_b` in
the Einsum's scope (h_3/attn/query/lora_a), created at init like any param:

  kernel [in..., out...]    A  lora_a [in..., r]    B  lora_b [r, out...]    scale = alpha / r

The kernel's contracted ("in") axes lead, its output axes follow, as in every zoo Einsum (`BTD,DNH->BTNH`,
`BTNH,NHD->BTD`, `BTD,DF->BTF`); A carries the in axes' logical names, B the out axes', so adapters shard
with the kernel they adapt. A is initialised as PEFT does (uniform, bound 1/sqrt(fan_in)) and B at zero,
so an adapted model starts equal to its base. Dropout (training only) falls on the adapters' input.

`merge(params, spec)` folds the adapters into the kernels (W + scale A B) and removes them: the plain model
then runs the adapted weights (sampling, export, fine-tuning from a LoRA run).
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import math

import flax.linen as nn
import jax
import jax.numpy as jnp

from zoo.nn import quant
from zoo.nn.layers import Einsum, dense, split_eqn

LEAVES = ("lora_a", "lora_b")


@dataclasses.dataclass(frozen=True)
class LoraSpec:
    """What a model config's lora_* fields say."""
    rank: int
    alpha: float
    dropout: float = 0.0
    targets: tuple[str, ...] = ()

    @property
    def scale(self) -> float:
        return self.alpha / self.rank

    def matches(self, path: tuple[str, ...]) -> bool:
        """Whether the Einsum at `path` ('h_0', 'attn', 'query') is adapted: a target without "/" names the
        layer ("query"), one with "/" a path suffix ("attn/out", "h_11/mlp/fc")."""
        joined = "/".join(path)
        return any(joined.endswith("/" + t) or joined == t if "/" in t else path[-1] == t for t in self.targets)


def factor_shapes(eqn: str, shape: tuple, rank: int) -> tuple[tuple, tuple, int]:
    """(A's shape, B's shape, number of in axes) of the kernel `shape` applied by `eqn`."""
    x, w, out = split_eqn(eqn)
    n_in = sum(c in x and c not in out for c in w)
    if any(c in out for c in w[:n_in]) or any(c not in out for c in w[n_in:]):
        raise ValueError(f"LoRA needs the contracted axes of {eqn!r}'s kernel before its output axes")
    return (*shape[:n_in], rank), (rank, *shape[n_in:]), n_in


def _init_a(fan_in: int):
    bound = 1.0 / math.sqrt(fan_in)  # PEFT: kaiming_uniform(a=sqrt(5)) of nn.Linear(in, r)
    return lambda key, shape, dtype: jax.random.uniform(key, shape, dtype, -bound, bound)


def delta(m: Einsum, x, spec: LoraSpec, train: bool):
    """scale * (x A) B of Einsum `m`, creating lora_a / lora_b at init."""
    a_shape, b_shape, n_in = factor_shapes(m.eqn, m.shape, spec.rank)
    a = m.param("lora_a", nn.with_logical_partitioning(_init_a(math.prod(a_shape[:-1])), (*m.axes[:n_in], None)),
                a_shape, m.param_dtype)
    b = m.param("lora_b", nn.with_logical_partitioning(nn.initializers.zeros_init(), (None, *m.axes[n_in:])),
                b_shape, m.param_dtype)
    x = x.astype(m.dtype)
    if train and spec.dropout > 0:
        keep = jax.random.bernoulli(m.make_rng("dropout"), 1.0 - spec.dropout, x.shape)
        x = jnp.where(keep, x / (1.0 - spec.dropout), 0).astype(m.dtype)
    xs, w, out = split_eqn(m.eqn)
    mid = "".join(c for c in xs if c not in w[:n_in]) + "r"  # x's letters left after the contraction, then r
    # The scale on the rank-r intermediate, not on the [B, T, out] delta: r elements per token to touch, not out.
    # Both as dense's 2-D matmuls: the adapters' gradients (dA = x^T dh, dB = h^T dy) then read x and dy in place.
    h = dense(f"{xs},{w[:n_in]}r->{mid}", x, a.astype(m.dtype)) * jnp.asarray(spec.scale, m.dtype)
    return dense(f"{mid},r{w[n_in:]}->{out}", h, b.astype(m.dtype))


_OFF = contextvars.ContextVar("zoo_lora_adapters_off", default=False)


@contextlib.contextmanager
def adapters_off():
    """Within: adapted layers run their base kernels alone (the adapters' params are there, unused). The frozen
    base of a LoRA run is then the reference model of preference tuning, with no second copy of its weights."""
    token = _OFF.set(True)
    try:
        yield
    finally:
        _OFF.reset(token)


def intercept(spec: LoraSpec, train: bool, seen: set | None = None):
    """A context manager under which the targeted Einsum layers carry adapters (init and apply alike; none within
    `adapters_off`). `seen` collects the path of every Einsum called (for naming what lora_targets may match)."""
    def interceptor(next_fun, args, kwargs, context):
        m = context.module
        if context.method_name != "__call__" or not isinstance(m, Einsum):
            return next_fun(*args, **kwargs)
        path = tuple(m.scope.path)
        if seen is not None:
            seen.add(path)
        y = next_fun(*args, **kwargs)
        return y + delta(m, args[0], spec, train) if spec.matches(path) and not _OFF.get() else y
    return nn.intercept_methods(interceptor)


def is_adapter(path: str) -> bool:
    """Whether a "/"-joined param path is an adapter leaf."""
    return path.rsplit("/", 1)[-1] in LEAVES


def adapted_kernel(node: dict, spec: LoraSpec):
    """W + scale A B of one adapted Einsum's params (a dequantized `qkernel` for a quantized base), float32."""
    a, b = jnp.asarray(node["lora_a"], jnp.float32), jnp.asarray(node["lora_b"], jnp.float32)
    scanned = "kernel" in node and a.ndim + b.ndim - 2 == jnp.ndim(node["kernel"]) + 1 or \
        "qkernel" in node and quant.scanned(node["qkernel"])
    lead = a.shape[:1] if scanned else ()
    in_dims, out_dims = a.shape[len(lead):-1], b.shape[len(lead) + 1:]
    shape = (*lead, *in_dims, *out_dims)
    w = node["kernel"] if "kernel" in node else quant.dequantize(node["qkernel"], shape, jnp.float32)
    a2 = a.reshape(*lead, math.prod(in_dims), -1)
    b2 = b.reshape(*lead, b.shape[len(lead)], math.prod(out_dims))
    return jnp.asarray(w, jnp.float32) + spec.scale * jnp.matmul(a2, b2).reshape(shape)


def merge(params, spec: LoraSpec | None):
    """The params with every adapter folded into its kernel (same dtype as the kernel) and removed; a
    quantized base's kernels come back dequantized. Unadapted params are returned as they are."""
    if spec is None:
        return params

    def walk(node):
        if not isinstance(node, dict):
            return node
        if "lora_a" in node:
            dtype = node["kernel"].dtype if "kernel" in node else jnp.float32
            rest = {k: walk(v) for k, v in node.items() if k not in (*LEAVES, "kernel", "qkernel")}
            return {**rest, "kernel": adapted_kernel(node, spec).astype(dtype)}
        return {k: walk(v) for k, v in node.items()}
    return walk(params)
