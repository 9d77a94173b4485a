"""The attention backend choice per platform and shape (zoo.nn.attention): `auto` is cuDNN flash attention on
a GPU wherever `cudnn_unsupported_reason` finds nothing against the shapes and dtype, XLA otherwise (the
reason logged once). Checked on CPU with abstract shapes, and on the zoo models at the `gpu` bench shapes."""

import logging
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from zoo.nn import attention as attn, attention_backend

BF16, F32 = jnp.bfloat16, jnp.float32
ROOT = Path(__file__).resolve().parents[2]


def sds(*shape, dtype=BF16):
    return jax.ShapeDtypeStruct(shape, dtype)


def qkv(B=16, T=1024, S=None, N=12, K=None, H=64, dtype=BF16):
    S, K = S or T, K or N
    return sds(B, T, N, H, dtype=dtype), sds(B, S, K, H, dtype=dtype), sds(B, S, K, H, dtype=dtype)


@pytest.fixture(autouse=True)
def fresh_fallbacks():
    attn.FALLBACKS.clear()
    yield
    attn.FALLBACKS.clear()


@pytest.mark.parametrize("impl,platform,backend", [
    ("auto", "cpu", "einsum"), (None, "cpu", "einsum"), ("auto", "gpu", "cudnn"), ("auto", "tpu", "splash"), ("auto", "METAL", "xla"),
    ("xla", "gpu", "xla"), ("cudnn", "cpu", "cudnn"), ("einsum", "gpu", "einsum")])
def test_resolve_attention_takes_the_platform(impl, platform, backend):
    assert attn.resolve_attention(impl, platform) == backend


def test_resolve_attention_defaults_to_jax_backend():
    assert attn.resolve_attention("auto") == "einsum"  # the tests run on CPU


@pytest.mark.parametrize("case", [
    dict(),  # GPT-2 training: causal, no mask
    dict(mask=sds(16, 1, 1024, 1024, dtype=bool)),  # BERT: [B, 1, T, S] padding mask
    dict(mask=sds(16, 1, 1, 1024, dtype=bool)),  # key padding only: broadcast to [T, S] by `attention`
    dict(bias=sds(1, 12, 1024, 1024, dtype=F32), is_causal=True),  # T5 decoder: relative bias + causal
    dict(bias=sds(1, 12, 1024, 1024, dtype=F32), mask=sds(16, 1, 1, 1024, dtype=bool)),  # T5 encoder
    dict(T=1, S=160, mask=sds(1, 1, 1, 160, dtype=bool), training=False),  # one decoding step against a cache
    dict(K=4),  # grouped keys and values
    dict(dtype=jnp.float16),
    dict(H=128), dict(H=256, compute_capability="9.0"),
])
def test_cudnn_takes(case):
    case = dict(case)
    shape = {k: case.pop(k) for k in ("T", "S", "K", "H", "dtype") if k in case}
    q, k, v = qkv(**shape)
    bias, mask = case.pop("bias", None), case.pop("mask", None)
    assert attn.cudnn_unsupported_reason(q, k, v, bias, mask, **case) is None


@pytest.mark.parametrize("case,words", [
    (dict(dtype=F32), "dtype float32"),
    (dict(H=160), "head dim 160"),
    (dict(H=160, compute_capability="8.0"), "up to 128"),
    (dict(H=60), "head dim 60"),
    (dict(H=264, compute_capability="9.0"), "up to 256"),
    (dict(compute_capability="7.5"), "compute capability 7.5"),
    (dict(compute_capability="gfx90a"), "not an NVIDIA GPU"),
    (dict(bias=sds(1, 12, 1, 1024, dtype=F32)), "does not span"),
    (dict(T=9, S=9, mask=sds(16, 1, 9, 9, dtype=bool)), "odd length"),
    (dict(T=9, S=9, bias=sds(1, 12, 9, 9, dtype=F32)), "odd length"),
])
def test_cudnn_refuses_with_a_reason(case, words):
    case = dict(case)
    shape = {k: case.pop(k) for k in ("T", "S", "H", "dtype") if k in case}
    q, k, v = qkv(**shape)
    bias, mask = case.pop("bias", None), case.pop("mask", None)
    reason = attn.cudnn_unsupported_reason(q, k, v, bias, mask, **case)
    assert reason and words in reason, reason


def test_mixed_dtypes_and_value_head_dims_are_refused():
    q, k, v = qkv()
    assert "differ" in attn.cudnn_unsupported_reason(q, k, sds(16, 1024, 12, 64, dtype=F32))
    assert "value head dim" in attn.cudnn_unsupported_reason(q, k, sds(16, 1024, 12, 32))


def test_odd_lengths_need_no_gradient():
    q, k, v = qkv(T=9, S=9)
    mask = sds(16, 1, 9, 9, dtype=bool)
    assert attn.cudnn_unsupported_reason(q, k, v, mask=mask, training=True)
    assert attn.cudnn_unsupported_reason(q, k, v, mask=mask, training=False) is None
    assert attn.cudnn_unsupported_reason(q, k, v, is_causal=True) is None  # no mask, no bias: any length


def test_a_bias_whose_gradient_jax_would_drop_is_refused(monkeypatch):
    """Older jax returned zeros for the cuDNN gradient of a bias other than [1, N, T, S]: a learned bias
    (T5's relative positions) combined with a per-example mask then stays on XLA."""
    q, k, v = qkv()
    bias, mask = sds(1, 12, 1024, 1024, dtype=F32), sds(16, 1, 1, 1024, dtype=bool)
    # cudnn_unsupported_reason reads _dbias_exported where both live (zoo.nn.attention only imports them)
    monkeypatch.setattr(attention_backend, "_dbias_exported", lambda shape, q_shape: shape[0] == 1)
    assert "gradient" in attn.cudnn_unsupported_reason(q, k, v, bias, mask)
    assert attn.cudnn_unsupported_reason(q, k, v, bias, mask, training=False) is None
    assert attn.cudnn_unsupported_reason(q, k, v, bias, is_causal=True) is None


def test_jax_s_own_bias_gradient_rule_is_read_where_it_has_one(monkeypatch):
    """jax up to 0.11.1 has `should_export_dbias` (its answer is taken); 0.11.2 dropped it and returns the
    bias gradient for any bias, summed over a broadcast batch (T5 fell back to XLA on an H200 before this)."""
    from jax._src.cudnn import fused_attention_stablehlo as fa
    shape, q_shape = (1, 8, 512, 512), (16, 512, 8, 64)
    monkeypatch.setattr(fa, "should_export_dbias", lambda b, q, layout: b[0] == 7, raising=False)
    assert attn._dbias_exported(shape, q_shape) is False
    monkeypatch.setattr(fa, "should_export_dbias", lambda b, q, layout: b[0] == 1)
    assert attn._dbias_exported(shape, q_shape) is True
    monkeypatch.delattr(fa, "should_export_dbias")
    assert attn._dbias_exported((16,) + shape[1:], q_shape) is True


def test_auto_on_gpu_falls_back_to_xla_and_logs_each_reason_once(caplog):
    q, k, v = qkv(dtype=F32)
    with caplog.at_level(logging.WARNING, logger="zoo.nn.attention"):
        for _ in range(3):
            assert attn.select_backend("auto", q, k, v, platform="gpu") == "xla"
        assert attn.select_backend("auto", *qkv(H=160), platform="gpu") == "xla"
    assert len(caplog.records) == 2 and "dtype float32" in caplog.records[0].getMessage()
    assert len(attn.FALLBACKS) == 2
    assert attn.select_backend("auto", *qkv(), platform="gpu") == "cudnn"
    assert attn.select_backend("cudnn", q, k, v, platform="gpu") == "cudnn"  # named: no second guessing
    assert attn.select_backend("auto", q, k, v, platform="cpu") == "einsum"


def test_cudnn_refused_at_trace_time_runs_xla_under_auto_and_raises_when_named():
    """jax's own cuDNN checks raise while tracing (here: no cuDNN on CPU); under `auto` that is a fallback."""
    ks = jax.random.split(jax.random.PRNGKey(0), 4)
    q, k, v = (jax.random.normal(kk, (2, 8, 4, 16)).astype(BF16) for kk in ks[:3])
    mask = jax.random.uniform(ks[3], (2, 1, 1, 8)) > 0.3
    out = attn._cudnn(q, k, v, None, mask, scale=None, is_causal=True, fallback=True)
    ref = jax.nn.dot_product_attention(q, k, v, mask=mask, is_causal=True, implementation="xla")
    np.testing.assert_allclose(out.astype(F32), ref.astype(F32))
    assert any("cuDNN" in r or "cudnn" in r.lower() for r in attn.FALLBACKS)
    with pytest.raises((RuntimeError, NotImplementedError, ValueError)):
        attn._cudnn(q, k, v, None, mask, scale=None, is_causal=True, fallback=False)


@pytest.mark.parametrize("workload", ["gpt_train", "bert_mlm", "encdec_train"])
def test_every_attention_of_the_gpu_bench_models_takes_cudnn(workload, monkeypatch):
    """GPT-2, BERT-base and T5-small in bf16 at the `gpu` bench shapes, traced as on a GPU: no call falls back."""
    from zoo import tasks
    from zoo.bench import shapes
    from zoo.overrides import apply_overrides, load_config_file
    chosen, real = [], attn.select_backend

    def as_on_gpu(implementation, *args, **kw):
        chosen.append(real(implementation, *args, **{**kw, "platform": "gpu"}))
        return "einsum"  # trace on with the CPU path

    monkeypatch.setattr(attn, "select_backend", as_on_gpu)
    for spec in shapes.specs([workload], "gpu"):
        cfg = load_config_file(str(ROOT / spec["config"]))
        cfg = apply_overrides(cfg, spec["overrides"] + ["model.dtype=bfloat16"])
        jax.eval_shape(tasks.build(cfg).init, jax.random.PRNGKey(0))
    assert chosen and set(chosen) == {"cudnn"}, attn.FALLBACKS
