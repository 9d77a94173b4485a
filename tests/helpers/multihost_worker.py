"""One process of a two-process run on 127.0.0.1 (4 CPU devices each, 8 in all), through JAX's own
distributed runtime. Used by tests/train/test_multihost.py: python multihost_worker.py PID PORT WORKDIR CFG_JSON"""

import os
import sys

os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=4"
os.environ["JAX_PLATFORMS"] = "cpu"

import jax  # noqa: E402

pid, port, workdir, cfg_json = int(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4]
jax.config.update("jax_cpu_collectives_implementation", "gloo")
jax.distributed.initialize(coordinator_address=f"127.0.0.1:{port}", num_processes=2, process_id=pid)

import numpy as np  # noqa: E402
from jax.experimental import multihost_utils  # noqa: E402

from zoo.train import trainer  # noqa: E402
from zoo.config import load_json  # noqa: E402

out = trainer.train(load_json(cfg_json), workdir, progress=False)
params = multihost_utils.process_allgather(out["state"].params, tiled=True)
if pid == 0:
    flat = {jax.tree_util.keystr(p): np.asarray(v) for p, v in jax.tree_util.tree_flatten_with_path(params)[0]}
    np.savez(os.path.join(workdir, "params.npz"), **flat)
