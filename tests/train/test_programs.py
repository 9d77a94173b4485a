"""A second run of a config in the same process takes the programs the first compiled (zoo.training.programs): it
traces and compiles no train step and trains the same numbers; another config, or a file the config names changed on
disk, compiles its own."""

import jax
import numpy as np
import pytest
from jax import monitoring

from conftest import replace
from tests.helpers.runs import run
from zoo.training import programs, trainer

COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"


class Compiles:
    """The names of the programs XLA compiles (or reads from the persistent cache) while it is entered."""

    def __init__(self):
        self.names, self.on = [], False
        monitoring.register_event_duration_secs_listener(self._seen)

    def _seen(self, event, seconds, fun_name="", **_):
        if self.on and event == COMPILE_EVENT:
            self.names.append(fun_name)

    def __enter__(self):
        self.names, self.on = [], True
        return self

    def __exit__(self, *exc):
        self.on = False


def lines(capsys) -> list[str]:
    return capsys.readouterr().out.splitlines()


def test_a_second_run_of_a_config_compiles_no_step_and_trains_the_same_numbers(tiny_cfg, tmp_path, capsys):
    cfg = replace(tiny_cfg, train=dict(steps=4, eval_every=2, eval_batches=2))
    kept = {"jit(train_step)", "jit(eval_step)", "jit(<lambda>)"}  # the step, the evaluation, the initialisation
    with Compiles() as seen:
        first = run(cfg, tmp_path / "a")
    assert "compiling the train step (batch 16 x 32)" in lines(capsys)
    assert kept <= set(seen.names)
    with Compiles() as seen:
        second = run(cfg, tmp_path / "b")
    said = lines(capsys)
    assert "the train step (batch 16 x 32) compiled by an earlier run of this config in this process: reused" in said
    assert not any(s.startswith("compiling the train step") for s in said)
    assert not kept & set(seen.names)  # none of them traced or compiled again
    for a, b in zip(jax.tree.leaves(jax.device_get(first["state"])), jax.tree.leaves(jax.device_get(second["state"]))):
        np.testing.assert_array_equal(a, b)
    assert second["setup"].task is not first["setup"].task  # each run its own task (its data, its host state)


def test_another_config_compiles_its_own_step(tiny_cfg, tmp_path, capsys):
    cfg = replace(tiny_cfg, train=dict(steps=2))
    run(cfg, tmp_path / "a")
    lines(capsys)
    run(replace(cfg, optim=dict(lr=3e-3)), tmp_path / "b")  # the schedule is traced into the step
    assert "compiling the train step (batch 16 x 32)" in lines(capsys)
    programs.forget()
    run(cfg, tmp_path / "c")
    assert "compiling the train step (batch 16 x 32)" in lines(capsys)


def test_a_file_the_config_names_changed_on_disk_is_another_key(tiny_cfg, tmp_path):
    mesh = trainer.sharding.make_mesh(tiny_cfg.mesh, jax.devices()[:1])
    path = tmp_path / "template.jinja"
    path.write_text("{{ messages }}")
    cfg = replace(tiny_cfg, data=dict(chat_template=str(path)))
    task = object()
    before = programs.key_of(cfg, mesh, False, task)
    assert programs.key_of(cfg, mesh, False, task) == before
    path.write_text("{{ messages }} changed")
    assert programs.key_of(cfg, mesh, False, task) != before
    # The token stores' directory grows as runs build them: not part of the key.
    (tmp_path / "store").mkdir()
    moved = replace(cfg, data=dict(cache_dir=str(tmp_path / "store")))
    key = programs.key_of(moved, mesh, False, task)
    (tmp_path / "store" / "new-store").mkdir()
    assert programs.key_of(moved, mesh, False, task) == key


def test_at_most_keep_configs_are_kept(monkeypatch):
    monkeypatch.setattr(programs, "KEEP", 2)
    for k in "abc":
        programs.keep(k, k)
    assert programs.get("a") is None
    assert programs.get("b") == "b"  # read: c is now the oldest
    programs.keep("d", "d")
    assert programs.get("c") is None and programs.get("b") == "b" and programs.get("d") == "d"


@pytest.fixture(autouse=True)
def none_kept():
    programs.forget()
    yield
    programs.forget()
