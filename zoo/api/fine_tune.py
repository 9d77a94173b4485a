"""`train.py --init-from SRC` and zoo.train(init_from=SRC): what a fine-tune starts from (a zoo run as it is; a
Hugging Face directory, GGUF file or PEFT adapter directory converted into WORKDIR/base) and with which settings.

Without a CONFIG, the model, tokenizer and task come from SRC and the rest from FINE_TUNE, zoo's
documented fine-tuning defaults (printed once), not from SRC's own run: a converted checkpoint has no
training settings of its own, and a pretraining run's batch, length, steps and peak learning rate are not a
fine-tune's. The data stays SRC's (the built-in corpus for a converted checkpoint) unless --set names it.

Before anything is converted, the data and settings a fine-tune names are checked against the config it will
train (`precheck`): a wrong column, file type or task setting is reported in seconds, not after minutes of
conversion. A start stopped during or after the conversion (a signal, kill -9) leaves a workdir the same command
goes on in: a complete base (base/CONVERTED) is reused, an incomplete one converted again. A GGUF file is
converted once, into zoo.load's cache, and each run's base is linked from there (`from_cache`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import os
import shutil
import sys

from zoo.api import configs
from zoo.sources import Source, source

CLS_FIELDS = ("data.label_column", "data.text_pair_column", "data.label_names")  # --set keys that mean bert_cls

# --init-from without a CONFIG: Hugging Face Trainer's schedule and scale (linear decay, lr 5e-5, small
# batches), a short warmup (6%, as RoBERTa/GLUE recipes), and LoRA's usual higher rate. --set overrides any.
FINE_TUNE = {"optim.lr": "1e-4", "optim.schedule": "linear", "optim.warmup": "0.06", "optim.weight_decay": "0.01",
             "optim.head_lr_mult": "20", "train.batch_size": "8", "train.epochs": "3", "train.eval_every": "50",
             "train.save_every": "100", "train.log_every": "10"}
FINE_TUNE_SEQ_LEN = 256  # data.seq_len, or the source run's if shorter
LORA_LR = "2e-4"  # optim.lr when the model carries LoRA adapters (model.lora_rank > 0)
# A CONFIG's model fields a fine-tune takes (the rest is SRC's): the adapters it trains, when it trains some.
LORA_FIELDS = ("lora_rank", "lora_alpha", "lora_dropout", "lora_targets", "quantize_base")


def base_run(src: Source, workdir: str, dry: bool = False):
    """(config, run directory) of an init_from source, resolved once (zoo.sources.source): a zoo run as it is; a
    Hugging Face directory, a GGUF file or a PEFT LoRA adapter directory (adapter_config.json, no config.json: a zoo
    LoRA run whose merged weights fine-tuning starts from) converted into WORKDIR/base (dry: nothing written, for
    --print-config; a GGUF file is converted into a temporary directory).

    The conversion holds the workdir's lock and ends by writing base/CONVERTED (`converted`): a start that was
    killed leaves a workdir the same command goes on in, reusing a complete base and redoing an incomplete
    one. A workdir that holds checkpoints, or a base converted from another source, is refused before anything
    is written in it."""
    from zoo.hf import peft
    from zoo.training import runs
    path = src.path
    if not src.converts:
        return runs.load_config(path), path
    from zoo import hf
    from zoo.hf.gguf import from_gguf
    base = os.path.join(workdir, "base")
    if dry and src.kind == "adapter":
        return peft.from_peft(path, base, dry=True)["config"], base
    if dry and src.kind == "gguf":
        if src.is_cached:  # zoo.load's conversion: nothing to do
            return runs.load_config(src.cache), base
        import tempfile
        with tempfile.TemporaryDirectory(prefix="zoo-print-config-") as tmp:
            from_gguf(path, os.path.join(tmp, "base"), verbose=False)
            return runs.load_config(os.path.join(tmp, "base")), base
    if dry:
        return hf.from_pretrained(path)[3], base
    import jax
    from zoo.training.workdir import claim
    created = not os.path.exists(workdir)
    with claim(workdir, enabled=jax.process_count() == 1, check=lambda: _check_reusable(workdir, path)):
        if converted(workdir) is not None:
            print(f"reusing {base}: {path} was converted into it by an earlier start of this run", flush=True)
            return runs.load_config(base), base
        shutil.rmtree(base, ignore_errors=True)  # what a start killed while converting left
        try:
            if src.kind == "gguf":
                from_cache(src, base)
            elif src.kind == "adapter":
                peft.from_peft(path, base)
            else:
                hf.from_hf(path, base)
            _mark_converted(base, path)
        except BaseException:
            shutil.rmtree(workdir if created else base, ignore_errors=True)  # nothing half-converted stays behind
            raise
    return runs.load_config(base), base


def from_cache(src: Source, base: str) -> None:
    """WORKDIR/base of the GGUF file `src` from zoo.load's cached conversion of it (zoo.hf.gguf.cached_run,
    which converts it there first when absent, so a later zoo.load or run is free too): every file hard-linked
    (copied across file systems) into a temporary directory beside `base`, renamed into place once whole. The
    cache is never written through the links: a run only reads its base, and converted.json is a new file."""
    import tempfile
    import time
    from zoo.hf.gguf import cached_run
    had = src.is_cached
    t0 = time.perf_counter()
    cached = cached_run(src)
    tmp = tempfile.mkdtemp(prefix=".base-", dir=os.path.dirname(os.path.abspath(base)))
    try:
        shutil.copytree(cached, os.path.join(tmp, "base"), copy_function=_link_or_copy)
        os.replace(os.path.join(tmp, "base"), base)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    how = "made earlier by zoo.load or a run: nothing converted" if had else \
        f"converted now, in {time.perf_counter() - t0:.0f} s; the next run or zoo.load reuses it"
    print(f"{base}: linked from {cached}, zoo's conversion of {src.path} ({how})", flush=True)


def _link_or_copy(src: str, dst: str) -> None:
    try:
        os.link(src, dst)
    except OSError:  # another file system, or links refused: a copy
        shutil.copy2(src, dst)


CONVERTED = "converted.json"  # in WORKDIR/base, written last: {"source": what was converted into it}


def converted(workdir: str) -> str | None:
    """The source WORKDIR/base was converted from, None when there is no complete conversion there."""
    import json
    try:
        with open(os.path.join(workdir, "base", CONVERTED)) as f:
            source = json.load(f)["source"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return source if isinstance(source, str) else None


def _mark_converted(base: str, src: str) -> None:
    import json
    tmp = os.path.join(base, CONVERTED + ".tmp")
    with open(tmp, "w") as f:
        json.dump({"source": os.path.abspath(src)}, f)
    os.replace(tmp, os.path.join(base, CONVERTED))


def _check_reusable(workdir: str, src: str) -> None:
    """Refuse a workdir a conversion may not go on in: one with checkpoints, or whose base is another source's."""
    from zoo.errors import ConfigError, TrainError
    from zoo.training import checkpoint
    if checkpoint.all_steps(workdir):
        raise TrainError(f"workdir {workdir!r} already holds checkpoints; continue it with "
                         f"`python train.py --resume {workdir}` or pick another --workdir")
    had = converted(workdir)
    if had is not None and had != os.path.abspath(src):
        raise ConfigError(f"{os.path.join(workdir, 'base')!r} was converted from {had}, not init_from={src!r}; "
                          f"pick another --workdir (or remove that base)")


def _set_keys(sets) -> set[str]:
    return {s.split("=", 1)[0].strip() for s in sets}


def _source_task(src: Source) -> str | None:
    """The task a source not yet converted holds, read off its config.json alone (None: not known)."""
    from zoo.hf import convert, io, peft
    if src.kind == "gguf":
        return "gpt_lm"
    if src.kind == "adapter":
        base = peft.read_config(src.path).get("base_model_name_or_path")  # checked: a bad file is named in one line
        return _source_task(source(base)) if isinstance(base, str) and os.path.isdir(base) and base != src.path \
            else None
    if src.kind != "hf":
        from zoo.training import runs
        return runs.load_config(src.path).task
    hf_cfg = io.read_config(src.path)
    conv = convert._converter(hf_cfg)  # an unsupported architecture is refused here, before any conversion
    return conv.task_for(hf_cfg, io.Keys({}, conv.PREFIXES))


def _task(theirs_task: str, sets, file_task: str | None = None) -> str:
    """The task a fine-tune of a `theirs_task` source trains before --set task=: a config file's own task when
    it is one of the source's family (its sections are written for it), else the source's (a bare BERT encoder:
    bert_mlm, or bert_cls when --set names a label field)."""
    from zoo.models import FAMILIES, TASK_FAMILY
    if file_task and file_task != "bert_encoder" and theirs_task in TASK_FAMILY and \
            file_task in FAMILIES[TASK_FAMILY[theirs_task]].tasks:
        return file_task
    task = "bert_mlm" if theirs_task == "bert_encoder" else theirs_task
    if theirs_task.startswith("bert_") and theirs_task != "bert_tokens" and _set_keys(sets) & set(CLS_FIELDS):
        task = "bert_cls"
    return task


def _stand_in(src: Source, task: str):
    """The config of a source not yet converted, as far as the data checks read it: its task and family, a
    model of that family's default shapes with the source's LoRA rank (an adapter's), room for any data.seq_len
    (the positions are checked after conversion) and a head that counts the labels."""
    from zoo.configuration import Config
    from zoo.hf import peft
    from zoo.models import FAMILIES, TASK_FAMILY
    model = FAMILIES[TASK_FAMILY[task]].config()
    if hasattr(model, "max_len"):
        model = dataclasses.replace(model, max_len=1 << 20)
    if hasattr(model, "num_classes"):
        model = dataclasses.replace(model, num_classes=0)
    if src.kind == "adapter":
        model = dataclasses.replace(model, lora_rank=int(peft.read_config(src.path)["r"]))
    return Config(task=task, model=model)


def precheck(src: Source, config: str | None, overrides) -> None:
    """The data of `--init-from SRC [CONFIG]` checked against the task it will train, before SRC is converted,
    on the config the run will train (`assemble`: CONFIG's task and sections, the fine-tuning defaults and every
    --set) with a stand-in for the model the conversion will give (`_stand_in`): the file opens, the columns
    exist and hold text, the labels are labels, the task's settings fit (grpo.beta and model.lora_rank). The
    tokenizer and the model's shapes wait for the conversion. Unknown tasks (an adapter on a hub base), and --set
    model fields the stand-in cannot take, are left to the trainer's own check."""
    from zoo import tasks
    from zoo.errors import ConfigError
    theirs_task = _source_task(src)
    if theirs_task is None:
        return
    theirs = _stand_in(src, theirs_task)
    try:
        cfg = assemble(theirs, src.path, config, overrides)[0]
    except ConfigError:
        plain = [s for s in overrides if not s.strip().startswith("model.")]
        if len(plain) == len(overrides):
            raise
        assemble(theirs, src.path, config, plain)  # a setting of another section is said now
        return  # the stand-in's shapes refused a model setting: the trainer checks it on the converted model
    with contextlib.redirect_stdout(io.StringIO()):  # what it counts is said once, by the trainer's own check
        tasks.check_data(cfg, vocab=False)


def defaults(theirs, sets) -> list[str]:
    """FINE_TUNE as --set assignments for a fine-tune of `theirs` (the user's own --set come after them)."""
    seq_len = min(FINE_TUNE_SEQ_LEN, theirs.data.seq_len)
    given = [f"{k}={v}" for k, v in FINE_TUNE.items()] + [f"data.seq_len={seq_len}"]
    if "train.steps" in _set_keys(sets):  # a number of steps asked for: no epochs to derive it from
        given = [g for g in given if not g.startswith("train.epochs=")]
    return given


def assemble(theirs, base: str, config: str | None, overrides):
    """(the config of a fine-tune of the run `base` whose config is `theirs`, the FINE_TUNE defaults it took):
    model and tokenizer from `theirs`; task, data, optim and train from CONFIG (its task when it is one of the
    model's family, its LoRA adapters when it has some: LORA_FIELDS), else FINE_TUNE and `theirs`' data; every
    --set last."""
    from zoo.overrides import apply_overrides, load_config_file
    ours = load_config_file(configs.find(config)) if config else theirs
    task = _task(theirs.task, overrides, ours.task if config else None)
    model = theirs.model
    if config and ours.model.family == model.family and ours.model.lora_rank:  # the file's adapters, on SRC's model
        model = dataclasses.replace(model, **{f: getattr(ours.model, f) for f in LORA_FIELDS})
    if task == "bert_cls" and theirs.task != "bert_cls" and "model.num_classes" not in _set_keys(overrides):
        model = dataclasses.replace(model, num_classes=0)  # a fresh head: as many classes as the labels have
    data = dataclasses.replace(ours.data, tokenizer=theirs.data.tokenizer, label_names=theirs.data.label_names
                               if not config else ours.data.label_names)
    cfg = dataclasses.replace(ours, task=task, model=model, data=data, init_from=os.path.abspath(base))
    given = defaults(theirs, overrides) if not config else []
    cfg = apply_overrides(cfg, given + overrides)
    if given and cfg.model.lora_rank and "optim.lr" not in _set_keys(overrides):
        cfg = apply_overrides(cfg, [f"optim.lr={LORA_LR}"])
        given = [g if not g.startswith("optim.lr=") else f"optim.lr={LORA_LR}" for g in given]
    return dataclasses.replace(cfg, context_len=max(theirs.window, cfg.data.seq_len)), given


def fine_tune_config(src: Source, workdir: str, *, config: str | None = None, overrides=(), dry: bool = False):
    """The config of `--init-from SRC [CONFIG]` (zoo.train(init_from=SRC)): `assemble` on SRC's run (a Hugging Face
    directory, GGUF file or adapter converted into WORKDIR/base first, its data checked before; `dry`: nothing
    written), the fine-tuning defaults it took said on the console."""
    overrides = list(overrides)
    if not dry and src.converts:
        precheck(src, config, overrides)
    theirs, base = base_run(src, workdir, dry)
    cfg, given = assemble(theirs, base, config, overrides)
    if given:
        mine = _set_keys(overrides)
        shown = ", ".join(g for g in given if g.split("=", 1)[0] not in mine)
        print(f"fine-tuning defaults (no CONFIG given): {shown}; data.source={cfg.data.source}; change any with "
              f"--set", file=sys.stderr if dry else sys.stdout, flush=True)
    return cfg
