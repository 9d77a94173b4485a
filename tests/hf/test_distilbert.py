"""DistilBERT from and to Hugging Face, as options of zoo's BERT (no token types, its own key names, a ReLU
pre_classifier head), beside the parity of its rows in tests/hf/parity_table.py (MLM and classifier logits under
padding, round trips, export as DistilBERT, in tests/hf/test_parity_encoders.py): BERT's pooler would give other
logits; unsupported variants are refused in one line."""

import dataclasses
import json
import os
import shutil

import jax.numpy as jnp
import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="torch is not installed: HF parity tests need transformers (PyTorch)")
transformers = pytest.importorskip("transformers", reason="transformers is not installed")

from tests.helpers import hf_runs  # noqa: E402
from tests.helpers.hf_runs import hf_refs_fixture  # noqa: F401,E402  (the session's references)
from tests.hf.parity_table import ENCODERS  # noqa: E402
from zoo import hf  # noqa: E402
from zoo.errors import ConversionError  # noqa: E402
from zoo.hf import convert  # noqa: E402

one_torch_thread = hf_runs.one_torch_thread  # autouse: torch on one thread


def test_bert_tanh_pooler_in_place_of_the_relu_pre_classifier_gives_other_logits(hf_refs):
    """What the parity of the distilbert_cls row rests on: the head is DistilBERT's own."""
    run, (ids, segments, valid) = hf_refs.converted("distilbert_cls"), hf_runs.encoder_inputs(
        ENCODERS["distilbert_cls"])
    inputs = (jnp.asarray(ids), jnp.asarray(segments), jnp.asarray(valid))
    ours = np.asarray(run.model.apply({"params": run.params}, *inputs))
    tanh = type(run.model)(dataclasses.replace(run.config.model, classifier="bert"))
    assert np.abs(np.asarray(tanh.apply({"params": run.params}, *inputs)) - ours).max() > 1e-2


def test_variants_are_refused_in_one_line(hf_refs, tmp_path):
    src = hf_refs.directory("distilbert_mlm")
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
    zcfg = hf_refs.converted("distilbert_mlm").config
    assert convert.export_converter(zcfg.model).__name__ == "zoo.hf.distilbert"
    with pytest.raises(ConversionError, match=r"^the run uses model.pre_ln=False, model.ln_eps=1e-05; Hugging Face "
                                              r"DistilBERT is post-LN at ln_eps=1e-12$"):
        convert.export_converter(zcfg.model).config_to_hf(dataclasses.replace(zcfg.model, ln_eps=1e-5))
