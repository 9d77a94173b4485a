"""The nanoGPT recipe re-implemented in torch (zoo.bench.nanogpt_torch): at init its loss is ln(V) (small, tied
logits); it has exactly as many parameters as zoo's GPT at the same shape (both tied, with biases and learned
positions); weight decay on the rank >= 2 parameters only; nanoGPT's warmup-then-cosine learning rate."""

import math

import jax
import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="torch is not installed: the nanoGPT row is torch")

from zoo.bench import nanogpt_torch  # noqa: E402
from zoo.models.gpt import GPT_TINY, Gpt  # noqa: E402

SHAPE = nanogpt_torch.NanoGptConfig(vocab_size=GPT_TINY.vocab_size, block_size=GPT_TINY.max_len,
                                    n_layer=GPT_TINY.num_layers, n_head=GPT_TINY.num_heads, n_embd=GPT_TINY.d_model)


def test_loss_at_init_is_ln_vocab():
    torch.manual_seed(0)
    model = nanogpt_torch.NanoGpt(SHAPE)
    ids = torch.from_numpy(np.random.default_rng(0).integers(0, 256, (4, 65)))
    with torch.no_grad():
        loss = model(ids[:, :-1], ids[:, 1:]).item()
    assert loss == pytest.approx(math.log(SHAPE.vocab_size), abs=0.05)


def test_parameter_count_equals_zoos_gpt_at_the_same_shape():
    torch_count = sum(p.numel() for p in nanogpt_torch.NanoGpt(SHAPE).parameters())  # the tied matrix once
    shapes = jax.eval_shape(lambda: Gpt(GPT_TINY).init(jax.random.PRNGKey(0), np.zeros((1, 8), np.int32)))
    zoo_count = sum(math.prod(x.shape) for x in jax.tree.leaves(shapes))
    assert GPT_TINY.d_ff == 4 * GPT_TINY.d_model and GPT_TINY.tie_embeddings
    assert torch_count == zoo_count == 875_264


def test_weight_decay_on_matrices_only():
    model = nanogpt_torch.NanoGpt(SHAPE)
    decay, no_decay = nanogpt_torch.configure_optimizer(model, 1e-3).param_groups
    assert decay["weight_decay"] == 0.1 and no_decay["weight_decay"] == 0.0
    assert all(p.dim() == 2 for p in decay["params"]) and all(p.dim() == 1 for p in no_decay["params"])
    # 4 blocks x 4 kernels, the (tied) token table and the position table
    assert len(decay["params"]) == 4 * 4 + 2
    assert len(no_decay["params"]) == 4 * 8 + 2  # 4 blocks x (4 biases, 2 LayerNorms x 2), ln_f's 2


def test_lr_warms_up_linearly_then_follows_a_cosine_to_a_tenth():
    lr = lambda it: nanogpt_torch.lr_at(it, 1e-3, warmup=10, decay_iters=110, min_lr=1e-4)
    assert lr(0) == pytest.approx(1e-3 / 11) and lr(9) == pytest.approx(1e-3 * 10 / 11)
    assert lr(10) == pytest.approx(1e-3)
    assert lr(60) == pytest.approx(1e-4 + 0.5 * 9e-4)  # half way through the decay
    assert lr(110) == pytest.approx(1e-4) and lr(200) == pytest.approx(1e-4)
