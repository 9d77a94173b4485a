"""RoBERTa and XLM-R from and to Hugging Face, as options of zoo's BERT: MLM, classifier and bare-encoder
outputs match transformers under right and left padding (positions numbered from pad_token_id + 1 over
real tokens); round trips are exact and export as RoBERTa; unsupported variants are refused in one line."""

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
from zoo.models.bert import BertConfig  # noqa: E402

V = 101
# (transformers class, zoo task, pad_token_id): XLM-R with another pad id, so another position offset
HEADS = {"RobertaForMaskedLM": ("bert_mlm", 1), "RobertaForSequenceClassification": ("bert_cls", 1),
         "RobertaModel": ("bert_encoder", 1), "XLMRobertaForMaskedLM": ("bert_mlm", 3)}


@pytest.fixture(scope="module")
def hf_dirs(tmp_path_factory):
    """Each head over a small random config of odd shapes (3 heads of width 16), every weight perturbed."""
    torch.set_num_threads(1)
    out = {}
    for i, (arch, (_, pad)) in enumerate(HEADS.items()):
        config_cls = transformers.XLMRobertaConfig if arch.startswith("XLM") else transformers.RobertaConfig
        cfg = config_cls(vocab_size=V, hidden_size=48, num_hidden_layers=2, num_attention_heads=3, intermediate_size=80,
                         max_position_embeddings=24 + pad + 1, type_vocab_size=1, layer_norm_eps=1e-5, num_labels=3,
                         pad_token_id=pad, bos_token_id=0, eos_token_id=2)
        torch.manual_seed(i)
        model = getattr(transformers, arch)(cfg).eval()
        with torch.no_grad():
            for p in model.parameters():
                p.add_(0.05 * torch.randn_like(p))
        d = tmp_path_factory.mktemp(arch)
        model.save_pretrained(d)
        out[arch] = (str(d), model)
    return out


def padded_inputs(pad, T=16, seed=0):
    """Rows of T, 11 and 5 real tokens padded on the right, and one of 9 padded on the left."""
    rng = np.random.default_rng(seed)
    valid = np.stack([np.arange(T) < n for n in (T, 11, 5)] + [np.arange(T) >= T - 9])
    ids = rng.integers(pad + 1, V, valid.shape)  # no real token is the pad id (transformers numbers by it)
    return np.where(valid, ids, pad).astype(np.int32), valid


def hf_outputs(model, ids, valid):
    with torch.no_grad():
        return model(input_ids=torch.tensor(ids, dtype=torch.long), attention_mask=torch.tensor(valid, dtype=torch.long))


def zoo_outputs(model, params, ids, valid):
    return jax.tree.map(np.asarray, model.apply({"params": params}, jnp.asarray(ids), jnp.zeros_like(ids),
                                                jnp.asarray(valid)))


@pytest.mark.parametrize("arch", list(HEADS))
def test_outputs_match_transformers_under_padding(hf_dirs, tmp_path, arch):
    (src, model), (task, pad) = hf_dirs[arch], HEADS[arch]
    out = hf.from_hf(src, str(tmp_path / "run"), verbose=False)
    cfg = out["config"]
    assert out["unused"] == [] and cfg.task == task
    assert (cfg.model.position_offset, cfg.model.max_len, cfg.model.classifier) == (pad + 1, 24, "roberta")
    zmodel, params, _, _ = hf.from_pretrained(str(tmp_path / "run"))
    assert params["bert"]["embed"]["position"].shape == (24 + pad + 1, 48)
    ids, valid = padded_inputs(pad)
    ours, theirs = zoo_outputs(zmodel, params, ids, valid), hf_outputs(model, ids, valid)
    if task == "bert_encoder":
        x_BTD, pooled_BD = ours
        assert np.abs(x_BTD - theirs.last_hidden_state.numpy())[valid].max() <= 1e-4
        assert np.abs(pooled_BD - theirs.pooler_output.numpy()).max() <= 1e-4  # row 3's <s> is left-padded
    elif task == "bert_mlm":
        assert np.abs(ours - theirs.logits.numpy())[valid].max() <= 1e-4
        # Positions from 0 (BERT's numbering) would change every position's logits: the offset is what matches.
        shifted = dataclasses.replace(cfg.model, position_offset=0, max_len=24)
        params0 = {**params, "bert": {**params["bert"], "embed": {**params["bert"]["embed"],
                                                                  "position": params["bert"]["embed"]["position"][:24]}}}
        assert np.abs(zoo_outputs(type(zmodel)(shifted), params0, ids, valid) - ours).max(-1)[valid].min() > 1e-3
    else:
        assert cfg.model.num_classes == 3 and cfg.data.label_names == "LABEL_0,LABEL_1,LABEL_2"
        assert np.abs(ours - theirs.logits.numpy()).max() <= 1e-4


@pytest.mark.parametrize("arch", list(HEADS))
def test_round_trip_is_exact_and_export_loads_in_transformers(hf_dirs, tmp_path, arch):
    (src, model), pad = hf_dirs[arch], HEADS[arch][1]
    hf.from_hf(src, str(tmp_path / "run"), verbose=False)
    hf.to_hf(str(tmp_path / "run"), str(tmp_path / "out"), verbose=False)
    hf.from_hf(str(tmp_path / "out"), str(tmp_path / "again"), verbose=False)
    a = jax.device_get(hf.from_pretrained(str(tmp_path / "run"))[1])
    b = jax.device_get(hf.from_pretrained(str(tmp_path / "again"))[1])
    assert jax.tree.structure(a) == jax.tree.structure(b)
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
        np.testing.assert_array_equal(x, y)
    exported_arch = arch.removeprefix("XLM")  # XLM-R exports as RoBERTa: the same architecture
    written = json.load(open(tmp_path / "out" / "config.json"))
    assert (written["architectures"], written["model_type"], written["pad_token_id"]) == ([exported_arch], "roberta", pad)
    exported, info = getattr(transformers, exported_arch).from_pretrained(str(tmp_path / "out"),
                                                                          output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    ids, valid = padded_inputs(pad, seed=1)
    ours, theirs = hf_outputs(exported.eval(), ids, valid), hf_outputs(model, ids, valid)
    np.testing.assert_array_equal(ours[0].numpy(), theirs[0].numpy())


def test_variants_are_refused_in_one_line(hf_dirs, tmp_path):
    src = hf_dirs["RobertaForMaskedLM"][0]
    base = json.load(open(os.path.join(src, "config.json")))
    for name, cfg, match in [
            ("relative", {**base, "position_embedding_type": "relative_key"},
             r"^RoBERTa position_embedding_type='relative_key' is not supported \(zoo BERT learns absolute positions\)$"),
            ("act", {**base, "hidden_act": "gelu_new"}, r"^RoBERTa hidden_act='gelu_new' is not supported"),
            ("decoder", {**base, "is_decoder": True}, r"^RoBERTa as a decoder .* is not supported$"),
            ("qa", {**base, "architectures": ["RobertaForQuestionAnswering"]},
             r"^unsupported architecture RobertaForQuestionAnswering \(model_type='roberta'\); supported: .*"
             r"RobertaModel, RobertaForMaskedLM, RobertaForSequenceClassification, RobertaForTokenClassification, "
             r"XLMRobertaModel, .*DistilBert")]:
        (tmp_path / name).mkdir()
        (tmp_path / name / "config.json").write_text(json.dumps(cfg))
        shutil.copy(os.path.join(src, "model.safetensors"), tmp_path / name)
        with pytest.raises(ConversionError, match=match) as e:
            hf.from_hf(str(tmp_path / name), str(tmp_path / f"run_{name}"), verbose=False)
        assert "\n" not in str(e.value)
    # RoBERTa's positions under BERT's pooler head: no Hugging Face class holds both.
    mixed = BertConfig(vocab_size=V, max_len=24, position_offset=2, type_vocab_size=1)
    with pytest.raises(ConversionError, match=r"^this bert model has no Hugging Face equivalent; it exports as BERT: "
                                              r"position_offset=0, .* or as RoBERTa: position_offset > 0, .*"
                                              r"classifier=roberta or as DistilBERT: type_vocab_size=0"):
        convert.export_converter(mixed)
    assert convert.export_converter(dataclasses.replace(mixed, classifier="roberta")).__name__ == "zoo.hf.roberta"
