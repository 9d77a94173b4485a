"""BertForTokenClassification, RobertaForTokenClassification and DistilBertForTokenClassification from and to
Hugging Face as zoo's bert_tokens (BertTokenClassifier: one `classifier` at every position, no pooler), beside the
parity of their rows in tests/hf/parity_table.py (logits at every real position under padding, id2label both ways
as the run's tag names, round trips, exports without missing or unexpected keys, in
tests/hf/test_parity_encoders.py): a checkpoint without `architectures` is read as a token classifier by its
weights."""

import json
import os

import pytest

torch = pytest.importorskip("torch", reason="torch is not installed: HF parity tests need transformers (PyTorch)")
transformers = pytest.importorskip("transformers", reason="transformers is not installed")

from tests.helpers import hf_runs  # noqa: E402
from tests.helpers.hf_runs import hf_refs_fixture  # noqa: F401,E402  (the session's references)
from zoo import hf  # noqa: E402

one_torch_thread = hf_runs.one_torch_thread  # autouse: torch on one thread


@pytest.mark.parametrize("name", ["bert_tokens", "roberta_tokens", "distilbert_tokens"])
def test_a_checkpoint_without_architectures_is_read_by_its_weights(hf_refs, tmp_path, name):
    src = hf_refs.directory(name)
    d = tmp_path / "bare"
    d.mkdir()
    config = json.load(open(os.path.join(src, "config.json")))
    del config["architectures"]
    (d / "config.json").write_text(json.dumps(config))
    os.symlink(os.path.join(src, "model.safetensors"), d / "model.safetensors")
    assert hf.from_hf(str(d), str(tmp_path / "run"), verbose=False)["config"].task == "bert_tokens"
