"""The programs a run traces and compiles (its state's initialisation, the train step compiled for its first batch, the
eval step), kept for the next run of the same config in the same process: a resume after a stop, `zoo.train` called
again in a notebook, a fine-tune started twice. That run's start traces, lowers and compiles nothing (a tiny model's
three programs took 5-10 s of a 2-core machine to trace and compile; a 124M GPT's take a minute).

A config's programs are its config's alone: the key is the whole config (zoo.configuration.Config.to_dict), the
devices and mesh, the task's class, jax's trace context (what jax's own caches key on: x64, matmul precision, ...) and
the files the config names as they are on disk now (a base run given to init_from that saved another step, a
tokenizer file rewritten). What a task learns from its data (labels, the base's replayed answers, DPO's reference
log-probabilities) is host data a run keeps in its own task object, never traced: each run still builds its own task.

Like jax.jit's cache, this one cannot see a module's code patched in place (a test's monkeypatch of a function the
step traces): `forget()` drops every kept program. The newest KEEP configs are kept.
"""

from __future__ import annotations

import collections
import json
import os

import jax

KEEP = 4
_kept: collections.OrderedDict = collections.OrderedDict()  # key -> zoo.training.trainer.Setup (its programs dict)
SKIP_PATHS = ("data.cache_dir",)  # token stores: built by the first run, their directory's listing grows


def forget() -> None:
    """Drop every kept program: the next run of any config traces and compiles its own."""
    _kept.clear()


def key_of(cfg, mesh, abstract_base: bool, task):
    """What a kept setup's programs depend on (a hashable tuple)."""
    try:
        from jax._src import config as jax_config
        context = jax_config.trace_context()
    except (ImportError, AttributeError):  # a jax without it: no reuse across changed jax settings is assumed
        context = None
    d = cfg.to_dict()
    # The device objects themselves: a process's own devices are the same objects run after run; a compile-only
    # topology's (zoo.aot) are new ones each time, so its programs are never taken for another topology's.
    return (json.dumps(d, sort_keys=True, default=repr), tuple(mesh.devices.flat), tuple(mesh.devices.shape),
            tuple(mesh.axis_names), abstract_base, type(task), repr(context), tuple(_on_disk(d)))


def get(key):
    """The setup kept for `key` (made the newest), or None."""
    if key not in _kept:
        return None
    _kept.move_to_end(key)
    return _kept[key]


def keep(key, setup) -> None:
    _kept[key] = setup
    _kept.move_to_end(key)
    while len(_kept) > KEEP:
        _kept.popitem(last=False)


def once(kept: dict, name: str, make):
    """kept[name], made by make() the first time it is asked for."""
    if name not in kept:
        kept[name] = make()
    return kept[name]


def _on_disk(d: dict, prefix: str = ""):
    """(name, what is on disk) of every string the config holds that names an existing file or directory: a file's
    size and modification time; a directory's listing and its config.json's time (a run directory: init_from)."""
    for k, v in sorted(d.items()):
        name = f"{prefix}{k}"
        if isinstance(v, dict):
            yield from _on_disk(v, name + ".")
        elif isinstance(v, str) and v and name not in SKIP_PATHS:
            path = os.path.expanduser(v)
            try:
                if os.path.isfile(path):
                    st = os.stat(path)
                    yield name, st.st_size, st.st_mtime_ns
                elif os.path.isdir(path):
                    conf = os.path.join(path, "config.json")
                    yield name, tuple(sorted(os.listdir(path))), os.stat(conf).st_mtime_ns if os.path.isfile(conf) else 0
            except OSError:  # unreadable, or gone in between: no reuse for this config
                yield name, object()


def batch_key(*trees):
    """The shapes, dtypes and shardings of `trees`' leaves, with their structure: the program a jitted function
    compiles for them."""
    leaves, treedef = jax.tree.flatten(trees)
    return treedef, tuple((getattr(x, "shape", None), str(getattr(x, "dtype", type(x))), getattr(x, "sharding", None))
                          for x in leaves)
