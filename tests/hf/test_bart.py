"""What only BART has, beside the parity table's steps (tests/hf/test_parity_seq2seq.py: tied with a non-zero
final_logits_bias and untied, logits under padding, greedy decoding, export and round trip, on the references of
tests/hf/parity_table.py): an all-zero final_logits_bias is dropped and written back; beam search equals `generate`
under BART's settings; byte-level BPE ids and the "<s> text </s>" framing equal transformers'; a converted run
batches and translates with BART's own ids; unsupported variants are named."""

import json
import os

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="torch is not installed: HF parity tests need transformers (PyTorch)")
transformers = pytest.importorskip("transformers", reason="transformers is not installed")

from tests.helpers.hf_runs import hf_refs_fixture  # noqa: F401,E402  (the session's references)
from tests.hf.parity_table import bart_bpe, bart_tokenizer  # noqa: E402
from zoo.infer import decoding  # noqa: E402
from zoo import hf  # noqa: E402
from zoo.tasks import seq2seq_data  # noqa: E402
from zoo.tasks.seq2seq import Seq2SeqTask  # noqa: E402
from zoo.cli import translate  # noqa: E402
from zoo.configuration import Config, DataConfig  # noqa: E402
from zoo.data.tokenizers import get_tokenizer  # noqa: E402
from zoo.hf import bart  # noqa: E402
from zoo.errors import ConversionError  # noqa: E402
from tests.helpers.hf_runs import one_torch_thread  # noqa: F401,E402  (autouse fixture)

V = 300  # the trained byte-level BPE: 5 specials, 256 bytes, 39 merges
SENTENCES = ["The if statement is used for conditional execution.", "Classes are callable",
             "  spaces\tand\nnewlines  ", "Unicode: naïve café — ünïcödé 😀"]


@pytest.fixture(scope="module")
def bpe_dir(tmp_path_factory):
    """vocab.json + merges.txt of the parity table's byte-level BPE (<s>=0 <pad>=1 </s>=2 <unk>=3)."""
    return bart_bpe(tmp_path_factory.mktemp("bpe"))


@pytest.fixture(scope="module")
def hf_tok(bpe_dir):
    return bart_tokenizer(bpe_dir)


def padded_sources(lengths=(20, 13, 5), seed=0):
    """Sources as BartTokenizer pads them: <s> text </s>, then <pad> (1)."""
    rng = np.random.default_rng(seed)
    B, S = len(lengths), max(lengths)
    src = np.full((B, S), 1, np.int32)
    for b, n in enumerate(lengths):
        src[b, :n] = [0, *rng.integers(5, V, n - 2), 2]
    return src, src != 1


def test_all_zero_final_logits_bias_is_dropped_and_written_back(hf_refs):
    src, run = hf_refs.directory("bart_untied"), hf_refs.converted("bart_untied")  # transformers saved a zero bias
    from safetensors.numpy import load_file
    assert not load_file(os.path.join(src, "model.safetensors"))["final_logits_bias"].any()
    cfg = run.config.model
    assert not cfg.logits_bias and "logits_bias" not in run.params
    assert not bart.params_to_hf(run.params, cfg)["final_logits_bias"].any()


# transformers' early_stopping True with a long-favouring penalty, and its default rule with a negative
# one (tests/hf/test_t5.py runs the default settings and "never").
SETTINGS = [(1, 1.0, False), (3, 2.0, True), (3, -1.0, False)]


def test_greedy_and_beam_search_equal_transformers_generate(hf_refs):
    from test_t5 import eos_for_variety
    src_dir, model = hf_refs.reference("bart_tied")
    zmodel, params, _, _ = hf.from_pretrained(src_dir)
    src, valid = padded_sources((12, 9, 5, 7), seed=4)
    eos = eos_for_variety(decoding.greedy(params, src, valid, model=zmodel, max_len=10, bos_id=2, eos_id=V,
                                          vocab_limit=V))
    lengths = set()
    for beam, alpha, early in SETTINGS:
        with torch.no_grad():
            out = model.generate(input_ids=torch.tensor(src, dtype=torch.long), eos_token_id=eos,
                                 attention_mask=torch.tensor(valid, dtype=torch.long), max_new_tokens=10,
                                 num_beams=beam, length_penalty=alpha, early_stopping=early, do_sample=False)
        theirs = [r[1:r.index(eos, 1)] if eos in r[1:] else r[1:] for r in out.tolist()]
        ours = decoding.generate(zmodel, params, src, valid, max_len=10, bos_id=2, eos_id=eos, vocab_limit=V,
                                 beam=beam, length_penalty=alpha, style="hf", early_stopping=early)
        assert ours == theirs, (beam, alpha, early)
        lengths |= {len(r) for r in ours}
    assert len(lengths) >= 3 and 10 in lengths  # rows that stop at EOS at different steps, and rows cut at 10


@pytest.mark.parametrize("layout", ["tokenizer.json", "vocab.json + merges.txt"])
def test_tokenizer_ids_and_framing_equal_transformers(hf_tok, hf_refs, bpe_dir, layout):
    run = hf_refs.converted("bart_tied").config
    if layout == "tokenizer.json":  # what transformers 5 saves, copied into the converted run
        assert "vocab.json" not in os.listdir(run.data.tokenizer)
        ours = get_tokenizer(run.data.tokenizer)
    else:  # the hub's facebook/bart-* layout: tiktoken from vocab.json + merges.txt
        ours = get_tokenizer(bpe_dir)
        ours.seq2seq = get_tokenizer(run.data.tokenizer).seq2seq
    assert type(ours).__name__ == {"tokenizer.json": "Pretrained", "vocab.json + merges.txt": "RemappedBpe"}[layout]
    assert (ours.n_vocab, ours.eot_token) == (V, 2)
    sp = seq2seq_data.framing(ours)
    assert (sp.decoder_start, sp.eos, sp.pad, sp.src_prefix, sp.tgt_prefix) == (2, 2, 1, (0,), (0,))
    from transformers.models.bart.modeling_bart import shift_tokens_right
    for text in SENTENCES:
        ids = ours.encode(text)
        assert sp.source(ids, 64) == hf_tok(text).input_ids  # "<s> text </s>"
        labels = hf_tok(text_target=text).input_ids
        assert sp.target(ids) == labels
        assert [sp.decoder_start, *labels[:-1]] == shift_tokens_right(torch.tensor([labels]), 1, 2)[0].tolist()
        assert ours.decode(sp.target(ids)) == text == hf_tok.decode(labels, skip_special_tokens=True)


def test_converted_run_batches_and_translates_with_bart_ids(hf_refs, hf_tok, tmp_path, capsys):
    converted = hf_refs.converted("bart_tied")
    run, model_cfg, tokenizer = converted.run, converted.config.model, converted.config.data.tokenizer
    from test_t5 import word_pairs
    cfg = Config(task="seq2seq", model=model_cfg,
                 data=DataConfig(source=word_pairs(tmp_path / "pairs.jsonl"), tokenizer=tokenizer,
                                 seq_len=16))
    b = Seq2SeqTask(cfg).make_data(cfg, 0, 1).train(0)
    n = b["src_valid"].sum(1)
    assert (b["src"][:, 0] == 0).all() and (b["src"][np.arange(len(n)), n - 1] == 2).all()
    assert (b["src"][~b["src_valid"]] == 1).all()
    assert (b["tgt_in"][:, :2] == [2, 0]).all() and (b["tgt_out"][:, 0] == 0).all()  # </s> <s> ... -> <s> ...
    assert (b["tgt_out"][b["weights"] == 0] == 1).all()
    assert "truncated 22 sources" in capsys.readouterr().out  # cut sources kept <s> ... </s> (checked above)
    texts = ["Classes are callable", "the if statement"]
    enc = hf_tok(texts, padding=True, return_tensors="pt")
    with torch.no_grad():
        gen = hf_refs.reference("bart_tied")[1].generate(**enc, max_new_tokens=8, num_beams=1, do_sample=False)
    assert translate.main([run, *[a for t in texts for a in ("--text", t)], "--beam", "1", "--max-len", "8"]) == 0
    assert capsys.readouterr().out.splitlines() == hf_tok.batch_decode(gen, skip_special_tokens=True)


def test_unsupported_variants_are_named(hf_refs, tmp_path):
    src = hf_refs.directory("bart_tied")
    cfg = json.load(open(os.path.join(src, "config.json")))
    for name, change, match in [
            ("silu", {"activation_function": "silu"},
             r"BART activation_function='silu' is not supported; supported: gelu, relu"),
            ("ffn", {"decoder_ffn_dim": 128}, r"BART encoder_ffn_dim=64 differs from decoder_ffn_dim=128")]:
        (tmp_path / name).mkdir()
        (tmp_path / name / "config.json").write_text(json.dumps({**cfg, **change}))
        os.symlink(os.path.join(src, "model.safetensors"), tmp_path / name / "model.safetensors")
        with pytest.raises(ConversionError, match=match):
            hf.from_hf(str(tmp_path / name), str(tmp_path / f"run_{name}"), verbose=False)
    import dataclasses
    from zoo.models.encdec import ENCDEC_TINY
    with pytest.raises(ConversionError, match=r"model.positions='sinusoidal'; Hugging Face BART needs "
                                              r"model.positions='learned'"):
        bart.config_to_hf(dataclasses.replace(ENCDEC_TINY))
