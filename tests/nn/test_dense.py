"""zoo.nn.layers.dense: a layer's einsum as one 2-D matmul over the input's flattened leading axes. The same
values and gradients as jnp.einsum for every equation zoo's layers use, einsum itself where the axes do not
fit, and the reason it exists: the compiled weight gradient on CPU holds no transposed copy of the output
gradient (a [F, B*T] array), for the plain layer, the SwiGLU MLP and LoRA's adapters alike."""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from zoo.nn import lora
from zoo.nn.layers import GatedMlp, dense

EQUATIONS = [  # (eqn, x shape, w shape)
    ("BTD,DF->BTF", (2, 5, 8), (8, 12)),
    ("BTD,DNH->BTNH", (2, 5, 8), (8, 3, 4)),
    ("BTNH,NHD->BTD", (2, 5, 3, 4), (3, 4, 8)),
    ("BTr,rF->BTF", (3, 7, 4), (4, 6)),
    ("BD,DF->BF", (3, 8), (8, 6)),  # one leading axis: already 2-D, einsum
    ("BTD,VD->BTV", (2, 5, 8), (11, 8)),  # the kernel's contracted axis last: einsum
    ("BNTS,BSNH->BTNH", (2, 3, 5, 5), (2, 5, 3, 4)),  # batched: einsum
]


@pytest.mark.parametrize("eqn, xs, ws", EQUATIONS)
def test_values_and_gradients_equal_einsum(eqn, xs, ws):
    x = jax.random.normal(jax.random.PRNGKey(0), xs)
    w = jax.random.normal(jax.random.PRNGKey(1), ws)
    g = jax.random.normal(jax.random.PRNGKey(2), jnp.einsum(eqn, x, w).shape)
    loss = lambda f: lambda x, w: jnp.sum(f(eqn, x, w) * g)  # noqa: E731
    np.testing.assert_allclose(dense(eqn, x, w), jnp.einsum(eqn, x, w), rtol=1e-6, atol=1e-6)
    for ours, theirs in zip(jax.grad(loss(dense), (0, 1))(x, w), jax.grad(loss(jnp.einsum), (0, 1))(x, w)):
        np.testing.assert_allclose(ours, theirs, rtol=1e-5, atol=1e-5)


def _transposed_grads(f, *args, rows: int, width: int) -> list[str]:
    """The arrays of shape [width, rows] (the output gradient transposed) in the compiled gradient's HLO."""
    hlo = jax.jit(jax.grad(f)).lower(*args).compile().as_text()
    return re.findall(rf"\S+ = f32\[{width},{rows}\]\S* \w+", hlo)


def test_no_transposed_output_gradient_in_the_swiglu_weight_gradient():
    mlp = GatedMlp(40, jax.nn.silu, out_std=0.02, use_bias=False)
    x = jax.random.normal(jax.random.PRNGKey(0), (4, 64, 16))  # B*T = 256 rows, F = 40
    params = mlp.init(jax.random.PRNGKey(1), x)
    loss = lambda p: jnp.sum(mlp.apply(p, x) ** 2)  # noqa: E731
    assert _transposed_grads(loss, params, rows=256, width=40) == []


def test_no_transposed_output_gradient_in_the_adapters_gradients():
    spec = lora.LoraSpec(rank=4, alpha=8.0, targets=("gate", "fc", "proj"))
    mlp = GatedMlp(40, jax.nn.silu, out_std=0.02, use_bias=False)
    x = jax.random.normal(jax.random.PRNGKey(0), (4, 64, 16))
    with lora.intercept(spec, train=False):
        params = mlp.init(jax.random.PRNGKey(1), x)["params"]
    adapters = {k: {n: v[n] for n in lora.LEAVES} for k, v in params.items()}
    frozen = {k: {"kernel": v["kernel"]} for k, v in params.items()}

    def loss(ad):
        with lora.intercept(spec, train=False):
            merged = {k: {**frozen[k], **ad[k]} for k in ad}
            return jnp.sum(mlp.apply({"params": merged}, x) ** 2)
    assert _transposed_grads(loss, adapters, rows=256, width=40) == []
