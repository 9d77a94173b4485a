"""python -m zoo.cli.results writes a fresh run's figures over the hand-written ones, and only those."""

import shutil

from zoo.cli import results, results_text

S = {"wall": 151.2, "steps": 800, "loss": (5.9, 1.51), "tokens_per_s": 13012.0, "mfu": 0.4, "eval_loss": 1.6234,
     "eval_accuracy": 0.52}


def test_the_expect_paragraph_and_the_readme_row_are_replaced(tmp_path):
    (tmp_path / "configs").mkdir()
    shutil.copy("configs/bert_tiny_mlm.py", tmp_path / "configs")
    shutil.copy("README.md", tmp_path)
    before = (tmp_path / "configs" / "bert_tiny_mlm.py").read_text()
    text = results.sentence("bert_tiny_mlm", S, "2-core CPU")
    assert "2m31s wall; loss 5.90 -> 1.51 over 800 steps, eval_loss 1.623, eval_accuracy 0.52; 13,012 tokens/s" in text
    results_text.rewrite_docstring(str(tmp_path / "configs" / "bert_tiny_mlm.py"), text)
    after = (tmp_path / "configs" / "bert_tiny_mlm.py").read_text()
    old = before.split("\nExpect", 1)[1].split("\n\n")[0].split('"""')[0]  # the hand-written paragraph
    assert old.strip() and old not in after and "python -m zoo.cli.results bert_tiny_mlm" in after
    assert after.split('"""')[2] == before.split('"""')[2]  # the code is untouched
    assert before.split("\nExpect")[0] == after.split("\nExpect")[0]  # so is the text before the paragraph
    compile(after, "bert_tiny_mlm.py", "exec")
    results_text.rewrite_readme(str(tmp_path / "README.md"), "bert_tiny_mlm", "CPU, 2m31s; eval_loss 1.62")
    rows = [r for r in (tmp_path / "README.md").read_text().splitlines() if r.startswith("| `configs/bert_tiny_mlm")]
    assert rows == ["| `configs/bert_tiny_mlm.py` | BERT, 2 layers, width 128, bytes | CPU, 2m31s; eval_loss 1.62 |"]


def test_the_sample_paragraph_is_the_last_runs_sample(tmp_path):
    path = tmp_path / "shakespeare_char.py"
    shutil.copy("configs/shakespeare_char.py", path)
    before = path.read_text()
    stdout = "step 1400: ...\ndone: step 1400 (...)\n" + results.SAMPLE_HEADER + "\nRomeo.\nWhat say'st thou?\n\n"
    assert results.run_sample(stdout) == "Romeo.\nWhat say'st thou?" and results.run_sample("done: x\n") is None
    results_text.rewrite_sample(str(path), results.run_sample(stdout))
    results_text.rewrite_sample(str(path), 'Juliet.\nA """quoted""" back\\slash\n  ')  # replaces it; cannot end the docstring
    after = path.read_text()
    doc = after.split('"""')[1]
    assert doc.endswith(f"\n\n{results_text.SAMPLE_PARAGRAPH}\n\n    Juliet.\n    A '''quoted''' back/slash\n")
    assert "Romeo.\n    What" not in after and after.count(results_text.SAMPLE_PARAGRAPH) == 1
    assert after.split('"""')[2] == before.split('"""')[2]  # the code is untouched, the docstring up to the sample too
    assert doc.startswith(before.split('"""')[1].split("\n" + results_text.SAMPLE_PARAGRAPH)[0].rstrip("\n") + "\n\n")
    compile(after, "shakespeare_char.py", "exec")


def test_chat_answers_go_to_the_docstring_end_and_the_readme_block(tmp_path):
    path, readme = tmp_path / "smollm2_chat_lora.py", tmp_path / "README.md"
    shutil.copy("configs/smollm2_chat_lora.py", path)
    shutil.copy("README.md", readme)
    code = path.read_text().split('"""')[2]
    for answer in ("Paris?", "The capital of France is Paris."):
        lines = ["Q: What is the capital of France?", "   before: The capital of France is Paris.", f"   after:  {answer}"]
        results_text.rewrite_answers(str(path), str(readme), "smollm2_chat_lora", lines)
    doc, text = path.read_text().split('"""')[1], readme.read_text()
    assert doc.endswith(f"{results_text.ANSWERS_PARAGRAPH}\n\n    Q: What is the capital of France?\n"
                        f"       before: The capital of France is Paris.\n       after:  The capital of France is Paris.\n")
    assert doc.count(results_text.ANSWERS_PARAGRAPH) == 1 and "Paris?" not in doc and path.read_text().split('"""')[2] == code
    block = text.split("<!-- answers:smollm2_chat_lora -->\n")[1].split("<!-- /answers -->")[0]
    assert block == "```\n" + "\n".join(lines) + "\n```\n" and "Paris?" not in text
    compile(path.read_text(), "smollm2_chat_lora.py", "exec")


def test_the_eval_table_takes_the_new_rows_and_keeps_the_others(tmp_path):
    readme = tmp_path / "README.md"
    old = {"gpt_tiny": "| `gpt_tiny` | builtin | 7 | 9.9 | 9.9 | 0.1 | 0.1 |",
           "shakespeare_char": "| `shakespeare_char` | shakespeare | 3 | 1.1 | 1.6 | 0.3 | 0.3 |"}
    readme.write_text("# x\n<!-- eval-table -->\n" + results_text.EVAL_HEADER + "\n" + "\n".join(old.values()) +
                      "\n<!-- /eval-table -->\nafter\n")
    new = {"smollm2_chat_lora (its base)": "| `smollm2_chat_lora (its base)` | builtin | 7 | 2 | 3 | 0.5 | 0.5 |",
           "smollm2_chat_lora": "| `smollm2_chat_lora` | builtin | 7 | 2.1 | 3.1 | 0.5 | 0.5 |",
           "gpt_tiny": "| `gpt_tiny` | builtin | 7 | 1.5 | 2.2 | 0.4 | 0.4 |"}
    results_text.rewrite_eval_table(str(readme), new, "2-core CPU, 2026-11-27")
    text = readme.read_text()
    rows = [line for line in text.splitlines() if line.startswith("| `")]
    assert rows == [new["gpt_tiny"], old["shakespeare_char"], new["smollm2_chat_lora (its base)"],
                    new["smollm2_chat_lora"]]
    assert "(2-core CPU, 2026-11-27)" in text and text.endswith("<!-- /eval-table -->\nafter\n")
