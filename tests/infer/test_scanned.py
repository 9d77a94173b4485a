"""zoo.infer.sample.scanned / unscanned, what generation and zoo-serve decode with: a model whose stack only loops
(the speedrun's U-net skips and value embeddings) is decoded as it is, not refused, and generates the tokens a plain
greedy loop over its own logits gives; unscanned undoes scanned."""

import dataclasses

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from zoo.infer import sample
from zoo.models.gpt import GPT_TINY, Gpt

PROMPT = [5, 17, 3, 99, 42, 7]


def _model(**kw):
    cfg = dataclasses.replace(GPT_TINY, num_layers=4, d_model=64, d_ff=128, max_len=32, **kw)
    model = Gpt(cfg)
    return model, nn.unbox(jax.jit(model.init)(jax.random.PRNGKey(0), jnp.zeros((1, 8), jnp.int32))["params"])


def _greedy(model, params, prompt, n):
    """The argmax continuation by full forward passes (no cache)."""
    ids = list(prompt)
    for _ in range(n):
        ids.append(int(jnp.argmax(model.apply({"params": params}, jnp.asarray([ids]))[0, -1])))
    return ids[len(prompt):]


def test_a_model_that_only_loops_is_decoded_as_it_is():
    model, params = _model(unet_skips=True, value_embeds=1)
    params = {**params, "skip_weights": jnp.array([0.7, 1.3])}
    assert sample.scanned(model, params)[0] is model  # its config refuses scan_layers: kept looped
    got = sample.generate(*sample.scanned(model, params), PROMPT, 6, temperature=0.0)[0]
    assert got == _greedy(model, params, PROMPT, 6)


def test_unscanned_undoes_scanned_and_both_decode_the_same():
    model, params = _model()
    twin, stacked = sample.scanned(model, params)
    assert twin.cfg.scan_layers and "h" in stacked
    back_model, back = sample.unscanned(twin, stacked)
    assert back_model.cfg == model.cfg and jax.tree.structure(back) == jax.tree.structure(params)
    assert all(np.array_equal(a, b) for a, b in zip(jax.tree.leaves(back), jax.tree.leaves(params)))
    looped = sample.generate(model, params, PROMPT, 6, temperature=0.0)[0]
    assert looped == sample.generate(twin, stacked, PROMPT, 6, temperature=0.0)[0] == _greedy(model, params, PROMPT, 6)
