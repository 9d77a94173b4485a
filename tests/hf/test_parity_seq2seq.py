"""Every encoder-decoder of tests/hf/parity_table.py (T5 v1.0 and v1.1, mT5 tied and untied, BART tied and untied)
against transformers, the same steps for each row: its small random reference converts with nothing left unused
into the row's zoo fields; zoo's logits equal transformers' to 1e-4 under padding; zoo's greedy decoding equals
`generate`'s token for token on every row; `to-hf` writes the architecture the row names (mT5 as the T5 it equals)
with the row's special ids, which transformers loads without missing or unexpected keys and computes as the original
(to the bit where the architecture is the same), with the tokenizer beside it, and which converts back to identical
params. What only one architecture has (beam search settings, tokenizer framing, refusals, fine-tuning) stays in
tests/hf/test_t5.py, test_mt5.py and test_bart.py, reading the same references. A test id names the row:
`test_logits_equal_transformers_under_padding[bart_tied]`.
"""

import json
import os

import jax
import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="torch is not installed: HF parity tests need transformers (PyTorch)")
transformers = pytest.importorskip("transformers", reason="transformers is not installed")

from tests.helpers import hf_runs  # noqa: E402
from tests.helpers.hf_runs import hf_refs_fixture  # noqa: F401,E402  (the session's references)
from tests.hf.parity_table import SEQ2SEQ  # noqa: E402
from zoo import hf  # noqa: E402
from zoo.infer import decoding  # noqa: E402

one_torch_thread = hf_runs.one_torch_thread  # autouse: torch on one thread


def padded_sources(row, lengths=(20, 13, 5), seed=0):
    """(ids, valid) as the row's tokenizer pads sources: T5 "text" then pad 0, BART "<s> text </s>" then pad 1;
    no real token is a special."""
    V, rng = row.kwargs["vocab_size"], np.random.default_rng(seed)
    valid = np.arange(max(lengths))[None] < np.array(lengths)[:, None]
    if row.frame == "t5":
        return np.where(valid, rng.integers(3, V, valid.shape), 0).astype(np.int32), valid
    src = np.full(valid.shape, 1, np.int32)
    for b, n in enumerate(lengths):
        src[b, :n] = [0, *rng.integers(5, V, n - 2), 2]
    return src, valid


def targets(row, T=12, seed=1):
    """Decoder inputs of 3 rows: the decoder start, then random ids."""
    ids = np.random.default_rng(seed).integers(0, row.kwargs["vocab_size"], (3, T - 1))
    return np.concatenate([np.full((3, 1), row.start_id), ids], 1).astype(np.int32)


def hf_logits(model, src, valid, tgt):
    t = lambda x: torch.tensor(np.asarray(x), dtype=torch.long)  # noqa: E731
    with torch.no_grad():
        return model(input_ids=t(src), attention_mask=t(valid), decoder_input_ids=t(tgt)).logits.numpy()


def hf_greedy(model, src, valid, start: int, n: int, cached: bool = True) -> list[list[int]]:
    """transformers' greedy continuation of each row, n tokens: `generate`'s, or (cached=False) the arg-max of
    a full forward per step, for T5 v1.0's deeper decoder, whose cache transformers sizes by the encoder's depth."""
    t = lambda x: torch.tensor(np.asarray(x), dtype=torch.long)  # noqa: E731
    with torch.no_grad():
        if cached:
            out = model.generate(input_ids=t(src), attention_mask=t(valid), max_new_tokens=n, do_sample=False,
                                 num_beams=1, eos_token_id=None)
            return [r[1:] for r in out.tolist()]  # transformers' rows start with the decoder start
        tgt = t(np.full((len(src), 1), start))
        for _ in range(n):
            nxt = model(input_ids=t(src), attention_mask=t(valid), decoder_input_ids=tgt).logits[:, -1].argmax(-1)
            tgt = torch.cat([tgt, nxt[:, None]], 1)
        return tgt[:, 1:].tolist()


@pytest.mark.parametrize("name", list(SEQ2SEQ))
def test_logits_equal_transformers_under_padding(hf_refs, name):
    row, run = SEQ2SEQ[name], hf_refs.converted(name)
    _, model = hf_refs.reference(name)
    hf_runs.check_conversion(row, run)
    src, valid = padded_sources(row)
    tgt = targets(row)
    ours = np.asarray(jax.jit(run.model.apply)({"params": run.params}, src, valid, tgt))  # one program, not per op
    diff = np.abs(ours - hf_logits(model, src, valid, tgt)).max()
    print(f"{name}: max abs logit diff {diff:.2e}")
    assert diff <= 1e-4


@pytest.mark.parametrize("name", list(SEQ2SEQ))
def test_greedy_decoding_equals_transformers_generate(hf_refs, name):
    row, run = SEQ2SEQ[name], hf_refs.converted(name)
    _, model = hf_refs.reference(name)
    V = row.kwargs["vocab_size"]
    src, valid = padded_sources(row, (11, 7, 4), seed=4)
    ours = decoding.generate(run.model, run.params, src, valid, max_len=8, bos_id=row.start_id, eos_id=V,
                             vocab_limit=V, beam=1, style="hf")  # eos_id V: never emitted, every row runs 8 steps
    assert ours == hf_greedy(model, src, valid, row.start_id, 8, cached=name != "t5_v1_0")
    assert len({tuple(r) for r in ours}) > 1  # the rows' answers differ: the padding is not what decides them


@pytest.mark.parametrize("name", list(SEQ2SEQ))
def test_export_loads_as_its_architecture_and_converts_back_identically(hf_refs, name, tmp_path):
    row, run = SEQ2SEQ[name], hf_refs.converted(name)
    _, model = hf_refs.reference(name)
    arch = row.exports_as or row.model
    out = tmp_path / "out"
    hf.to_hf(run.run, str(out), verbose=False)
    written = json.load(open(out / "config.json"))
    assert written["architectures"] == [arch]
    assert {k: written[k] for k in row.export_json} == row.export_json
    ids = {k: written.get(k) for k in ("bos_token_id", "decoder_start_token_id", "eos_token_id", "pad_token_id")}
    assert all(i is None or 0 <= i < row.kwargs["vocab_size"] for i in ids.values()), ids  # each names a row
    exported, info = getattr(transformers, arch).from_pretrained(str(out), output_loading_info=True,
                                                               attn_implementation="eager")  # as the reference
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    src, valid = padded_sources(row, seed=2)
    tgt = targets(row, 7, seed=3)
    ours, theirs = hf_logits(exported.eval(), src, valid, tgt), hf_logits(model, src, valid, tgt)
    if arch == row.model:
        np.testing.assert_array_equal(ours, theirs)
    else:  # another class: the same math, perhaps in another order
        np.testing.assert_allclose(ours, theirs, atol=1e-5)
    if row.tokenizer:  # the tokenizer travels; zoo's own framing file does not
        assert "tokenizer.json" in os.listdir(out) and "seq2seq.json" not in os.listdir(out)
    hf_runs.check_converts_back(str(out), str(tmp_path / "again"), run)
