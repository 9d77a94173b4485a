"""DistilBERT from and to Hugging Face, as options of zoo's BERT (no token types, its own key names, a
ReLU pre_classifier head): MLM and classifier logits match transformers under padding; round trips are
exact and export as DistilBERT; unsupported variants are refused in one line."""

import dataclasses
import json
import os
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="torch is not installed: HF parity tests need transformers (PyTorch)")
transformers = pytest.importorskip("transformers", reason="transformers is not installed")

from zoo import hf  # noqa: E402
from zoo.errors import ConversionError  # noqa: E402
from zoo.hf import convert  # noqa: E402

V = 101
HEADS = {"DistilBertForMaskedLM": "bert_mlm", "DistilBertForSequenceClassification": "bert_cls"}


@pytest.fixture(scope="module")
def hf_dirs(tmp_path_factory):
    """Both heads over a small random config of odd shapes (3 heads of width 16), every weight perturbed."""
    torch.set_num_threads(1)
    cfg = transformers.DistilBertConfig(vocab_size=V, dim=48, n_layers=2, n_heads=3, hidden_dim=80,
                                        max_position_embeddings=24, num_labels=3)
    out = {}
    for i, arch in enumerate(HEADS):
        torch.manual_seed(i)
        model = getattr(transformers, arch)(cfg).eval()
        with torch.no_grad():
            for p in model.parameters():
                p.add_(0.05 * torch.randn_like(p))
        d = tmp_path_factory.mktemp(arch)
        model.save_pretrained(d)
        out[arch] = (str(d), model)
    return out


def padded_inputs(T=16, seed=0):
    rng = np.random.default_rng(seed)
    valid = np.arange(T)[None] < np.array([[T], [11], [5]])
    return np.where(valid, rng.integers(1, V, valid.shape), 0).astype(np.int32), valid


def hf_outputs(model, ids, valid):
    with torch.no_grad():
        return model(input_ids=torch.tensor(ids, dtype=torch.long), attention_mask=torch.tensor(valid, dtype=torch.long))


def zoo_outputs(model, params, ids, valid):
    return np.asarray(model.apply({"params": params}, jnp.asarray(ids), jnp.zeros_like(ids), jnp.asarray(valid)))


@pytest.mark.parametrize("arch", list(HEADS))
def test_outputs_match_transformers_under_padding(hf_dirs, tmp_path, arch):
    src, model = hf_dirs[arch]
    out = hf.from_hf(src, str(tmp_path / "run"), verbose=False)
    cfg = out["config"]
    assert out["unused"] == [] and cfg.task == HEADS[arch]
    assert (cfg.model.type_vocab_size, cfg.model.classifier, cfg.model.ln_eps) == (0, "distilbert", 1e-12)
    zmodel, params, _, _ = hf.from_pretrained(str(tmp_path / "run"))
    assert "segment" not in params["bert"]["embed"]
    ids, valid = padded_inputs()
    ours, theirs = zoo_outputs(zmodel, params, ids, valid), hf_outputs(model, ids, valid).logits.numpy()
    if arch == "DistilBertForMaskedLM":
        assert np.abs(ours - theirs)[valid].max() <= 1e-4
    else:
        assert cfg.model.num_classes == 3 and cfg.data.label_names == "LABEL_0,LABEL_1,LABEL_2"
        assert np.abs(ours - theirs).max() <= 1e-4
        # BERT's tanh pooler in place of the ReLU pre_classifier gives other logits.
        tanh = type(zmodel)(dataclasses.replace(cfg.model, classifier="bert"))
        assert np.abs(zoo_outputs(tanh, params, ids, valid) - ours).max() > 1e-2


@pytest.mark.parametrize("arch", list(HEADS))
def test_round_trip_is_exact_and_export_loads_in_transformers(hf_dirs, tmp_path, arch):
    src, model = hf_dirs[arch]
    hf.from_hf(src, str(tmp_path / "run"), verbose=False)
    hf.to_hf(str(tmp_path / "run"), str(tmp_path / "out"), verbose=False)
    hf.from_hf(str(tmp_path / "out"), str(tmp_path / "again"), verbose=False)
    a = jax.device_get(hf.from_pretrained(str(tmp_path / "run"))[1])
    b = jax.device_get(hf.from_pretrained(str(tmp_path / "again"))[1])
    assert jax.tree.structure(a) == jax.tree.structure(b)
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
        np.testing.assert_array_equal(x, y)
    written = json.load(open(tmp_path / "out" / "config.json"))
    assert (written["architectures"], written["model_type"]) == ([arch], "distilbert")
    exported, info = getattr(transformers, arch).from_pretrained(str(tmp_path / "out"), output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    ids, valid = padded_inputs(seed=1)
    ours, theirs = hf_outputs(exported.eval(), ids, valid), hf_outputs(model, ids, valid)
    np.testing.assert_array_equal(ours.logits.numpy(), theirs.logits.numpy())


def test_variants_are_refused_in_one_line(hf_dirs, tmp_path):
    src = hf_dirs["DistilBertForMaskedLM"][0]
    base = json.load(open(os.path.join(src, "config.json")))
    for name, cfg, match in [
            ("relu", {**base, "activation": "relu"},
             r"^DistilBERT activation='relu' is not supported \(zoo BERT uses exact erf GELU, \"gelu\"\)$"),
            ("sinusoidal", {**base, "sinusoidal_pos_embds": True},
             r"^DistilBERT sinusoidal_pos_embds=true is not supported \(zoo BERT learns absolute positions\)$"),
            ("bare", {**base, "architectures": ["DistilBertModel"]},
             r"^unsupported architecture DistilBertModel \(model_type='distilbert'\); supported: .*RobertaModel, .*"
             r"DistilBertForMaskedLM, DistilBertForSequenceClassification"),
            ("no_head", {k: v for k, v in base.items() if k != "architectures"}, None)]:
        (tmp_path / name).mkdir()
        (tmp_path / name / "config.json").write_text(json.dumps(cfg))
        if match is None:  # the bare encoder's weights alone, no architecture named
            from safetensors.numpy import load_file, save_file
            tensors = load_file(os.path.join(src, "model.safetensors"))
            save_file({k: v for k, v in tensors.items() if k.startswith("distilbert.")},
                      str(tmp_path / name / "model.safetensors"))
            match = r"^a DistilBERT checkpoint without an MLM or classification head \(DistilBertModel\) is not supported"
        else:
            shutil.copy(os.path.join(src, "model.safetensors"), tmp_path / name)
        with pytest.raises(ConversionError, match=match) as e:
            hf.from_hf(str(tmp_path / name), str(tmp_path / f"run_{name}"), verbose=False)
        assert "\n" not in str(e.value)
    run = str(tmp_path / "run")
    zcfg = hf.from_hf(src, run, verbose=False)["config"]
    assert convert.export_converter(zcfg.model).__name__ == "zoo.hf.distilbert"
    with pytest.raises(ConversionError, match=r"^the run uses model.pre_ln=False, model.ln_eps=1e-05; Hugging Face "
                                              r"DistilBERT is post-LN at ln_eps=1e-12$"):
        convert.export_converter(zcfg.model).config_to_hf(dataclasses.replace(zcfg.model, ln_eps=1e-5))
