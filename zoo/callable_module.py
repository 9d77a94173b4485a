"""Modules that are also functions. `zoo.train` is the package of the trainer and `zoo.config` the module of
Config, and both names are the library's calls too: zoo.train(...) trains (zoo.api.training.train) and
zoo.config(...) builds a checked Config (zoo.api.training.config), as the README writes them. A module made
callable here keeps every attribute it has (zoo.train.trainer, zoo.config.Config); calling it imports its
target on first use."""

from __future__ import annotations

import importlib
import sys
import types


def make_callable(module_name: str, target: str) -> None:
    """Calling the module `module_name` calls `target` ("package.module:function") with the same arguments."""
    mod, _, attr = target.partition(":")

    class CallableModule(types.ModuleType):
        def __call__(self, *args, **kwargs):
            return getattr(importlib.import_module(mod), attr)(*args, **kwargs)

    CallableModule.__call__.__doc__ = f"{module_name}(...) is {mod}.{attr}(...); see its docstring."
    sys.modules[module_name].__class__ = CallableModule
