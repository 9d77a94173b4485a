"""A decoder's params for decoding on a CPU: every plain `Einsum` kernel stored transposed, as `kernel_t` [out, in]
(torch's Linear layout), which `Einsum` then applies by `dense_t`: a decoding step's few rows against a [out, in]
weight run at 1.6-2.2x the rate of XLA:CPU's [rows, in] x [in, out] (zoo.nn.layers.dense_t). The numbers are the
same up to float rounding; the params are a copy (zoo.api.pretrained's `decoding` makes it once and keeps it).

Only where it pays and nothing else reads the kernel: on the CPU backend, for Einsums whose einsum is one 2-D
product (`layers.simple`), not adapted (LoRA's lora_a/lora_b beside the kernel) and not quantized (qkernel). Other
backends' matrix units take either layout: their params come back as they are. `ZOO_KERNEL_LAYOUT=plain` in the
environment keeps the kernels as they are on the CPU too (what `python -m zoo.bench.serve --servers
zoo-serve,zoo-serve-plain-kernels` measures the layout against).
"""

from __future__ import annotations

import math
import os

import flax.linen as nn
import jax
import jax.numpy as jnp

from zoo.nn.layers import Einsum, simple, split_eqn


LAYOUTS = ("out_in", "plain")  # ZOO_KERNEL_LAYOUT: kernels as kernel_t [out, in] on a CPU (the default), or as they are


def _einsums(model, params, ids_BT) -> dict:
    """{params path of an Einsum: (its eqn, its kernel's shape)}, read off one abstract forward pass."""
    found = {}

    def record(next_fun, args, kwargs, context):
        m = context.module
        if isinstance(m, Einsum) and context.method_name == "__call__":
            found[tuple(m.path)] = (m.eqn, tuple(m.shape))
        return next_fun(*args, **kwargs)

    with nn.intercept_methods(record):
        jax.eval_shape(lambda p: model.apply({"params": p}, ids_BT), params)
    return found


def transposed(model, params, *, platform: str | None = None):
    """`params` with each plain Einsum kernel as `kernel_t` [.., out, in] (a scanned stack keeps its layer axis
    first); as they are off the CPU. The model reads either (zoo.nn.layers.Einsum)."""
    platform = platform or jax.default_backend()
    layout = os.environ.get("ZOO_KERNEL_LAYOUT", "out_in")
    if layout not in LAYOUTS:
        from zoo.errors import ConfigError
        raise ConfigError(f"ZOO_KERNEL_LAYOUT={layout!r} is unknown; choose one of {', '.join(LAYOUTS)}")
    if platform != "cpu" or layout == "plain":
        return params
    out = jax.tree.map(lambda x: x, params)  # a new tree of dicts, the same leaves
    for path, (eqn, shape) in _einsums(model, params, jnp.zeros((1, 2), jnp.int32)).items():
        node = out
        for name in path:
            if not isinstance(node, dict) or name not in node:
                break
            node = node[name]
        else:
            if not simple(eqn) or set(node) != {"kernel"} and set(node) != {"kernel", "bias"}:
                continue
            w = node.pop("kernel")
            xs, ws, o = split_eqn(eqn)
            n_in = sum(c in xs and c not in o for c in ws)
            lead = w.ndim - len(shape)  # a scanned stack's layer axis
            w2 = w.reshape(*w.shape[:lead], math.prod(shape[:n_in]), math.prod(shape[n_in:]))
            node["kernel_t"] = _swap(w2)
    return out


@jax.jit
def _swap(w):
    return jnp.swapaxes(w, -1, -2)
