"""python -m zoo.cli.results writes a fresh run's figures over the hand-written ones, and only those."""

import shutil

from zoo.cli import results

S = {"wall": 151.2, "steps": 800, "loss": (5.9, 1.51), "tokens_per_s": 13012.0, "mfu": 0.4, "eval_loss": 1.6234,
     "eval_accuracy": 0.52}


def test_the_expect_paragraph_and_the_readme_row_are_replaced(tmp_path):
    (tmp_path / "configs").mkdir()
    shutil.copy("configs/bert_tiny_mlm.py", tmp_path / "configs")
    shutil.copy("README.md", tmp_path)
    before = (tmp_path / "configs" / "bert_tiny_mlm.py").read_text()
    text = results.sentence("bert_tiny_mlm", S, "2-core CPU")
    assert "2m31s wall; loss 5.90 -> 1.51 over 800 steps, eval_loss 1.623, eval_accuracy 0.52; 13,012 tokens/s" in text
    results.rewrite_docstring(str(tmp_path / "configs" / "bert_tiny_mlm.py"), text)
    after = (tmp_path / "configs" / "bert_tiny_mlm.py").read_text()
    old = before.split("\nExpect", 1)[1].split("\n\n")[0].split('"""')[0]  # the hand-written paragraph
    assert old.strip() and old not in after and "python -m zoo.cli.results bert_tiny_mlm" in after
    assert after.split('"""')[2] == before.split('"""')[2]  # the code is untouched
    assert before.split("\nExpect")[0] == after.split("\nExpect")[0]  # so is the text before the paragraph
    compile(after, "bert_tiny_mlm.py", "exec")
    results.rewrite_readme(str(tmp_path / "README.md"), "bert_tiny_mlm", "CPU, 2m31s; eval_loss 1.62")
    rows = [r for r in (tmp_path / "README.md").read_text().splitlines() if r.startswith("| `configs/bert_tiny_mlm")]
    assert rows == ["| `configs/bert_tiny_mlm.py` | BERT, 2 layers, width 128, bytes | CPU, 2m31s; eval_loss 1.62 |"]
