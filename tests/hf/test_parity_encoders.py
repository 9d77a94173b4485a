"""Every encoder of tests/hf/parity_table.py (BERT, RoBERTa, XLM-R, DistilBERT: bare, MLM, sequence and token
classifiers) against transformers, the same steps for each row: its small random reference converts with nothing
left unused into the row's task and zoo fields; zoo's outputs equal transformers' to 1e-4 at every real position
of padded rows (token types where the row has them, a left-padded row for RoBERTa's positions), and the labels
travel; `to-hf` writes the architecture the row names, which transformers loads without missing or unexpected
keys and computes exactly as the original, and which converts back to identical params. A test id names the row:
`test_outputs_equal_transformers_under_padding[roberta_mlm]`.
"""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="torch is not installed: HF parity tests need transformers (PyTorch)")
transformers = pytest.importorskip("transformers", reason="transformers is not installed")

from tests.helpers import hf_runs  # noqa: E402
from tests.helpers.hf_runs import hf_refs_fixture  # noqa: F401,E402  (the session's references)
from tests.hf.parity_table import ENCODERS, TAGS  # noqa: E402
from zoo import hf, tasks  # noqa: E402
from zoo.errors import ConfigError  # noqa: E402

one_torch_thread = hf_runs.one_torch_thread  # autouse: torch on one thread
padded_inputs, hf_outputs = hf_runs.encoder_inputs, hf_runs.encoder_outputs


@pytest.mark.parametrize("name", list(ENCODERS))
def test_outputs_equal_transformers_under_padding(hf_refs, name):
    row, run = ENCODERS[name], hf_refs.converted(name)
    _, model = hf_refs.reference(name)
    hf_runs.check_conversion(row, run)
    cfg = run.config
    ids, segments, valid = padded_inputs(row)
    apply = jax.jit(run.model.apply)  # one compile, not one per op
    ours = jax.tree.map(np.asarray, apply({"params": run.params}, jnp.asarray(ids), jnp.asarray(segments),
                                          jnp.asarray(valid)))
    theirs = hf_outputs(row, model, ids, segments, valid)
    if row.task == "bert_encoder":
        x_BTD, pooled_BD = ours
        assert np.abs(x_BTD - theirs.last_hidden_state.numpy())[valid].max() <= 1e-4  # real positions only
        assert np.abs(pooled_BD - theirs.pooler_output.numpy()).max() <= 1e-4  # a left-padded row's first too
        with pytest.raises(ConfigError, match="task=bert_encoder has no training objective"):
            tasks.build(cfg).make_data(cfg, 0, 1)
    elif row.task == "bert_cls":
        assert cfg.model.num_classes == 3 and cfg.data.label_names == "LABEL_0,LABEL_1,LABEL_2"
        assert np.abs(ours - theirs.logits.numpy()).max() <= 1e-4
    else:  # bert_mlm, bert_tokens: every real position's logits (padding's own outputs are nobody's)
        assert ours.shape == theirs.logits.shape
        assert np.abs(ours - theirs.logits.numpy())[valid].max() <= 1e-4
    if row.task == "bert_tokens":
        import zoo
        from zoo.api.encoder import class_names
        assert ours.shape == (3, 16, len(TAGS)) and cfg.model.num_classes == len(TAGS)
        assert cfg.data.label_names == ",".join(TAGS) and class_names(zoo.load(run.run)) == TAGS


@pytest.mark.parametrize("name", list(ENCODERS))
def test_export_loads_in_transformers_and_converts_back_identically(hf_refs, name, tmp_path):
    row, run = ENCODERS[name], hf_refs.converted(name)
    _, model = hf_refs.reference(name)
    arch = row.exports_as or row.model
    hf.to_hf(run.run, str(tmp_path / "out"), verbose=False)
    written = json.load(open(tmp_path / "out" / "config.json"))
    assert written["architectures"] == [arch]
    assert {k: written[k] for k in row.export_json} == row.export_json
    exported, info = getattr(transformers, arch).from_pretrained(str(tmp_path / "out"), output_loading_info=True,
                                                                 attn_implementation="eager")  # as the reference
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    if row.task == "bert_tokens":
        assert exported.config.id2label == dict(enumerate(TAGS))
    ids, segments, valid = padded_inputs(row, seed=1)
    ours, theirs = hf_outputs(row, exported.eval(), ids, segments, valid), hf_outputs(row, model, ids, segments, valid)
    np.testing.assert_array_equal(ours[0].numpy(), theirs[0].numpy())
    hf_runs.check_converts_back(str(tmp_path / "out"), str(tmp_path / "again"), run)
