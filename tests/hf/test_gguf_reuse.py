"""A fine-tune from a GGUF file converts it once (issue #54): into zoo.load's cache (ZOO_CACHE_DIR), which every
later run's WORKDIR/base is linked from, with the same params; a conversion that fails midway leaves neither a
cache entry nor a workdir, and the next run converts whole. The converter is counted, not run: transformers'
GGUF reader on SmolLM2 is tests/hf/test_smollm2.py's."""

import os
import shutil

import jax
import numpy as np
import pytest

from conftest import replace
from zoo.api import fine_tune
from zoo.hf import gguf
from zoo.sources import source
from zoo.training import runs, trainer


@pytest.fixture
def fake_gguf(tiny_cfg, tmp_path, monkeypatch):
    """(a .gguf path, the list of conversions made): the converter writes a one-step tiny GPT run."""
    monkeypatch.setenv("ZOO_CACHE_DIR", str(tmp_path / "zoo-cache"))
    made = tmp_path / "made"
    trainer.train(replace(tiny_cfg, train=dict(steps=1, save_every=1)), str(made), quiet=True)
    src = tmp_path / "model.gguf"
    src.write_bytes(b"GGUF stand-in")
    calls = []

    def convert(path, run_dir, *, verbose=True):
        calls.append((path, run_dir))
        if os.environ.get("FAIL_CONVERSION"):
            os.makedirs(os.path.join(run_dir, "checkpoints"))  # half written, then the failure
            raise KeyboardInterrupt
        shutil.copytree(made, run_dir)
        return {}
    monkeypatch.setattr(gguf, "from_gguf", convert)
    return str(src), calls


def params(run):
    return jax.tree.leaves(jax.device_get(runs.load_params(run)))


def test_a_second_run_from_the_same_gguf_links_the_cached_conversion(fake_gguf, tmp_path, capsys):
    src, calls = fake_gguf
    cfg1, base1 = fine_tune.base_run(source(src), str(tmp_path / "one"))
    assert len(calls) == 1 and os.path.isdir(os.path.join(source(src).cache, "checkpoints"))
    assert f"base: linked from {source(src).cache}, zoo's conversion of {src} (converted now, in " in \
        capsys.readouterr().out
    cfg2, base2 = fine_tune.base_run(source(src), str(tmp_path / "two"))
    assert len(calls) == 1  # not converted again
    assert "(made earlier by zoo.load or a run: nothing converted)" in capsys.readouterr().out
    assert cfg1 == cfg2 and fine_tune.converted(str(tmp_path / "two")) == os.path.abspath(src)
    for a, b in zip(params(base1), params(base2), strict=True):
        np.testing.assert_array_equal(a, b)
    # The files are the cache's own (hard links), and the run's marker is not written into the cache.
    cached = os.path.join(source(src).cache, "config.json")
    assert os.stat(cached).st_ino == os.stat(os.path.join(base2, "config.json")).st_ino
    assert not os.path.exists(os.path.join(source(src).cache, fine_tune.CONVERTED))
    # zoo.load reads the same conversion: nothing converted either.
    fine_tune.base_run(source(src), str(tmp_path / "x"), dry=True)
    assert len(calls) == 1


def test_a_conversion_failing_midway_leaves_no_cache_entry_and_the_next_run_converts(fake_gguf, tmp_path,
                                                                                      monkeypatch):
    src, calls = fake_gguf
    monkeypatch.setenv("FAIL_CONVERSION", "1")
    with pytest.raises(KeyboardInterrupt):
        fine_tune.base_run(source(src), str(tmp_path / "one"))
    assert not os.path.exists(source(src).cache) and not os.path.exists(tmp_path / "one")
    assert os.listdir(os.path.dirname(source(src).cache)) == []  # no temporary directory left either
    monkeypatch.delenv("FAIL_CONVERSION")
    base = fine_tune.base_run(source(src), str(tmp_path / "one"))[1]
    assert len(calls) == 2 and params(base)
