"""The converters' key tables (torch-free): every converter module satisfies the Converter protocol,
and each architecture's import and export, both derived from its one table, are exact inverses that
cover the zoo model's whole param tree and use every tensor they write."""

import dataclasses
import types

import flax.linen as nn
import jax
import numpy as np
import pytest

from zoo import tasks
from zoo.errors import ConversionError
from zoo.hf import (bart, base, bert, convert, distilbert, gpt2, gpt_neox, io, llama, mistral, phi3, qwen2, qwen3,
                    roberta, t5, table)
from zoo.models.bert import BERT_TINY
from zoo.models.encdec import BART_BASE, T5_SMALL
from zoo.models.gpt import GPT_TINY, LLAMA_TINY, PYTHIA_160M

GPT = dataclasses.replace(GPT_TINY, vocab_size=50, max_len=16, num_layers=2, d_model=32, num_heads=4, d_ff=64)
BERT = dataclasses.replace(BERT_TINY, vocab_size=50, max_len=16, num_layers=2, d_model=32, num_heads=4, d_ff=64,
                           num_classes=3)
ROBERTA = dataclasses.replace(BERT, position_offset=2, type_vocab_size=1, classifier="roberta")
DISTILBERT = dataclasses.replace(BERT, type_vocab_size=0, classifier="distilbert")
T5 = dataclasses.replace(T5_SMALL, vocab_size=40, max_len=16, num_encoder_layers=1, num_decoder_layers=2,
                         d_model=16, num_heads=2, d_kv=4, d_ff=32)  # N * H != D: the head reshapes are exercised
BART = dataclasses.replace(BART_BASE, vocab_size=40, max_len=16, num_encoder_layers=2, num_decoder_layers=1,
                           d_model=16, num_heads=2, d_ff=32)
# Llama-like: 4 query heads over 2 key/value heads, untied; Qwen2's q/k/v biases; Mistral's window.
LLAMA = dataclasses.replace(LLAMA_TINY, vocab_size=50, max_len=16, num_layers=2, d_model=32, d_ff=48)
NEOX = dataclasses.replace(PYTHIA_160M, vocab_size=50, max_len=16, num_layers=2, d_model=32, num_heads=4, d_ff=48)
CASES = {"gpt2": (gpt2, GPT, "gpt_lm"),
         "llama": (llama, LLAMA, "gpt_lm"),
         "llama_biases_tied": (llama, dataclasses.replace(LLAMA, qkv_bias=True, out_bias=True, mlp_bias=True,
                                                          tie_embeddings=True), "gpt_lm"),
         "qwen2": (qwen2, dataclasses.replace(LLAMA, qkv_bias=True, tie_embeddings=True), "gpt_lm"),
         "mistral": (mistral, dataclasses.replace(LLAMA, sliding_window=4), "gpt_lm"),
         "qwen3": (qwen3, dataclasses.replace(LLAMA, qk_norm=True, d_kv=24), "gpt_lm"),  # q/k norms; N * H != D
         "phi3": (phi3, dataclasses.replace(LLAMA, rotary_fraction=0.5, sliding_window=4), "gpt_lm"),
         "gpt_neox": (gpt_neox, NEOX, "gpt_lm"),
         "gpt_neox_tied_no_bias": (gpt_neox, dataclasses.replace(NEOX, tie_embeddings=True, qkv_bias=False,
                                                                 out_bias=False, parallel_residual=False), "gpt_lm"),
         "bert_mlm": (bert, BERT, "bert_mlm"), "bert_cls": (bert, BERT, "bert_cls"),
         "bert_encoder": (bert, BERT, "bert_encoder"), "bert_tokens": (bert, BERT, "bert_tokens"),
         "t5_v1.0": (t5, T5, "seq2seq"),
         **{f"roberta_{t}": (roberta, ROBERTA, t) for t in ("bert_mlm", "bert_cls", "bert_encoder", "bert_tokens")},
         **{f"distilbert_{t}": (distilbert, DISTILBERT, t) for t in ("bert_mlm", "bert_cls", "bert_tokens")},
         "t5_v1.1": (t5, dataclasses.replace(T5, activation="gated_gelu", tie_output=False, output_scale=False),
                     "seq2seq"),
         "t5_untied": (t5, dataclasses.replace(T5, share_embeddings=False), "seq2seq"),
         "bart": (bart, BART, "seq2seq"),
         "bart_untied_bias": (bart, dataclasses.replace(BART, share_embeddings=False, tie_output=False,
                                                        logits_bias=True), "seq2seq")}


def test_every_converter_module_satisfies_the_protocol():
    mods = set(convert.converters().values())
    assert {m.__name__ for m in mods} == {"zoo.hf.gpt2", "zoo.hf.llama", "zoo.hf.qwen2", "zoo.hf.qwen3",
                                          "zoo.hf.mistral", "zoo.hf.bert", "zoo.hf.roberta", "zoo.hf.distilbert",
                                          "zoo.hf.t5", "zoo.hf.bart", "zoo.hf.mixtral", "zoo.hf.qwen3_moe",
                                          "zoo.hf.phi3", "zoo.hf.gpt_neox", "zoo.hf.gemma", "zoo.hf.gemma2",
                                          "zoo.hf.gemma3"}
    assert {"task_for", "data_fields", "head_config", "seq2seq_framing", "run_fields"} <= set(base.MEMBERS)
    for mod in mods:
        assert base.check(mod) is mod
        assert all(callable(getattr(mod, m)) for m in base.MEMBERS if not m.isupper())
    partial = types.ModuleType("partial")
    for m in base.MEMBERS:
        if m != "run_fields":
            setattr(partial, m, getattr(gpt2, m))
    with pytest.raises(ConversionError, match="converter partial lacks run_fields"):
        base.check(partial)


def test_transforms_invert():
    rng = np.random.default_rng(0)
    N, H, D = 2, 3, 5
    for t, hf_shape, zoo_shape in [(table.SAME, (4, 7), (4, 7)), (table.LINEAR, (7, 4), (4, 7)),
                                   (table.HEADS_IN, (N * H, D), (D, N, H)), (table.HEADS_OUT, (D, N * H), (N, H, D)),
                                   (table.CONV_HEADS_IN, (D, N * H), (D, N, H)),
                                   (table.CONV_HEADS_OUT, (N * H, D), (N, H, D)), (table.HEADS_BIAS, (N * H,), (N, H))]:
        x = rng.standard_normal(hf_shape).astype(np.float32)
        z = t.zoo(x, N, H)
        assert z.shape == zoo_shape, t.name
        np.testing.assert_array_equal(t.hf(z, N, H), x, err_msg=t.name)
    K = 1  # grouped-query key/value: K heads of width H, whatever N is
    for t, hf_shape, zoo_shape in [(table.KV_HEADS_IN, (K * H, D), (D, K, H)), (table.KV_HEADS_BIAS, (K * H,), (K, H))]:
        x = rng.standard_normal(hf_shape).astype(np.float32)
        z = t.zoo(x, N, H)
        assert z.shape == zoo_shape, t.name
        np.testing.assert_array_equal(t.hf(z, N, H), x, err_msg=t.name)
    # as in HEADS_IN, row k*H + h of the torch weight is head k, dimension h (here 4 key/value heads > N)
    x = np.arange(4 * H * D, dtype=np.float32).reshape(4 * H, D)
    np.testing.assert_array_equal(table.KV_HEADS_IN.zoo(x, N, H)[:, 3, 1], x[3 * H + 1])


def _flat(tree) -> dict:
    return {jax.tree_util.keystr(p): np.asarray(v) for p, v in jax.tree_util.tree_flatten_with_path(tree)[0]}


@pytest.mark.parametrize("case", list(CASES))
def test_import_inverts_export(case):
    conv, model_cfg, task = CASES[case]
    rows = conv.key_table(model_cfg, task) if conv in (bert, roberta, distilbert) else conv.key_table(model_cfg)
    assert len({r[0] for r in rows}) == len(rows), "two rows fill one zoo param"
    assert len({(r[1], r[2].part) for r in rows}) == len(rows), "two rows write one HF tensor"
    cfg = convert._run_config(model_cfg, task, None)
    shapes = nn.unbox(jax.eval_shape(tasks.build(cfg).init, jax.random.PRNGKey(0)))
    rng = np.random.default_rng(0)
    params = jax.tree.map(lambda s: rng.standard_normal(s.shape).astype(np.float32), shapes)
    tensors = conv.params_to_hf(params, model_cfg)
    keys = io.Keys(tensors, conv.PREFIXES)
    back = conv.params_from_hf(keys, model_cfg, task)
    assert keys.unused() == []
    want, got = _flat(params), _flat(back)
    assert sorted(got) == sorted(want)
    for k in want:
        np.testing.assert_array_equal(got[k], want[k], err_msg=k)
