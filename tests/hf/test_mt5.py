"""What only mT5 has, beside the parity table's steps (tests/hf/test_parity_seq2seq.py: mT5 tied and untied, head
width 24 over width 40 and 3 heads, converted through the T5 converter with logits under padding and greedy decoding
equal to transformers', the decoder output never scaled, exported as T5 and converted back identically): an mT5 head
zoo does not serve is refused naming what is supported.
"""

import json
import os

import pytest

torch = pytest.importorskip("torch", reason="torch is not installed: HF parity tests need transformers (PyTorch)")
transformers = pytest.importorskip("transformers", reason="transformers is not installed")

from tests.helpers.hf_runs import hf_refs_fixture  # noqa: F401,E402  (the session's references)
from zoo import hf  # noqa: E402
from zoo.errors import ConversionError  # noqa: E402


def test_an_mt5_head_zoo_does_not_serve_is_refused_naming_what_is(hf_refs, tmp_path):
    src = hf_refs.directory("mt5_tied")
    hf_cfg = json.load(open(os.path.join(src, "config.json")))
    assert hf_cfg["model_type"] == "mt5"  # the reference is an mT5, not a T5 under another name
    (tmp_path / "enc").mkdir()
    os.symlink(os.path.join(src, "model.safetensors"), tmp_path / "enc" / "model.safetensors")
    (tmp_path / "enc" / "config.json").write_text(json.dumps({**hf_cfg, "architectures": ["MT5EncoderModel"]}))
    with pytest.raises(ConversionError, match=r"^unsupported architecture MT5EncoderModel \(model_type='mt5'\); "
                                              r"supported: .*T5ForConditionalGeneration, MT5ForConditionalGeneration, "
                                              r"BartForConditionalGeneration") as e:
        hf.from_hf(str(tmp_path / "enc"), str(tmp_path / "run"), verbose=False)
    assert "\n" not in str(e.value) and str(e.value).count("MT5ForConditionalGeneration") == 1
