"""Mixtures of experts (zoo.nn.moe) from and to Hugging Face: a small random MixtralForCausalLM (4 experts, 2
per token, grouped-query attention, expert width 28) and Qwen3MoeForCausalLM (q/k norms, head width 24 over
width 40, top-2 of 4 left unnormalised: norm_topk_prob false) convert to zoo runs whose logits and KV-cached
greedy continuations equal transformers'; `to-hf` writes per-expert keys, as transformers saves them, that
load back as the same architecture and convert back to identical params; export picks the architecture by
the q/k norms and refuses what none holds, in one line; Qwen3-MoE's dense layers are refused.
"""

import dataclasses
import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="torch is not installed: HF parity tests need transformers (PyTorch)")
transformers = pytest.importorskip("transformers", reason="transformers is not installed")

from tests.helpers import hf_runs  # noqa: E402
from zoo import hf  # noqa: E402
from zoo.errors import ConversionError  # noqa: E402
from zoo.hf.convert import export_converter  # noqa: E402
from zoo.infer.sample import generate  # noqa: E402
from zoo.training import runs as run_reader  # noqa: E402

V = 300
# initializer_range 0.2: routing far from uniform, so a wrong top-k, renormalisation or expert order shows.
SMALL = dict(vocab_size=V, hidden_size=40, num_hidden_layers=2, num_experts_per_tok=2, max_position_embeddings=64,
             rms_norm_eps=1e-6, bos_token_id=0, eos_token_id=1, initializer_range=0.2, router_aux_loss_coef=0.02,
             attn_implementation="eager")
# name -> (transformers class prefix, config fields beside SMALL, the zoo fields they convert to, an expert's key)
MODELS = {
    "mixtral": ("Mixtral", dict(intermediate_size=28, num_attention_heads=4, num_key_value_heads=2,
                                num_local_experts=4),
                dict(num_experts=4, experts_per_token=2, moe_norm_topk=True, d_ff=28, num_kv_heads=2, qk_norm=False),
                "model.layers.1.block_sparse_moe.experts.3.w2.weight"),
    "qwen3_moe": ("Qwen3Moe", dict(intermediate_size=56, moe_intermediate_size=28, num_attention_heads=3,
                                   num_key_value_heads=1, head_dim=24, num_experts=4, norm_topk_prob=False),
                  dict(num_experts=4, experts_per_token=2, moe_norm_topk=False, d_ff=28, num_kv_heads=1, d_kv=24,
                       qk_norm=True),
                  "model.layers.1.mlp.experts.3.down_proj.weight"),
}
IDS = np.random.default_rng(0).integers(0, V, (2, 12))
one_torch_thread = hf_runs.one_torch_thread  # autouse: torch on one thread
edited = hf_runs.edited
hf_logits = hf_runs.hf_logits


@pytest.fixture(scope="module")
def hf_dirs(tmp_path_factory):
    """name -> (checkpoint directory, its transformers model); norm weights perturbed off 1."""
    out = {}
    for name, (prefix, fields, _, _) in MODELS.items():
        torch.manual_seed(0)
        model = getattr(transformers, f"{prefix}ForCausalLM")(
            getattr(transformers, f"{prefix}Config")(**SMALL, **fields)).eval()
        with torch.no_grad():
            for n, p in model.named_parameters():
                if "norm" in n:  # ones at init: a swapped norm would not show
                    p.add_(0.3 * torch.randn_like(p))
                if n.endswith("mlp.gate.weight"):  # Qwen3-MoE's router starts at zeros: uniform, every choice a tie
                    p.normal_(0.0, 0.2)
        d = tmp_path_factory.mktemp(name)
        model.save_pretrained(d)
        out[name] = (str(d), model)
    return out


@pytest.fixture(scope="module")
def runs(hf_dirs, tmp_path_factory):
    return hf_runs.convert_all(hf_dirs, tmp_path_factory)


@pytest.mark.parametrize("name", list(MODELS))
def test_logits_and_kv_cached_greedy_decoding_equal_transformers(hf_dirs, runs, name):
    run_dir, report = runs[name]
    assert report["unused"] == []
    zmodel, params, _, cfg = run_reader.load_run(run_dir)
    assert {k: getattr(cfg.model, k) for k in MODELS[name][2]} == MODELS[name][2]
    assert cfg.model.router_aux_loss_coef == 0.02
    mlp = params["h_1"]["mlp"]
    assert (mlp["router"].shape, mlp["gate"].shape, mlp["proj"].shape) == ((40, 4), (4, 40, 28), (4, 28, 40))
    ours = np.asarray(zmodel.apply({"params": params}, jnp.asarray(IDS)))
    diff = np.abs(ours - hf_logits(hf_dirs[name][1], IDS)).max()
    print(f"{name}: max abs logit diff {diff:.2e}")
    assert diff <= 1e-4
    prompt = [5, 17, 42, 8]
    with torch.no_grad():
        theirs = hf_dirs[name][1].generate(torch.tensor([prompt]), max_new_tokens=8, do_sample=False,
                                           pad_token_id=1, eos_token_id=None)[0, len(prompt):].tolist()
    assert generate(zmodel, params, prompt, 8, temperature=0.0)[0] == theirs


@pytest.mark.parametrize("name", list(MODELS))
def test_export_writes_per_expert_keys_loads_back_and_converts_back_identically(hf_dirs, runs, name, tmp_path):
    run_dir, report = runs[name]
    src, model = hf_dirs[name]
    hf.to_hf(run_dir, str(tmp_path / "out"), verbose=False)
    hf_cfg = json.load(open(tmp_path / "out" / "config.json"))
    assert hf_cfg["model_type"] == name and hf_cfg["num_experts_per_tok"] == 2
    from safetensors import safe_open
    key = MODELS[name][3]
    with safe_open(str(tmp_path / "out" / "model.safetensors"), "np") as f, \
            safe_open(os.path.join(src, "model.safetensors"), "np") as g:
        assert set(f.keys()) == set(g.keys())  # one tensor per expert and Linear, as transformers saves them
        np.testing.assert_array_equal(f.get_tensor(key), g.get_tensor(key))
    exported = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path / "out")).eval()
    assert type(exported) is type(model)
    np.testing.assert_allclose(hf_logits(exported, IDS), hf_logits(model, IDS), atol=1e-5)
    again = hf.from_hf(str(tmp_path / "out"), str(tmp_path / "again"), verbose=False)
    assert again["unused"] == [] and again["config"].model == report["config"].model
    assert jax.tree.structure(again["params"]) == jax.tree.structure(report["params"])
    for x, y in zip(jax.tree.leaves(again["params"]), jax.tree.leaves(report["params"])):
        np.testing.assert_array_equal(x, y)


def test_export_picks_the_architecture_by_qk_norms_and_refuses_what_none_holds(runs):
    mixtral, qwen = (runs[n][1]["config"].model for n in ("mixtral", "qwen3_moe"))
    assert export_converter(mixtral).ARCHITECTURES[0] == "MixtralForCausalLM"
    assert export_converter(qwen).ARCHITECTURES[0] == "Qwen3MoeForCausalLM"
    assert export_converter(dataclasses.replace(mixtral, num_experts=0)).ARCHITECTURES[0] == "LlamaForCausalLM"
    assert export_converter(dataclasses.replace(qwen, num_experts=0)).ARCHITECTURES[0] == "Qwen3ForCausalLM"
    for bad in (dict(moe_norm_topk=False), dict(qkv_bias=True), dict(sliding_window=8, qk_norm=True)):
        with pytest.raises(ConversionError, match=r"no Hugging Face equivalent; .* or as Mixtral: positions=rope, "
                                                  r"norm=rmsnorm, mlp=swiglu, no biases, qk_norm off, num_experts > 0"
                           ) as e:
            export_converter(dataclasses.replace(mixtral, **bad))
        assert "\n" not in str(e.value)


@pytest.mark.parametrize("fields,message", [
    (dict(decoder_sparse_step=2), r"^Qwen3-MoE with dense MLP layers \(decoder_sparse_step=2, mlp_only_layers=\[\]\) "
                                  r"is not supported; supported: experts in every layer"),
    (dict(mlp_only_layers=[1]), r"^Qwen3-MoE with dense MLP layers \(decoder_sparse_step=1, mlp_only_layers=\[1\]\)")])
def test_qwen3_moe_dense_layers_are_refused_in_one_line(hf_dirs, tmp_path, fields, message):
    bad = edited(hf_dirs["qwen3_moe"][0], tmp_path / "bad", **fields)
    with pytest.raises(ConversionError, match=message) as e:
        hf.from_hf(bad, str(tmp_path / "run"), verbose=False)
    assert "\n" not in str(e.value)
