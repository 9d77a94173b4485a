"""`--set section.field=value` overrides, type-checked against a Config (apply_overrides), and config files read
by their `get_config()` (load_config_file)."""

from __future__ import annotations

import dataclasses
import types
import typing

from zoo.configuration import Config, _check
from zoo.errors import ConfigError
from zoo.models import FAMILIES


def _parse_value(key: str, text: str, typ):
    origin = typing.get_origin(typ)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(typ) if a is not type(None)]
        if text.lower() in ("none", "null"):
            return None
        typ = args[0]
    try:
        if typ is bool:
            low = text.lower()
            if low not in ("true", "false", "1", "0", "yes", "no"):
                raise ValueError
            return low in ("true", "1", "yes")
        if typ is int:
            return int(float(text)) if "e" in text.lower() and float(text).is_integer() else int(text)
        if typ is float:
            return float(text)
        if typ is str:
            return text
    except ValueError:
        raise ConfigError(f"--set {key}={text!r}: expected a value of type {typ.__name__}") from None
    raise ConfigError(f"--set {key}: fields of type {typ} cannot be set from the command line")


def _assignment(cfg: Config, assignment: str):
    """One `section.field=value` (or `field=value` for a top-level field) checked and parsed against
    `cfg`: (section or None, field, value)."""
    if "=" not in assignment:
        raise ConfigError(f"--set {assignment!r}: expected key=value, e.g. optim.lr=3e-4")
    key, text = assignment.split("=", 1)
    parts = key.strip().split(".")
    top = {f.name: f for f in dataclasses.fields(cfg)}
    if len(parts) == 1:
        name = parts[0]
        leaves = [n for n, f in top.items() if not dataclasses.is_dataclass(getattr(cfg, n))]
        _check(name in leaves, f"unknown config key {key!r}; valid top-level keys: {', '.join(leaves)} "
               f"(sections: {', '.join(n for n in top if n not in leaves)})")
        if name == "task":  # another task of the same family (bert_mlm -> bert_cls); the model stays
            tasks = FAMILIES[cfg.model.family].tasks
            _check(text in tasks, f"--set task={text!r}: a {cfg.model.family} model trains as one of {', '.join(tasks)}")
        return None, name, _parse_value(key, text, typing.get_type_hints(Config)[name])
    _check(len(parts) == 2 and parts[0] in top and dataclasses.is_dataclass(getattr(cfg, parts[0])),
           f"unknown config key {key!r}; sections: "
           f"{', '.join(n for n in top if dataclasses.is_dataclass(getattr(cfg, n)))}")
    section, name = parts
    sub = getattr(cfg, section)
    fields = {f.name: f for f in dataclasses.fields(sub)}
    _check(name in fields, f"unknown config key {key!r}; valid keys in {section}: {', '.join(fields)}")
    return section, name, _parse_value(key, text, typing.get_type_hints(type(sub))[name])


def override(cfg: Config, assignment: str) -> Config:
    """Apply one `section.field=value` (or `field=value` for top-level fields) to a config."""
    return apply_overrides(cfg, [assignment])


def apply_overrides(cfg: Config, assignments) -> Config:
    """Apply `section.field=value` assignments (a later one of the same key wins). Each section's fields
    change together and are checked once, so that `model.num_heads=9 model.num_kv_heads=3` holds although
    9 heads alone would not fit the file's 2 key/value heads."""
    top, sections = {}, {}
    for a in assignments or ():
        section, name, value = _assignment(cfg, a)
        (top if section is None else sections.setdefault(section, {}))[name] = value
    changed = {section: dataclasses.replace(getattr(cfg, section), **fields) for section, fields in sections.items()}
    out = dataclasses.replace(cfg, **top, **changed) if top or changed else cfg
    lora_only = sorted({"lora_targets", "lora_alpha", "lora_dropout"} & set(sections.get("model", {})))
    if lora_only and not getattr(out.model, "lora_rank", 1):
        raise ConfigError(f"model.{lora_only[0]} is set but model.lora_rank=0 (no adapters): set model.lora_rank=N "
                          f"(e.g. 8) too")
    return out


def load_config_file(path: str) -> Config:
    """Run `get_config()` of a config file such as configs/gpt_tiny.py."""
    import importlib.machinery
    import importlib.util
    import os
    if os.path.isdir(path):
        raise ConfigError(f"config file {path!r} is a directory; give a .py file such as configs/gpt_tiny.py")
    if not os.path.isfile(path):
        raise ConfigError(f"config file {path!r} does not exist (see configs/ for the shipped ones)")
    if not path.endswith(".py"):
        raise ConfigError(f"config file {path!r} is not a Python file (.py) with a get_config() function")
    name = f"zoo_config_{os.path.basename(path)[:-3]}"
    module = importlib.util.module_from_spec(importlib.util.spec_from_loader(
        name, importlib.machinery.SourceFileLoader(name, path)))
    try:
        module.__loader__.exec_module(module)
    except SystemExit as e:
        raise ConfigError(f"config file {path!r} called sys.exit({e.code!r}) while loading; a config file only "
                          f"defines get_config()") from None
    except SyntaxError as e:
        raise ConfigError(f"config file {path!r} line {e.lineno}: syntax error ({e.msg})") from None
    except Exception as e:  # an exception while the file runs: name the file and the first line of it
        raise ConfigError(f"config file {path!r} failed to run: {type(e).__name__}: {e}") from None
    if not hasattr(module, "get_config"):
        raise ConfigError(f"config file {path!r} has no get_config() function")
    try:
        cfg = module.get_config()
    except ConfigError:
        raise
    except SystemExit as e:
        raise ConfigError(f"config file {path!r}: get_config() called sys.exit({e.code!r}); it must return a "
                          f"zoo.configuration.Config") from None
    except Exception as e:
        raise ConfigError(f"config file {path!r}: get_config() failed: {type(e).__name__}: {e}") from None
    if not isinstance(cfg, Config):
        raise ConfigError(f"config file {path!r}: get_config() returned {type(cfg).__name__}, not a zoo.configuration.Config")
    return cfg
