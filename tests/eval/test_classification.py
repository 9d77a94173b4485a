"""zoo-eval on a [CLS] classifier run: accuracy, macro-F1 and the confusion matrix of its predictions on a
labelled file (string labels mapped to the run's classes), the same predictions zoo-classify makes; a label
the run does not know and a GPT-only task are one error line."""

import json

import numpy as np
import pytest

from tests.helpers import tiny_configs
from tests.helpers.runs import run, write_jsonl
from zoo.cli import classify as zoo_classify
from zoo.cli import eval as zoo_eval
from zoo.tasks.classify import builtin_examples


@pytest.fixture(scope="module")
def cls_run(tmp_path_factory):
    work = tmp_path_factory.mktemp("cls")
    cfg = tiny_configs.bert("bert_cls", str(work / "cache"))
    run(cfg, work / "run")
    return str(work / "run")


@pytest.fixture(scope="module")
def labelled(cls_run, tmp_path_factory):
    """40 builtin paragraphs cut to 50 characters (within the 64 positions) with their class names as string
    labels, the first of them ten times over, far past the positions."""
    ds = builtin_examples()
    names = ds.features["label"].names
    rows = [{"text": t[:50], "label": names[y]} for t, y in zip(ds["text"][:40], ds["label"][:40])]
    rows[0]["text"] = rows[0]["text"] * 10
    return write_jsonl(tmp_path_factory.mktemp("data") / "test.jsonl", rows), rows, names


def test_scores_are_those_of_zoo_classify_s_predictions(cls_run, labelled, tmp_path, capsys):
    path, rows, names = labelled
    assert zoo_eval.main([cls_run, "--data", path, "--json"]) == 0  # a classifier: --task classify by itself
    assert json.loads(capsys.readouterr().out)["truncated"] == 1  # the long row is cut, as training cuts it
    path, rows = write_jsonl(tmp_path / "fits.jsonl", rows[1:]), rows[1:]  # zoo-classify refuses a long text
    assert zoo_eval.main([cls_run, "--data", path, "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert zoo_classify.main([cls_run, "--file", path, "--out", str(tmp_path / "p.jsonl")]) == 0
    capsys.readouterr()
    pred = [names.index(json.loads(line)["label"]) for line in open(tmp_path / "p.jsonl")]
    true = [names.index(r["label"]) for r in rows]
    confusion = np.zeros((len(names), len(names)), int)
    np.add.at(confusion, (true, pred), 1)
    assert out["confusion"] == confusion.tolist() and out["examples"] == 39 and out["truncated"] == 0
    assert out["accuracy"] == pytest.approx(np.mean(np.equal(true, pred)))
    present = [c for c in range(len(names)) if confusion[c].sum() + confusion[:, c].sum()]
    f1 = np.mean([2 * confusion[c, c] / (confusion[c].sum() + confusion[:, c].sum()) for c in present])
    assert out["macro_f1"] == pytest.approx(f1)
    assert zoo_eval.main([cls_run, "--data", path, "--task", "classify"]) == 0
    table = capsys.readouterr().out
    assert "accuracy" in table and "confusion (rows: true, columns: predicted):" in table and names[0] in table


def test_a_label_the_run_does_not_know_and_a_gpt_task_are_one_line(cls_run, tmp_path, capsys):
    path = write_jsonl(tmp_path / "t.jsonl", [{"text": "a", "label": "no-such-class"}])
    assert zoo_eval.main([cls_run, "--data", path]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "no-such-class" in err and err.count("\n") == 1
    questions = write_jsonl(tmp_path / "q.jsonl", [{"context": "a", "choices": ["b", "c"], "answer": 0}])
    assert zoo_eval.main([cls_run, "--task", "choice", questions]) == 2
    assert "a classifier (task bert_cls) is scored with --task classify" in capsys.readouterr().err
