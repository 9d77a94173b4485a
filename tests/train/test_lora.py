"""LoRA, QLoRA and partial fine-tuning on the one trainer: an adapted model starts equal to its base; only
the adapters (and a new head) train, and only they have optimizer moments and checkpoints; the merged
weights give the adapted model's logits; resume is bit for bit and a 2x2x2 mesh equals 1 device; an
int8 / NF4 base trains within its quantization error; train.trainable trains its matches alone."""

import dataclasses

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from conftest import replace
from tests.helpers import shared, tiny_configs
from tests.helpers.runs import losses, run
from zoo import tasks
from zoo.errors import CheckpointError, ConfigError
from zoo.nn import lora, quant
from zoo.training import freeze, runs, trainer


@pytest.fixture(scope="module")
def base(tmp_path_factory, cache_dir):
    """(config, directory) of a 3-step Llama-style tiny run: the base every adapter here trains on (trained once
    a session, by whichever xdist worker asks first)."""
    cfg = replace(tiny_configs.llama_lm(cache_dir), train=dict(steps=3, save_every=3),
                  model=dict(dropout=0.0))
    path = shared.once(tmp_path_factory, "lora-base", lambda p: run(cfg, p / "base", devices=jax.devices()[:1]))
    return cfg, str(path / "base")


def adapted(base, **model):
    cfg, work = base
    return dataclasses.replace(cfg, init_from=work, optim=dataclasses.replace(cfg.optim, lr=1e-2),
                               model=dataclasses.replace(cfg.model, **{"lora_rank": 4, "lora_alpha": 8.0, **model}))


def size(tree) -> int:
    return sum(int(np.prod(x.shape)) for x in jax.tree.leaves(tree))


@pytest.fixture(scope="module")
def trained(base, tmp_path_factory):
    """(config, directory, {"params": the trained adapters, "frozen": the frozen base as training left it}) of 3
    steps of rank-4 adapters on the base at lr 1e-2: trained once a session (by whichever xdist worker asks
    first), the state at the end kept beside the run."""
    cfg = adapted(base)

    def build(path):
        out = run(cfg, path / "run", devices=jax.devices()[:1])
        for part, tree in (("params", out["params"]), ("frozen", out["state"].frozen)):
            np.savez(path / f"{part}.npz", **freeze.flat(jax.device_get(tree)))
    path = shared.once(tmp_path_factory, "lora-adapted", build)
    end = {part: freeze.unflat(dict(np.load(path / f"{part}.npz"))) for part in ("params", "frozen")}
    return cfg, str(path / "run"), end


def logits_fn(cfg):
    """Jitted logits of the plain model: (of params without adapters, of params with them)."""
    plain, spec = tasks.plain(cfg).model, cfg.model.lora_spec

    def adapted_logits(params, ids):
        with lora.intercept(spec, False):
            return plain.apply({"params": params}, ids)
    return jax.jit(plain.apply), jax.jit(adapted_logits)


def test_an_adapted_model_starts_as_its_base_and_only_its_adapters_train(base, trained):
    cfg, work, out = trained
    s = trainer.setup(cfg, jax.devices()[:1])
    state = trainer.init_from(s, s.init_state(jax.random.PRNGKey(0)), cfg.init_from)
    trainable = freeze.flat(state.params)
    assert trainable and all(lora.is_adapter(k) for k in trainable)
    assert len(trainable) == 2 * 7 * cfg.model.num_layers  # A and B on q, k, v, o, gate, fc, proj of each layer
    moments = [x for x in jax.tree.leaves(state.opt_state) if x.ndim > 0]
    assert sum(x.size for x in moments) == 2 * size(state.params)  # Adam's two moments, for the adapters only
    base_params = runs.load_params_of(base[1], base[0])
    ids = jnp.asarray(np.random.default_rng(0).integers(0, 256, (2, 16)))
    plain_logits, adapted_logits = logits_fn(cfg)
    start = adapted_logits(s.full_params(state), ids)
    np.testing.assert_array_equal(np.asarray(start), np.asarray(plain_logits({"params": base_params}, ids)))

    saved, paths = runs.load_trained(work, cfg)
    assert set(freeze.flat(saved)) == set(trainable) == set(paths)  # the checkpoint holds the adapters alone
    for k, v in freeze.flat(out["frozen"]).items():
        np.testing.assert_array_equal(v, freeze.flat(base_params)[k])  # the base never moved
    merged = runs.load_params_of(work, cfg)
    node = out["params"]["h_1"]["attn"]["query"]
    ab = np.einsum("dr,rnh->dnh", node["lora_a"], node["lora_b"])
    assert np.abs(ab).max() > 1e-3  # B left zero: the adapters learned something
    np.testing.assert_allclose(merged["h_1"]["attn"]["query"]["kernel"], node["kernel"] + 2.0 * ab, atol=1e-6)
    np.testing.assert_allclose(np.asarray(plain_logits({"params": merged}, ids)),
                               np.asarray(adapted_logits(out["params"], ids)), rtol=1e-5, atol=1e-5)


@pytest.mark.slow
def test_lora_resumes_bit_for_bit_and_a_2x2x2_mesh_equals_one_device(base, tmp_path):
    cfg = replace(adapted(base, lora_dropout=0.1), train=dict(steps=4, save_every=2), optim=dict(lr=1e-3),
                  mesh=dict(data=1, fsdp=1, tensor=1))
    one = run(cfg, tmp_path / "one", devices=jax.devices()[:1])
    run(cfg, tmp_path / "part", stop_at_step=2, devices=jax.devices()[:1])
    resumed = run(cfg, tmp_path / "part", resume=True, devices=jax.devices()[:1])
    for a, b in zip(jax.tree.leaves(jax.device_get(one["state"])), jax.tree.leaves(jax.device_get(resumed["state"]))):
        np.testing.assert_array_equal(a, b)
    assert losses(tmp_path / "part") == losses(tmp_path / "one")
    many = run(replace(cfg, mesh=dict(data=2, fsdp=2, tensor=2)), tmp_path / "many")
    assert losses(tmp_path / "many") == pytest.approx(losses(tmp_path / "one"), rel=1e-5)
    for a, b in zip(jax.tree.leaves(jax.device_get(many["state"].params)),
                    jax.tree.leaves(jax.device_get(one["state"].params))):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


@pytest.fixture(scope="module")
def unquantized(trained):
    """The first training loss of the adapters on the float32 base (what a quantized base approximates)."""
    return losses(trained[1])[1]


@pytest.mark.parametrize("kind, bound, ratio", [("int8", 1 / 254, 0.27), ("nf4", 0.15, 0.15)])
def test_a_quantized_base_trains_within_its_quantization_error(base, unquantized, tmp_path, kind, bound, ratio):
    cfg = replace(adapted(base, quantize_base=kind), train=dict(steps=2, save_every=2))
    out = run(cfg, tmp_path / kind, devices=jax.devices()[:1])
    frozen = freeze.flat(jax.device_get(out["state"].frozen))
    codes = frozen["h_0/mlp/fc/qkernel/codes"]
    assert codes.dtype == (np.int8 if kind == "int8" else np.uint8) and "h_0/mlp/fc/kernel" not in frozen
    w = runs.load_params_of(base[1], base[0])["h_0"]["mlp"]["fc"]["kernel"]
    q = {"codes": codes, "scale": frozen["h_0/mlp/fc/qkernel/scale"]}
    assert quant.nbytes(q) <= ratio * w.nbytes  # int8: ~1/4 of float32; nf4: 0.5625 / 4
    err = np.abs(np.asarray(quant.dequantize(q, w.shape, jnp.float32)) - w).max() / np.abs(w).max()
    assert 0 < err <= bound
    assert losses(tmp_path / kind)[1] == pytest.approx(unquantized, rel=0.02, abs=0.02)


def test_train_trainable_trains_its_matches_alone(base, tmp_path):
    cfg = dataclasses.replace(base[0], init_from=base[1], train=dataclasses.replace(base[0].train, steps=2,
                                                                                     trainable="h_1/|ln_f"))
    out = run(cfg, tmp_path / "partial", devices=jax.devices()[:1])
    trained = set(freeze.flat(out["state"].params))
    assert trained and all(k.startswith(("h_1/", "ln_f/")) for k in trained)
    before = freeze.flat(runs.load_params_of(base[1], base[0]))
    after = freeze.flat(runs.load_params_of(str(tmp_path / "partial"), cfg))
    assert set(after) == set(before)
    for k in before:
        assert np.array_equal(before[k], after[k]) == (k not in trained), k


def test_lora_on_bert_trains_the_adapters_and_the_new_head(cache_dir, tmp_path):
    mlm = tiny_configs.bert("bert_mlm", cache_dir)
    run(replace(mlm, train=dict(steps=1)), tmp_path / "mlm", devices=jax.devices()[:1])
    cls = tiny_configs.bert("bert_cls", cache_dir)
    cfg = dataclasses.replace(cls, init_from=str(tmp_path / "mlm"), train=dataclasses.replace(cls.train, steps=2),
                              model=dataclasses.replace(cls.model, lora_rank=2, lora_targets="query,value"))
    out = run(cfg, tmp_path / "cls", devices=jax.devices()[:1])
    trained = set(freeze.flat(out["state"].params))
    adapters = {k for k in trained if lora.is_adapter(k)}
    assert adapters and {k.split("/")[-2] for k in adapters} == {"query", "value"}
    assert trained - adapters and all("cls_head" in k or "pooler" in k for k in trained - adapters)


def test_lora_on_the_encoder_decoder_adapts_cross_attention_too(s2s_cfg, tmp_path):
    run(replace(s2s_cfg, train=dict(steps=1)), tmp_path / "base", devices=jax.devices()[:1])
    cfg = dataclasses.replace(s2s_cfg, init_from=str(tmp_path / "base"),
                              model=dataclasses.replace(s2s_cfg.model, lora_rank=2))
    s = trainer.setup(cfg, jax.devices()[:1])
    names = {k.rsplit("/", 2)[0] for k in freeze.flat(nn.unbox(s.abstract_params)) if lora.is_adapter(k)}
    assert any("cross" in n for n in names) and any(n.startswith("encoder") for n in names), sorted(names)
    assert np.isfinite(run(cfg, tmp_path / "s2s", devices=jax.devices()[:1])["records"][-1]["loss"])


def test_a_lora_fine_tune_reads_its_base_once_for_what_freezes_and_what_is_new(base, monkeypatch):
    """The base's shapes say both what stays frozen and which params take optim.head_lr_mult (a fine-tune's default
    is 20): its config is read once, where each of the two read it again."""
    cfg = adapted(base, lora_targets="query,value")
    cfg = dataclasses.replace(cfg, optim=dataclasses.replace(cfg.optim, head_lr_mult=20.0))
    reads, load = [], runs.load_config
    monkeypatch.setattr(runs, "load_config", lambda *a, **k: reads.append(a[0]) or load(*a, **k))
    s = trainer.setup(cfg, jax.devices()[:1])
    assert reads == [base[1]]
    assert s.trainable and all(lora.is_adapter(k) for k in s.trainable)


@pytest.mark.parametrize("model, train, match", [
    (dict(lora_targets="nosuch"), {}, r"model.lora_targets='nosuch' matches no layer.*query"),
    ({}, dict(trainable="nosuch"), r"train.trainable='nosuch' matches no parameter"),
])
def test_what_matches_nothing_is_refused_naming_the_choices(base, model, train, match):
    cfg = adapted(base, **model) if model else dataclasses.replace(base[0], init_from=base[1])
    cfg = dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, **train))
    with pytest.raises(ConfigError, match=match):
        trainer.setup(cfg, jax.devices()[:1])


def test_adapters_need_a_base_and_a_positive_rank(cache_dir):
    cfg = tiny_configs.llama_lm(cache_dir)
    with pytest.raises(ConfigError, match="model.lora_rank freezes a base model, which comes from init_from"):
        trainer.setup(replace(cfg, model=dict(lora_rank=2)), jax.devices()[:1])
    with pytest.raises(ConfigError, match=r"model.lora_rank=-1 must be >= 0"):
        replace(cfg, model=dict(lora_rank=-1))
    with pytest.raises(ConfigError, match=r"model.quantize_base='nf4' .* set model.lora_rank > 0"):
        replace(cfg, model=dict(quantize_base="nf4"))


def test_a_lora_run_reads_the_base_step_it_trained_on(cache_dir, tmp_path):
    # The base is one 8-step run stopped and resumed (one schedule: one compiled step for all three legs).
    cfg = replace(tiny_configs.gpt_lm(cache_dir), model=dict(dropout=0.0), train=dict(steps=8, save_every=2, keep=2))
    one = dict(devices=jax.devices()[:1])
    run(cfg, tmp_path / "base", stop_at_step=2, **one)
    lcfg = replace(dataclasses.replace(cfg, init_from=str(tmp_path / "base")), model=dict(lora_rank=2),
                   optim=dict(lr=1e-2), train=dict(steps=2))
    run(lcfg, tmp_path / "lora", **one)
    before = runs.load_params_of(str(tmp_path / "lora"), lcfg)
    run(cfg, tmp_path / "base", resume=True, stop_at_step=4, **one)  # the base trains on: step 4
    for a, b in zip(jax.tree.leaves(before), jax.tree.leaves(runs.load_params_of(str(tmp_path / "lora"), lcfg))):
        np.testing.assert_array_equal(a, b)
    # keep=1: step 2 rotates out (8 stays, and 6, the last good step: the loss after it was calm)
    run(replace(cfg, train=dict(keep=1)), tmp_path / "base", resume=True, **one)
    with pytest.raises(CheckpointError, match=r"trained on step 2 of its base, .* no longer holds it \(steps: 8, 6\)"):
        runs.load_params_of(str(tmp_path / "lora"), lcfg)
