"""Sampling: greedy equals step-by-step argmax, filters restrict the support, EOS stops."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import pytest

from zoo.models.gpt import GptConfig
from zoo.models.gpt import Gpt
from zoo.infer.sample import generate, sample_logits

CFG = GptConfig(vocab_size=64, max_len=48, num_layers=2, d_model=32, num_heads=2, d_ff=64, dropout=0.0)


@pytest.fixture(scope="module")
def model_params():
    model = Gpt(CFG)
    params = jax.jit(model.init)(jax.random.PRNGKey(0), jnp.zeros((1, 8), jnp.int32))["params"]
    # Larger weights than init so the argmax varies from step to step.
    params = jax.tree.map(lambda p: p * 4.0, nn.unbox(params))
    return model, params


def test_greedy_equals_full_recomputation(model_params):
    model, params = model_params
    prompt = [5, 9, 2]
    out = generate(model, params, prompt, 20, temperature=0.0)[0]
    # One causal forward pass over prompt + output recomputes every step's logits without a cache.
    logits = jax.jit(model.apply)({"params": params}, jnp.asarray([prompt + out]))[0]
    assert out == [int(t) for t in jnp.argmax(logits[len(prompt) - 1:-1], axis=-1)]
    assert len(set(out)) > 1


def test_seed_makes_sampling_repeatable(model_params):
    model, params = model_params
    a = generate(model, params, [1, 2], 16, temperature=2.0, seed=3)
    assert a == generate(model, params, [1, 2], 16, temperature=2.0, seed=3)
    assert a != generate(model, params, [1, 2], 16, temperature=2.0, seed=4)


def test_top_k_one_is_greedy(model_params):
    model, params = model_params
    assert generate(model, params, [7], 12, temperature=1.5, top_k=1, seed=1) == \
        generate(model, params, [7], 12, temperature=0.0)


def test_filters_restrict_the_support():
    logits = jnp.log(jnp.asarray([[0.5, 0.3, 0.15, 0.05]]))
    draws = lambda **kw: {int(sample_logits(logits, jax.random.PRNGKey(i), 1.0, **kw)[0]) for i in range(300)}
    assert draws(top_k=2, top_p=1.0) == {0, 1}
    assert draws(top_k=0, top_p=0.7) == {0, 1}  # 0.5 < 0.7, 0.5 + 0.3 reaches it
    assert draws(top_k=0, top_p=0.85) == {0, 1, 2}
    assert draws(top_k=0, top_p=1.0) == {0, 1, 2, 3}


def test_eos_stops_and_vocab_limit_masks(model_params):
    model, params = model_params
    greedy = generate(model, params, [5, 9, 2], 20, temperature=0.0)[0]
    eos = greedy[4]
    out = generate(model, params, [5, 9, 2], 20, temperature=0.0, eos_id=eos)[0]
    assert out == greedy[:greedy.index(eos)]
    limited = generate(model, params, [3], 30, temperature=2.0, vocab_limit=10, seed=0)[0]
    assert max(limited) < 10


def test_generation_never_leaves_the_window(model_params):
    """Past the window (the trained length) the context is cropped: the first segment fills it, later ones
    continue from its last window // 2 tokens, prefilled again; a longer prompt keeps its last window - 1."""
    model, params = model_params
    W, prompt = 16, [5, 9, 2]
    first = generate(model, params, prompt, W - len(prompt), temperature=0.0, window=W)[0]
    long = generate(model, params, prompt, 40, temperature=0.0, window=W)[0]
    assert len(long) == 40 and long[:len(first)] == first
    # Each later segment is greedy decoding from the last W // 2 tokens before it.
    seq, at, keep = prompt + long, W, W // 2
    while at < len(seq):
        n = min(W - keep, len(seq) - at)
        assert seq[at:at + n] == generate(model, params, seq[at - keep:at], n, temperature=0.0, window=W)[0]
        at += n
    # Greedy decoding, so the long prompt's continuation equals its last W - 1 tokens' continuation.
    long_prompt = list(range(1, 31))
    assert generate(model, params, long_prompt, 8, temperature=0.0, window=W) == \
        generate(model, params, long_prompt[-(W - 1):], 8, temperature=0.0, window=W)
    # Beyond the model's positions (max_len 48) too: the window is capped at max_len.
    assert len(generate(model, params, prompt, 100, temperature=0.0)[0]) == 100


@pytest.mark.parametrize("kw, fragment", [(dict(max_new_tokens=0), "max-new-tokens=0"),
                                          (dict(max_new_tokens=-1), "max-new-tokens=-1"),
                                          (dict(num_samples=0), "num-samples=0"),
                                          (dict(temperature=float("nan")), "temperature >= 0")])
def test_bad_sampling_arguments_are_refused(model_params, kw, fragment):
    model, params = model_params
    args = dict(max_new_tokens=4) | kw
    with pytest.raises(ValueError, match=fragment):
        generate(model, params, [1, 2], args.pop("max_new_tokens"), **args)


def test_greedy_picks_jnp_argmax_first_of_equal_maxima():
    """first_argmax (greedy decoding's pick: a maximum, then the least index holding it) is jnp.argmax: on random
    rows, on ties (the first wins), on rows of -inf (a grammar masking every token: index 0) and of one token."""
    from zoo.nn.layers import first_argmax
    x = jax.random.normal(jax.random.PRNGKey(0), (32, 49152))
    x = x.at[3, 7].set(9.0).at[3, 9000].set(9.0).at[5].set(-jnp.inf).at[6].set(0.0)  # ties; all -inf; all equal
    got = jax.jit(first_argmax)(x)
    assert got.dtype == jnp.int32 and got[3] == 7 and got[5] == 0 and got[6] == 0
    assert (got == jnp.argmax(x, -1)).all()
    assert int(first_argmax(jnp.asarray([[1.5]]))[0]) == 0
    assert int(first_argmax(jnp.asarray([[0.0, jnp.nan, 1.0]]))[0]) in range(3)  # NaN: an index in range, not V
