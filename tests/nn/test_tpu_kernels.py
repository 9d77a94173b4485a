"""TPU kernels (zoo.nn.tpu_kernels) without a TPU: splash attention and the experts' grouped matmul (megablox gmm)
run in Pallas interpret mode on CPU and equal zoo's einsum attention and the dense (every expert, gathered by
weight) dispatch, outputs and gradients within 1e-5 in float32; `auto` picks them for a TPU mesh (the platform
of the mesh traced under, not jax's default backend) and keeps einsum on CPU and cuDNN on GPU; a train-step
compile for a v5e:2x2 topology holds their custom calls."""

import dataclasses
import re

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from zoo.models.gpt import MOE_TINY, Gpt
from zoo.nn import attention as attn, moe, tpu_kernels
from zoo.nn.layers import target_platform
from zoo.training import sharding

TOL = 1e-5


@pytest.fixture(scope="module")
def tpu_mesh(monkeypatch_module):
    """Four compile-only v5e devices (libtpu on this CPU host) as zoo's mesh: data 2 x tensor 2."""
    monkeypatch_module.setenv("TPU_WORKER_HOSTNAMES", "localhost")
    monkeypatch_module.setenv("TPU_ACCELERATOR_TYPE", "v5litepod-4")
    from jax.experimental import topologies
    devices = topologies.get_topology_desc(topology_name="v5e:2x2", platform="tpu").devices
    return Mesh(np.array(devices).reshape(2, 1, 2, 1), sharding.AXES)


@pytest.fixture(scope="module")
def monkeypatch_module():
    with pytest.MonkeyPatch.context() as mp:
        yield mp


@pytest.fixture(autouse=True)
def fresh_fallbacks():
    attn.FALLBACKS.clear()
    yield
    attn.FALLBACKS.clear()


def test_the_kernel_axes_are_the_sharding_rules():
    rules = dict(sharding.RULES)
    assert tpu_kernels.BATCH_AXES == rules["batch"] and tpu_kernels.HEAD_AXES == (rules["heads"],) == (rules["mlp"],)


def sds(*shape, dtype=jnp.bfloat16):
    return jax.ShapeDtypeStruct(shape, dtype)


def test_auto_is_splash_on_tpu_and_unchanged_elsewhere():
    q, kv = sds(2, 256, 8, 64), sds(2, 256, 4, 64)
    assert attn.select_backend("auto", q, kv, kv, is_causal=True, platform="tpu") == "splash"
    assert attn.select_backend("auto", q, kv, kv, is_causal=True, platform="cpu") == "einsum"
    assert attn.select_backend("auto", q, kv, kv, is_causal=True, platform="gpu") == "cudnn"
    assert attn.select_backend("xla", q, kv, kv, platform="tpu") == "xla"
    assert not attn.FALLBACKS


@pytest.mark.parametrize("case,reason", [
    (dict(bias=sds(1, 8, 256, 256, dtype=jnp.float32)), "bias"),  # T5
    (dict(mask=sds(2, 1, 256, 256, dtype=bool)), "mask beyond causal"),  # BERT padding, a KV cache
    (dict(T=100), "multiples of 128"),
    (dict(dtype=jnp.float16), "float16"),
])
def test_splash_falls_back_with_a_reason(case, reason):
    case = dict(case)
    T, dtype = case.pop("T", 256), case.pop("dtype", jnp.bfloat16)
    q, kv = sds(2, T, 8, 64, dtype=dtype), sds(2, T, 4, 64, dtype=dtype)
    assert reason in attn.splash_unsupported_reason(q, kv, kv, **case)
    assert attn.select_backend("auto", q, kv, kv, platform="tpu", **case) == "xla"
    assert len(attn.FALLBACKS) == 1 and reason in attn.FALLBACKS.pop()
    with pytest.raises(ValueError, match="attention_impl=splash"):
        attn.select_backend("splash", q, kv, kv, platform="tpu", **case)


def test_the_platform_follows_the_mesh_traced_under(tpu_mesh):
    assert target_platform() == "cpu" and attn.resolve_attention("auto") == "einsum"
    assert moe.default_implementation() == "dense"
    with jax.set_mesh(tpu_mesh):  # a TPU program compiled on this CPU host
        assert target_platform() == "tpu" and attn.resolve_attention("auto") == "splash"
        assert moe.default_implementation() == "gmm" and not tpu_kernels.interpret_default()
    assert jax.default_backend() == "cpu" and tpu_kernels.interpret_default()


def out_and_grads(fn, *args, seed=3):
    """fn's output and the gradients of <fn(args), w> for a fixed random w, in one jitted program."""
    def run(*args):
        out, vjp = jax.vjp(fn, *args)
        return out, vjp(jax.random.normal(jax.random.PRNGKey(seed), out.shape, out.dtype))
    return jax.jit(run)(*args)


def assert_close(got, want):
    for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
        np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=TOL, atol=TOL)


def test_splash_equals_einsum_attention_in_interpret_mode():
    """Causal, a 24-token window, two packed examples and padding, soft-capping at 1, 2 query heads per key
    head: one kernel holds them all (each changes the reference, checked), outputs and gradients within 1e-5."""
    B, T, N, K, H, window, cap = 1, 128, 2, 1, 16, 24, 1.0
    q, k, v = (jax.random.normal(r, (B, T, n, H)) for r, n in zip(jax.random.split(jax.random.PRNGKey(0), 3),
                                                                    (N, K, K)))
    seg_BT = jnp.asarray(np.repeat([1, 2, 0], [70, 40, 18])[None], jnp.int32)

    def reference(q, k, v, window=window, seg=seg_BT, cap=cap):
        mask = attn.window_mask(T, T, window) if window else None
        if seg is not None:
            mask = attn.segment_mask(seg) if mask is None else mask & attn.segment_mask(seg)
        return attn.einsum_attention(q, k, v, None, mask, is_causal=True, softcap=cap)

    def splash(q, k, v):
        return tpu_kernels.splash_attention(q, k, v, is_causal=True, window=window, segment_ids_BT=seg_BT,
                                            softcap=cap, interpret=True)

    want = out_and_grads(reference, q, k, v)
    assert_close(out_and_grads(splash, q, k, v), want)
    for dropped in (dict(window=0), dict(seg=None), dict(cap=0.0)):  # each option changes the numbers
        assert np.abs(np.asarray(reference(q, k, v, **dropped) - want[0])).max() > 1e-2, dropped


def test_gmm_experts_equal_the_dense_dispatch_in_interpret_mode():
    """A MoE layer (5 experts, 2 per token, 21 tokens: rows padded to a 128-row tile; F=10 in a 128-wide tile)
    through megablox's gmm equals every expert on every token weighted by the routing: outputs and the
    gradients of every parameter and of the input within 1e-5."""
    E, R, D, F = 5, 2, 12, 10
    x = jax.random.normal(jax.random.PRNGKey(0), (3, 7, D))
    params = nn.unbox(jax.jit(moe.MoeMlp(E, R, F).init)(jax.random.PRNGKey(1), x)["params"])
    params = dict(params, router=params["router"] * 5.0)  # sharp routing: experts differ in load

    def apply(implementation):
        layer = moe.MoeMlp(E, R, F, implementation=implementation)
        return lambda p, x: layer.apply({"params": p}, x)

    want = out_and_grads(apply("dense"), params, x)
    assert_close(out_and_grads(apply("gmm"), params, x), want)


def test_a_tpu_train_step_compiles_to_splash_and_gmm(tpu_mesh):
    """jit(grad) of a one-layer MoE Llama (grouped keys, a 64-token window, packed rows, bf16) with its params and
    batch as NamedShardings over 4 v5e devices, traced under the mesh: the compiled program calls splash's
    forward and backward kernels and gmm/tgmm (tpu_custom_call), and no XLA attention softmax of [T, S]."""
    cfg = dataclasses.replace(MOE_TINY, num_layers=1, sliding_window=64, dtype="bfloat16")
    model, B, T = Gpt(cfg), 4, 128
    boxed = jax.eval_shape(model.init, jax.random.PRNGKey(0), sds(B, T, dtype=jnp.int32))
    param_sh, batch_sh = sharding.shardings(boxed, tpu_mesh), NamedSharding(tpu_mesh, P(sharding.DATA_AXES))

    def loss(params, ids_BT, seg_BT):
        return jnp.sum(model.apply(params, ids_BT, segment_ids_BT=seg_BT).astype(jnp.float32))

    params = jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s), nn.unbox(boxed), param_sh)
    batch = jax.ShapeDtypeStruct((B, T), jnp.int32, sharding=batch_sh)
    with jax.set_mesh(tpu_mesh):
        step = jax.jit(jax.grad(loss), in_shardings=(param_sh, batch_sh, batch_sh), out_shardings=param_sh)
        text = step.lower(params, batch, batch).compile().as_text()
    kernels = {re.sub(r"\.\d+$", "", m) for m in re.findall(r"%(\S+) = .*custom_call_target=\"tpu_custom_call\"", text)}
    assert {"splash_mha_fwd_segmented_residuals", "splash_mha_dkv_segmented_no_residuals", "gmm", "tgmm"} <= kernels
    assert not attn.FALLBACKS
