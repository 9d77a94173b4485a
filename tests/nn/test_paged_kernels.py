"""zoo's side of the TPU's ragged paged-attention kernel (zoo.nn.paged_kernels): the combined pool, its writes, the
kernel's arguments and the engine decoding by it. The kernel itself runs on a TPU only (its Pallas interpret mode
does not run it), so here a stand-in takes its place, itself checked against jax's `ref_ragged_paged_attention`;
tests/aot/test_compile_for.py compiles the kernel for a v5e."""

import dataclasses

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import zoo
from tests.helpers.engine_runs import greedy_tokens, shared_prompts
from zoo.errors import ArgumentError
from zoo.nn import paged_cache, paged_kernels
from zoo.nn.attention import einsum_attention


def stand_in(q_TNH, kv_pages, kv_lens, page_indices, cu_q_lens, num_seqs, *, sm_scale, soft_cap=None, **_):
    """The kernel's answer for sequences of one query each (cu_q_lens = 0..B), in jnp: sequence b's query over the
    first kv_lens[b] slots of its pages, keys at the even combined heads and values at the odd."""
    B, N, H = q_TNH.shape
    PAGE, C = kv_pages.shape[1:3]
    kv = kv_pages[page_indices.reshape(-1)].reshape(B, -1, C, H)
    k_BSNH, v_BSNH = (jnp.repeat(kv[:, :, i::2], N // (C // 2), axis=2) for i in (0, 1))
    s_BNS = jnp.einsum("bnh,bsnh->bns", q_TNH, k_BSNH) * sm_scale
    if soft_cap:
        s_BNS = soft_cap * jnp.tanh(s_BNS / soft_cap)
    s_BNS = jnp.where(jnp.arange(kv.shape[1])[None, None, :] < kv_lens[:, None, None], s_BNS, -1e30)
    return jnp.einsum("bns,bsnh->bnh", jax.nn.softmax(s_BNS, axis=-1), v_BSNH).astype(q_TNH.dtype)


@pytest.fixture
def on_a_tpu(monkeypatch):
    """The engine and the model as on a TPU, the kernel the stand-in."""
    monkeypatch.setattr(paged_kernels, "available", lambda kernel, platform: None)
    monkeypatch.setattr(paged_kernels, "kernel_call", stand_in)


def _inputs(seed, B=5, N=4, K=2, H=128, PAGE=16, P=48, NP=8):
    rng = np.random.default_rng(seed)
    q = jnp.asarray(rng.normal(size=(B, 1, N, H)), jnp.float32)
    kv = jnp.asarray(rng.normal(size=(P, PAGE, 2 * K, H)), jnp.float32)
    table = jnp.asarray(rng.permutation(np.arange(1, P))[:B * NP].reshape(B, NP), jnp.int32)
    return q, kv, table


@pytest.mark.parametrize("soft_cap", [None, 5.0])
def test_the_stand_in_answers_as_jaxs_reference_of_the_kernel(soft_cap):
    from jax.experimental.pallas.ops.tpu.ragged_paged_attention.kernel import ref_ragged_paged_attention
    q, kv, table = _inputs(0)
    B = q.shape[0]
    args = (q[:, 0], kv, jnp.array([5, 17, 100, 127, 1], jnp.int32), table, jnp.arange(B + 1, dtype=jnp.int32),
            jnp.array([B], jnp.int32))
    want = ref_ragged_paged_attention(*args, sm_scale=0.088, soft_cap=soft_cap)
    np.testing.assert_allclose(np.asarray(stand_in(*args, sm_scale=0.088, soft_cap=soft_cap)), np.asarray(want),
                               atol=2e-6)


def test_attend_gives_the_kernel_each_rows_length_pages_and_scale(on_a_tpu):
    """Rows at positions 4, 16, 99 and 126 (one free, -1) over pages scattered through the pool: attend's call of
    the kernel answers the gathered attention of each row up to its position."""
    q, kv, table = _inputs(1)
    B, NP, PAGE = q.shape[0], table.shape[1], kv.shape[1]
    pos = jnp.array([[4], [16], [99], [126], [-1]], jnp.int32)
    got = paged_kernels.attend(q, kv, pos, table, softcap=30.0)
    gathered = kv[table.reshape(-1)].reshape(B, NP * PAGE, *kv.shape[2:])
    mask = (jnp.arange(NP * PAGE)[None, :] <= pos)[:, None, None, :]
    want = einsum_attention(q, gathered[:, :, 0::2], gathered[:, :, 1::2], mask=mask, softcap=30.0)
    np.testing.assert_allclose(np.asarray(got[:4]), np.asarray(want[:4]), atol=2e-6)
    assert np.all(np.isfinite(np.asarray(got[4])))  # a free row reads its scratch page


def test_a_prefill_writes_and_reads_the_combined_pool_as_the_two_pools():
    """Written into the combined pool [P, PAGE, 2K, H] and read back by the gather, a prefill's keys and values
    are those of the key and value pools."""
    rng = np.random.default_rng(2)
    B, T, K, H, PAGE, P = 2, 5, 2, 8, 4, 9
    k_BTKH, v_BTKH = (jnp.asarray(rng.normal(size=(B, T, K, H)), jnp.float32) for _ in range(2))
    table = jnp.array([[3, 5, 0], [7, 1, 0]], jnp.int32)

    class Var:
        def __init__(self, shape):
            self.value = jnp.zeros(shape, jnp.float32)
    for pos in (jnp.array([[0, 1, 2, 3, 4], [2, 3, 4, 5, -1]], jnp.int32), jnp.array([[6], [9]], jnp.int32)):
        t = pos.shape[1]
        views = []
        for kernel, shapes in ((None, ((P, PAGE, K, H),) * 2), ("tpu", ((P, PAGE, 2 * K, H), (0,)))):
            key, value = Var(shapes[0]), Var(shapes[1])
            k, v, mask = paged_cache.write_read(key, value, k_BTKH[:, :t], v_BTKH[:, :t], pos,
                                                paged_cache.Paged(table, None, kernel))
            views.append([np.asarray(x) for x in (k, v, mask)])
        for a, b in zip(*views):
            np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(views[1][0][1, 9], np.asarray(k_BTKH[1, 0]))  # row 1's position 9: page 1, slot 1


@pytest.fixture(scope="module")
def lm128():
    """llama_tiny with 4 query heads on 2 key/value heads of 128 dims (the kernel's lane width), 2 layers."""
    from zoo import tasks
    from zoo.api.pretrained import Pretrained
    base = zoo.load("llama_tiny")
    cfg = dataclasses.replace(base.config, model=dataclasses.replace(base.config.model, d_model=512, num_layers=2))
    model = tasks.build(cfg).model
    params = nn.unbox(jax.jit(lambda r: model.init(r, jnp.zeros((1, 8), jnp.int32))["params"])(jax.random.PRNGKey(0)))
    return Pretrained(model, params, base.tokenizer, cfg, source="llama_tiny", kind="preset")


def test_the_engine_decoding_by_the_kernel_answers_the_tokens_of_the_gathered_pages(lm128, on_a_tpu):
    """Three prompts of 40, 70 and 5 tokens, 20 greedy tokens each, over 4 rows (a prompt sharing pages with
    another): keys and values one pool, each step's token written in place and its attention the kernel's, the
    same tokens as the two pools gathered."""
    from zoo.engine.batching import Engine
    prompts, got = shared_prompts(), {}
    for kernel in ("off", "tpu"):
        engine = Engine(lm128, slots=4, max_len=128, chunk=4, paged_kernel=kernel)
        attn = engine.cache["h_0"]["attn"]
        assert engine.kernel == (None if kernel == "off" else "tpu")
        assert (attn["cached_key"].shape, attn["cached_value"].shape) == (
            ((33, 16, 2, 128),) * 2 if kernel == "off" else ((33, 16, 4, 128), (0,)))
        got[kernel] = greedy_tokens(engine, prompts)
        assert engine.reused == (48 if kernel == "off" else got["off_reused"])
        got[kernel + "_reused"] = engine.reused
    assert got["tpu"] == got["off"] and [len(t) for t in got["off"]] == [20] * 4


def test_auto_gathers_off_a_tpu_and_a_kernel_that_cannot_take_a_model_is_refused_in_one_line(lm128):
    from zoo.engine.batching import Engine
    presets = zoo.models.PRESETS
    cfg = lm128.config.model
    assert paged_kernels.for_model("auto", cfg, "float32") == ("cpu", None)  # this CPU: zoo's C++ kernel
    assert paged_kernels.for_model("auto", cfg, "bfloat16") == (None, "dtypes bfloat16 (it takes float32)")
    assert paged_kernels.for_model("auto", cfg, "bfloat16", platform="tpu") == ("tpu", None)
    assert paged_kernels.for_model("auto", presets["smollm2_135m"], "bfloat16", platform="tpu") == (
        None, "head dim 64: the TPU kernel's blocks are whole 128-lane tiles")
    mistral = paged_kernels.for_model("tpu", presets["mistral_7b"], "bfloat16", platform="tpu")
    assert mistral == (None, "a sliding window")
    three = dataclasses.replace(cfg, d_model=768, num_heads=6, num_kv_heads=3)
    assert paged_kernels.for_model("tpu", three, "bfloat16", platform="tpu")[1] == (
        "3 key/value heads in bfloat16 (the kernel tiles 1, 2, 4, 8 or a multiple of 8)")
    assert paged_kernels.for_model("tpu", presets["qwen3_0_6b"], "bfloat16", platform="tpu", tensor=4) == (
        "tpu", None)  # 2 of its 8 key/value heads a chip
    with pytest.raises(ArgumentError, match=r"^--paged-kernel tpu: the tpu kernel runs on a TPU only"):
        Engine(lm128, slots=2, max_len=64, paged_kernel="tpu")
    with pytest.raises(ValueError, match=r"paged attention kernel 'cuda': choose auto, off, tpu, cpu"):
        paged_kernels.choose("cuda", "cpu")
