"""A decoder's params for decoding on a CPU: every plain `Einsum` kernel stored transposed, as `kernel_t` [out, in]
(torch's Linear layout), which `Einsum` then applies by `dense_t`: a decoding step's few rows against a [out, in]
weight run at 1.6-2.2x the rate of XLA:CPU's [rows, in] x [in, out] (zoo.nn.layers.dense_t). The numbers are the
same up to float rounding; the params are a copy (zoo.api.pretrained's `decoding` makes it once and keeps it).

Only where it pays and nothing else reads the kernel: on the CPU backend, for Einsums whose einsum is one 2-D
product (`layers.simple`), not adapted (LoRA's lora_a/lora_b beside the kernel) and not quantized (qkernel). Other
backends' matrix units take either layout: their params come back as they are. A self-attention's query, key and
value become one weight (`_groups`, read by zoo.nn.layers.fused_t): one product where there were three on the same
input. One row of SmolLM2-135M decodes 11-13% faster so; 8 and 32 rows measured the same within the noise, and a
gated MLP's gate and fc fused too gained nothing more (python -m zoo.bench.decode_layouts). `ZOO_KERNEL_LAYOUT=plain`
in the environment keeps the kernels as they are on the CPU too (what `python -m zoo.bench.serve --servers
zoo-serve,zoo-serve-plain-kernels` measures the layout against).
"""

from __future__ import annotations

import math
import os

import flax.linen as nn
import jax
import jax.numpy as jnp

from zoo.nn.attention import Attention
from zoo.nn.layers import Einsum, simple, split_eqn


LAYOUTS = ("out_in", "plain")  # ZOO_KERNEL_LAYOUT: kernels as kernel_t [out, in] on a CPU (the default), or as they are


def _einsums(model, params, ids_BT) -> dict:
    """{params path of an Einsum: (its eqn, its kernel's shape, its input's id, its parent module's type)}, read
    off one abstract forward pass."""
    found = {}

    def record(next_fun, args, kwargs, context):
        m = context.module
        if isinstance(m, Einsum) and context.method_name == "__call__":
            found[tuple(m.path)] = (m.eqn, tuple(m.shape), id(args[0]), type(m.parent))
        return next_fun(*args, **kwargs)

    with nn.intercept_methods(record):
        jax.eval_shape(lambda p: model.apply({"params": p}, ids_BT), params)
    return found


def transposed(model, params, *, platform: str | None = None, fuse: bool = True):
    """`params` with each plain Einsum kernel as `kernel_t` [.., out, in] (a scanned stack keeps its layer axis
    first); as they are off the CPU. The model reads either (zoo.nn.layers.Einsum). `fuse`: a self-attention's
    query, key and value as one weight (`_groups`); False where the Einsums must stay apart, as zoo-serve's
    per-request adapters find them by path (zoo.nn.multi_lora)."""
    platform = platform or jax.default_backend()
    layout = os.environ.get("ZOO_KERNEL_LAYOUT", "out_in")
    if layout not in LAYOUTS:
        from zoo.errors import ConfigError
        raise ConfigError(f"ZOO_KERNEL_LAYOUT={layout!r} is unknown; choose one of {', '.join(LAYOUTS)}")
    if platform != "cpu" or layout == "plain":
        return params
    out = jax.tree.map(lambda x: x, params)  # a new tree of dicts, the same leaves
    found = _einsums(model, params, jnp.zeros((1, 2), jnp.int32))
    plain = {}  # path -> (its node, its kernel as [.., in, out]): the Einsums transposed here
    for path, (eqn, shape, _, _) in found.items():
        node = _node(out, path)
        if node is None or not simple(eqn) or set(node) != {"kernel"} and set(node) != {"kernel", "bias"}:
            continue
        w = node["kernel"]
        xs, ws, o = split_eqn(eqn)
        n_in = sum(c in xs and c not in o for c in ws)
        lead = w.ndim - len(shape)  # a scanned stack's layer axis
        plain[path] = node, w.reshape(*w.shape[:lead], math.prod(shape[:n_in]), math.prod(shape[n_in:]))
    for parent, name, children in (_groups(found, plain) if fuse else []):
        node, members = _node(out, parent), [plain.pop(parent + (c,)) for c in children]
        node[f"{name}_t"] = _swap(*(w for _, w in members))
        if "bias" in members[0][0]:  # [.., out...] each: flattened past a scanned stack's layer axis
            lead = members[0][1].ndim - 2
            node[f"{name}_bias"] = jnp.concatenate([m["bias"].reshape(*m["bias"].shape[:lead], -1)
                                                    for m, _ in members], axis=-1)
        for c in children:
            del node[c]
    for node, w in plain.values():
        del node["kernel"]
        node["kernel_t"] = _swap(w)
    return out


def _node(tree, path):
    for name in path:
        if not isinstance(tree, dict) or name not in tree:
            return None
        tree = tree[name]
    return tree if isinstance(tree, dict) else None


# Siblings that read one input, stored as one weight (zoo.nn.layers.fused_t): {parent module: (name, children)}
FUSED = {Attention: ("qkv", ("query", "key", "value"))}


def _groups(found: dict, plain: dict) -> list:
    """[(parent path, name, children)] of the FUSED groups whose members all read the same input (a
    self-attention's query, key and value; not a cross-attention's) and are all transposed here with the same
    params (all with a bias or none): each becomes one `{name}_t` [.., sum of outs, in] (and `{name}_bias`). A
    group with an adapted or quantized member stays apart."""
    out = []
    for parent, kind in {path[:-1]: found[path][3] for path in found if found[path][3] in FUSED}.items():
        name, children = FUSED[kind]
        paths = [parent + (c,) for c in children]
        if all(p in plain for p in paths) and len({found[p][2] for p in paths}) == 1 and \
                len({frozenset(plain[p][0]) for p in paths}) == 1:
            out.append((parent, name, children))
    return out


@jax.jit
def _swap(*ws):
    """[.., in, out] kernels as one [.., sum of outs, in]."""
    return jnp.swapaxes(ws[0] if len(ws) == 1 else jnp.concatenate(ws, axis=-1), -1, -2)
