"""mT5 from and to Hugging Face through the T5 converter: small random MT5ForConditionalGeneration models
(head width 24 over width 40 and 3 heads; tied as transformers 5 builds one, untied as the released
checkpoints are) convert to zoo runs whose logits under padding and KV-cached greedy decoding equal
transformers'; the decoder output is never scaled (transformers 5's mT5 does not, whatever
tie_word_embeddings says); a converted mT5 exports as T5 with the same logits and converts back to
identical params; an mT5 head zoo does not serve is refused naming what is supported.
"""

import json
import os

import jax
import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="torch is not installed: HF parity tests need transformers (PyTorch)")
transformers = pytest.importorskip("transformers", reason="transformers is not installed")

from tests.helpers import hf_runs  # noqa: E402
from zoo import hf  # noqa: E402
from zoo.errors import ConversionError  # noqa: E402
from zoo.infer import decoding  # noqa: E402

V = 200
SMALL = dict(vocab_size=V, d_model=40, d_kv=24, d_ff=56, num_layers=2, num_decoder_layers=2, num_heads=3,
             relative_attention_num_buckets=8, relative_attention_max_distance=20, dropout_rate=0.0,
             feed_forward_proj="gated-gelu", decoder_start_token_id=0, pad_token_id=0, eos_token_id=1)
VARIANTS = ("tied", "untied")
one_torch_thread = hf_runs.one_torch_thread  # autouse: torch on one thread


@pytest.fixture(scope="module")
def hf_dirs(tmp_path_factory):
    """name -> (checkpoint directory, its transformers model), every weight perturbed; "untied" gets an
    lm_head of its own (saved beside `shared`, so transformers 5 keeps it apart on load)."""
    out = {}
    for i, name in enumerate(VARIANTS):
        torch.manual_seed(i)
        model = transformers.MT5ForConditionalGeneration(transformers.MT5Config(**SMALL)).eval()
        with torch.no_grad():
            if name == "untied":
                model.lm_head.weight = torch.nn.Parameter(0.2 * torch.randn(V, 40))
            for p in model.parameters():
                p.add_(0.1 * torch.randn_like(p))
            model.shared.weight.mul_(0.2)  # T5's init std 1.0: logits of ~100, float32 rounding then near 1e-4
        d = tmp_path_factory.mktemp(name)
        model.save_pretrained(d)
        out[name] = (str(d), model)
    return out


@pytest.fixture(scope="module")
def runs(hf_dirs, tmp_path_factory):
    return hf_runs.convert_all(hf_dirs, tmp_path_factory)


def padded_sources(lengths=(11, 7, 4), seed=0):
    rng = np.random.default_rng(seed)
    valid = np.arange(max(lengths))[None] < np.array(lengths)[:, None]
    return np.where(valid, rng.integers(3, V, valid.shape), 0).astype(np.int32), valid


def hf_logits(model, src, valid, tgt):
    t = lambda x: torch.tensor(np.asarray(x), dtype=torch.long)  # noqa: E731
    with torch.no_grad():
        return model(input_ids=t(src), attention_mask=t(valid), decoder_input_ids=t(tgt)).logits.numpy()


@pytest.mark.parametrize("name", VARIANTS)
def test_logits_under_padding_and_greedy_decoding_equal_transformers(hf_dirs, runs, name):
    run, out = runs[name]
    m, model = out["config"].model, hf_dirs[name][1]
    assert json.load(open(os.path.join(hf_dirs[name][0], "config.json")))["model_type"] == "mt5"
    assert out["unused"] == [] and out["config"].task == "seq2seq"
    assert (m.activation, m.head_dim, m.output_scale, m.tie_output) == ("gated_gelu", 24, False, name == "tied")
    zmodel, params, _, _ = hf.from_pretrained(run)
    src, valid = padded_sources()
    tgt = np.random.default_rng(1).integers(0, V, (3, 9)).astype(np.int32)
    diff = np.abs(np.asarray(jax.jit(zmodel.apply)({"params": params}, src, valid, tgt))
                  - hf_logits(model, src, valid, tgt)).max()
    print(f"mT5 {name}: max abs logit diff {diff:.2e}")
    assert diff <= 1e-4
    ours = decoding.generate(zmodel, params, src, valid, max_len=8, bos_id=0, eos_id=V, vocab_limit=V, beam=1,
                             style="hf")  # eos_id V: never emitted, every row runs 8 steps
    with torch.no_grad():
        theirs = model.generate(input_ids=torch.tensor(src, dtype=torch.long), max_new_tokens=8, do_sample=False,
                                attention_mask=torch.tensor(valid, dtype=torch.long), eos_token_id=None)
    assert ours == [r[1:] for r in theirs.tolist()]  # transformers' rows start with the decoder start


def test_export_is_t5_with_equal_logits_and_converts_back_identically(hf_dirs, runs, tmp_path):
    for name in VARIANTS:
        run, out = runs[name]
        dst = tmp_path / name
        hf.to_hf(run, str(dst), verbose=False)
        assert json.load(open(dst / "config.json"))["model_type"] == "t5"
        exported = transformers.AutoModelForSeq2SeqLM.from_pretrained(str(dst)).eval()
        assert type(exported) is transformers.T5ForConditionalGeneration
        src, valid = padded_sources(seed=2)
        tgt = np.random.default_rng(3).integers(0, V, (3, 6)).astype(np.int32)
        np.testing.assert_allclose(hf_logits(exported, src, valid, tgt), hf_logits(hf_dirs[name][1], src, valid, tgt),
                                   atol=1e-5)
        again = hf.from_hf(str(dst), str(tmp_path / f"again_{name}"), verbose=False)
        assert again["unused"] == [] and again["config"].model == out["config"].model
        assert jax.tree.structure(again["params"]) == jax.tree.structure(out["params"])
        for x, y in zip(jax.tree.leaves(again["params"]), jax.tree.leaves(out["params"])):
            np.testing.assert_array_equal(x, y)


def test_an_mt5_head_zoo_does_not_serve_is_refused_naming_what_is(hf_dirs, tmp_path):
    src = hf_dirs["tied"][0]
    (tmp_path / "enc").mkdir()
    os.symlink(os.path.join(src, "model.safetensors"), tmp_path / "enc" / "model.safetensors")
    hf_cfg = {**json.load(open(os.path.join(src, "config.json"))), "architectures": ["MT5EncoderModel"]}
    (tmp_path / "enc" / "config.json").write_text(json.dumps(hf_cfg))
    with pytest.raises(ConversionError, match=r"^unsupported architecture MT5EncoderModel \(model_type='mt5'\); "
                                              r"supported: .*T5ForConditionalGeneration, MT5ForConditionalGeneration, "
                                              r"BartForConditionalGeneration") as e:
        hf.from_hf(str(tmp_path / "enc"), str(tmp_path / "run"), verbose=False)
    assert "\n" not in str(e.value) and str(e.value).count("MT5ForConditionalGeneration") == 1
