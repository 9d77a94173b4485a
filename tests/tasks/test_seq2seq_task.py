"""The seq2seq task: evaluation's BLEU and exact match, label smoothing on the training loss only, its
FLOP count (for MFU) against XLA's for sources and targets of different lengths, and a tiny model that learns the offline task (trained once: conftest's learned_seq2seq). The trainer's
invariants for seq2seq: tests/train/test_invariants.py; the translate CLI: tests/cli/."""

import flax.linen as nn
import jax
import numpy as np
import pytest

from conftest import replace
from tests.helpers import plain_losses
from tests.helpers.runs import run
from zoo import tasks


def test_evaluation_records_bleu_and_exact_match(s2s_cfg, tmp_path):
    out = run(replace(s2s_cfg, train=dict(steps=2, eval_every=2, eval_batches=1)), tmp_path, devices=jax.devices()[:1])
    last = out["records"][-1]
    assert 0 <= last["eval_bleu"] <= 100 and 0 <= last["eval_exact_match"] <= 1


@pytest.mark.parametrize("head", [{}, dict(tie_output=False, share_embeddings=False, logits_bias=True)])
def test_label_smoothing_applies_to_the_training_loss_only(s2s_cfg, head):
    """The task's fused loss (any output head: tied, or an untied lm_head with a logits bias) against
    cross-entropy of the model's logits: values, and gradients of the training loss."""
    task = tasks.build(replace(s2s_cfg, model=dict(dropout=0.0, **head)))
    params = nn.unbox(jax.jit(task.init)(jax.random.PRNGKey(0)))  # jitted: one program, not one per op
    if "logits_bias" in params:
        params["logits_bias"] = jax.random.normal(jax.random.PRNGKey(2), params["logits_bias"].shape)
    batch = task.make_data(s2s_cfg, 0, 1).train(0)
    logits = lambda p: task.model.apply({"params": p}, batch["src"], batch["src_valid"], batch["tgt_in"])
    plain, _ = jax.jit(lambda p: plain_losses.token_cross_entropy(logits(p), batch["tgt_out"], batch["weights"]))(params)
    eval_loss, aux = jax.jit(lambda p: task.loss(p, batch, jax.random.PRNGKey(1), False))(params)
    smoothed = lambda p: plain_losses.smoothed_cross_entropy(logits(p), batch["tgt_out"], batch["weights"], 0.1)
    train_loss, grads = jax.jit(jax.value_and_grad(lambda p: task.loss(p, batch, jax.random.PRNGKey(1), True)[0]))(params)
    np.testing.assert_allclose(eval_loss, plain, rtol=1e-6)
    np.testing.assert_allclose(train_loss, jax.jit(smoothed)(params), rtol=1e-5)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6), grads,
                 jax.jit(jax.grad(smoothed))(params))
    assert aux["tokens"] == batch["src_valid"].sum() + batch["weights"].sum()  # source + target tokens


@pytest.mark.slow
def test_a_tiny_model_learns_the_offline_task(learned_seq2seq):
    cfg, params, _ = learned_seq2seq
    task = tasks.build(cfg)
    data = task.make_data(cfg, 0, 1)
    scores = task.evaluate_extra(params, data)  # greedy over the 128 held-out pairs
    assert scores["eval_exact_match"] >= 0.95, scores
    assert scores["eval_bleu"] >= 90, scores


@pytest.mark.parametrize("S, T", [(64, 16), (16, 64)])
def test_flops_per_token_agree_with_xla_when_source_and_target_lengths_differ(s2s_cfg, S, T):
    """The encoder's params meet the S source tokens, the decoder's and the output matmul the T target
    tokens: counted as if both were seq_len long, MFU came out 1.46x (S = 4T) or 0.74x (T = 4S) of XLA's."""
    task = tasks.build(replace(s2s_cfg, model=dict(d_model=128, d_ff=512, vocab_size=4096, max_len=64)))
    B, V = 4, 4096
    rng = np.random.default_rng(0)
    tgt = rng.integers(3, V, (B, T + 1)).astype(np.int32)
    batch = {"src": rng.integers(3, V, (B, S)).astype(np.int32), "src_valid": np.ones((B, S), bool),
             "tgt_in": tgt[:, :-1], "tgt_out": tgt[:, 1:], "weights": np.ones((B, T), np.float32)}
    params = nn.unbox(task.init(jax.random.PRNGKey(0)))
    grad = jax.jit(jax.grad(lambda p: task.loss(p, batch, jax.random.PRNGKey(0), False)[0]))
    cost = grad.lower(params).compile().cost_analysis()
    xla_flops = (cost[0] if isinstance(cost, list) else cost)["flops"]  # forward + backward, every op
    ours = task.flops_per_token(S, target_len=T) * (S + T) * B  # matmuls only: a little under XLA's
    assert 0.9 < ours / xla_flops < 1.05
    assert task.flops_per_token(S, target_len=S) == task.flops_per_token(S)
