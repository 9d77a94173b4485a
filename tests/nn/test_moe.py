"""Mixture of experts (zoo.nn.moe, GptConfig.num_experts): both dispatches (sorted with ragged_dot, and
dense) equal a per-token reference (Mixtral's renormalised top-k and Qwen3-MoE's unnormalised one); the
load-balancing loss is transformers' and equals R for a uniform router; a MoE GPT decodes from its KV
cache as it runs in full and scans as it loops; training adds router_aux_loss_coef times the balance loss
and logs it; bad switches are one-line errors; Mixtral 8x7B's and Qwen3-30B-A3B's published parameter
counts and their active counts for MFU; a train step with the experts split over the `expert` mesh axis
on 8 devices equals 1 device."""

import dataclasses

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from zoo.errors import ConfigError
from zoo.models.gpt import Gpt, GptConfig
from zoo.nn import moe
from zoo.nn.moe import MoeMlp

E, R, D, F = 5, 2, 12, 10  # 5 experts (odd), 2 per token


def reference(params, x_MD, norm_topk):
    """Each token on its own: softmax over the router, its R best experts, their SwiGLU outputs weighted."""
    out = np.zeros_like(x_MD)
    for m, x in enumerate(x_MD):
        logits = x @ params["router"]
        p = np.exp(logits - logits.max())
        p /= p.sum()
        top = np.argsort(-p)[:R]
        w = p[top] / (p[top].sum() if norm_topk else 1.0)
        for e, we in zip(top, w):
            g, u = x @ params["gate"][e], x @ params["fc"][e]
            out[m] += we * ((g / (1 + np.exp(-g))) * u) @ params["proj"][e]
    return out


@pytest.mark.parametrize("implementation", ("sorted", "dense"))  # gmm (Pallas, interpret): test_tpu_kernels.py
@pytest.mark.parametrize("norm_topk", [True, False])
def test_both_dispatches_equal_a_per_token_reference(norm_topk, implementation):
    layer = MoeMlp(E, R, F, norm_topk=norm_topk, implementation=implementation)
    x = jax.random.normal(jax.random.PRNGKey(0), (3, 7, D))
    params = nn.unbox(jax.jit(layer.init)(jax.random.PRNGKey(1), x)["params"])  # jitted: one compile, not per op
    params = {k: np.asarray(v) * (5.0 if k == "router" else 1.0) for k, v in params.items()}  # sharp routing
    assert params["gate"].shape == (E, D, F) and params["proj"].shape == (E, F, D)
    y, sown = jax.jit(lambda p, x: layer.apply({"params": p}, x, mutable=[moe.COLLECTION]))(params, x)
    ref = reference(params, np.asarray(x).reshape(-1, D), norm_topk)
    np.testing.assert_allclose(np.asarray(y).reshape(-1, D), ref, rtol=1e-5, atol=1e-6)
    count_E, prob_E = np.asarray(sown[moe.COLLECTION]["router"][0])
    assert count_E.sum() == 21 * R and 0 < count_E.max() < 21 and prob_E.sum() == pytest.approx(21, rel=1e-5)


def test_balance_loss_is_transformers_and_R_when_uniform():
    torch = pytest.importorskip("torch", reason="torch is not installed: the reference is transformers'")
    from transformers.models.mixtral.modeling_mixtral import load_balancing_loss_func

    class TwoLayers(nn.Module):
        @nn.compact
        def __call__(self, x):
            return MoeMlp(E, R, F, name="b")(MoeMlp(E, R, F, name="a")(x) + x)

    x = jax.random.normal(jax.random.PRNGKey(0), (2, 9, D))
    model = TwoLayers()
    params = jax.tree.map(lambda v: v * 20, nn.unbox(jax.jit(model.init)(jax.random.PRNGKey(2), x)["params"]))
    # jitted: one compile (the model's sown statistics and their loss), not one per op
    balance = jax.jit(lambda p, x: moe.load_balancing_loss(
        model.apply({"params": p}, x, mutable=[moe.COLLECTION])[1], 18))
    ours = float(balance(params, x))
    h = jax.jit(MoeMlp(E, R, F).apply)({"params": params["a"]}, x)
    logits = [np.asarray(x).reshape(-1, D) @ params["a"]["router"],
              np.asarray(h + x).reshape(-1, D) @ params["b"]["router"]]
    theirs = float(load_balancing_loss_func(tuple(torch.tensor(np.asarray(g)) for g in logits), E, R))
    assert ours == pytest.approx(theirs, rel=1e-5) and abs(ours - R) > 0.05  # unbalanced: not the uniform value
    uniform = jax.tree.map(lambda v: v, params)
    uniform["a"]["router"] = uniform["b"]["router"] = jnp.zeros((D, E))
    assert float(balance(uniform, x)) == pytest.approx(R, rel=1e-6)


def moe_gpt(**kw) -> GptConfig:
    return GptConfig(**{**dict(vocab_size=64, max_len=32, num_layers=2, d_model=24, num_heads=3, num_kv_heads=1,
                               d_ff=20, dropout=0.0, positions="rope", norm="rmsnorm", mlp="swiglu", qkv_bias=False,
                               out_bias=False, mlp_bias=False, tie_embeddings=False, num_experts=4,
                               experts_per_token=2), **kw})


def test_moe_gpt_decodes_from_its_cache_as_it_runs_in_full_and_scans_as_it_loops():
    model = Gpt(moe_gpt())
    ids = jax.random.randint(jax.random.PRNGKey(0), (2, 9), 0, 64)
    params = nn.unbox(jax.jit(model.init)(jax.random.PRNGKey(1), ids)["params"])  # jitted: eager init is slow
    params = jax.tree.map(lambda v: v * 3, params)  # routing far from uniform
    apply = jax.jit(model.apply, static_argnames=("decode", "mutable"))  # one compile per shape, not op by op
    full = np.asarray(apply({"params": params}, ids))
    cache = jax.tree.map(jnp.zeros_like, nn.unbox(jax.eval_shape(
        lambda: model.init(jax.random.PRNGKey(0), jnp.zeros_like(ids), decode=True))["cache"]))
    steps = []
    for a, b in ((0, 5), (5, 6), (6, 7), (7, 8), (8, 9)):  # a prefill of 5 tokens (routed together), then one by one
        out, mut = apply({"params": params, "cache": cache}, ids[:, a:b], decode=True, mutable=("cache",))
        cache = mut["cache"]
        steps.append(np.asarray(out))
    np.testing.assert_allclose(np.concatenate(steps, 1), full, rtol=1e-5, atol=1e-5)
    scanned = Gpt(moe_gpt(scan_layers=True, remat=True))
    stacked = {**{k: v for k, v in params.items() if not k.startswith("h_")},
               "h": jax.tree.map(lambda *xs: jnp.stack(xs), params["h_0"], params["h_1"])}
    out, sown = jax.jit(scanned.apply, static_argnames="mutable")({"params": stacked}, ids, mutable=(moe.COLLECTION,))
    np.testing.assert_allclose(out, full, rtol=1e-5, atol=1e-5)
    _, loop_sown = apply({"params": params}, ids, mutable=(moe.COLLECTION,))
    assert moe.router_stats(sown)[1] == moe.router_stats(loop_sown)[1] == 2
    np.testing.assert_allclose(moe.load_balancing_loss(sown, 18), moe.load_balancing_loss(loop_sown, 18), rtol=1e-6)


@pytest.mark.parametrize("bad, fragment", [
    (dict(experts_per_token=5), r"model.experts_per_token=5 must be in 1..model.num_experts=4"),
    (dict(experts_per_token=0), r"model.experts_per_token=0 must be in 1..model.num_experts=4"),
    (dict(num_experts=-1), r"model.num_experts=-1 must be >= 0"),
    (dict(mlp="gelu"), r"model.num_experts=4 needs model.mlp=swiglu and model.mlp_bias=false"),
    (dict(mlp_bias=True), r"model.num_experts=4 needs model.mlp=swiglu and model.mlp_bias=false"),
    (dict(router_aux_loss_coef=-0.1), r"model.router_aux_loss_coef=-0.1 must be >= 0")])
def test_bad_moe_switches_are_one_line_errors(bad, fragment):
    with pytest.raises(ConfigError, match=fragment) as e:
        moe_gpt(**bad)
    assert "\n" not in str(e.value)


def test_training_adds_coef_times_the_balance_loss_and_evaluation_does_not(tiny_cfg):
    from zoo.tasks.lm import LmTask
    cfg = dataclasses.replace(tiny_cfg, model=moe_gpt(vocab_size=384, router_aux_loss_coef=0.5))
    task = LmTask(cfg)
    params = nn.unbox(jax.jit(task.init)(jax.random.PRNGKey(0)))  # jitted: eager init is slow
    ids = jax.random.randint(jax.random.PRNGKey(1), (2, 8), 0, 384)
    batch = {"inputs": ids, "targets": jnp.roll(ids, -1, axis=1), "weights": jnp.ones((2, 8)).at[0, :3].set(0)}
    loss = jax.jit(task.loss, static_argnums=3)  # one compile per mode, not op by op
    train_sum, train_aux = loss(params, batch, jax.random.PRNGKey(2), True)
    eval_sum, eval_aux = loss(params, batch, jax.random.PRNGKey(2), False)
    balance = float(eval_aux["moe_aux_sum"]) / float(eval_aux["weight"])  # per-token sum over the weight 13
    assert float(eval_aux["weight"]) == 13 and balance > 1.9  # ~R=2 at init: near balanced
    assert float(train_sum) == pytest.approx(float(eval_sum) + 0.5 * balance * 13, rel=1e-5)
    # Its gradient reaches the routers (through the router probabilities).
    extra = jax.jit(jax.grad(lambda p: task.loss(p, batch, jax.random.PRNGKey(2), True)[0] -
                             task.loss(p, batch, jax.random.PRNGKey(2), False)[0]))(params)
    assert np.abs(np.asarray(extra["h_0"]["mlp"]["router"])).max() > 1e-6
    dense = LmTask(dataclasses.replace(cfg, model=moe_gpt(vocab_size=384, num_experts=0)))
    dense_params = nn.unbox(jax.eval_shape(dense.init, jax.random.PRNGKey(0)))
    _, dense_aux = jax.eval_shape(lambda p: dense.loss(p, batch, jax.random.PRNGKey(2), True), dense_params)
    assert "moe_aux_sum" not in dense_aux


# Published totals (Hugging Face's num_parameters()); active: the total less the unchosen experts' kernels,
# L * 3 * D * F * (E - R): Mixtral 46,702,792,704 - 32 * 3 * 4096 * 14336 * 6 = 12,879,925,248.
MOE_COUNTS = {"mixtral_8x7b": (46_702_792_704, 12_879_925_248), "qwen3_30b_a3b": (30_532_122_624, 3_353_032_704)}


@pytest.mark.parametrize("name", sorted(MOE_COUNTS))
def test_presets_have_the_published_counts_and_mfu_counts_the_active_params(name):
    from zoo.configuration import Config, DataConfig
    from zoo.models.gpt import PRESETS
    from zoo.tasks.lm import LmTask
    m = dataclasses.replace(PRESETS[name], scan_layers=True)  # the same counts, traced faster
    shapes = jax.eval_shape(lambda: Gpt(m).init(jax.random.PRNGKey(0), jnp.zeros((1, 8), jnp.int32)))
    total, active = MOE_COUNTS[name]
    assert sum(x.size for x in jax.tree.leaves(shapes["params"])) == total
    # FLOPs per token: 6 per active param but the input embedding (a lookup) + attention's 12 L N H T.
    T = 256
    fpt = LmTask(Config(model=m, data=DataConfig(seq_len=T))).flops_per_token(T)
    assert fpt == 6 * (active - m.vocab_size * m.d_model) + 12 * m.num_layers * m.num_heads * m.head_dim * T


def test_expert_parallel_steps_on_eight_devices_equal_one_and_log_the_balance_loss(cache_dir, tmp_path, monkeypatch):
    from conftest import replace
    monkeypatch.setattr(moe, "default_implementation", lambda: "sorted")  # the accelerators' dispatch: a global sort
    from tests.helpers import tiny_configs
    from tests.helpers.runs import losses, run
    cfg = tiny_configs.llama_lm(cache_dir)  # dropout on: the per-step rng must not depend on the layout
    cfg = replace(cfg, model=dict(d_ff=40, num_experts=4, experts_per_token=2), train=dict(steps=3))
    one = run(replace(cfg, mesh=dict(data=1, fsdp=1, tensor=1, expert=1)), tmp_path / "one", devices=jax.devices()[:1])
    many = run(replace(cfg, mesh=dict(data=1, fsdp=2, tensor=2, expert=2)), tmp_path / "many")
    assert many["setup"].mesh.shape == {"data": 1, "fsdp": 2, "tensor": 2, "expert": 2}
    gate = many["state"].params["h_0"]["mlp"]["gate"]  # [E, D, F]: experts over `expert`, D over fsdp, F over tensor
    assert gate.sharding.spec == jax.sharding.PartitionSpec("expert", "fsdp", "tensor")
    assert losses(tmp_path / "many") == pytest.approx(losses(tmp_path / "one"), rel=1e-5)
    for a, b in zip(jax.tree.leaves(jax.device_get(many["state"].params)),
                    jax.tree.leaves(jax.device_get(one["state"].params))):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    recs = [r for r in one["records"] if "loss" in r]
    assert len(recs) == 3 and all(1.9 < r["moe_aux_loss"] < 4 for r in recs)  # R = 2 when balanced, E = 4 at worst
    balance = [r["moe_aux_loss"] for r in many["records"] if "loss" in r]
    assert balance == pytest.approx([r["moe_aux_loss"] for r in recs], rel=1e-5)
