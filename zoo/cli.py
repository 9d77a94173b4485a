"""`train.py` / `zoo-train`: parse the command line, resolve the config, hand it to the trainer.

    train.py CONFIG [--workdir DIR] [--set key=value ...]
    train.py --resume DIR [--set key=value ...]
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import time

BAD_INPUT = (ValueError, FileNotFoundError)  # ConfigError, ZooDataError, CheckpointError are ValueErrors


def parse(argv):
    ap = argparse.ArgumentParser(prog="train.py", description="Train a zoo model from a config file.")
    ap.add_argument("config", nargs="?", help="a config file, e.g. configs/gpt_tiny.py")
    ap.add_argument("--workdir", help="run directory (default: runs/<config>-<time>)")
    ap.add_argument("--resume", metavar="DIR", help="continue the run in DIR from its latest checkpoint")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="override a config field, e.g. --set optim.lr=1e-3 (repeatable)")
    a = ap.parse_args(argv)
    if bool(a.config) == bool(a.resume):
        ap.error("give a CONFIG file, or --resume DIR (not both)")
    if a.resume and a.workdir:
        ap.error("--resume DIR trains in DIR; --workdir does not apply")
    return a


def resolve(a):
    """(config, workdir, resume) from parsed arguments."""
    import jax
    from zoo import checkpoint, tasks
    from zoo.config import ConfigError, apply_overrides, load_config_file
    if a.resume:
        old = checkpoint.load_config(a.resume)
        cfg = apply_overrides(old, a.set)
        shapes = lambda c: jax.tree.map(lambda x: x.shape, jax.eval_shape(tasks.build(c).init, jax.random.PRNGKey(0)))
        if cfg.task != old.task or shapes(cfg) != shapes(old):
            raise ConfigError(f"--set {' '.join(a.set)} changes the model's shape; a resumed run keeps the "
                              f"model of {a.resume!r} (only data, optim, train and mesh settings may change)")
        return cfg, a.resume, True
    cfg = apply_overrides(load_config_file(a.config), a.set)
    if cfg.data.tokenizer == "init_from":  # the tokenizer the init_from run was trained or converted with
        if not cfg.init_from:
            raise ConfigError("data.tokenizer=init_from needs --set init_from=RUN")
        tok = checkpoint.load_config(cfg.init_from).data.tokenizer
        cfg = dataclasses.replace(cfg, data=dataclasses.replace(cfg.data, tokenizer=tok))
    name = os.path.splitext(os.path.basename(a.config))[0]
    return cfg, a.workdir or os.path.join("runs", f"{name}-{time.strftime('%Y%m%d-%H%M%S')}"), False


def train_main(argv=None) -> int:
    a = parse(sys.argv[1:] if argv is None else argv)
    from zoo import trainer
    try:
        cfg, workdir, resume = resolve(a)
        print(f"{'resuming' if resume else 'training'} {cfg.task} in {workdir}", flush=True)
        out = trainer.train(cfg, workdir, resume=resume)
    except (trainer.TrainError, *BAD_INPUT) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    last = out["records"][-1] if out["records"] else {}
    summary = ", ".join(f"{k}={last[k]:.4g}" for k in ("loss", "eval_loss", "eval_ppl", "eval_accuracy",
                                                      "eval_macro_f1", "eval_bleu", "tokens_per_s", "mfu")
                        if k in last)
    print(f"done: step {int(out['state'].step)} ({summary}); checkpoints and metrics.jsonl in {workdir}")
    if cfg.train.sample_tokens and not out["interrupted"] and out["setup"].task.name == "gpt_lm":
        _print_sample(cfg, out)
    return 0


def _print_sample(cfg, out):
    from zoo.sample import generate
    import jax
    tok = out["tokenizer"]
    params = jax.device_get(out["state"].params)
    n = min(cfg.train.sample_tokens, cfg.model.max_len - len(tok.encode(cfg.train.sample_prompt)))
    ids = generate(out["setup"].task.model, params, tok.encode(cfg.train.sample_prompt), n,
                   temperature=0.8, top_k=40, seed=0, eos_id=tok.eot_token, vocab_limit=tok.n_vocab)[0]
    print(f"sample (temperature 0.8, top-k 40):\n{cfg.train.sample_prompt}{tok.decode(ids)}")
