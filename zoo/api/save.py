"""Pretrained.save: a loaded (or tuned) model written as a zoo run, a Hugging Face directory, a PEFT adapter or
(an encoder) a sentence-transformers folder (with its tokenizer's files), by the writers `zoo-convert` uses
(zoo.hf.convert.export, zoo.hf.peft_export.to_peft, zoo.training.checkpoint.save_weights) and zoo.hf.st_export. Every
format writes into a new or empty directory and checks everything before it writes."""

from __future__ import annotations

import json
import os
import shutil

from zoo.errors import ArgumentError, ConversionError

FORMATS = ("zoo", "hf", "peft", "sentence-transformers")


def save(lm, out_dir: str, format: str = "zoo", *, params=None, verbose: bool = True) -> str:
    """See Pretrained.save."""
    if format not in FORMATS:
        raise ArgumentError(f"format={format!r}; choose one of {', '.join(FORMATS)}")
    if not isinstance(out_dir, (str, os.PathLike)):
        raise ArgumentError(f"out_dir={out_dir!r} must be a path")
    out_dir = os.path.expanduser(os.fspath(out_dir))
    params = lm.params if params is None else params
    if format == "peft":
        from zoo.hf import peft_export
        if lm.lora_run is None:
            raise ArgumentError(f"format='peft' writes a LoRA run's adapters; {lm.source!r} holds none (train LoRA "
                                f"with zoo.train(..., overrides={{'model.lora_rank': 16}}) or save with format='hf')")
        if params is not lm.params:
            raise ArgumentError("format='peft' writes the adapters the run trained; params= applies to 'zoo', 'hf' "
                                "and 'sentence-transformers'")
        # the run's restored adapters and traced shapes, kept on the model: a second save only writes
        peft_export.to_peft(lm.lora_run, out_dir, verbose=verbose, cache=lm.__dict__.setdefault("_peft_export_", {}))
    elif format == "hf":
        from zoo.hf.convert import export
        what = f"{lm.source}" + (f", step {lm.step}" if lm.step is not None else "")
        export(lm.config, params, out_dir, run_dir=lm.run_dir, what=what, verbose=verbose)
    elif format == "sentence-transformers":
        from zoo.api.embed import pooling_of
        from zoo.hf import st_export
        what = f"{lm.source}" + (f", step {lm.step}" if lm.step is not None else "")
        st_export.check(lm.config, lm.source)
        st_export.to_st(lm.config, params, out_dir, pooling_of(lm), run_dir=lm.run_dir, what=what, verbose=verbose)
    else:
        _zoo(lm, out_dir, params, verbose)
    return out_dir


def _zoo(lm, out_dir: str, params, verbose: bool) -> None:
    """A weights-only zoo run: params, config, checksums, the tokenizer's files (and the run's chat template and
    class names) copied in, so the directory stands alone; zoo.load, --init-from and zoo-sample read it."""
    import dataclasses

    import jax
    from zoo.data.chat import TEMPLATE_FILE
    from zoo.hf.convert import check_out_dir, count
    from zoo.training import checkpoint
    from zoo.training.workdir import own_tokenizer
    check_out_dir(out_dir)
    cfg = own_tokenizer(lm.config, out_dir, write=False)
    try:
        os.makedirs(out_dir, exist_ok=True)
        own_tokenizer(lm.config, out_dir)
        for name in (TEMPLATE_FILE, "labels.json"):
            if lm.run_dir and os.path.isfile(os.path.join(lm.run_dir, name)):
                shutil.copyfile(os.path.join(lm.run_dir, name), os.path.join(out_dir, name))
        cfg = dataclasses.replace(cfg, init_from="")
        checkpoint.save_weights(out_dir, jax.device_get(params), cfg)
        with open(os.path.join(out_dir, "config.json"), "w") as f:
            json.dump(checkpoint.portable(cfg.to_dict(), out_dir), f, indent=2, sort_keys=True)
    except OSError as e:
        raise ConversionError(f"cannot write {out_dir!r}: {e.strerror or e}") from None
    if verbose:
        print(f"wrote {out_dir}: a {cfg.task} run of {lm.source} ({count(params):,} params, step 0); read it with "
              f"zoo.load({out_dir!r})")
