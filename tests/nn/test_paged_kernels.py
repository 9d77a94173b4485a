"""A decoding step's attention by jax's Pallas paged-attention kernel (zoo.nn.paged_kernels), run here in the TPU's
interpret mode: the engine with its pool laid out for the kernel answers the tokens of the engine that gathers the
pages, the kernel's output is the gathered attention's, and the choice refuses in one line what it cannot take."""

import dataclasses

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import zoo
from tests.helpers.engine_runs import decode_all
from zoo.errors import ArgumentError
from zoo.nn import paged_cache, paged_kernels
from zoo.nn.attention import einsum_attention


@pytest.fixture(scope="module")
def lm128():
    """llama_tiny with 2 query heads on 1 key/value head of 128 dims (the TPU kernel's lane width), 2 layers."""
    from zoo import tasks
    from zoo.api.pretrained import Pretrained
    base = zoo.load("llama_tiny")
    cfg = dataclasses.replace(base.config, model=dataclasses.replace(base.config.model, d_model=256, num_heads=2,
                                                                     num_kv_heads=1, num_layers=2))
    model = tasks.build(cfg).model
    params = nn.unbox(jax.jit(lambda r: model.init(r, jnp.zeros((1, 8), jnp.int32))["params"])(jax.random.PRNGKey(0)))
    return Pretrained(model, params, base.tokenizer, cfg, source="llama_tiny", kind="preset")


def test_the_kernel_reads_each_rows_pages_up_to_its_length_as_the_gathered_attention_does():
    """Rows at 5, 17, 100 and 127 tokens (one free: position -1) over pages scattered through the pool, 6 query
    heads on 2 key/value heads: the kernel's output is einsum_attention's over the rows' gathered pages."""
    rng = np.random.default_rng(0)
    B, N, K, H, PAGE, P, NP = 5, 6, 2, 128, 16, 48, 8
    q = jnp.asarray(rng.normal(size=(B, 1, N, H)), jnp.float32)
    k_pool, v_pool = (jnp.asarray(rng.normal(size=(K, P, PAGE, H)), jnp.float32) for _ in range(2))
    table = jnp.asarray(rng.permutation(np.arange(1, P))[:B * NP].reshape(B, NP), jnp.int32)
    pos = jnp.array([[4], [16], [99], [126], [-1]], jnp.int32)
    got = paged_kernels.attend("tpu", q, k_pool, v_pool, pos, table)
    k_BSKH, v_BSKH = (p[:, table.reshape(-1)].reshape(K, B, NP * PAGE, H).transpose(1, 2, 0, 3)
                      for p in (k_pool, v_pool))
    mask = (jnp.arange(NP * PAGE)[None, :] <= pos)[:, None, None, :]
    want = einsum_attention(q, k_BSKH, v_BSKH, mask=mask)
    # the interpret mode's products differ from XLA:CPU's by about 1e-3 of a logit (the kernel's own numbers)
    np.testing.assert_allclose(np.asarray(got[:4]), np.asarray(want[:4]), atol=2e-2, rtol=0)
    assert float(jnp.abs(got - want)[:4].mean()) < 2e-3 and not np.any(np.asarray(got[4]))  # a free row: zeros


def test_the_engine_decoding_by_the_kernel_answers_the_tokens_of_the_gathered_pages(lm128):
    """Three prompts of 40, 70 and 5 tokens, 20 greedy tokens each, over 4 rows: the pool laid out heads first
    ([K, pages, PAGE, H]) and each step's attention the TPU kernel's, the same tokens as the pages gathered."""
    from zoo.engine.batching import Engine, Sequence
    rng = np.random.default_rng(0)
    prompts = [rng.integers(1, 256, n).tolist() for n in (40, 70, 5)]
    got = {}
    for kernel in ("off", "tpu"):
        engine = Engine(lm128, slots=4, max_len=128, chunk=4, paged_kernel=kernel)
        pool = engine.cache["h_0"]["attn"]["cached_key"]
        assert engine.kernel == (None if kernel == "off" else "tpu")
        assert pool.shape == ((33, 16, 1, 128) if kernel == "off" else (1, 33, 16, 128))
        chunks = decode_all(engine, [Sequence(prompt=p, max_tokens=20, temperature=0.0) for p in prompts],
                            timeout=300)[0]
        got[kernel] = [sum(c, []) for c in chunks]
    assert got["tpu"] == got["off"] and [len(t) for t in got["off"]] == [20, 20, 20]


def test_auto_gathers_on_a_cpu_and_a_kernel_named_for_a_model_it_cannot_take_is_refused(lm128):
    from zoo.engine.batching import Engine
    smol = zoo.models.PRESETS["smollm2_135m"]
    assert paged_kernels.for_model("auto", lm128.config.model, "float32") == (None, None)  # CPU: the gather
    assert paged_kernels.for_model("auto", lm128.config.model, "bfloat16", platform="tpu") == (None, None)
    assert paged_kernels.for_model("tpu", lm128.config.model, "float32") == ("tpu", None)
    assert paged_kernels.for_model("tpu", smol, "float32") == (
        None, "head dim 64: the TPU kernel's blocks are whole 128-lane tiles")
    assert paged_kernels.for_model("tpu", zoo.models.PRESETS["mistral_7b"], "bfloat16")[1] == "a sliding window"
    with pytest.raises(ArgumentError, match=r"^--paged-kernel tpu: head dim 32: the TPU kernel's blocks"):
        Engine(zoo.load("llama_tiny"), slots=2, max_len=64, paged_kernel="tpu")
    with pytest.raises(ValueError, match=r"paged attention kernel 'cuda': choose auto, off, tpu, gpu"):
        paged_kernels.choose("cuda")


def test_a_prefill_reads_the_heads_first_pool_by_the_gather():
    """Many queries a row take the gather whatever the kernel: written into the heads-first pool and read back as
    [B, N * PAGE, K, H], the same keys as the pages-first pool gives."""
    rng = np.random.default_rng(1)
    B, T, K, H, PAGE, P = 2, 5, 2, 8, 4, 9
    k_BTKH, v_BTKH = (jnp.asarray(rng.normal(size=(B, T, K, H)), jnp.float32) for _ in range(2))
    table = jnp.array([[3, 5, 0], [7, 1, 0]], jnp.int32)
    pos = jnp.array([[0, 1, 2, 3, 4], [2, 3, 4, 5, -1]], jnp.int32)

    class Var:
        def __init__(self, shape):
            self.value = jnp.zeros(shape, jnp.float32)
    views = []
    for kernel, shape in ((None, (P, PAGE, K, H)), ("tpu", (K, P, PAGE, H))):
        key, value = Var(shape), Var(shape)
        k, v, mask = paged_cache.write_read(key, value, k_BTKH, v_BTKH, pos, paged_cache.Paged(table, None, kernel))
        views.append((np.asarray(k), np.asarray(v), np.asarray(mask)))
    for a, b in zip(*views):
        np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(views[0][0][0, :5], np.asarray(k_BTKH[0]))  # row 0's positions 0..4, pages 3, 5
