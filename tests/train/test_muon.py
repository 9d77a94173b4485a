"""optim.name=muon: one step's update equals a NumPy Muon (Nesterov momentum, 5 Newton-Schulz steps on the
normalised matrix, Moonlight's RMS scaling) and optax.contrib.muon, for a 2-D kernel and for a 3-D attention kernel
as its [D, N*H] matrix; the hidden kernels of a GPT and a Llama get Muon and the rest AdamW; a tiny run's loss falls,
resumes bit for bit and trains the same numbers on 8 devices as on 1; bad values and LoRA are refused in one line."""

import math

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax.sharding import PartitionSpec

from conftest import replace
from tests.helpers import tiny_configs
from tests.helpers.runs import losses, run
from zoo import tasks
from zoo.configuration import OptimConfig
from zoo.overrides import apply_overrides
from zoo.errors import ConfigError
from zoo.training import freeze, optim

LR, WD, RMS, BETA = 0.02, 0.1, 0.2, 0.95


def numpy_muon(g, params, steps=1):
    """Muon's update of a matrix [fan_in, fan_out] after `steps` equal gradients g, written from the papers: Nesterov
    momentum (optax's bias-corrected form), Frobenius normalisation, 5 quintic Newton-Schulz steps on the wide
    orientation, times sqrt(max(fan_in, fan_out)) * 0.2, plus decoupled decay, times -lr."""
    g = g.astype(np.float64)
    mu = np.zeros_like(g)
    for t in range(1, steps + 1):
        mu = BETA * mu + (1 - BETA) * g
    t = steps
    x = BETA * mu / (1 - BETA ** (t + 1)) + (1 - BETA) * g / (1 - BETA ** t)
    wide = x.shape[0] <= x.shape[1]
    x = x if wide else x.T
    x = x / (np.linalg.norm(x) + 1e-8)
    a, b, c = 3.4445, -4.775, 2.0315
    for _ in range(5):
        A = x @ x.T
        x = a * x + (b * A + c * A @ A) @ x
    x = x if wide else x.T
    x = x * math.sqrt(max(g.shape)) * RMS
    return -LR * (x + WD * params)


def cfg_muon(**kw):
    return OptimConfig(name="muon", lr=LR, schedule="constant", warmup=0, weight_decay=WD, clip_norm=0, **kw)


def one_update(boxed, grads):
    """The first update of zoo's Muon on `boxed` (nn.Partitioned leaves) for `grads`."""
    cfg = cfg_muon()
    tx = optim.make_optimizer(cfg, optim.make_schedule(cfg, 10, 8), optim.decay_mask(boxed), boxed=boxed)
    params = nn.unbox(boxed)
    return tx.update(grads, tx.init(params), params)[0]


def test_a_2d_kernel_steps_as_numpy_muon_and_optax_muon():
    rng = np.random.default_rng(0)
    for shape in ((16, 48), (48, 16)):  # [D, F] and [F, D]: both orientations of Newton-Schulz
        w = rng.normal(size=shape).astype(np.float32)
        g = rng.normal(size=shape).astype(np.float32)
        names = ("embed", "mlp") if shape[0] == 16 else ("mlp", "embed")
        ours = one_update({"w": nn.Partitioned(jnp.asarray(w), names)}, {"w": jnp.asarray(g)})["w"]
        np.testing.assert_allclose(ours, numpy_muon(g, w), rtol=1e-5, atol=1e-7)
        ref = optax.contrib.muon(LR, weight_decay=WD, consistent_rms=RMS)  # its default: Muon on every 2-D leaf
        theirs = ref.update({"w": jnp.asarray(g)}, ref.init({"w": jnp.asarray(w)}), {"w": jnp.asarray(w)})[0]["w"]
        np.testing.assert_allclose(ours, theirs, rtol=1e-6, atol=1e-8)


def test_momentum_over_three_steps_matches_numpy():
    w = np.random.default_rng(1).normal(size=(8, 24)).astype(np.float32)
    g = np.random.default_rng(2).normal(size=(8, 24)).astype(np.float32)
    boxed = {"w": nn.Partitioned(jnp.asarray(w), ("embed", "mlp"))}
    cfg = cfg_muon()
    tx = optim.make_optimizer(cfg, optim.make_schedule(cfg, 10, 8), optim.decay_mask(boxed), boxed=boxed)
    state, params = tx.init({"w": jnp.asarray(w)}), {"w": jnp.asarray(w)}
    for _ in range(3):  # the same gradient at the same params: only the momentum moves
        update, state = tx.update({"w": jnp.asarray(g)}, state, params)
    np.testing.assert_allclose(update["w"], numpy_muon(g, w, steps=3), rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("names, shape", [(("embed", "heads", "kv"), (24, 4, 8)),
                                          (("heads", "kv", "embed"), (4, 8, 24)),
                                          (("layers", "embed", "heads", "kv"), (2, 24, 4, 8))])
def test_attention_kernels_step_as_their_matrix(names, shape):
    """q/k/v [D, N, H] step as the matrix [D, N*H], out [N, H, D] as [N*H, D]; a scanned layers axis is a batch."""
    rng = np.random.default_rng(3)
    w = rng.normal(size=shape).astype(np.float32)
    g = rng.normal(size=shape).astype(np.float32)
    ours = np.asarray(one_update({"w": nn.Partitioned(jnp.asarray(w), names)}, {"w": jnp.asarray(g)})["w"])
    matrix = (lambda x: x.reshape(24, 32)) if names[-3] == "embed" else (lambda x: x.reshape(32, 24))
    stack = (lambda x: x) if names[0] == "layers" else (lambda x: x[None])
    for w1, g1, u1 in zip(stack(w), stack(g), stack(ours)):
        np.testing.assert_allclose(matrix(u1), numpy_muon(matrix(g1), matrix(w1)), rtol=1e-5, atol=1e-7)


def test_the_other_leaves_step_as_zoos_adamw():
    """Embeddings, norms and biases in a Muon run: AdamW as optim.name=adamw has it, decay on matrices only."""
    rng = np.random.default_rng(4)
    boxed = {"kernel": nn.Partitioned(jnp.asarray(rng.normal(size=(8, 16)), jnp.float32), ("embed", "mlp")),
             "wte": nn.Partitioned(jnp.asarray(rng.normal(size=(32, 8)), jnp.float32), ("vocab", "embed")),
             "scale": nn.Partitioned(jnp.ones((8,)), ("embed",))}
    grads = jax.tree.map(lambda p: jnp.asarray(rng.normal(size=p.shape), jnp.float32), nn.unbox(boxed))
    ours = one_update(boxed, grads)
    cfg = OptimConfig(lr=LR, schedule="constant", warmup=0, weight_decay=WD, clip_norm=0)
    tx = optim.make_optimizer(cfg, optim.make_schedule(cfg, 10, 8), optim.decay_mask(boxed))
    params = nn.unbox(boxed)
    adamw = tx.update(grads, tx.init(params), params)[0]
    for k in ("wte", "scale"):
        np.testing.assert_array_equal(ours[k], adamw[k])
    assert not np.allclose(ours["kernel"], adamw["kernel"], rtol=0.1)  # the kernel took Muon's step


def leaves_by_rule(cfg):
    """{path: 'muon' | 'adamw'} of a config's params, as muon_dims sorts them."""
    abstract = jax.eval_shape(tasks.build(cfg).init, jax.random.PRNGKey(0))
    dims = optim.muon_dims(abstract)
    flat = freeze.flat(jax.tree.map(lambda d: "adamw" if d is None else "muon", dims, is_leaf=optim._is_dims))
    return flat, freeze.flat(dims)


@pytest.mark.parametrize("family", ["gpt_lm", "llama_lm"])
def test_hidden_kernels_get_muon_and_the_rest_adamw(family, cache_dir):
    flat, dims = leaves_by_rule(getattr(tiny_configs, family)(cache_dir))
    muon = sorted(k for k, v in flat.items() if v == "muon")
    kernels = ["attn/key/kernel", "attn/out/kernel", "attn/query/kernel", "attn/value/kernel", "mlp/fc/kernel"]
    kernels += ["mlp/gate/kernel"] * (family == "llama_lm") + ["mlp/proj/kernel"]
    assert muon == [f"h_{i}/{k}" for i in range(2) for k in kernels]
    adamw = {k for k, v in flat.items() if v == "adamw"}
    assert "wte/embedding" in adamw and "ln_f/scale" in adamw
    assert ("lm_head/embedding" in adamw) == (family == "llama_lm")  # the untied head: a vocab axis
    assert ("wpe" in adamw) == (family == "gpt_lm")  # learned positions: an unnamed axis
    assert dims["h_0/attn/query/kernel"] == optax.contrib.MuonDimensionNumbers((0,), (1, 2))
    assert dims["h_0/attn/out/kernel"] == optax.contrib.MuonDimensionNumbers((0, 1), (2,))
    assert dims["h_0/mlp/proj/kernel"] == optax.contrib.MuonDimensionNumbers((0,), (1,))


def test_scanned_layers_and_experts_are_batch_axes():
    assert optim.kernel_dims(("layers", "embed", "mlp")) == optax.contrib.MuonDimensionNumbers((1,), (2,))
    assert optim.kernel_dims(("layers", "expert", "mlp", "embed")) == optax.contrib.MuonDimensionNumbers((2,), (3,))
    for names in (("embed", "expert"), ("vocab", "embed"), (None, "embed"), ("layers", "embed"), ("embed", None)):
        assert optim.kernel_dims(names) is None, names


def test_a_muon_run_learns_and_resumes_bit_for_bit(cache_dir, tmp_path):
    cfg = replace(tiny_configs.llama_lm(cache_dir), optim=dict(name="muon", lr=5e-3, warmup=1),
                  train=dict(steps=6, save_every=3))
    one = run(cfg, tmp_path / "one", devices=jax.devices()[:1])
    first = losses(tmp_path / "one")
    assert first[6] < first[1] - 0.3, first  # 5.96 -> 4.97 (AdamW at this lr: 4.81)
    run(cfg, tmp_path / "part", stop_at_step=3, devices=jax.devices()[:1])
    resumed = run(cfg, tmp_path / "part", resume=True, devices=jax.devices()[:1])
    for a, b in zip(jax.tree.leaves(jax.device_get(one["state"])), jax.tree.leaves(jax.device_get(resumed["state"]))):
        np.testing.assert_array_equal(a, b)
    assert losses(tmp_path / "part") == first
    many = run(replace(cfg, mesh=dict(data=2, fsdp=2, tensor=2)), tmp_path / "many")
    assert many["setup"].mesh.devices.size == 8
    specs = {jax.tree_util.keystr(k): v.spec for k, v in
             jax.tree_util.tree_flatten_with_path(many["setup"].state_shardings.opt_state)[0]}
    muon_fc = [spec for k, spec in specs.items() if "'muon'" in k and k.endswith("mu['h_0']['mlp']['fc']['kernel']")]
    assert muon_fc == [PartitionSpec("fsdp", "tensor")]  # Muon's momentum sharded as its kernel
    assert losses(tmp_path / "many") == pytest.approx(first, rel=1e-5)
    for a, b in zip(jax.tree.leaves(jax.device_get(many["state"].params)),
                    jax.tree.leaves(jax.device_get(one["state"].params))):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def test_lora_is_refused_in_one_line(cache_dir):
    cfg = replace(tiny_configs.llama_lm(cache_dir), optim=dict(name="muon"), model=dict(lora_rank=4))
    abstract = jax.eval_shape(tasks.build(cfg).init, jax.random.PRNGKey(0))
    with pytest.raises(ConfigError, match=r"optim.name='muon' .*model.lora_rank.*optim.name=adamw"):
        optim.muon_dims(abstract)


@pytest.mark.parametrize("key, value, match", [
    ("name", "lion", "optim.name='lion' is unknown; choose one of adamw, muon"),
    ("muon_beta", 1.0, r"optim.muon_beta=1.0 must be in \[0, 1\)"),
    ("muon_ns_steps", 0, "optim.muon_ns_steps=0 must be >= 1"),
    ("muon_rms", 0.0, "optim.muon_rms=0.0 must be a positive number"),
])
def test_bad_values_are_refused_naming_the_key(key, value, match):
    with pytest.raises(ConfigError, match=match):
        OptimConfig(**{key: value})


def test_the_name_is_set_from_the_command_line(cache_dir):
    cfg = apply_overrides(tiny_configs.gpt_lm(cache_dir), ["optim.name=muon", "optim.muon_rms=0.3"])
    assert (cfg.optim.name, cfg.optim.muon_rms) == ("muon", 0.3)


def test_a_resume_cannot_switch_the_optimizer(cache_dir):
    """The resume check compares optimizer-state layouts (zoo.api.start.optimizer_state): Muon's differs."""
    from zoo.api.start import optimizer_state
    adamw = tiny_configs.llama_lm(cache_dir)
    muon = replace(adamw, optim=dict(name="muon"))
    assert optimizer_state(muon) == optimizer_state(replace(muon, optim=dict(lr=1e-2)))
    assert optimizer_state(muon) != optimizer_state(adamw)


def test_an_mlp_kernel_is_not_gathered_whole_on_an_fsdp_tensor_mesh():
    """Newton-Schulz on [D, F] sharded (fsdp, tensor): XLA gathers the Gram matrix [D, D] (each step's X X^T,
    all-reduced over F's shards), never the kernel [D, F] or [F, D]."""
    import re
    from jax.sharding import Mesh, NamedSharding
    mesh = Mesh(np.array(jax.devices()[:8]).reshape(2, 4), ("fsdp", "tensor"))
    D, F = 64, 256
    boxed = {"fc": nn.Partitioned(jax.ShapeDtypeStruct((D, F), jnp.float32), ("embed", "mlp")),
             "proj": nn.Partitioned(jax.ShapeDtypeStruct((F, D), jnp.float32), ("mlp", "embed"))}
    cfg = cfg_muon()
    tx = optim.make_optimizer(cfg, optim.make_schedule(cfg, 10, 8), optim.decay_mask(boxed), boxed=boxed)
    sh = {"fc": NamedSharding(mesh, PartitionSpec("fsdp", "tensor")),
          "proj": NamedSharding(mesh, PartitionSpec("tensor", "fsdp"))}
    params = {k: jax.ShapeDtypeStruct((D, F) if k == "fc" else (F, D), jnp.float32, sharding=sh[k]) for k in sh}
    hlo = jax.jit(tx.update, out_shardings=(sh, None)).lower(params, jax.eval_shape(tx.init, params),
                                                             params).compile().as_text()
    gathered = set(re.findall(r"= f32\[([\d,]+)\]\S* all-gather(?:-start)?\(", hlo))
    assert gathered and all(math.prod(map(int, s.split(","))) <= D * D for s in gathered), gathered
