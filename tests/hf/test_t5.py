"""What only T5 has, beside the parity table's steps (tests/hf/test_parity_seq2seq.py: v1.0 and v1.1 logits under
padding, greedy decoding, export and round trip, on the references of tests/hf/parity_table.py): beam search equal
to `generate` under three settings, also with model rows past the tokenizer's ids; relative-position buckets,
SentencePiece ids and the "text </s>" framing equal transformers'; a converted T5 fine-tunes through the trainer and
translates as its export does in transformers; unsupported variants and missing keys are named."""

import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="torch is not installed: HF parity tests need transformers (PyTorch)")
transformers = pytest.importorskip("transformers", reason="transformers is not installed")

from tests.helpers.hf_runs import hf_refs_fixture  # noqa: F401,E402  (the session's references)
from tests.hf.parity_table import T5 as SMALL, t5_tokenizer  # noqa: E402
from zoo.infer import decoding  # noqa: E402
from zoo import hf  # noqa: E402
from zoo.nn import positions  # noqa: E402
from zoo.tasks import seq2seq_data  # noqa: E402
from zoo.tasks.seq2seq import Seq2SeqTask  # noqa: E402
from zoo.training import trainer  # noqa: E402
from zoo.cli import translate  # noqa: E402
from zoo.configuration import Config, DataConfig, OptimConfig, TrainConfig  # noqa: E402
from zoo.hf import t5  # noqa: E402
from zoo.errors import ConversionError  # noqa: E402
from tests.helpers.hf_runs import one_torch_thread  # noqa: F401,E402  (autouse fixture)

V, EXTRA = 256, 4  # model rows; the tokenizer has 250 pieces + 4 sentinels
V11 = dict(feed_forward_proj="gated-gelu", tie_word_embeddings=False)  # v1.1's fields (the table's t5_v1_1)
SENTENCES = ["The if statement is used for conditional execution.", "Classes are callable",
             "  spaces\tand\nnewlines  ", "x <extra_id_0> y"]


@pytest.fixture(scope="module")
def hf_tok(tmp_path_factory):
    """(directory, transformers' T5Tokenizer): the parity table's trained unigram, saved."""
    d = tmp_path_factory.mktemp("t5_tok")
    tok = t5_tokenizer()
    tok.save_pretrained(d)
    return str(d), tok


def padded_sources(lengths=(24, 15, 5), seed=0):
    """Sources as HF's tokenizer pads them: pad id 0 after the text."""
    rng = np.random.default_rng(seed)
    B, S = len(lengths), max(lengths)
    valid = np.arange(S)[None] < np.array(lengths)[:, None]
    return np.where(valid, rng.integers(3, V, (B, S)), 0).astype(np.int32), valid


def test_relative_position_buckets_equal_transformers():
    rel = torch.arange(-300, 301)[None, :] - torch.zeros(1, 1, dtype=torch.long)
    for bidirectional, buckets, distance in [(True, 32, 128), (False, 32, 128), (True, 8, 20), (False, 12, 40)]:
        theirs = transformers.models.t5.modeling_t5.T5Attention._relative_position_bucket(
            rel, bidirectional=bidirectional, num_buckets=buckets, max_distance=distance).numpy()
        ours = np.asarray(jax.jit(positions.relative_position_bucket, static_argnums=(1, 2, 3))(
            rel.numpy(), bidirectional, buckets, distance))
        np.testing.assert_array_equal(ours, theirs)
        # every bucket in use, the log-spaced ones too (bidirectional: offset +0 has no bucket of its own)
        assert len(np.unique(theirs)) == buckets - bidirectional


def hf_generate(model, src, valid, eos, **kw):
    """Generated ids per row, cut before the first EOS (transformers pads after it)."""
    with torch.no_grad():
        out = model.generate(input_ids=torch.tensor(src, dtype=torch.long), eos_token_id=eos,
                             attention_mask=torch.tensor(valid, dtype=torch.long), do_sample=False, **kw)
    rows = [r[1:] for r in out.tolist()]  # drop the decoder start
    return [r[:r.index(eos)] if eos in r else r for r in rows]


# (num_beams, length_penalty, early_stopping): greedy, transformers' default, and "never" with a
# short-favouring penalty (tests/hf/test_bart.py runs early_stopping True and a negative penalty).
SETTINGS = [(1, 1.0, False), (3, 1.0, False), (3, 0.5, "never")]


def eos_for_variety(raw_BL) -> int:
    """The token whose first emission by greedy decoding varies most across rows ("never" counts, and
    wins ties): taken as EOS, the random model stops at different steps per row, some rows not at all."""
    rows = np.asarray(raw_BL).tolist()
    outcome = lambda t: {r.index(t) if t in r else None for r in rows}
    return max(sorted({t for r in rows for t in r}), key=lambda t: (len(outcome(t)), None in outcome(t)))


def test_greedy_and_beam_search_equal_transformers_generate(hf_refs):
    src_dir, model = hf_refs.reference("t5_v1_1")
    zmodel, params, _, _ = hf.from_pretrained(src_dir)
    src, valid = padded_sources((12, 9, 5, 7), seed=4)
    eos = eos_for_variety(decoding.greedy(params, jnp.asarray(src), jnp.asarray(valid), model=zmodel, max_len=10,
                                          bos_id=0, eos_id=V, vocab_limit=V))  # eos_id V: never emitted
    lengths = set()
    for beam, alpha, early in SETTINGS:
        theirs = hf_generate(model, src, valid, eos, max_new_tokens=10, num_beams=beam, length_penalty=alpha,
                             early_stopping=early)
        ours = decoding.generate(zmodel, params, src, valid, max_len=10, bos_id=0, eos_id=eos, vocab_limit=V,
                                 beam=beam, length_penalty=alpha, style="hf", early_stopping=early)
        assert ours == theirs, (beam, alpha, early)
        lengths |= {len(r) for r in ours}
    assert len(lengths) >= 3 and 10 in lengths  # rows that stop at EOS at different steps, and rows cut at 10


def test_rows_past_the_tokenizer_count_in_the_scores_as_transformers_counts_them(hf_refs):
    """A model with more rows than its tokenizer has ids (t5-small: 32128 and 32100): beam scores are
    log-probabilities over every row, as transformers computes them, and only ids the tokenizer can write are
    chosen, as transformers' suppress_tokens does. Normalising over the tokenizer's ids alone changed which
    beams won."""
    src_dir, model = hf_refs.reference("t5_v1_1")
    zmodel, params, _, _ = hf.from_pretrained(src_dir)
    src, valid = padded_sources((12, 9, 5, 7), seed=4)
    limit = V // 2
    eos = eos_for_variety(decoding.greedy(params, jnp.asarray(src), jnp.asarray(valid), model=zmodel, max_len=10,
                                          bos_id=0, eos_id=V, vocab_limit=limit))
    for beam, alpha, early in SETTINGS:
        theirs = hf_generate(model, src, valid, eos, max_new_tokens=10, num_beams=beam, length_penalty=alpha,
                             early_stopping=early, suppress_tokens=list(range(limit, V)))
        ours = decoding.generate(zmodel, params, src, valid, max_len=10, bos_id=0, eos_id=eos, vocab_limit=limit,
                                 beam=beam, length_penalty=alpha, style="hf", early_stopping=early)
        assert ours == theirs, (beam, alpha, early)


def test_tokenizer_ids_and_framing_equal_transformers(hf_tok, hf_refs):
    from zoo.data.tokenizers import get_tokenizer
    tok_dir, theirs = hf_tok
    ours = get_tokenizer(hf_refs.converted("t5_v1_0").config.data.tokenizer)  # the converted run's copy + seq2seq.json
    assert type(ours).__name__ == "Pretrained" and (ours.n_vocab, ours.eot_token) == (250 + EXTRA, 1)
    sp = seq2seq_data.framing(ours)
    assert (sp.decoder_start, sp.eos, sp.pad, sp.beam_style) == (0, 1, 0, "hf")
    model = hf_refs.reference("t5_v1_0")[1]
    for text in SENTENCES:
        ids = ours.encode(text)
        assert ids == theirs(text, add_special_tokens=False).input_ids
        assert sp.source(ids, 64) == theirs(text).input_ids  # "text </s>"
        labels = theirs(text_target=text).input_ids
        assert sp.target(ids) == labels
        shifted = model.prepare_decoder_input_ids_from_labels(torch.tensor([labels]))[0].tolist()
        assert [sp.decoder_start, *sp.target(ids)[:-1]] == shifted
        assert ours.decode(ids) == theirs.decode(ids, skip_special_tokens=True)
    assert ours.decode(ours.encode(SENTENCES[0])) == SENTENCES[0]


def test_spiece_model_alone_gives_transformers_ids(tmp_path):
    spm = pytest.importorskip("sentencepiece", reason="sentencepiece is not installed: it trains the test's "
                                                      "spiece.model (zoo reads the file without it)")
    pytest.importorskip("google.protobuf", reason="protobuf is not installed: transformers needs it to read "
                                                  "spiece.model")
    from pydoc_data.topics import topics
    from zoo.data.tokenizers import get_tokenizer
    lines = "\n".join(list(topics.values())[:40]).splitlines()
    spm.SentencePieceTrainer.train(sentence_iterator=iter(lines), model_prefix=str(tmp_path / "spiece"),
                                   vocab_size=300, model_type="unigram", pad_id=0, eos_id=1, unk_id=2, bos_id=-1,
                                   character_coverage=1.0, minloglevel=2)
    os.remove(tmp_path / "spiece.vocab")
    ours, theirs = get_tokenizer(str(tmp_path)), transformers.T5Tokenizer.from_pretrained(str(tmp_path))
    assert type(ours).__name__ == "Pretrained" and ours.n_vocab == len(theirs) == 400  # 300 pieces + 100 sentinels
    for text in [*SENTENCES, "naïve café — ünïcödé", topics["if"][:400]]:
        assert ours.encode(text) + [1] == theirs(text).input_ids
        assert ours.decode(ours.encode(text)) == theirs.decode(theirs(text).input_ids, skip_special_tokens=True)


def word_pairs(path, n=32):
    """A local jsonl of n (phrase, its words reversed) pairs: a seq2seq source that tokenizes in no time."""
    words = "the class object is created by calling its type with arguments and returns a new instance".split()
    rng = np.random.default_rng(0)
    with open(path, "w") as f:
        for _ in range(n):
            phrase = " ".join(rng.choice(words, rng.integers(3, 6)))
            f.write(json.dumps({"source": phrase, "target": " ".join(phrase.split()[::-1])}) + "\n")
    return str(path)


def test_converted_t5_fine_tunes_and_translates_as_transformers(hf_tok, tmp_path, capsys):
    """init_from a converted v1.1 checkpoint (1+1 layers: the trainer compiles it fast): batches framed as
    T5 frames them, a training step moves the weights, and zoo.translate of the fine-tuned run equals
    transformers' generate of its export."""
    torch.manual_seed(5)
    src = tmp_path / "hf"
    transformers.T5ForConditionalGeneration(transformers.T5Config(**{**SMALL, "num_layers": 1}, **V11)
                                            ).save_pretrained(src)
    hf_tok[1].save_pretrained(src)
    conv = hf.from_hf(str(src), str(tmp_path / "run"), verbose=False)
    cfg = Config(task="seq2seq", model=conv["config"].model, init_from=str(tmp_path / "run"),
                 data=DataConfig(source=word_pairs(tmp_path / "pairs.jsonl"), tokenizer=conv["config"].data.tokenizer,
                                 seq_len=16),
                 optim=OptimConfig(lr=1e-3, warmup=0), train=TrainConfig(steps=1, batch_size=8, log_every=1,
                                                                          eval_every=0, save_every=1))
    batch = Seq2SeqTask(cfg).make_data(cfg, 0, 1).train(0)
    ends = batch["src_valid"].sum(1) - 1
    assert (batch["src"][np.arange(8), ends] == 1).all() and (batch["src"][~batch["src_valid"]] == 0).all()
    assert (batch["tgt_in"][:, 0] == 0).all()  # decoder start = <pad>
    work = str(tmp_path / "tuned")
    out = trainer.train(cfg, work, progress=False, devices=jax.devices()[:1])
    path = ("decoder", "layers_0", "mlp", "gate", "kernel")
    start, tuned = conv["params"], out["state"].params
    for k in path:
        start, tuned = start[k], tuned[k]
    assert 0 < np.abs(np.asarray(tuned) - np.asarray(start)).max() <= 2e-3  # init_from carried them; one Adam step
    hf.to_hf(work, str(tmp_path / "out"), verbose=False)
    exported = transformers.T5ForConditionalGeneration.from_pretrained(str(tmp_path / "out")).eval()
    hf_tok = transformers.AutoTokenizer.from_pretrained(str(tmp_path / "out"))
    texts = ["Classes are callable", "the if statement is used for"]
    enc = hf_tok(texts, padding=True, return_tensors="pt")
    with torch.no_grad():
        gen = exported.generate(**enc, max_new_tokens=16, num_beams=2, do_sample=False)
    want = hf_tok.batch_decode(gen, skip_special_tokens=True)
    capsys.readouterr()  # the training run's own lines
    assert translate.main([work, *[a for t in texts for a in ("--text", t)], "--beam", "2"]) == 0
    assert capsys.readouterr().out.splitlines() == want


def test_unsupported_variants_and_missing_keys_are_named(hf_refs, tmp_path):
    src = hf_refs.directory("t5_v1_0")
    cfg = json.load(open(os.path.join(src, "config.json")))
    from safetensors.numpy import load_file, save_file
    tensors = load_file(os.path.join(src, "model.safetensors"))
    for name, change, match in [
            ("silu", {"feed_forward_proj": "gated-silu"},
             r"T5 feed_forward_proj='gated-silu' is not supported; supported: relu, gelu, gated-gelu"),
            ("missing", {}, r"missing key 'decoder.block.1.layer.1.EncDecAttention.k.weight'")]:
        (tmp_path / name).mkdir()
        (tmp_path / name / "config.json").write_text(json.dumps({**cfg, **change}))
        dropped = "decoder.block.1.layer.1.EncDecAttention.k.weight" if name == "missing" else None
        save_file({k: v for k, v in tensors.items() if k != dropped}, str(tmp_path / name / "model.safetensors"))
        with pytest.raises(ConversionError, match=match):
            hf.from_hf(str(tmp_path / name), str(tmp_path / f"run_{name}"), verbose=False)
    model_cfg = hf.from_pretrained(src)[3].model
    import dataclasses
    with pytest.raises(ConversionError, match=r"model.use_bias=True; Hugging Face T5 needs model.use_bias=False"):
        t5.config_to_hf(dataclasses.replace(model_cfg, use_bias=True))
