"""How long a run sized in epochs trains (`steps_of_epochs`), how often a short one logs, and the one line a fine-tune
gets when its size or learning rate make it unlikely to teach anything (`size_warning`).

Epochs count the rows the task lays out (TRL's num_train_epochs over its packed dataset, Keras' fit(epochs=)),
except where packing would leave a small set only a handful of updates: SFT packs about four short chats to a row,
so 60 chats are 15 rows and 3 epochs at batch 8 were 6 optimizer steps, too few for any learning rate to teach
anything. A Hugging Face user counts epochs in examples (Trainer, and TRL without packing: 3 x 60 / 8 = 23 updates),
so a packed run makes at least MIN_UPDATES updates, never more than the same epochs of its examples unpacked would:
a small set gets the updates an unpacked run would (the packed rows are drawn more often), a large one is unchanged
(its packed epochs already make more updates than the floor), and a run without packing (every pretraining config:
one example a row) is exactly as before.
"""

from __future__ import annotations

import dataclasses
import math

from zoo.configuration import Config
from zoo.errors import ConfigError

MIN_UPDATES = 30  # the fewest optimizer steps a packed run sized in epochs makes (bounded by its unpacked count)
SHORT_LOG = 10  # a run sized in epochs logs about this many times at least (train.log_every lowered, never raised)
FEW_UPDATES = 20  # a fine-tune with fewer optimizer steps than this is told it is likely too short
HOT_PASSES = 20  # a fine-tune drawing each training row more often than this at optim.lr >= 1e-4 likely memorises


def steps_of_epochs(cfg: Config, rows: int, main: bool = True, examples: int = 0) -> Config:
    """cfg with train.steps from train.epochs when > 0 (said in one line); as it is otherwise. `rows`: the training
    rows of one epoch; `examples`: the examples packed into them (0: one a row). Steps are ceil(epochs * rows /
    batch_size), raised for a packed set to min(MIN_UPDATES, ceil(epochs * examples / batch_size)). train.log_every
    is lowered to steps // SHORT_LOG (at least 1) so a short run logs as it goes."""
    t = cfg.train
    if not t.epochs:
        return cfg
    if rows <= 0:
        raise ConfigError(f"train.epochs={t.epochs:g}: this task's data has no fixed number of rows (a stream); "
                          f"set train.steps instead")
    steps = max(1, math.ceil(t.epochs * rows / t.batch_size))
    line = f"train.epochs={t.epochs:g}: {steps} steps of {t.batch_size} rows over {rows} training rows"
    if examples > rows:
        unpacked = max(1, math.ceil(t.epochs * examples / t.batch_size))
        if min(MIN_UPDATES, unpacked) > steps:
            steps = min(MIN_UPDATES, unpacked)
            line = (f"train.epochs={t.epochs:g}: {steps} steps of {t.batch_size} rows over {rows} training rows "
                    f"({examples} examples packed; {t.epochs:g} epochs of the packed rows would be "
                    f"{math.ceil(t.epochs * rows / t.batch_size)} steps, so a small set trains as many as "
                    f"{t.epochs:g} epochs of its examples unpacked would ({unpacked}), up to {MIN_UPDATES}: each row "
                    f"drawn about {steps * t.batch_size / rows:.1f} times)")
    log_every = max(1, min(t.log_every, steps // SHORT_LOG))
    if log_every != t.log_every:
        line += f"; a line every {log_every} step{'s' * (log_every > 1)} (train.log_every={log_every})"
    if main:
        print(line, flush=True)
    return dataclasses.replace(cfg, train=dataclasses.replace(t, steps=steps, log_every=log_every))


def size_warning(cfg: Config, rows: int) -> str | None:
    """One line for a fine-tune (init_from) likely too short (fewer than FEW_UPDATES optimizer steps) or too hot (a
    full fine-tune above lr 1e-4; LoRA above 1e-3; each of few rows drawn more than HOT_PASSES times at lr >= 1e-4),
    naming the settings to change (a hot chat fine-tune: data.mix_source too); None for a run of a sensible size,
    and for every run from scratch."""
    if not cfg.init_from:
        return None
    t, lr, lora = cfg.train, cfg.optim.lr, cfg.model.lora_rank > 0
    said = []
    if t.steps < FEW_UPDATES:
        said.append(f"this fine-tune makes only {t.steps} optimizer step{'s' if t.steps != 1 else ''}: likely too few "
                    f"to change the model; set train.steps={MIN_UPDATES} or more (or raise train.epochs, lower "
                    f"train.batch_size={t.batch_size})")
    if lr > (1e-3 if lora else 1e-4):
        said.append(f"optim.lr={lr:g} is high for a {'LoRA' if lora else 'full'} fine-tune (usual: "
                    f"{'1e-4 to 3e-4' if lora else '1e-5 to 5e-5'}); lower optim.lr")
    passes = t.steps * t.batch_size / rows if rows > 0 else 0.0
    if passes > HOT_PASSES and lr >= 1e-4:
        said.append(f"each of the {rows} training rows is drawn about {passes:.0f} times at optim.lr={lr:g}: likely "
                    f"to memorise them; lower train.epochs (or train.steps) or optim.lr")
    hot = lr > (1e-3 if lora else 1e-4) or (passes > HOT_PASSES and lr >= 1e-4)
    if hot and cfg.task == "sft" and not cfg.data.mix_source:
        said.append("a hot chat fine-tune moves the base's general answers too: data.mix_source=zoo_general (or "
                    "general chats of your own, or replay: the base's own answers) trains them beside yours")
    return "warning: " + "; ".join(said) if said else None
