"""zoo.cli.translate on a model that learnt the offline task (conftest's learned_seq2seq): it reverses a
held-out phrase with beam 1 and 4, and bad input or a checkpoint of another family is refused."""

import jax
import pytest

from conftest import replace
from tests.helpers.runs import run
import zoo
from zoo.cli import translate
from zoo.training import runs
from zoo.data.tokenizers import ByteTokenizer
from zoo.tasks import seq2seq_data

TOK = ByteTokenizer()
SP = seq2seq_data.framing(TOK)


@pytest.mark.slow
def test_translate_cli_reverses_a_held_out_phrase(learned_seq2seq, capsys):
    cfg, _, workdir = learned_seq2seq
    _, val = seq2seq_data.split_pairs(cfg, TOK, SP)
    # The first of 8 held-out phrases that greedy decoding reverses (the model gets >= 95% right, tested
    # in tests/tasks/test_seq2seq_task.py; which ones it misses depends on the numerics of training).
    srcs = [TOK.decode(val.src.ids[val.src.offsets[i]:val.src.offsets[i + 1]]) for i in range(8)]
    hyps = zoo.load(workdir).translate(srcs, beam=1)
    src = next(s for s, h in zip(srcs, hyps) if h == seq2seq_data.reverse_words(s))
    assert translate.main([workdir, "--text", src, "--beam", "4"]) == 0
    assert capsys.readouterr().out.strip() == seq2seq_data.reverse_words(src)
    assert translate.main([workdir, "--text", src, "--beam", "1"]) == 0
    assert capsys.readouterr().out.strip() == seq2seq_data.reverse_words(src)


@pytest.mark.parametrize("argv, fragment", [
    (["--text", "a b c", "--beam", "0"], "error: beam size 0 must be >= 1"),
    (["--text", "x" * 17], "is 17 tokens, above the model's data.seq_len=16"),
])
def test_translate_cli_errors(learned_seq2seq, capsys, argv, fragment):
    assert translate.main([learned_seq2seq[2], *argv]) == 2
    err = capsys.readouterr().err
    assert fragment in err and err.count("\n") == 1


def test_a_checkpoint_of_another_family_is_refused(tiny_cfg, tmp_path):
    run(replace(tiny_cfg, train=dict(steps=1)), tmp_path / "gpt", devices=jax.devices()[:1])
    with pytest.raises(ValueError, match="holds a gpt model; this command needs a run of family encdec"):
        runs.load_run(str(tmp_path / "gpt"), "encdec")
