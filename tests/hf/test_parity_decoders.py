"""Every architecture of tests/hf/parity_table.py against transformers, the same steps for each row: its
small random reference converts with nothing left unused into the zoo fields the row names; zoo's logits equal
transformers' to 1e-4 and its KV-cached greedy continuation equals `generate`'s token for token; `to-hf` writes
the architecture the row names, which transformers loads and computes the same, with the same tensor names as
transformers saves, and which converts back to identical params. A test id names the row:
`test_logits_equal_transformers[llama]`.
"""

import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="torch is not installed: HF parity tests need transformers (PyTorch)")
transformers = pytest.importorskip("transformers", reason="transformers is not installed")

from tests.helpers import hf_runs  # noqa: E402
from tests.helpers.hf_runs import hf_refs_fixture  # noqa: F401,E402  (the session's references)
from tests.hf.parity_table import DECODERS  # noqa: E402
from zoo import hf  # noqa: E402
from zoo.infer.sample import generate  # noqa: E402

one_torch_thread = hf_runs.one_torch_thread  # autouse: torch on one thread
hf_logits = hf_runs.hf_logits


def ids_of(name):
    row = DECODERS[name]
    return np.random.default_rng(0).integers(0, row.kwargs["vocab_size"], (2, row.length))


@pytest.mark.parametrize("name", list(DECODERS))
def test_logits_equal_transformers(hf_refs, name):
    row, run = DECODERS[name], hf_refs.converted(name)
    _, model = hf_refs.reference(name)
    hf_runs.check_conversion(row, run)
    ids = ids_of(name)
    ours = np.asarray(jax.jit(run.model.apply)({"params": run.params}, jnp.asarray(ids)))  # one program, not one per op
    theirs = hf_logits(model, ids)
    diff = np.abs(ours - theirs).max()
    print(f"{name}: max abs logit diff {diff:.2e}, max |logit| {np.abs(theirs).max():.2f}")
    assert diff <= 1e-4
    if row.logit_cap:  # the cap bites: some logits lie close to it
        assert 0.9 * row.logit_cap < np.abs(theirs).max() < row.logit_cap


@pytest.mark.parametrize("name", list(DECODERS))
def test_kv_cached_greedy_decoding_equals_transformers_generate(hf_refs, name):
    row, run = DECODERS[name], hf_refs.converted(name)
    _, model = hf_refs.reference(name)
    prompt = list(row.prompt)
    with torch.no_grad():
        theirs = model.generate(torch.tensor([prompt]), max_new_tokens=row.new_tokens, do_sample=False,
                                use_cache=True, pad_token_id=row.pad_id, eos_token_id=None)[0, len(prompt):].tolist()
    assert generate(run.model, run.params, prompt, row.new_tokens, temperature=0.0)[0] == theirs


@pytest.mark.parametrize("name", list(DECODERS))
def test_export_loads_as_its_architecture_and_converts_back_identically(hf_refs, name, tmp_path):
    row, run = DECODERS[name], hf_refs.converted(name)
    src, model = hf_refs.reference(name)
    arch = row.exports_as or row.model
    hf.to_hf(run.run, str(tmp_path / "out"), verbose=False)
    hf_cfg = json.load(open(tmp_path / "out" / "config.json"))
    assert hf_cfg["architectures"] == [arch]
    assert {k: hf_cfg[k] for k in row.export_json} == row.export_json
    exported = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path / "out")).eval()
    assert type(exported).__name__ == arch
    if arch == row.model:  # the same architecture: the tensors transformers saves (one per expert and Linear)
        assert exported.config.model_type == model.config.model_type
        from safetensors import safe_open
        with safe_open(str(tmp_path / "out" / "model.safetensors"), "np") as f, \
                safe_open(os.path.join(src, "model.safetensors"), "np") as g:
            assert set(f.keys()) == set(g.keys())
            for key in f.keys():
                np.testing.assert_array_equal(f.get_tensor(key), g.get_tensor(key))
    ids = ids_of(name)
    np.testing.assert_allclose(hf_logits(exported, ids), hf_logits(model, ids), atol=1e-5)
    hf_runs.check_converts_back(str(tmp_path / "out"), str(tmp_path / "again"), run)
