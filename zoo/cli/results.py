"""Regenerate the documented results: train each CPU config afresh and write what it gives into the
config's docstring (its "Expect ..." paragraph) and the README's table of configs.

    python -m zoo.cli.results                      # every CPU config, in order (about an hour on 2 cores)
    python -m zoo.cli.results gpt_tiny encdec_tiny # some of them

Figures in the docs are therefore never typed by hand: wall time, first and last training loss, the
final evaluation metrics and throughput of one fresh run on this machine, with its date; for a
character-level config, the eval loss in bits per character; for a config in SAMPLED, the sample the
run prints at its end, quoted in the docstring's "Sample" paragraph; for a chat config in CHAT_PROBES,
the answers of its base and of the fine-tuned run to the same questions ("Answers", and the README); for a
config in EVALUATED, zoo-eval's held-out perplexity and multiple-choice accuracy (the README's Evaluate table).
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import subprocess
import sys
import tempfile
import time

from zoo.cli.results_text import (EVALUATED, rewrite_answers, rewrite_block, rewrite_docstring, rewrite_eval_table,
                                   rewrite_marked, rewrite_readme, rewrite_sample)

# The configs that run on a CPU in minutes, in the order their dependencies need (cls fine-tunes mlm).
CPU_CONFIGS = ("gpt_tiny", "llama_tiny", "moe_tiny", "bert_tiny_mlm", "bert_tiny_cls", "bert_ner_tiny",
               "encdec_tiny", "minilm_cls", "shakespeare_char", "smollm2_chat_lora", "smollm2_dpo_lora",
               "smollm2_grpo_lora", "smollm2_distill")
DEPENDS = {"bert_tiny_cls": ("bert_tiny_mlm", "init_from")}  # config -> (run it starts from, the key)
EVAL_KEYS = ("eval_loss", "eval_accuracy", "eval_macro_f1", "eval_entity_f1", "eval_exact_match", "eval_bleu",
             "moe_aux_loss", "eval_rewards/accuracies", "eval_rewards/margins", "eval_reward",
             "eval_rewards/exact_answer", "eval_rewards/answer_format")
# What the trained run answers to the config's documented example, quoted in the docstring too.
FILL_MASK_EXAMPLE = 'The "wh[MASK]le" statement is used for repeated execution'
PROBES = {"bert_tiny_mlm": ("zoo.cli.fill_mask", "--text", FILL_MASK_EXAMPLE, "--top-k", "3")}
# ASCII text through the byte tokenizer: a token is a character, so eval_loss / ln 2 is bits per character.
CHARACTER_LEVEL = ("shakespeare_char",)
SAMPLED = ("shakespeare_char",)  # configs whose docstring quotes the sample their run prints at its end
SAMPLE_HEADER = "sample (temperature 0.8, top-k 40):"  # the line zoo.cli.train prints before it
# Chat runs: questions answered by the base (WORKDIR/base) and by the fine-tuned run, quoted in the docstring's
# "Answers" paragraph and in the README between <!-- answers:NAME --> and <!-- /answers -->. For
# smollm2_chat_lora: two phrasings of trained facts that no training conversation uses, two questions
# unlike any it trained on.
CHAT_PROBES = {"smollm2_chat_lora": ("How can I draw the attention heads of a model with zoo?",
                                     "What would I type to pick up a training run where it stopped?",
                                     "What is the capital of France?",
                                     "Name three primary colors."),
               "smollm2_dpo_lora": ("How can I draw the attention heads of a model with zoo?",
                                    "What would I type to pick up a training run where it stopped?",
                                    "What is the capital of France?",
                                    "Name three primary colors."),
               "smollm2_grpo_lora": ("What is the capital of France?", "Name three primary colors.")}
# Preference runs: on their held-out pairs, the share whose chosen answer the base already gives the higher
# log-probability and the mean log-probability margin, then the tuned run's; quoted in the docstring's
# "Preferences" paragraph and the README between <!-- preferences:NAME --> and <!-- /preferences -->.
PREFERENCE = ("smollm2_dpo_lora",)
PREFERENCES_PARAGRAPH = "Preferences (held-out pairs; log-probabilities summed over each answer):"
# Reinforcement learning runs: their held-out questions answered greedily by the base and by the tuned run, scored
# by the run's rewards, with three example completions, the reward curve and the share of the time spent
# generating; quoted in the docstring's "Rewards" paragraph and the README between <!-- rewards:NAME --> and
# <!-- /rewards -->.
REINFORCED = ("smollm2_grpo_lora",)
REWARDS_PARAGRAPH = "Rewards (held-out questions answered greedily, scored by the run's reward functions):"
# Runs scored with zoo-eval into the README's Evaluate table (between <!-- eval-table --> and <!-- /eval-table -->):
# perplexity on the documents their training held out (--held-out; a chat run, whose data are conversations, on
# builtin's) and accuracy on zoo's offline multiple-choice set (zoo.eval.sets). A chat run's base is scored too.
TEXT_SOURCES = ("builtin", "shakespeare")


def run(name: str, workdir: str, extra: list[str]) -> dict:
    """Train one config in a fresh process; its wall time and metrics.jsonl records."""
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    t = time.perf_counter()
    out = subprocess.run([sys.executable, "-m", "zoo.cli.train", name, "--workdir", workdir, *extra], env=env,
                         capture_output=True, text=True)
    wall = time.perf_counter() - t
    if out.returncode:
        raise RuntimeError(f"{name} failed: {out.stderr.strip().splitlines()[-1:]}")
    with open(os.path.join(workdir, "metrics.jsonl")) as f:
        records = [json.loads(line) for line in f if line.strip()]
    return {"wall": wall, "records": records, "stdout": out.stdout}


def probe(name: str, workdir: str) -> str | None:
    """The run's answer to its config's example command (PROBES), as one phrase for the docstring."""
    if name not in PROBES:
        return None
    module, *args = PROBES[name]
    out = subprocess.run([sys.executable, "-m", module, workdir, *args], capture_output=True, text=True,
                         env={k: v for k, v in os.environ.items() if k != "XLA_FLAGS"})
    if out.returncode:
        raise RuntimeError(f"{module} on {name} failed: {out.stderr.strip().splitlines()[-1:]}")
    answers = next(line for line in out.stdout.splitlines() if line.startswith("[MASK] 1: "))
    return f"zoo-fill-mask answers {answers[len('[MASK] 1: '):].replace('  ', ', ')} for '{args[1]}'"


def chat_answer(workdir: str, question: str) -> str:
    """The run's greedy chat answer to `question`, on one line."""
    out = subprocess.run([sys.executable, "-m", "zoo.cli.sample", workdir, "--chat", "--prompt", question,
                          "--temperature", "0", "--max-new-tokens", "48"], capture_output=True, text=True,
                         env={k: v for k, v in os.environ.items() if k != "XLA_FLAGS"})
    if out.returncode:
        raise RuntimeError(f"zoo-sample on {workdir} failed: {out.stderr.strip().splitlines()[-1:]}")
    return " ".join(out.stdout.split())


def chat_answers(name: str, workdir: str) -> list[str] | None:
    """Lines quoting, for each of the config's CHAT_PROBES, the base's answer and the run's."""
    if name not in CHAT_PROBES:
        return None
    lines = []
    for q in CHAT_PROBES[name]:
        lines += [f"Q: {q}", f"   before: {chat_answer(os.path.join(workdir, 'base'), q)}",
                  f"   after:  {chat_answer(workdir, q)}"]
    return lines


def preference_lines(name: str, workdir: str) -> list[str] | None:
    """For a run in PREFERENCE: its held-out pairs' preference under the base (before) and the tuned run (after)."""
    if name not in PREFERENCE:
        return None
    import contextlib
    import io
    import jax
    import numpy as np
    import zoo
    from zoo import tasks
    from zoo.training import runs
    cfg = runs.load_config(workdir)
    with contextlib.redirect_stdout(io.StringIO()):  # the data line, said once by the run already
        held = tasks.build(cfg).make_data(cfg, 0, 1).examples["eval"]
    rows, plain = held.rows(np.arange(len(held))), tasks.plain(cfg)
    lines = [f"{len(held)} held-out pairs"]
    for label, path in (("before (the base)", os.path.join(workdir, "base")), ("after", workdir)):
        lp = np.asarray(plain.logps(zoo.load(path).params, rows, False, jax.random.PRNGKey(0))[0])
        lines.append(f"{label + ':':18} chosen preferred in {int((lp[:, 0] > lp[:, 1]).sum())}/{len(held)}, "
                     f"mean log-prob margin {np.mean(lp[:, 0] - lp[:, 1]):+.2f}")
    return lines


def reward_lines(name: str, workdir: str, records: list[dict], wall: float) -> list[str] | None:
    """For a run in REINFORCED: its held-out questions' rewards under the base (before) and the tuned run (after),
    three completions of each, the training reward's curve and the share of the run spent generating."""
    if name not in REINFORCED:
        return None
    import contextlib
    import io
    import zoo
    from zoo import tasks
    from zoo.training import runs
    cfg = runs.load_config(workdir)
    task = tasks.plain(cfg)
    with contextlib.redirect_stdout(io.StringIO()):  # the data line, said once by the run already
        data = task.make_data(cfg, 0, 1)
    held = data.examples["eval"]
    lines, shown = [f"{len(held)} held-out questions"], {}
    for label, path in (("before (the base)", os.path.join(workdir, "base")), ("after", workdir)):
        comps = task.complete(zoo.load(path).params, held.ids, data.tokenizer, seed=0, temperature=0.0)[0]
        texts = [data.tokenizer.decode(c) for c in comps]
        total, per = task.score(held, texts)
        parts = [f"{n} {per[:, k].mean():.3f}" for k, (n, _) in enumerate(task.rewards)]
        lines.append(f"{label + ':':18} mean reward {total.mean():.3f}; " + ", ".join(parts))
        shown[label] = texts
    for i in range(min(3, len(held))):
        question = held.prompts[i][-1]["content"] if isinstance(held.prompts[i], list) else held.prompts[i]
        lines += [f"Q: {question} (answer {held.columns['answer'][i]})" if "answer" in held.columns else f"Q: {question}",
                  *(f"   {k.split(' ')[0] + ':':8}{' '.join(v[i].split())}" for k, v in shown.items())]
    rewards = [r["reward"] for r in records if "reward" in r]
    k = max(1, len(rewards) // 6)
    curve = [sum(rewards[j:j + k]) / len(rewards[j:j + k]) for j in range(0, len(rewards), k)]
    lines.append(f"training reward, mean of each {k} steps: " + " ".join(f"{x:.2f}" for x in curve))
    gen = sum(r.get("gen_seconds", 0.0) for r in records)
    lines.append(f"wall {round(wall) // 60}m{round(wall) % 60:02d}s; generating (sampling + rewards) {gen:.0f} s = "
                 f"{gen / wall:.0%} of it")
    return lines


def zoo_eval(workdir: str, *args: str) -> dict:
    out = subprocess.run([sys.executable, "-m", "zoo.cli.eval", workdir, *args, "--json"], capture_output=True,
                         text=True, env={k: v for k, v in os.environ.items() if k != "XLA_FLAGS"})
    if out.returncode:
        raise RuntimeError(f"zoo-eval on {workdir} failed: {out.stderr.strip().splitlines()[-1:]}")
    return json.loads(out.stdout)


def eval_rows(name: str, workdir: str) -> dict[str, str]:
    """README Evaluate-table rows (label -> markdown row) of a run in EVALUATED, and of its base if it has one."""
    if name not in EVALUATED:
        return {}
    with open(os.path.join(workdir, "config.json")) as f:
        source = json.load(f)["data"]["source"]
    runs = {name: workdir}
    if os.path.isdir(os.path.join(workdir, "base")):
        runs = {f"{name} (its base)": os.path.join(workdir, "base"), **runs}
    if source in TEXT_SOURCES:  # its own corpus, the documents its training held out
        text, data = source, [source, "--held-out"]
    else:  # trained on other data (conversations): builtin's documents every default run holds out, for base and run
        from zoo.data.corpus import NAMED
        from zoo.data.store import doc_hash
        from zoo.eval.sets import VAL_FRACTION
        held = os.path.join(workdir, "builtin_held_out.jsonl")
        with open(held, "w") as f:
            f.writelines(json.dumps({"text": t}) + "\n" for t in NAMED["builtin"][0]() if doc_hash(t) < VAL_FRACTION)
        text, data = "builtin", [held]
    rows = {}
    for label, path in runs.items():
        ppl = zoo_eval(path, "--data", *data)
        mc = zoo_eval(path, "--task", "choice", "builtin")
        rows[label] = (f"| `{label}` | {text} | {ppl['documents']} | {ppl['nll_per_token']:.3f} | "
                       f"{ppl['bits_per_byte']:.3f} | {mc['acc']:.3f} | {mc['acc_norm']:.3f} |")
    return rows


def run_sample(stdout: str) -> str | None:
    """The sample a run printed at its end (the lines after SAMPLE_HEADER), or None."""
    _, sep, sample = stdout.partition(SAMPLE_HEADER + "\n")
    return sample.rstrip("\n") if sep else None


def summary(result: dict) -> dict:
    records = result["records"]
    losses = [r["loss"] for r in records if r.get("loss") is not None]
    evals = [r for r in records if any(k in r for k in EVAL_KEYS if k.startswith("eval_"))]
    speeds = sorted(r["tokens_per_s"] for r in records if r.get("tokens_per_s"))
    s = {"wall": result["wall"], "steps": records[-1]["step"], "loss": (losses[0], losses[-1]),
         "tokens_per_s": speeds[len(speeds) // 2] if speeds else None,
         "mfu": records[-1].get("mfu")}
    s.update({k: evals[-1][k] for k in EVAL_KEYS if evals and evals[-1].get(k) is not None})
    return s


def evals(s: dict, fmt: str, bits_fmt: str) -> list[str]:
    """The final eval metrics, "eval_loss 1.234 (1.780 bits per character)" for a character-level config."""
    bits = {"eval_loss": f" ({s['bits_per_char']:{bits_fmt}} bits per character)"} if "bits_per_char" in s else {}
    return [f"{k} {s[k]:{fmt}}" + bits.get(k, "") for k in EVAL_KEYS if k in s]


def sentence(name: str, s: dict, machine: str) -> str:
    m, sec = divmod(round(s["wall"]), 60)
    parts = [f"loss {s['loss'][0]:.2f} -> {s['loss'][1]:.2f} over {s['steps']} steps"]
    parts += evals(s, ".4g", ".3f")
    speed = f"{s['tokens_per_s']:,.0f} tokens/s" if s.get("tokens_per_s") else ""
    if speed and s.get("mfu") is not None:
        speed += f", MFU {s['mfu']:.2f}"
    return (f"Expect (`python -m zoo.cli.results {name}`, {machine}, {datetime.date.today()}): {m}m{sec:02d}s "
            f"wall; {', '.join(parts)}" + (f"; {speed}" if speed else "")
            + (f"; {s['probe']}" if s.get("probe") else "") + ".")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m zoo.cli.results", description=__doc__.split("\n")[0])
    ap.add_argument("configs", nargs="*", default=list(CPU_CONFIGS), help="config names (default: every CPU config)")
    ap.add_argument("--root", default=".", help="the repository root holding configs/ and README.md (default: .)")
    a = ap.parse_args(argv)
    machine = f"{os.cpu_count()}-core CPU"
    work = tempfile.mkdtemp(prefix="zoo-results-")
    done: dict[str, str] = {}
    for name in a.configs:
        extra = []
        if name in DEPENDS:
            parent, key = DEPENDS[name]
            if parent not in done:
                done[parent] = os.path.join(work, parent)
                run(parent, done[parent], [])
            extra = ["--set", f"{key}={done[parent]}"]
        done[name] = os.path.join(work, name)
        result = run(name, done[name], extra)
        s = summary(result)
        s["probe"] = probe(name, done[name])
        if name in CHARACTER_LEVEL and "eval_loss" in s:
            s["bits_per_char"] = s["eval_loss"] / math.log(2)
        text = sentence(name, s, machine)
        print(text, flush=True)
        config_file = os.path.join(a.root, "configs", f"{name}.py")
        rewrite_docstring(config_file, text)
        sample = run_sample(result["stdout"]) if name in SAMPLED else None
        if sample:
            print(sample, flush=True)
            rewrite_sample(config_file, sample)
        prefs = preference_lines(name, done[name])
        if prefs:
            prefs.insert(1, f"wall {round(s['wall']) // 60}m{round(s['wall']) % 60:02d}s; at the end: reward accuracy "
                            f"{s.get('eval_rewards/accuracies', float('nan')):.3f}, reward margin "
                            f"{s.get('eval_rewards/margins', float('nan')):.3f}")
            print("\n".join(prefs), flush=True)
            rewrite_block(config_file, PREFERENCES_PARAGRAPH, "\n".join(prefs))
            rewrite_marked(os.path.join(a.root, "README.md"), name, "preferences", prefs)
        scored = reward_lines(name, done[name], result["records"], s["wall"])
        if scored:
            print("\n".join(scored), flush=True)
            rewrite_block(config_file, REWARDS_PARAGRAPH, "\n".join(scored))
            rewrite_marked(os.path.join(a.root, "README.md"), name, "rewards", scored)
        answers = chat_answers(name, done[name])
        if answers:
            print("\n".join(answers), flush=True)
            rewrite_answers(config_file, os.path.join(a.root, "README.md"), name, answers)
        scored = eval_rows(name, done[name])
        if scored:
            print("\n".join(scored.values()), flush=True)
            rewrite_eval_table(os.path.join(a.root, "README.md"), scored,
                               f"{machine}, {datetime.date.today().isoformat()}")
        m, sec = divmod(round(s["wall"]), 60)
        cell = f"CPU, {m}m{sec:02d}s; " + ", ".join(evals(s, ".3g", ".2f"))
        rewrite_readme(os.path.join(a.root, "README.md"), name, cell)
    return 0


if __name__ == "__main__":
    sys.exit(main())
