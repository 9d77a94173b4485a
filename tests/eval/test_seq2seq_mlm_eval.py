"""zoo-eval's scorers for the other families: an encoder-decoder run on a source/target file (BLEU and exact
match of the same outputs zoo-translate gives, the worst rows shown), and a masked-LM run's pseudo-accuracy on
a held-out source (every row of the text counted once, the filled rows of the last batch not at all)."""

import json

import jax
import numpy as np
import pytest

from tests.helpers import tiny_configs
from tests.helpers.runs import run, write_jsonl
from zoo import hf
from zoo.cli import eval as zoo_eval
import zoo
from zoo.configuration import DataConfig
from zoo.eval import mlm as mlm_eval
from zoo.eval import seq2seq as s2s_eval
from zoo.infer.bleu import corpus_scores
from zoo.tasks import build
from zoo.tasks.seq2seq_data import builtin_phrases, reverse_words


def test_an_encoder_decoder_run_is_scored_on_its_outputs(learned_seq2seq, tmp_path, capsys):
    _, _, workdir = learned_seq2seq
    model, params, tok, cfg = hf.from_pretrained(workdir)
    short = [p for p in builtin_phrases() if len(tok.encode(p)) + 2 <= cfg.data.seq_len]
    rows = [{"source": p, "target": reverse_words(p)} for p in short[-12:]]
    path = write_jsonl(tmp_path / "pairs.jsonl", rows)
    out = s2s_eval.evaluate(model, params, tok, cfg, DataConfig(source=path), beam=1, batch_size=5)
    want = zoo.load(workdir).translate([r["source"] for r in rows], beam=1)
    targets = [r["target"] for r in rows]
    # The scores are those of the outputs zoo-translate gives (batches of 5, the last one filled, change nothing).
    assert out["examples"] == 12 and out["truncated"] == 0
    assert out["exact_match"] == pytest.approx(corpus_scores(want, targets)["exact_match"]) and out["exact_match"] > 0.5
    assert out["bleu"] == pytest.approx(corpus_scores(want, targets)["bleu"])
    by_source = dict(zip((r["source"] for r in rows), want))
    assert all(r["output"] == by_source[r["source"]] != r["target"] for r in out["worst"])
    long = write_jsonl(tmp_path / "long.jsonl", [{"source": rows[0]["source"] * 20, "target": "x"}, rows[1]])
    cut = s2s_eval.evaluate(model, params, tok, cfg, DataConfig(source=long), batch_size=5)
    assert cut["examples"] == 2 and cut["truncated"] == 1  # cut as training cuts it, and counted
    # zoo-eval picks the translation scoring for a seq2seq run by itself.
    assert zoo_eval.main([workdir, "--data", path, "--batch-size", "5"]) == 0
    table = capsys.readouterr().out
    assert "(greedy, 12 pairs, 0 sources truncated)" in table and f"exact match {out['exact_match']:.4f}" in table


@pytest.fixture(scope="module")
def mlm_run(tmp_path_factory):
    work = tmp_path_factory.mktemp("mlm")
    run(tiny_configs.bert("bert_mlm", str(work / "cache")), work / "run", devices=jax.devices()[:1])
    return str(work / "run")


def test_mlm_pseudo_accuracy_counts_every_row_once(mlm_run, capsys):
    model, params, tok, cfg = hf.from_pretrained(mlm_run)
    task = build(cfg)
    data = DataConfig(source="builtin")
    out = mlm_eval.evaluate(task, params, tok, data, batch_size=8, max_docs=6)
    again = mlm_eval.evaluate(task, params, tok, data, batch_size=5, max_docs=6)  # other batches: same rows
    W = cfg.data.seq_len - 2
    assert out["tokens"] == again["tokens"] and out["tokens"] % W == 0
    assert out["masked"] == again["masked"] and 0.12 * out["tokens"] < out["masked"] < 0.2 * out["tokens"]
    assert out["mlm_accuracy"] == pytest.approx(again["mlm_accuracy"]) and 0 < out["mlm_accuracy"] < 1
    assert out["perplexity"] == pytest.approx(np.exp(out["mlm_loss"]))
    assert zoo_eval.main([mlm_run, "--data", "builtin", "--max-docs", "6", "--json"]) == 0  # chosen by itself
    got = json.loads(capsys.readouterr().out)
    assert got["mlm_accuracy"] == pytest.approx(again["mlm_accuracy"]) and got["masked"] == out["masked"]
    assert zoo_eval.main([mlm_run, "--task", "translate", "--data", "builtin"]) == 2
    assert capsys.readouterr().err.strip() == f"error: --task translate scores seq2seq runs; {mlm_run} is a bert_mlm run"
