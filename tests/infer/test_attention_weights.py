"""The attention weights zoo-attention draws are the model's own: softmax rows that sum to 1, exactly 0
above the diagonal of a causal head and on padded keys, and, multiplied with the layer's values and its
output projection, the attention layer's output; asking for them changes no output. What a head is
called (previous-token, first-token, self head) follows from where its weight goes."""

import dataclasses

import flax.linen as nn
import jax
import numpy as np
import pytest
from flax import traverse_util

from tests.helpers import tiny_configs
from zoo.infer.attention import collect, head_stats, role
from zoo.models.bert import BertMlm
from zoo.models.encdec import EncDec
from zoo.models.gpt import Gpt

RNG = np.random.default_rng(0)
CAPTURE = lambda module, method: module.name in ("value", "out")  # noqa: E731  (the layers the check reads)


def sharpened(params, factor=300.0):
    """Query kernels scaled up: a freshly initialised model attends almost uniformly, which hides mistakes."""
    flat = traverse_util.flatten_dict(nn.unbox(params))
    return traverse_util.unflatten_dict({k: v * factor if "query" in k and k[-1] == "kernel" else v
                                         for k, v in flat.items()})


def run(model, params, *inputs):
    """(plain output, output with the weights asked for, Weights, the captured intermediates)."""
    # Both jitted (one compile each, not one per op).
    plain = jax.jit(model.apply)({"params": params}, *inputs)
    out, variables = jax.jit(lambda p, *a: model.apply({"params": p}, *a, mutable=["intermediates"],
                                                       capture_intermediates=CAPTURE))(params, *inputs)
    return plain, out, collect(variables["intermediates"]), variables["intermediates"]


def assert_gives_the_output(w_BNTS, attn_intermediates, attn_params, layer=None):
    """softmax rows x values, through the output projection = the attention module's own output."""
    pick = (lambda x: x) if layer is None else (lambda x: x[layer])  # a scanned stack holds [L, ...]
    v_BSKH = pick(attn_intermediates["value"]["__call__"][0])
    out_BTD = pick(attn_intermediates["out"]["__call__"][0])
    v_BSNH = np.repeat(v_BSKH, w_BNTS.shape[1] // v_BSKH.shape[2], axis=2)
    o_BTNH = np.einsum("BNTS,BSNH->BTNH", w_BNTS, v_BSNH)
    ours_BTD = np.einsum("BTNH,NHD->BTD", o_BTNH, pick(attn_params["out"]["kernel"])) + pick(attn_params["out"]["bias"])
    np.testing.assert_allclose(ours_BTD, out_BTD, rtol=1e-4, atol=1e-5)


def assert_softmax_rows(w_BNTS):
    np.testing.assert_allclose(w_BNTS.sum(-1), 1.0, atol=1e-5)
    assert w_BNTS.min() >= 0.0 and w_BNTS.max() > 0.5  # not the near-uniform rows of an untrained model


@pytest.mark.parametrize("switches", [{}, dict(positions="rope", num_kv_heads=2, scan_layers=True), dict(remat=True)],
                         ids=["gpt2", "grouped_rope_scanned", "remat"])
def test_gpt_weights_are_causal_softmax_rows_that_give_the_attention_output(switches):
    cfg = dataclasses.replace(tiny_configs.gpt_lm("unused").model, **switches)
    model, ids_BT = Gpt(cfg), RNG.integers(0, 256, (2, 12)).astype(np.int32)
    params = sharpened(jax.jit(model.init)(jax.random.PRNGKey(0), ids_BT)["params"])
    plain, out, maps, inter = run(model, params, ids_BT)
    np.testing.assert_array_equal(out, plain)  # asking for the weights changes nothing on CPU
    assert [(m.kind, m.layer) for m in maps] == [("self", i) for i in range(cfg.num_layers)]
    for m in maps:
        assert m.w_BNTS.shape == (2, cfg.num_heads, 12, 12)
        assert_softmax_rows(m.w_BNTS)
        assert not np.triu(m.w_BNTS, 1).any()  # causal: exactly 0 above the diagonal
        if cfg.scan_layers:
            assert_gives_the_output(m.w_BNTS, inter["h"]["attn"], params["h"]["attn"], m.layer)
        else:
            assert_gives_the_output(m.w_BNTS, inter[f"h_{m.layer}"]["attn"], params[f"h_{m.layer}"]["attn"])


def divisions_of_shape(jaxpr, shape) -> int:
    """How many divisions in a traced computation (nested ones too) give an array of `shape`."""
    n = 0
    for eqn in jaxpr.eqns:
        n += eqn.primitive.name == "div" and any(tuple(v.aval.shape) == shape for v in eqn.outvars)
        for value in eqn.params.values():
            sub = getattr(value, "jaxpr", value)
            n += divisions_of_shape(sub, shape) if hasattr(sub, "eqns") else 0
    return n


def test_only_a_call_that_asks_computes_the_weights():
    """Training applies the model plainly: its trace normalises [B, T, N, H] outputs, never [B, N, T, S] rows."""
    cfg = tiny_configs.gpt_lm("unused").model
    model, ids_BT = Gpt(cfg), RNG.integers(0, 256, (2, 12)).astype(np.int32)
    params = nn.unbox(model.init(jax.random.PRNGKey(0), ids_BT)["params"])
    plain = jax.make_jaxpr(lambda p: model.apply({"params": p}, ids_BT))(params)
    asked = jax.make_jaxpr(lambda p: model.apply({"params": p}, ids_BT, mutable=["intermediates"]))(params)
    rows = (2, cfg.num_heads, 12, 12)
    assert divisions_of_shape(plain.jaxpr, rows) == 0 and divisions_of_shape(asked.jaxpr, rows) == cfg.num_layers


def test_bert_weights_are_bidirectional_and_zero_on_padding():
    model = BertMlm(dataclasses.replace(tiny_configs.BERT_MODEL, dropout=0.0))
    ids_BT = RNG.integers(0, 256, (2, 10)).astype(np.int32)
    valid_BT = np.arange(10)[None] < np.array([[10], [6]])
    params = sharpened(jax.jit(model.init)(jax.random.PRNGKey(0), ids_BT, np.zeros_like(ids_BT), valid_BT)["params"])
    plain, out, maps, inter = run(model, params, ids_BT, np.zeros_like(ids_BT), valid_BT)
    np.testing.assert_array_equal(out, plain)
    assert [(m.kind, m.layer) for m in maps] == [("self", 0), ("self", 1)]
    for m in maps:
        assert_softmax_rows(m.w_BNTS)
        assert not m.w_BNTS[1, :, :, 6:].any()  # no query, padded or not, looks at a padded key
        assert np.triu(m.w_BNTS[0], 1).max() > 0.1  # bidirectional: later tokens are seen
        layer = f"layer_{m.layer}"
        assert_gives_the_output(m.w_BNTS, inter["bert"]["encoder"][layer]["attn"],
                                params["bert"]["encoder"][layer]["attn"])


def test_encdec_weights_of_encoder_decoder_and_cross_attention():
    cfg = tiny_configs.seq2seq("unused").model
    model = EncDec(dataclasses.replace(cfg, dropout=0.0))
    src_BS, tgt_BT = (RNG.integers(0, 256, (2, n)).astype(np.int32) for n in (8, 6))
    valid_BS = np.arange(8)[None] < np.array([[8], [5]])
    params = sharpened(jax.jit(model.init)(jax.random.PRNGKey(0), src_BS, valid_BS, tgt_BT)["params"])
    plain, out, maps, inter = run(model, params, src_BS, valid_BS, tgt_BT)
    np.testing.assert_array_equal(out, plain)
    assert [(m.kind, m.layer) for m in maps] == [("encoder", 0), ("decoder", 0), ("cross", 0)]
    encoder, decoder, cross = (m.w_BNTS for m in maps)
    assert encoder.shape == (2, 4, 8, 8) and decoder.shape == (2, 4, 6, 6) and cross.shape == (2, 4, 6, 8)
    for w in (encoder, decoder, cross):
        np.testing.assert_allclose(w.sum(-1), 1.0, atol=1e-5)
    assert not encoder[1, :, :, 5:].any() and not cross[1, :, :, 5:].any()  # padded source keys
    assert not np.triu(decoder, 1).any() and np.triu(encoder[0], 1).max() > 0.1
    assert_gives_the_output(cross, inter["decoder"]["layers_0"]["cross"], params["decoder"]["layers_0"]["cross"])
    assert_gives_the_output(encoder, inter["encoder"]["layers_0"]["attn"], params["encoder"]["layers_0"]["attn"])


def test_head_stats_and_the_names_of_positional_heads():
    T = 6
    previous = np.eye(T, k=-1)
    previous[0, 0] = 1.0  # the first token has only itself
    s = head_stats(previous)
    assert s == pytest.approx({"previous": 1.0, "first": 1 / (T - 1), "self": 0.0, "distance": 1.0})
    assert role(s) == "previous-token head"
    assert head_stats(np.eye(T)) == pytest.approx({"previous": 0.0, "first": 0.0, "self": 1.0, "distance": 0.0})
    assert role(head_stats(np.eye(T))) == "self head"
    first = np.zeros((T, T))
    first[:, 0] = 1.0
    assert head_stats(first) == pytest.approx({"previous": 0.2, "first": 1.0, "self": 0.0, "distance": 3.0})
    assert role(head_stats(first)) == "first-token head"
    uniform = np.tril(np.ones((T, T))) / np.arange(1, T + 1)[:, None]  # query t spreads over t + 1 keys
    assert head_stats(uniform)["distance"] == pytest.approx(1.5) and role(head_stats(uniform)) == ""
    cross = np.full((3, 4), 0.1)
    cross[:, 2] = 0.7
    assert head_stats(cross, self_attention=False) == pytest.approx({"first": 0.1, "peak": 0.7})
