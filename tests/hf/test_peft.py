"""LoRA adapters as Hugging Face PEFT files (zoo.hf.peft): a zoo LoRA run, trained on a base converted from a
small random transformers model, exports merged (transformers' logits equal zoo's) and as a PEFT adapter
(PEFT's `PeftModel.from_pretrained` on that transformers model gives zoo's logits: Llama with grouped-query
heads, Qwen2 with q/k/v biases, GPT-2 with its fused c_attn); adapters made by PEFT itself come in as zoo
LoRA runs with PEFT's logits; zoo -> PEFT -> zoo is exact; train.py --init-from takes an adapter directory;
bad input is one `error:` line and leaves nothing behind.
"""

import dataclasses
import json
import os
import shutil

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="torch is not installed: PEFT parity tests need transformers (PyTorch)")
transformers = pytest.importorskip("transformers", reason="transformers is not installed")
peft = pytest.importorskip("peft", reason="peft is not installed")

from safetensors.numpy import load_file, save_file  # noqa: E402

from tests.helpers.hf_runs import one_torch_thread  # noqa: F401,E402  (autouse fixture)
from tests.helpers import shared  # noqa: E402
from tests.helpers.runs import run  # noqa: E402
from zoo import hf, tasks  # noqa: E402
from zoo.cli import convert as convert_cli  # noqa: E402
from zoo.cli import train as train_cli  # noqa: E402
from zoo.configuration import DataConfig, OptimConfig, TrainConfig  # noqa: E402
from zoo.errors import ConversionError  # noqa: E402
from zoo.hf import peft as zoo_peft  # noqa: E402
from zoo.hf import peft_export  # noqa: E402
from zoo.training import checkpoint, freeze, runs  # noqa: E402

V = 300
LLAMA = dict(vocab_size=V, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, max_position_embeddings=64, rms_norm_eps=1e-5, bos_token_id=0, eos_token_id=1,
             initializer_range=0.2, attn_implementation="eager")
MODELS = {  # name -> (transformers config class, model class, fields)
    "llama": ("LlamaConfig", "LlamaForCausalLM", LLAMA),  # 4 query heads over 2 key/value heads, untied
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", dict(LLAMA, tie_word_embeddings=True)),  # q/k/v biases
    "gpt2": ("GPT2Config", "GPT2LMHeadModel", dict(n_layer=2, n_embd=32, n_head=4, vocab_size=V, n_positions=64,
                                                   bos_token_id=0, eos_token_id=1)),
}
LLAMA_TARGETS = ["down_proj", "gate_proj", "k_proj", "o_proj", "q_proj", "up_proj", "v_proj"]
IDS = np.random.default_rng(0).integers(0, V, (2, 12))


@pytest.fixture(scope="module")
def built(tmp_path_factory, cache_dir):
    """The directories of hf_dirs, lora_runs and adapters, built once a session (by whichever xdist worker
    asks first): converting and training them twice, once on each worker, would only repeat the same work."""
    return shared.once(tmp_path_factory, "peft", lambda root: build(root, cache_dir))


def build(root, cache_dir):
    """Under `root`: name/hf, a saved small random transformers model; name/base, it converted; name/lora, a
    LoRA run on it; name/adapter, the PEFT adapter `to-hf --adapter` wrote for that run."""
    for name, (config_cls, model_cls, fields) in MODELS.items():
        torch.manual_seed(0)
        model = getattr(transformers, model_cls)(getattr(transformers, config_cls)(**fields))
        model.save_pretrained(root / name / "hf")
        base = str(root / name / "base")
        hf.from_hf(str(root / name / "hf"), base, verbose=False)
        cfg = runs.load_config(base)
        cfg = dataclasses.replace(
            cfg, init_from=base, model=dataclasses.replace(cfg.model, lora_rank=4, lora_alpha=8.0),
            data=DataConfig(source="builtin", tokenizer="bytes", seq_len=16, cache_dir=cache_dir),
            optim=OptimConfig(lr=1e-2, warmup=0),
            train=TrainConfig(steps=3, batch_size=4, log_every=3, eval_every=0, save_every=3,
                              trainable="ln_f" if name == "qwen2" else ""))  # qwen2's final norm trains too
        run(cfg, root / name / "lora", devices=jax.devices()[:1])
        assert convert_cli.main(["to-hf", str(root / name / "lora"), str(root / name / "adapter"), "--adapter"]) == 0


@pytest.fixture(scope="module")
def hf_dirs(built):
    """name -> a saved small random transformers model's directory."""
    return {name: str(built / name / "hf") for name in MODELS}


@pytest.fixture(scope="module")
def lora_runs(built):
    """name -> (base run converted from hf_dirs[name], a LoRA run on it: rank 4, alpha 8, 3 steps at lr 1e-2, so
    every lora_b is far from zero; Qwen2's also trains its final norm, which travels as modules_to_save)."""
    return {name: (str(built / name / "base"), str(built / name / "lora")) for name in MODELS}


@pytest.fixture(scope="module")
def adapters(built):
    """name -> the PEFT adapter directory `to-hf --adapter` wrote for lora_runs[name]."""
    return {name: str(built / name / "adapter") for name in MODELS}


def fresh(src):
    """A transformers model loaded anew (PEFT adapts the model it is given in place)."""
    return transformers.AutoModelForCausalLM.from_pretrained(src).eval()


def hf_logits(model, ids=IDS):
    with torch.no_grad():
        return model(torch.tensor(np.asarray(ids))).logits.numpy()


def zoo_logits(run_dir, ids=IDS):
    model, params, _, _ = runs.load_run(run_dir)
    return np.asarray(jax.jit(model.apply)({"params": params}, jnp.asarray(ids)))  # one compile, not one per op


@pytest.mark.slow
def test_a_lora_run_exports_merged_with_its_logits_in_transformers(hf_dirs, lora_runs, tmp_path):
    base, lora = lora_runs["llama"]
    hf.to_hf(lora, str(tmp_path / "out"), verbose=False)
    ours = zoo_logits(lora)
    assert np.abs(hf_logits(fresh(str(tmp_path / "out"))) - ours).max() <= 1e-4
    assert np.abs(hf_logits(fresh(hf_dirs["llama"])) - ours).max() > 1e-2  # the adapters moved the logits


@pytest.mark.parametrize("name", list(MODELS))
def test_peft_loads_the_adapter_with_the_lora_runs_logits(hf_dirs, lora_runs, adapters, name):
    base_model = fresh(hf_dirs[name])
    plain = hf_logits(base_model)
    adapted = peft.PeftModel.from_pretrained(base_model, adapters[name]).eval()
    ours = zoo_logits(lora_runs[name][1])
    diff = np.abs(hf_logits(adapted) - ours).max()
    print(f"{name}: max abs logit diff {diff:.2e}")
    assert diff <= 1e-4
    assert np.abs(plain - ours).max() > 1e-2  # the adapters moved the logits, and PEFT applied them


@pytest.mark.parametrize("base", ["hf", "zoo"])
def test_the_exported_folder_alone_loads_with_auto_peft(hf_dirs, lora_runs, adapters, base, tmp_path, cache_dir):
    """AutoPeftModelForCausalLM.from_pretrained(OUT) with nothing else: a base converted from a Hugging Face
    directory is named by that directory; a base zoo trained (here: saved by zoo.load(...).save) is exported
    beside the adapter, OUT/base, and named by it. Either way transformers + PEFT give the LoRA run's logits."""
    if base == "hf":
        out, lora = adapters["llama"], lora_runs["llama"][1]
    else:
        import zoo
        zoo.load(lora_runs["llama"][0]).save(str(tmp_path / "zoo-base"), verbose=False)  # no record of an origin
        cfg = runs.load_config(lora_runs["llama"][1])
        lora = str(tmp_path / "lora")
        run(dataclasses.replace(cfg, init_from=str(tmp_path / "zoo-base"), data=dataclasses.replace(
            cfg.data, cache_dir=cache_dir)), lora, devices=jax.devices()[:1])
        out = str(tmp_path / "adapter")
        assert convert_cli.main(["to-hf", lora, out, "--adapter"]) == 0
        assert json.load(open(os.path.join(out, "adapter_config.json")))["base_model_name_or_path"] == \
            os.path.join(out, "base") and os.path.isfile(os.path.join(out, "base", "model.safetensors"))
    model = peft.AutoPeftModelForCausalLM.from_pretrained(out).eval()
    assert np.abs(hf_logits(model) - zoo_logits(lora)).max() <= 1e-4
    import zoo
    merged = zoo.load(lora)  # the adapters merged: its config describes the plain model its params fit
    assert merged.config.model.lora_rank == 0 and merged.lora_run == lora


def test_the_adapter_config_and_key_names_are_peft_s(hf_dirs, lora_runs, adapters):
    cfg = json.load(open(os.path.join(adapters["llama"], "adapter_config.json")))
    assert (cfg["peft_type"], cfg["task_type"], cfg["r"], cfg["lora_alpha"], cfg["bias"], cfg["fan_in_fan_out"]) == \
        ("LORA", "CAUSAL_LM", 4, 8, "none", False)
    assert cfg["target_modules"] == LLAMA_TARGETS and cfg["rank_pattern"] == {} and cfg["modules_to_save"] is None
    assert cfg["base_model_name_or_path"] == os.path.abspath(hf_dirs["llama"])  # the checkpoint the base came from
    tensors = load_file(os.path.join(adapters["llama"], "adapter_model.safetensors"))
    assert len(tensors) == 2 * 7 * 2  # 2 layers x 7 projections x (A, B)
    layer = "base_model.model.model.layers.1."
    assert tensors[layer + "self_attn.q_proj.lora_A.weight"].shape == (4, 32)
    assert tensors[layer + "self_attn.k_proj.lora_B.weight"].shape == (16, 4)  # 2 key/value heads of width 8
    assert tensors[layer + "mlp.down_proj.lora_A.weight"].shape == (4, 48)
    gpt2 = json.load(open(os.path.join(adapters["gpt2"], "adapter_config.json")))
    # c_attn holds query | key | value: one rank-12 adapter, scale 24 / 12 = 8 / 4
    assert (gpt2["fan_in_fan_out"], gpt2["target_modules"], gpt2["rank_pattern"], gpt2["alpha_pattern"]) == \
        (True, ["c_attn", "c_fc", "c_proj"], {"c_attn": 12}, {"c_attn": 24})
    b = load_file(os.path.join(adapters["gpt2"], "adapter_model.safetensors"))[
        "base_model.model.transformer.h.0.attn.c_attn.lora_B.weight"]
    assert b.shape == (96, 12) and not b[:32, 4:].any() and not b[32:64, :4].any() and b[32:64, 4:8].any()
    qwen2 = json.load(open(os.path.join(adapters["qwen2"], "adapter_config.json")))
    assert qwen2["modules_to_save"] == ["model.norm"]  # train.trainable=ln_f: the whole module, as PEFT saves it
    assert "base_model.model.model.norm.weight" in load_file(os.path.join(adapters["qwen2"],
                                                                          "adapter_model.safetensors"))


@pytest.mark.parametrize("name", list(MODELS))
def test_zoo_to_peft_to_zoo_is_exact(lora_runs, adapters, name, tmp_path):
    base, lora = lora_runs[name]
    assert convert_cli.main(["from-hf", adapters[name], str(tmp_path / "back"), "--base", base]) == 0
    mine, back = runs.load_config(lora), runs.load_config(str(tmp_path / "back"))
    assert back.init_from == mine.init_from
    assert dataclasses.replace(back.model, lora_targets="x") == dataclasses.replace(mine.model, lora_targets="x")
    # the same layers adapted (lora_targets may name them otherwise: GPT-2 has no `gate`)
    assert runs.load_trained(str(tmp_path / "back"), back)[1] == runs.load_trained(lora, mine)[1]
    np.testing.assert_array_equal(zoo_logits(str(tmp_path / "back")), zoo_logits(lora))
    peft_export.to_peft(str(tmp_path / "back"), str(tmp_path / "again"), verbose=False)
    first = load_file(os.path.join(adapters[name], "adapter_model.safetensors"))
    again = load_file(str(tmp_path / "again" / "adapter_model.safetensors"))
    assert sorted(first) == sorted(again) and all(first[k].tobytes() == again[k].tobytes() for k in first)


def test_a_new_head_travels_whole_with_its_adapter_merged_into_it(tmp_path):
    """bert_cls on a masked-LM base: the pooler and classifier are new, so they train whole and travel in
    modules_to_save; the classifier (an `out` Einsum) also carries an adapter, which PEFT cannot put on a module
    it saves whole: it is merged into the saved weight. Trained params are random here (no training needed)."""
    torch.manual_seed(0)
    transformers.BertForMaskedLM(transformers.BertConfig(
        vocab_size=V, hidden_size=32, num_hidden_layers=1, num_attention_heads=4, intermediate_size=64,
        max_position_embeddings=64)).save_pretrained(tmp_path / "mlm")
    base, lora_run = str(tmp_path / "base"), str(tmp_path / "lora")
    cfg = hf.from_hf(str(tmp_path / "mlm"), base, verbose=False)["config"]
    cfg = dataclasses.replace(cfg, task="bert_cls", init_from=base, model=dataclasses.replace(
        cfg.model, lora_rank=4, lora_alpha=8.0, num_classes=3))
    task = tasks.build(cfg)
    boxed = jax.eval_shape(task.init, jax.random.PRNGKey(0))
    trained = freeze.split(nn.unbox(boxed), runs.trainable_of(cfg, boxed, task.seen))[0]
    rng = np.random.default_rng(1)
    checkpoint.save_weights(lora_run, jax.tree.map(lambda s: 0.2 * rng.standard_normal(s.shape, np.float32),
                                                   trained), cfg)
    hf.to_hf(lora_run, str(tmp_path / "merged"), verbose=False)
    peft_export.to_peft(lora_run, str(tmp_path / "adapter"), verbose=False)
    adapter = json.load(open(tmp_path / "adapter" / "adapter_config.json"))
    assert adapter["modules_to_save"] == ["bert.pooler.dense", "classifier"] and adapter["task_type"] is None
    assert not any("classifier.lora" in k for k in load_file(str(tmp_path / "adapter" / "adapter_model.safetensors")))
    head = transformers.AutoModelForSequenceClassification
    merged = hf_logits(head.from_pretrained(str(tmp_path / "merged")).eval())
    theirs = peft.PeftModel.from_pretrained(head.from_pretrained(str(tmp_path / "mlm"), num_labels=3),
                                            str(tmp_path / "adapter")).eval()
    assert np.abs(hf_logits(theirs) - merged).max() <= 1e-4


# Adapters PEFT itself makes: a subset of Llama's layers with rank-stabilised scaling; GPT-2's c_attn as one
# rank-4 adapter over query | key | value (zoo: three adapters sharing A).
MADE_BY_PEFT = {"llama": dict(target_modules=["q_proj", "v_proj", "down_proj"], use_rslora=True),
                "gpt2": dict(target_modules=["c_attn"], fan_in_fan_out=True)}


@pytest.mark.parametrize("name,targets", [("llama", "proj,query,value"), ("gpt2", "key,query,value")])
def test_an_adapter_peft_made_comes_in_on_its_hugging_face_base(hf_dirs, name, targets, tmp_path):
    torch.manual_seed(1)
    made = peft.get_peft_model(fresh(hf_dirs[name]), peft.LoraConfig(r=4, lora_alpha=8, task_type="CAUSAL_LM",
                                                                     **MADE_BY_PEFT[name]))
    with torch.no_grad():
        for n, p in made.named_parameters():
            if "lora_B" in n:
                p.normal_(0.0, 0.2)  # PEFT starts B at zero
    made.save_pretrained(str(tmp_path / "adapter"))
    theirs = hf_logits(made.eval())
    # base_model_name_or_path is the transformers directory: converted into RUN_DIR/base
    report = zoo_peft.from_peft(str(tmp_path / "adapter"), str(tmp_path / "run"), verbose=False)
    assert report["base"] == str(tmp_path / "run" / "base") and checkpoint.latest_step(report["base"]) == 0
    cfg = report["config"]
    assert (cfg.model.lora_rank, cfg.model.lora_targets) == (4, targets)
    diff = np.abs(zoo_logits(str(tmp_path / "run")) - theirs).max()
    assert diff <= 1e-4
    assert np.abs(hf_logits(fresh(hf_dirs[name])) - theirs).max() > 1e-2


def test_train_init_from_an_adapter_directory_starts_from_the_merged_model(lora_runs, adapters, tmp_path):
    workdir = str(tmp_path / "ft")
    args = ["--init-from", adapters["llama"], "--workdir", workdir, "--set", "train.steps=1"]
    cfg, _, _ = train_cli.resolve(train_cli.parse([*args, "--print-config"]))
    assert not os.path.exists(workdir) and cfg.init_from == os.path.join(workdir, "base")
    cfg, _, _ = train_cli.resolve(train_cli.parse(args))
    assert cfg.init_from == os.path.join(os.path.abspath(workdir), "base") and cfg.model.lora_rank == 4
    np.testing.assert_array_equal(zoo_logits(cfg.init_from), zoo_logits(lora_runs["llama"][1]))


def edited_adapter(src, dst, config=None, tensors=None):
    """A copy of adapter directory `src` with `config` fields set and `tensors` replaced (None: left out)."""
    os.makedirs(dst)
    c = {**json.load(open(os.path.join(src, "adapter_config.json"))), **(config or {})}
    json.dump(c, open(os.path.join(dst, "adapter_config.json"), "w"))
    t = {**load_file(os.path.join(src, "adapter_model.safetensors")), **(tensors or {})}
    save_file({k: v for k, v in t.items() if v is not None}, os.path.join(dst, "adapter_model.safetensors"))
    return str(dst)


Q_A = "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight"


@pytest.mark.parametrize("config,tensors,message", [
    (dict(peft_type="IA3"), None, r"holds a peft_type='IA3' adapter; zoo holds LoRA only$"),
    (dict(use_dora=True), None, r"sets use_dora=true, which zoo's LoRA does not have$"),
    (dict(layers_to_transform=[0]), None, r"sets layers_to_transform=\[0\], which zoo's LoRA does not have$"),
    (dict(rank_pattern={"q_proj": 8}), None, r"rank_pattern gives model.layers.0.self_attn.q_proj rank 8; zoo's "),
    (dict(target_modules=["c_attn", "c_proj"]), None, r"target_modules=\[\"c_attn\", \"c_proj\"\] matches no layer of "
                                                      r"the base \(LlamaForCausalLM; its layers: down_proj, "),
    (None, {Q_A: np.zeros((4, 64), np.float32)}, rf"{Q_A} has shape \(4, 64\); the base's "
                                                 r"model.layers.0.self_attn.q_proj needs \(4, 32\): an adapter for "),
    (None, {Q_A: None}, rf"has no {Q_A}, which the adapter config's layers need$"),
    (None, {"base_model.model.model.layers.0.mlp.act.lora_A.weight": np.zeros((4, 8), np.float32)},
     r"model.layers.0.mlp.act.lora_A.weight fits no layer the adapter config targets in the base")])
def test_an_adapter_zoo_cannot_hold_is_refused_in_one_line(lora_runs, adapters, config, tensors, message, tmp_path,
                                                           capsys):
    bad = edited_adapter(adapters["llama"], tmp_path / "bad", config, tensors)
    with pytest.raises(ConversionError, match=message) as e:
        zoo_peft.from_peft(bad, str(tmp_path / "run"), lora_runs["llama"][0], verbose=False)
    assert "\n" not in str(e.value)
    assert not os.path.exists(tmp_path / "run")
    assert convert_cli.main(["from-hf", bad, str(tmp_path / "run")]) == 2  # base: base_model_name_or_path
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and "\n" not in err and not os.path.exists(tmp_path / "run")


def test_adapter_export_of_a_run_without_adapters_is_refused_in_one_line(lora_runs, tmp_path, capsys):
    assert convert_cli.main(["to-hf", lora_runs["llama"][0], str(tmp_path / "out"), "--adapter"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and "has no LoRA adapters (model.lora_rank=0)" in err and "\n" not in err
    assert not os.path.exists(tmp_path / "out")


def test_base_applies_to_adapter_directories_only(hf_dirs, lora_runs, tmp_path, capsys):
    assert convert_cli.main(["from-hf", hf_dirs["llama"], str(tmp_path / "run"), "--base", lora_runs["llama"][0]]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: --base applies to a PEFT adapter directory; ") and "\n" not in err
    assert not os.path.exists(tmp_path / "run")


def test_a_base_that_will_not_convert_leaves_no_run_directory(hf_dirs, adapters, tmp_path):
    src = tmp_path / "broken"
    shutil.copytree(hf_dirs["llama"], src)
    os.remove(src / "model.safetensors")  # config.json without weights
    with pytest.raises(ConversionError, match="has neither"):
        zoo_peft.from_peft(adapters["llama"], str(tmp_path / "run"), str(src), verbose=False)
    assert not os.path.exists(tmp_path / "run")
