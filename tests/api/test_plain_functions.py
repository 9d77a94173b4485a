"""zoo.train and zoo.config are plain functions (issue #53 item 2): help() shows their signatures and the override
sections; the trainer's package (zoo.training) and Config's module (zoo.configuration) are ordinary modules that
importing leaves zoo.train and zoo.config as they were."""

import importlib
import inspect
import pydoc
import types

import zoo


def test_zoo_train_and_config_are_functions_with_their_signatures_in_help():
    import zoo.training.trainer  # noqa: F401  (a submodule of the trainer's package, imported first)
    import zoo.configuration  # noqa: F401
    assert inspect.isfunction(zoo.train) and inspect.isfunction(zoo.config)
    assert zoo.train is importlib.import_module("zoo.api.training").train
    assert zoo.config is importlib.import_module("zoo.api.training").config
    assert isinstance(zoo.training, types.ModuleType) and isinstance(zoo.configuration, types.ModuleType)
    assert type(zoo.training) is types.ModuleType and type(zoo.configuration) is types.ModuleType
    text = pydoc.render_doc(zoo.train, renderer=pydoc.plaintext)
    assert "train(config=None, *, workdir" in text and "overrides" in text
    for section in ("model.*", "data.*", "optim.*", "train.*", "mesh.*", "dpo.*", "grpo.*", "embed.*"):
        assert section in text, section
    assert "config(" in pydoc.render_doc(zoo.config, renderer=pydoc.plaintext)


def test_zoo_config_builds_a_config_of_the_configuration_module():
    cfg = zoo.config("gpt_tiny", train={"steps": 3})
    assert isinstance(cfg, zoo.configuration.Config) and cfg.train.steps == 3
