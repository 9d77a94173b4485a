"""Evaluation sets scored during training (`train.eval_sets`): multiple choice and generation files, read
once before the first step and scored on the current params at every evaluation, their metrics logged with
the rest (metrics.jsonl, TensorBoard, the console line) as eval_STEM_acc / _acc_norm / _exact_match /
_contains, STEM the file's name without its extension."""

from __future__ import annotations

import os

from zoo.errors import ConfigError
from zoo.eval import choice, generation
from zoo.eval.loglik import prefix_token

GENERATE_TOKENS = 32  # the longest answer scored during training (zoo-eval's --max-new-tokens: 64)


def load(cfg) -> list[tuple[str, str, list[dict]]]:
    """[(stem, kind, rows)] of cfg.train.eval_sets, each file read and checked now (a bad one is one
    ZooDataError line naming file, line and key); ConfigError for a family other than GPT or two files of
    one stem."""
    items = [x.strip() for x in cfg.train.eval_sets.split(",") if x.strip()]
    if not items:
        return []
    if cfg.model.family != "gpt":
        raise ConfigError(f"train.eval_sets scores GPT-family runs; this is a {cfg.model.family} run")
    out = []
    for item in items:
        kind, _, path = item.partition(":")
        path = os.path.expanduser(path.strip())
        stem = os.path.splitext(os.path.basename(path))[0]
        if stem in {s for s, _, _ in out}:
            raise ConfigError(f"train.eval_sets names two files called {stem!r}; their metrics would collide")
        rows = choice.read_questions(path) if kind == "choice" else generation.read_items(path)
        out.append((stem, kind, rows))
    return out


def score(sets, model, params, tokenizer, cfg) -> dict:
    """The metrics of every set on `params`."""
    out = {}
    for stem, kind, rows in sets:
        if kind == "choice":
            r = choice.evaluate(model, params, tokenizer, rows, prefix=prefix_token(tokenizer), context=cfg.window,
                                delimiter=" ")
            out[f"eval_{stem}_acc"], out[f"eval_{stem}_acc_norm"] = r["acc"], r["acc_norm"]
        else:
            r = generation.evaluate(model, params, tokenizer, cfg.data.tokenizer, rows, run_dir=None,
                                    window=cfg.window, max_new_tokens=GENERATE_TOKENS)
            out[f"eval_{stem}_exact_match"] = r["exact"] / r["items"]
            out[f"eval_{stem}_contains"] = r["contained"] / r["items"]
    return out
