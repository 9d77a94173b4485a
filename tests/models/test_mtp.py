"""Multi-token prediction (model.mtp_depth, zoo.models.mtp): module k's prediction at position t reads tokens up to
t + k + 1 and none later; the training loss is the main cross-entropy plus mtp_weight / D times the modules' (each
predicting the token k + 2 places on, the row's last k + 1 positions unweighted); the modules leave the main model's
logits, its evaluation and a run without them as they were; a gpt_lm run trains them (their loss falls)."""

import dataclasses
import json

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tests.conftest import replace
from tests.helpers import tiny_configs
from tests.helpers.runs import run
from zoo import tasks
from zoo.errors import ConfigError
from zoo.models.gpt import GPT_SPEEDRUN_TINY, Gpt, GptConfig
from zoo.nn import losses

CFG = dataclasses.replace(GPT_SPEEDRUN_TINY, num_layers=2, d_model=64, d_ff=128, max_len=32, value_embeds=0,
                          mtp_depth=2)
IDS = jax.random.randint(jax.random.PRNGKey(1), (2, 17), 0, 384)


def init(cfg=CFG):
    return nn.unbox(jax.jit(Gpt(cfg).init)(jax.random.PRNGKey(0), IDS[:, :-1])["params"])


@jax.jit
def mtp_states(params, ids):
    return Gpt(CFG).apply({"params": params}, ids[:, :-1], hidden=True, mtp_ids_BT=ids[:, 1:])


def test_module_k_reads_no_token_past_t_plus_k_plus_1():
    params = init()
    assert {"mtp_0", "mtp_1"} <= set(params)
    _, hs = mtp_states(params, IDS)
    t = 6
    changed = IDS.at[:, t + 3].set((IDS[:, t + 3] + 1) % 384)  # the token t + 3: read by module 1 at t, not module 0
    _, hs2 = mtp_states(params, changed)
    np.testing.assert_array_equal(np.asarray(hs[0][:, :t + 2]), np.asarray(hs2[0][:, :t + 2]))
    assert not np.allclose(hs[0][:, t + 2], hs2[0][:, t + 2])  # position t + 2 reads it as its next token
    np.testing.assert_array_equal(np.asarray(hs[1][:, :t + 1]), np.asarray(hs2[1][:, :t + 1]))
    assert not np.allclose(hs[1][:, t + 1], hs2[1][:, t + 1])


def test_the_loss_adds_each_modules_cross_entropy_and_leaves_the_main_model_as_it_was(tiny_cfg):
    cfg = dataclasses.replace(tiny_cfg, model=CFG)
    t = tasks.build(cfg)
    params = init()
    batch = {"inputs": IDS[:, :-1], "targets": IDS[:, 1:], "weights": jnp.ones((2, 16))}
    rng = jax.random.PRNGKey(2)
    loss, aux = jax.jit(t.loss, static_argnums=3)(params, batch, rng, True)
    h, hs = mtp_states(params, IDS)
    w_VD = params["lm_head"]["embedding"]
    main = float(losses.linear_cross_entropy(h, w_VD, IDS[:, 1:], jnp.ones((2, 16)), logit_cap=15.0)[0])
    want_mtp = 0.0
    for k, h_k in enumerate(hs, start=1):  # module k-1 predicts x_{t+k+1} = IDS[:, t + k + 1], for t < 16 - k
        z = np.asarray(losses.linear_cross_entropy(h_k[:, :16 - k], w_VD, IDS[:, k + 1:], jnp.ones((2, 16 - k)),
                                                   logit_cap=15.0)[0])
        want_mtp += float(z)
    np.testing.assert_allclose(float(aux["mtp_sum"]), want_mtp, rtol=1e-5)
    np.testing.assert_allclose(float(loss), main + 0.3 / 2 * want_mtp, rtol=1e-5)
    # evaluation: the main loss alone; the logits are the model's without modules (same shared params)
    ev, ev_aux = jax.jit(t.loss, static_argnums=3)(params, batch, rng, False)
    np.testing.assert_allclose(float(ev), main, rtol=1e-5)
    assert "mtp_sum" not in ev_aux
    plain = {k: v for k, v in params.items() if not k.startswith("mtp_")}
    np.testing.assert_array_equal(
        np.asarray(Gpt(CFG).apply({"params": params}, IDS)),
        np.asarray(Gpt(dataclasses.replace(CFG, mtp_depth=0)).apply({"params": plain}, IDS)))


def test_a_gpt_lm_run_trains_the_modules(cache_dir, tmp_path):
    cfg = replace(tiny_configs.gpt_lm(cache_dir), model=dict(mtp_depth=1, dropout=0.0),
                  train=dict(steps=30, log_every=1, save_every=30), optim=dict(lr=3e-3))
    run(cfg, tmp_path / "w", quiet=True)
    with open(tmp_path / "w" / "metrics.jsonl") as f:
        mtp = [r["mtp_loss"] for r in map(json.loads, f) if "mtp_loss" in r]
    assert len(mtp) == 30 and np.mean(mtp[-3:]) < 0.8 * np.mean(mtp[:3]), mtp


def test_bad_mtp_settings_are_refused():
    with pytest.raises(ConfigError, match=r"model.mtp_depth=-1 and model.mtp_weight=0.3 must be >= 0"):
        GptConfig(mtp_depth=-1)


def test_the_flops_count_runs_each_module_s_block_and_the_head_again(tiny_cfg):
    """MFU counts what a step runs: D more blocks (their params and attention) and the shared head D more times."""
    from zoo.tasks.base import attention_flops, count
    with_mtp = tasks.build(dataclasses.replace(tiny_cfg, model=CFG))
    without = tasks.build(dataclasses.replace(tiny_cfg, model=dataclasses.replace(CFG, mtp_depth=0)))
    shapes = jax.eval_shape(with_mtp.init, jax.random.PRNGKey(0))
    module_params = sum(count({k: v}) for k, v in shapes.items() if k.startswith("mtp_"))
    T = tiny_cfg.data.seq_len
    extra = with_mtp.flops_per_token(T) - without.flops_per_token(T)
    assert module_params > 0
    assert extra == 6 * module_params + 2 * 6 * CFG.vocab_size * CFG.d_model + \
        attention_flops(2, CFG.num_heads, CFG.head_dim, T)
