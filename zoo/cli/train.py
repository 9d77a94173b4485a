"""`train.py` / `zoo-train`: parse the command line and call zoo.train (zoo.api.training), which resolves the
config and runs the trainer; print its summary.

    train.py CONFIG [--workdir DIR] [--set key=value ...]
    train.py --init-from RUN_OR_HF_DIR [CONFIG] [--workdir DIR] [--set key=value ...]
    train.py --resume DIR [--step N] [--new-batch] [--set key=value ...]

--init-from fine-tunes a checkpoint without a config file of its own: the model config, tokenizer and
task come from the checkpoint (a zoo run, or a Hugging Face directory, GGUF file or PEFT LoRA adapter
directory, converted first into WORKDIR/base); data, optim, train and mesh from CONFIG if given, else
zoo's fine-tuning defaults (zoo.api.fine_tune.FINE_TUNE, printed) and the checkpoint's data. An adapter
becomes a zoo LoRA run on its base (zoo.hf.peft; a Hugging Face base is converted into WORKDIR/base/base), so fine-tuning starts from the base with the adapter merged and trains
fresh adapters of the adapter's rank and targets (--set model.lora_rank=0: every weight). A
bare BERT encoder trains as bert_mlm, or as bert_cls when --set names data.label_column,
data.text_pair_column or data.label_names (model.num_classes: the labels' count unless set); --set
task=... picks any task of the model's family (a CONFIG's own task, when it is one). The data is checked before
anything is converted or built, and a run that fails before its first step leaves no workdir behind, so the
corrected command can run again. A SIGTERM or Ctrl-C before the first step ends in one line (exit 128 + the
signal) and keeps a converted base; the same command, run again, goes on from it (so does one killed with
kill -9), and --resume of a run that never saved starts it again from step 0.
"""

from __future__ import annotations

import argparse
import sys

from zoo import distributed, runtime
from zoo.api import configs
from zoo.cli import BAD_INPUT, error


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
    ap.add_argument("--compile-for", metavar="TARGET",
                    help="compile this run's train step for a TPU topology (v5e:2x2, v5p-16, v5e-8/2 for 2 slices) "
                         "with libtpu's compile-only client and print its memory, FLOPs, collectives, kernels and an "
                         "estimated step time instead of training (pip install 'zoo[tpu]')")
    ap.add_argument("--json", action="store_true", help="with --compile-for: the report as one JSON object")
    ap.add_argument("--largest-batch", action="store_true",
                    help="with --compile-for: also find the largest train.batch_size that fits (one compile each)")
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
    if (a.json or a.largest_batch) and not a.compile_for:
        ap.error("--json and --largest-batch go with --compile-for TARGET")
    if a.compile_for:
        a.print_config = True  # resolved as a dry run: nothing converted, no workdir made
    if a.new_batch and not a.resume:
        ap.error("--new-batch lets --resume DIR go on with another train.batch_size; give --resume DIR")
    return a


def workdir_of(a) -> str:
    """The run directory of parsed arguments (--resume's, --workdir, else runs/<name>-<time>)."""
    from zoo.api.training import default_workdir
    return a.resume or a.workdir or default_workdir(a.config, a.init_from)


def resolve(a):
    """(config, workdir, resume) of parsed arguments, as zoo.train resolves them (zoo.api.start)."""
    from zoo.api.start import start
    workdir = workdir_of(a)
    cfg = start(a.config, workdir=workdir, overrides=a.set, resume=bool(a.resume), init_from=a.init_from,
                step=a.step, new_batch=a.new_batch, dry=a.print_config).config
    return cfg, workdir, bool(a.resume)


def train_main(argv=None) -> int:
    runtime.prepare_command()  # the compilation cache, XLA's log level: before jax starts
    from zoo import accel
    accel.configure()  # XLA's GPU flags, before anything starts jax's backend
    a = parse(sys.argv[1:] if argv is None else argv)
    if a.list:
        print(configs.listing())
        return 0
    from zoo.errors import TrainError
    from zoo.training.workdir import check_free
    try:
        several = distributed.wanted(a)
        if several and a.print_config:  # a dry run (of a launch script): say what would start, start nothing
            sys.stderr.write(distributed.plan(a) + "\n")  # one write: processes started together share the stream
            sys.stderr.flush()
            several = False
        timeout = distributed.timeout_of(a, a.set, a.config and configs.find(a.config), a.resume) if several else 0
        if several:  # JAX's multi-process runtime, before any other jax call; process 0 alone takes the lock
            distributed.start(a, timeout)
        a.workdir = workdir_of(a) if not a.resume else None
        if not several:
            check_free(a.resume or a.workdir)  # a run in progress is named first, before anything is loaded
    except (TrainError, distributed.DistributedError, *BAD_INPUT) as e:
        return error(e)
    main = not several or _process_index() == 0
    distributed.hint = f"resume on every host: python train.py --resume {a.resume or a.workdir} (and the same flags)"
    try:
        return _run(a, several, main, timeout)
    finally:
        if several:  # process 0 holds the coordination service: it ends last, once every peer has said it ended
            distributed.finished()  # (a peer still shutting jax down when the service goes may crash on its way out)
            if main:
                distributed.linger()


def _run(a, several: bool, main: bool, timeout: int) -> int:
    """The run proper (or its --compile-for / --print-config), once the processes have started."""
    from zoo.errors import Interrupted, TrainError
    from zoo.api import training
    try:
        if a.compile_for:
            return _compile_for(a)
        if a.print_config:
            sys.stdout.write(resolve(a)[0].to_json() + "\n")  # one write, as the plan's line: a launch script's
            sys.stdout.flush()                                # processes share the stream (and may be unbuffered)
            return 0
        if several:  # the same settings on every process, compared before anything is built
            distributed.agree(settings(a), timeout)
        run = training.train(a.config, workdir=a.resume or a.workdir, overrides=a.set, resume=bool(a.resume),
                             init_from=a.init_from, step=a.step, new_batch=a.new_batch, quiet=a.quiet)
    except BaseException as e:
        if isinstance(e, (TrainError, distributed.DistributedError, *BAD_INPUT)):
            return error(e) if not isinstance(e, Interrupted) else stopped(e)
        if several:  # a collective that failed because a peer is gone: the watchdog names it and exits
            distributed.settle()
        raise
    if not main:
        return 0
    last = run.metrics
    # What the run's records hold: eval_ppl is absent for classification, eval_bleu/eval_exact_match seq2seq's.
    summary = ", ".join(f"{k}={last[k]:.4g}" for k in ("loss", "eval_loss", "eval_ppl", "eval_accuracy",
                                                      "eval_macro_f1", "eval_entity_f1", "eval_bleu",
                                                      "eval_exact_match", "tokens_per_s", "mfu")
                        if last.get(k) is not None)
    print(f"done: step {run.step} ({summary}); checkpoints and metrics.jsonl in {run.workdir}")
    cfg = run.config
    if cfg.train.sample_tokens and not run.interrupted:
        prompt = cfg.train.sample_prompt
        if cfg.model.family == "gpt":  # the decoders: a continuation (an answer, for a chat run)
            lm, kw = run.load(), dict(max_new_tokens=cfg.train.sample_tokens, temperature=0.8, top_k=40, seed=0)
            text = lm.chat(prompt, **kw) if cfg.task == "sft" else lm.generate(prompt, **kw)
            print(f"sample (temperature 0.8, top-k 40):\n{prompt}{text}")
    return 0


def _compile_for(a) -> int:
    """--compile-for TARGET: the report of the run's train step compiled for TARGET (zoo.aot), nothing trained."""
    import json
    from zoo.aot import report, train as aot
    out = aot.compile_for(resolve(a)[0], a.compile_for, largest_batch=a.largest_batch)
    print(json.dumps(out) if a.json else report.text(out))
    return 0


def stopped(e) -> int:
    """A run a signal stopped before its loop (zoo.errors.Interrupted): its one line, and the exit code a shell
    gives a process that signal ended (143 for SIGTERM, 130 for Ctrl-C)."""
    print(e, file=sys.stderr, flush=True)
    return 128 + e.signal


def settings(a) -> dict:
    """What every process of a run must be given alike, flat ("model.d_model": 64, "workdir": ...): the config
    resolved from the config file or the resumed run's config.json with the --set overrides (a fine-tune from
    --init-from alone: its source and the overrides as given), the workdir and the resume's --step and
    --new-batch. Cheap and silent (nothing converted, built or printed); a config that does not resolve is its
    error's text, the same on every process given the same command (the run itself then reports it)."""
    import json
    import os
    from zoo.api import training
    from zoo.configuration import from_dict
    from zoo.overrides import apply_overrides
    out = {"workdir": a.resume or a.workdir, "init_from": a.init_from, "step": a.step,
           "new_batch": a.new_batch}
    try:
        if a.resume:
            with open(os.path.join(a.resume, "config.json")) as f:
                cfg = apply_overrides(from_dict(json.load(f)), a.set)
        elif a.config:
            cfg = training.config(a.config, a.set)
        else:
            return {**out, "--set": list(a.set)}
        return {**out, **_flat(json.loads(cfg.to_json()))}
    except Exception as e:
        return {**out, "config": f"{type(e).__name__}: {e}"}


def _flat(d: dict, prefix: str = "") -> dict:
    """A nested dict (a config's JSON) as {"section.field": value}."""
    out = {}
    for k, v in d.items():
        if isinstance(v, dict) and v:
            out.update(_flat(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def _process_index() -> int:
    import jax
    return jax.process_index()


main = train_main  # every zoo.cli module's entry point is `main`

if __name__ == "__main__":
    sys.exit(main())
