"""zoo.cli.fill_mask and zoo.cli.classify on runs made through train.py's entry point: MLM pretraining,
then fine-tuning from it, then the two CLIs and their one-line errors."""

import pytest

from zoo.cli import classify, fill_mask
from zoo.cli import train as cli
from zoo.tasks import classify as classify_data


@pytest.mark.slow
def test_mlm_then_fine_tune_through_train_py_and_the_clis(cache_dir, tmp_path, capsys):
    mlm_dir, cls_dir = str(tmp_path / "mlm"), str(tmp_path / "cls")
    common = [f"--set=data.cache_dir={cache_dir}", "--set=train.steps=4", "--set=train.log_every=2",
              "--set=train.eval_every=4", "--set=train.eval_batches=2", "--set=train.batch_size=8"]
    assert cli.train_main(["configs/bert_tiny_mlm.py", "--workdir", mlm_dir, *common]) == 0
    assert cli.train_main(["configs/bert_tiny_cls.py", "--workdir", cls_dir, f"--set=init_from={mlm_dir}",
                           *common]) == 0
    capsys.readouterr()
    assert classify.main([cls_dir, "--text", "The for statement iterates over a sequence"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert sorted(line.split("  ", 1)[1] for line in lines) == sorted(classify_data.TOPIC_FAMILIES)
    assert sum(float(line.split()[0]) for line in lines) == pytest.approx(1.0, abs=2e-3)
    assert fill_mask.main([mlm_dir, "--text", "The [MASK]or statement", "--top-k", "3"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[1].startswith("[MASK] 1: ") and len(out[1].split("  ")) == 3
    # Several --text: one block each, in order (the filled text, then a line per [MASK]).
    assert fill_mask.main([mlm_dir, "--text", "The [MASK]or statement", "--text", "wh[MASK]le [MASK]"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert len(out) == 5 and out[0].startswith("The ") and out[2].startswith("wh") and out[4].startswith("[MASK] 2: ")
    # Bad CLI input: one line on stderr, exit status 2.
    assert classify.main([mlm_dir, "--text", "x"]) == 2
    assert fill_mask.main([mlm_dir, "--text", "no mask here"]) == 2
    assert fill_mask.main([mlm_dir, "--text", "[MASK]" + "x" * 200]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert ".classify needs a bert_cls model" in err[0] and "task bert_mlm, which offers fill_mask" in err[0]
    assert "has no [MASK]" in err[1] and "more than the model's max_len=128" in err[2]
