"""seq2seq data (zoo.tasks.seq2seq_data): the offline word-reversal pairs, per-batch padding, local
pairs with nested columns, bad input, truncation, and a converted checkpoint's framing."""

import numpy as np
import pytest

from conftest import replace
from tests.helpers.runs import write_jsonl
from zoo import tasks
from zoo.data.tokenizers import ByteTokenizer
from zoo.errors import ZooDataError
from zoo.tasks import seq2seq_data
from zoo.tasks.seq2seq import Seq2SeqTask

TOK = ByteTokenizer()
SP = seq2seq_data.framing(TOK)  # EOS 256 (the tokenizer's eot), BOS 257, PAD 258


def test_builtin_task_reverses_the_words_of_corpus_phrases(s2s_cfg):
    sources, targets = seq2seq_data.load_pairs(s2s_cfg.data, TOK)
    pairs = dict(zip(sources, targets))
    assert pairs["but not with"] == "with not but"
    assert all(len(s) <= 15 for s in sources) and len(sources) > 5000  # phrases that fit data.seq_len=16


def test_batches_are_padded_per_batch_and_a_pure_function_of_the_step(s2s_cfg):
    cfg = replace(s2s_cfg, data=dict(seq_len=32))
    data = tasks.build(cfg).make_data(cfg, 0, 1)
    b = data.train(5)
    again = Seq2SeqTask(cfg).make_data(cfg, 0, 1).train(5)
    assert all(np.array_equal(b[k], again[k]) for k in b)
    assert not np.array_equal(data.train(6)["src"], b["src"])
    S, T = b["src"].shape[1], b["tgt_out"].shape[1]
    src_len, tgt_len = b["src_valid"].sum(1), b["weights"].sum(1).astype(int)
    assert S in (16, 32) and S == seq_lens_bucket(src_len.max()) and T == seq_lens_bucket(tgt_len.max())
    np.testing.assert_array_equal(b["src_valid"], b["src"] != SP.pad)
    np.testing.assert_array_equal(b["tgt_in"][:, 0], SP.bos)  # decoder input = BOS + target shifted right
    np.testing.assert_array_equal(b["tgt_in"][:, 1:], b["tgt_out"][:, :-1])
    np.testing.assert_array_equal(b["weights"] > 0, b["tgt_out"] != SP.pad)
    np.testing.assert_array_equal(b["tgt_out"][np.arange(16), tgt_len - 1], SP.eos)  # targets end in EOS
    np.testing.assert_array_equal(tgt_len, src_len + 1)  # word reversal keeps the length
    # Two processes' rows, stacked, are the one-process batch (same padded shape on both).
    halves = [Seq2SeqTask(cfg).make_data(cfg, i, 2).train(5) for i in range(2)]
    for k in b:
        np.testing.assert_array_equal(np.concatenate([h[k] for h in halves]), b[k])


def seq_lens_bucket(n):
    return max(8, 1 << (int(n) - 1).bit_length())


def test_local_pairs_with_nested_columns(s2s_cfg, tmp_path):
    rows = [{"translation": {"de": f"Hallo {i}", "en": f"Hello {i}"}} for i in range(40)]
    path = write_jsonl(tmp_path / "wmt.jsonl", rows)
    cfg = replace(s2s_cfg, data=dict(source=path, source_column="translation.de", target_column="translation.en"))
    sources, targets = seq2seq_data.load_pairs(cfg.data, TOK)
    assert sources[3] == "Hallo 3" and targets[3] == "Hello 3"


@pytest.mark.parametrize("field, value, fragment", [
    ("source_column", "src", "data.source_column='src' is not a column of"),
    ("target_column", "tgt", "data.target_column='tgt' is not a column of"),
    ("source_column", "translation.fr", "data.source_column='translation.fr': column 'translation' has no key 'fr'; "
                                        "keys: de, en"),
])
def test_a_missing_column_is_named(s2s_cfg, tmp_path, field, value, fragment):
    rows = [{"translation": {"de": "Hallo", "en": "Hello"}, "source": "a", "target": "b"}] * 4
    cfg = replace(s2s_cfg, data=dict(source=write_jsonl(tmp_path / "d.jsonl", rows), **{field: value}))
    with pytest.raises(ZooDataError) as e:
        seq2seq_data.load_pairs(cfg.data, TOK)
    assert fragment in str(e.value) and "\n" not in str(e.value)


def test_long_sequences_are_truncated_and_counted(s2s_cfg, tmp_path, capsys):
    rows = [{"source": "short", "target": "tiny"}] * 10 + [{"source": "x" * 30, "target": "y" * 30}]
    cfg = replace(s2s_cfg, data=dict(source=write_jsonl(tmp_path / "d.jsonl", rows), seq_len=8, val_fraction=0.5))
    train, val = seq2seq_data.split_pairs(cfg, TOK, SP)
    assert "truncated 1 sources and 1 targets (target + EOS) of 11 pairs to data.seq_len=8" in capsys.readouterr().out
    both = [train, val]
    long_tgt = [p.tgt.ids[p.tgt.offsets[i]:p.tgt.offsets[i + 1]] for p in both for i in range(len(p))
                if p.tgt.lengths[i] == 8]
    assert len(long_tgt) == 1 and SP.eos not in long_tgt[0]  # a cut target has no EOS
    assert max(p.src.lengths.max() for p in both if len(p)) == 8


def test_vocabulary_too_small_for_the_specials(s2s_cfg):
    cfg = replace(s2s_cfg, model=dict(vocab_size=258))
    with pytest.raises(ZooDataError, match=r"model.vocab_size=258 .* \(257\) \+ BOS \+ PAD = 259"):
        tasks.build(cfg).make_data(cfg, 0, 1)


def test_a_checkpoint_framing_frames_sources_targets_and_decoder_inputs(s2s_cfg):
    """BART's framing (seq2seq.json of a converted checkpoint): <s> text </s> sources, cut inside the
    text so that both specials stay; targets <s> text </s>; decoder input </s> <s> text; pad 1."""
    tok = ByteTokenizer()
    tok.seq2seq = {"decoder_start": 2, "eos": 2, "pad": 1, "src_prefix": [0], "src_suffix": [2], "tgt_prefix": [0],
                   "beam_style": "hf", "length_penalty": 1.0, "early_stopping": False}
    sp = seq2seq_data.framing(tok)
    assert (sp.bos, sp.vocab_needed, sp.beam_style) == (2, 3, "hf")
    pairs, n_src, n_tgt = seq2seq_data.encode_pairs(tok, sp, ["abc", "x" * 20], ["de", "y" * 20], seq_len=8)
    assert (n_src, n_tgt) == (1, 1)
    src = [pairs.src.ids[pairs.src.offsets[i]:pairs.src.offsets[i + 1]].tolist() for i in range(2)]
    assert src == [[0, 97, 98, 99, 2], [0, *[120] * 6, 2]]
    b = seq2seq_data.make_batch(pairs, np.arange(2), slice(None), sp, seq_len=8)
    np.testing.assert_array_equal(b["tgt_out"][0], [0, 100, 101, 2, 1, 1, 1, 1])
    np.testing.assert_array_equal(b["tgt_in"][0], [2, 0, 100, 101, 2, 1, 1, 1])
    np.testing.assert_array_equal(b["src"][0], [0, 97, 98, 99, 2, 1, 1, 1])
    assert 2 not in b["tgt_out"][1]  # a cut target has no EOS
    src_BS, valid_BS = seq2seq_data.encode_sources(tok, ["ab"], seq_len=8)
    np.testing.assert_array_equal(src_BS[0][valid_BS[0]], [0, 97, 98, 2])
    with pytest.raises(ZooDataError, match=r"input 'abcdefg' is 9 tokens, above the model's data.seq_len=8"):
        seq2seq_data.encode_sources(tok, ["abcdefg"], seq_len=8)
    tok.seq2seq = {**tok.seq2seq, "beam_style": "fairseq"}
    with pytest.raises(ZooDataError, match=r"seq2seq.json beam_style='fairseq'; choose one of gnmt, hf"):
        seq2seq_data.framing(tok)
