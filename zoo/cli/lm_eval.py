"""lm-evaluation-harness's own command line with zoo's model registered: `--model zoo` scores a zoo run (or a
Hugging Face checkpoint directory) with zoo's jitted forward pass and KV-cache decoding (zoo.harness).

    zoo-lm-eval --model_args run=runs/x --tasks hellaswag,arc_easy --batch_size 16
    zoo-lm-eval --model_args run=runs/x,stride=512 --tasks wikitext --limit 50
    zoo-lm-eval --model_args run=runs/x --tasks my_task --include_path my_tasks/   # a local task YAML
    zoo-lm-eval ls tasks                                                           # the task names

Every flag is lm_eval's (`lm_eval --help`); `--model` defaults to zoo here, and with it `--batch_size` to 8
(the harness's default is 1). A plain `lm_eval --model zoo`
does not work: the harness finds models through its own table, not through installed entry points. Bad
model_args (an unknown key, a missing run, a batch_size, stride or max_length out of range, a run of another
family) end in one `error:` line with exit code 2, checked before the harness spends its seconds indexing its
tasks and loading the run; so does a task name the harness does not know.
"""

from __future__ import annotations

import argparse
import sys

from zoo import runtime
from zoo.cli import error


def _model_args(argv: list[str]) -> tuple[dict | None, str | None]:
    """(--model_args as the harness parses them when --model is zoo, else None; --batch_size, where given)."""
    from lm_eval._cli.utils import MergeDictAction
    ap = argparse.ArgumentParser(add_help=False)
    ap.add_argument("--model", default="zoo")
    ap.add_argument("--model_args", "-a", nargs="+", action=MergeDictAction, default=None)
    ap.add_argument("--batch_size", "-b", default=None)
    a, _ = ap.parse_known_args(argv)
    return ((a.model_args or {}) if a.model == "zoo" else None), a.batch_size


def _unknown_task(e: ValueError, argv: list[str]) -> str | None:
    """The one line for the harness's "Tasks not found: a, b" (None for any other ValueError)."""
    prefix = "Tasks not found: "
    if not str(e).startswith(prefix):
        return None
    names = str(e)[len(prefix):]
    local = any(a == "--include_path" or a.startswith("--include_path=") for a in argv)
    return (f"--tasks: {names}: no such task in lm_eval's index{' nor under --include_path' if local else ''}; list "
            f"the valid names with `zoo-lm-eval ls tasks` (a task of your own: --include_path DIR of its YAML)")


def main(argv=None) -> int:
    runtime.prepare_command()  # the compilation cache, XLA's log level: before jax starts
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] not in ("ls", "validate", "-h", "--help") and not any(
            a == "--model" or a.startswith("--model=") for a in argv):
        at = 1 if argv[0] == "run" else 0
        argv[at:at] = ["--model", "zoo"]
        if "-b" not in argv and not any("batch_size" in a for a in argv):  # nor --batch_size, nor in model_args
            argv[at:at] = ["--batch_size", "8"]  # the harness's default is 1: a batch of one row
    from zoo import accel
    from zoo.errors import ConfigError, ZooError
    accel.configure()  # XLA's GPU flags, before anything starts jax's backend
    from zoo import harness  # registers --model zoo
    old, sys.argv = sys.argv, ["zoo-lm-eval", *argv]  # the harness's parser reads sys.argv itself
    try:
        args, batch_size = _model_args(argv[1:] if argv[:1] == ["run"] else argv)
        if args is not None:  # before the harness indexes its tasks and loads the run (seconds)
            harness.check_model_args(args, batch_size)  # (the default 8 above comes only without one)
        from lm_eval.__main__ import cli_evaluate
        try:
            cli_evaluate()
        except ValueError as e:
            if isinstance(e, ZooError) or _unknown_task(e, argv) is None:
                raise
            raise ConfigError(_unknown_task(e, argv)) from None
    except ZooError as e:
        return error(e)
    finally:
        sys.argv = old
    return 0


if __name__ == "__main__":
    sys.exit(main())
