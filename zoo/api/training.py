"""zoo.train and zoo.config: the one trainer from Python, with the run's start resolved exactly as `train.py`
resolves it (zoo.api.start; train.py is a shell over `train`), and the Run it returns.

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
from zoo.api.start import _base, _text, assignments, check_arguments, start
from zoo.configuration import Config
from zoo.overrides import apply_overrides


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


def default_workdir(config=None, init_from: str | None = None) -> str:
    """runs/<config or checkpoint name>[-ft]-<time>: where a run goes when no workdir is given."""
    if init_from:
        name = os.path.basename(os.path.normpath(init_from)) + "-ft"
    elif isinstance(config, Config):
        name = config.task
    else:
        name = os.path.splitext(os.path.basename(configs.find(os.fspath(config))))[0]
    return os.path.join("runs", f"{name}-{time.strftime('%Y%m%d-%H%M%S')}")


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
            begun = start(config, workdir=workdir, overrides=sets, resume=resume, init_from=init_from, step=step,
                          new_batch=new_batch)
            if main and begun.restarted:
                print(f"{workdir} holds no checkpoint yet (its run stopped before its first save): starting it "
                      f"again from step 0 with its config.json", flush=True)
            cfg = begun.config
            if main:
                print(f"{'resuming' if begun.resume else 'training'} {cfg.task} in {workdir}", flush=True)
            if quiet or not sys.stderr.isatty():
                import datasets
                datasets.disable_progress_bars()  # the one-time tokenization's bars are noise in a log
            out = trainer.train(cfg, workdir, resume=begun.resume, quiet=quiet, resume_step=step, devices=devices,
                                config_of=_config_of(workdir, sets) if begun.resume else None,
                                teacher_of=load_source)
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
