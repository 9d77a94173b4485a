"""Two processes on 127.0.0.1 (jax.distributed, 4 CPU devices each) train exactly like one process
with 8 devices: each process feeds only its rows of the global batch."""

import json
import os
import socket
import subprocess
import sys

import jax
import numpy as np
import pytest

from conftest import replace
from zoo.train import trainer

TESTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_two_processes_match_one_process_with_eight_devices(tiny_cfg, tmp_path):
    cfg = replace(tiny_cfg, train=dict(steps=3))
    cfg_path = tmp_path / "cfg.json"
    cfg_path.write_text(cfg.to_json())
    work, port = tmp_path / "multi", str(free_port())
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([os.path.dirname(TESTS), os.environ.get("PYTHONPATH", "")])}
    procs = [subprocess.Popen([sys.executable, os.path.join(TESTS, "helpers", "multihost_worker.py"), str(i), port,
                               str(work), str(cfg_path)], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True) for i in range(2)]
    outs = [p.communicate(timeout=300)[0] for p in procs]
    assert all(p.returncode == 0 for p in procs), outs[0][-3000:] + outs[1][-3000:]
    single = trainer.train(cfg, str(tmp_path / "single"), progress=False)
    assert single["setup"].mesh.devices.size == 8
    multi = np.load(work / "params.npz")
    flat = jax.tree_util.tree_flatten_with_path(jax.device_get(single["state"].params))[0]
    assert set(multi.files) == {jax.tree_util.keystr(p) for p, _ in flat}
    for p, v in flat:
        np.testing.assert_allclose(multi[jax.tree_util.keystr(p)], v, rtol=1e-5, atol=1e-6)
    losses = lambda d: [r["loss"] for r in map(json.loads, open(d / "metrics.jsonl"))]
    assert losses(work) == pytest.approx(losses(tmp_path / "single"), rel=1e-5)
    assert sorted(os.listdir(work / "checkpoints")) == [".checksummed", "3"]  # one step, written by both processes
