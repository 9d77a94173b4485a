"""RoBERTa and XLM-R from and to Hugging Face, as options of zoo's BERT, beside the parity of their rows in
tests/hf/parity_table.py (MLM, classifier and bare-encoder outputs under right and left padding, round trips,
export as RoBERTa, in tests/hf/test_parity_encoders.py): positions numbered from pad_token_id + 1 over real tokens
are what matches; unsupported variants are refused in one line."""

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
from zoo.models.bert import BertConfig  # noqa: E402

V = 101
one_torch_thread = hf_runs.one_torch_thread  # autouse: torch on one thread


def test_positions_numbered_from_0_would_move_every_logit(hf_refs):
    """What the parity of the roberta rows rests on: positions from 0 (BERT's numbering) in place of RoBERTa's
    pad_token_id + 1 change every real position's logits, so the offset is what matches."""
    run, (ids, segments, valid) = hf_refs.converted("roberta_mlm"), hf_runs.encoder_inputs(ENCODERS["roberta_mlm"])
    params, inputs = run.params, (jnp.asarray(ids), jnp.asarray(segments), jnp.asarray(valid))
    ours = np.asarray(run.model.apply({"params": params}, *inputs))
    shifted = dataclasses.replace(run.config.model, position_offset=0, max_len=24)
    params0 = {**params, "bert": {**params["bert"], "embed": {**params["bert"]["embed"],
                                                              "position": params["bert"]["embed"]["position"][:24]}}}
    from_0 = np.asarray(type(run.model)(shifted).apply({"params": params0}, *inputs))
    assert np.abs(from_0 - ours).max(-1)[valid].min() > 1e-3


def test_variants_are_refused_in_one_line(hf_refs, tmp_path):
    src = hf_refs.directory("roberta_mlm")
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
