"""QLoRA's quantized frozen kernels: int8 and NF4 round trips within their error, NF4's packing, a matmul
whose input gradient equals the dequantized kernel's, and no dequantized kernel kept alive for the
backward pass (XLA's own memory analysis of the compiled gradient)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from zoo.nn import quant


@pytest.mark.parametrize("kind, bound, size", [("int8", 1 / 254, 1 + 4 / 256), ("nf4", 0.15, 0.5 + 4 / 64)])
def test_a_quantized_kernel_is_within_its_error_and_its_bytes(kind, bound, size):
    w = jax.random.normal(jax.random.PRNGKey(0), (256, 4, 32)) * 0.02  # [in, N, H]: one input axis
    q = quant.quantize(w, 1, kind)
    back = quant.dequantize(q, w.shape, jnp.float32)
    err = float(jnp.max(jnp.abs(back - w)) / jnp.max(jnp.abs(w)))
    assert 0 < err <= bound and quant.nbytes(q) == pytest.approx(size * w.size, rel=1e-6)
    if kind == "nf4":  # every code is a level of the table, two per byte
        assert q["codes"].dtype == jnp.uint8 and q["codes"].shape == (128, 128)
        levels = np.unique(np.asarray(back / jnp.repeat(q["scale"], 64, 0).reshape(w.shape)).round(5))
        assert set(levels) <= set(quant.NF4.round(5))


def test_the_matmul_gradient_is_the_dequantized_kernels():
    w = jax.random.normal(jax.random.PRNGKey(1), (64, 96)) * 0.05
    x = jax.random.normal(jax.random.PRNGKey(2), (2, 5, 64))
    for kind in quant.KINDS:
        q = quant.quantize(w, 1, kind)
        wd = quant.dequantize(q, w.shape, jnp.float32)
        f = lambda x_: jnp.sum(jnp.sin(quant.einsum("BTD,DF->BTF", x_, q, w.shape, jnp.float32)))  # noqa: E731
        g = lambda x_: jnp.sum(jnp.sin(jnp.einsum("BTD,DF->BTF", x_, wd)))  # noqa: E731
        # Both sides jitted: one compile each, not one per op.
        np.testing.assert_allclose(jax.jit(f)(x), jax.jit(g)(x), rtol=1e-6)
        np.testing.assert_allclose(jax.jit(jax.grad(f))(x), jax.jit(jax.grad(g))(x), rtol=1e-5, atol=1e-7)


def test_the_backward_pass_keeps_codes_not_dequantized_kernels():
    """Eight big frozen kernels, small activations: the compiled gradient's temporaries stay far below the
    eight float32 kernels (dequantized in the forward pass and kept for the backward, they would not)."""
    D, L = 512, 8
    keys = jax.random.split(jax.random.PRNGKey(0), L)
    qs = [quant.quantize(jax.random.normal(k, (D, D)) * 0.02, 1, "nf4") for k in keys]

    def loss(x, qs):
        for q in qs:
            x = jnp.tanh(quant.einsum("BD,DF->BF", x, q, (D, D), jnp.float32))
        return jnp.sum(x)
    mem = jax.jit(jax.grad(loss)).lower(jnp.ones((4, D)), qs).compile().memory_analysis()
    kernel = D * D * 4
    assert mem.temp_size_in_bytes < 3 * kernel, (mem.temp_size_in_bytes, L * kernel)


@pytest.mark.parametrize("kind", quant.KINDS)
def test_quantizing_is_one_program_per_shape_with_the_op_by_op_bits(kind):
    """quant.quantize is jitted (static: n_in, kind, lead): its codes and scales are the op-by-op ones bit for bit,
    for a plain kernel and a scanned one (leading layers axis, two input axes), and bad input still raises."""
    w = jax.random.normal(jax.random.PRNGKey(3), (3, 64, 4, 48)) * 0.05
    for x, n_in, lead in ((w[0], 1, 0), (w, 1, 1), (w, 2, 1)):
        got, want = quant.quantize(x, n_in, kind, lead), quant.quantize.__wrapped__(x, n_in, kind, lead)
        assert set(got) == set(want)
        for k in want:
            assert got[k].dtype == want[k].dtype
            np.testing.assert_array_equal(np.asarray(got[k]), np.asarray(want[k]))
    with pytest.raises(ValueError, match="choose one of int8, nf4"):
        quant.quantize(w[0], 1, "fp8")
