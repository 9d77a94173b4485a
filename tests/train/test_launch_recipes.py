"""The launch recipes users copy (configs/launch/), run dry: `--print-config` under a fake two-host
environment makes train.py print the config and the jax.distributed plan of each process (which process of how
many, which coordinator) and start nothing. SLURM's `srun` and gcloud's `tpu-vm ssh --worker=all` are stand-ins
on PATH that start the command twice, as the real ones would on two hosts."""

import json
import os
import subprocess

import pytest

from tests.helpers.processes import ROOT

LAUNCH = os.path.join(ROOT, "configs", "launch")
FAKE_SRUN = """#!/usr/bin/env bash
# srun on a 2-node job: the command once per node, with the variables SLURM sets
[ "$1" = --kill-on-bad-exit=1 ] && shift
for i in 0 1; do SLURM_JOB_ID=4242 SLURM_STEP_NODELIST='gpu[007-008]' SLURM_NTASKS=2 SLURM_PROCID=$i SLURM_LOCALID=0 "$@" || exit; done
"""
FAKE_GCLOUD = """#!/usr/bin/env bash
# gcloud compute tpus tpu-vm ssh NAME --zone Z --worker=all --command=CMD: CMD once per worker of a 2-host slice
for a in "$@"; do case $a in --command=*) cmd=${a#--command=};; esac; done
for i in 0 1; do JAX_COORDINATOR_ADDRESS=10.0.0.2:8476 JAX_NUM_PROCESSES=2 JAX_PROCESS_ID=$i bash -c "$cmd" || exit; done
"""


def fake(tmp_path, name, text):
    path = tmp_path / "bin" / name
    path.parent.mkdir(exist_ok=True)
    path.write_text(text)
    path.chmod(0o755)
    return str(path.parent)


def dry(script, args, tmp_path, env=()):
    """(configs printed, plan lines) of `bash configs/launch/SCRIPT ARGS --print-config`."""
    inherited = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "JAX_COORDINATOR", "JAX_NUM_P",
                                                                          "JAX_PROCESS"))}
    env = {**inherited, "JAX_PLATFORMS": "cpu", "PYTHONPATH": ROOT, **dict(env)}
    # submitted from the repository's root, as the recipes' usage lines show
    out = subprocess.run(["bash", os.path.join(LAUNCH, script), "configs/gpt_tiny.py", str(tmp_path / "run"), *args,
                          "--print-config"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    configs = [json.loads(block) for block in out.stdout.replace("}\n{", "}\x00{").split("\x00")]
    plans = sorted(line for line in out.stderr.splitlines() if line.startswith("jax.distributed:"))
    return configs, plans


def test_every_recipe_parses():
    for name in os.listdir(LAUNCH):
        assert subprocess.run(["bash", "-n", os.path.join(LAUNCH, name)]).returncode == 0, name


def test_the_local_recipe_starts_process_0_and_1_on_one_coordinator(tmp_path):
    configs, plans = dry("local_two_process.sh", ["--set", "train.steps=7"], tmp_path, {"PORT": "23456"})
    assert [c["train"]["steps"] for c in configs] == [7, 7]
    assert plans == [f"jax.distributed: process {i} of 2, coordinator 127.0.0.1:23456 (flags or JAX_* variables)"
                     for i in (0, 1)]


def test_the_slurm_recipe_leaves_the_start_to_jax_s_own_detection(tmp_path):
    path = fake(tmp_path, "srun", FAKE_SRUN)
    configs, plans = dry("slurm_gpu.sbatch", [], tmp_path, {"PATH": f"{path}:{os.environ['PATH']}"})
    assert len(configs) == 2
    port = 4242 % 2 ** 12 + 65535 - 2 ** 12 + 1  # jax's own choice for the job id
    assert plans == [f"jax.distributed: process {i} of 2, coordinator gpu007:{port} (detected by jax: slurm)"
                     for i in (0, 1)]


def test_the_tpu_recipe_runs_the_same_command_on_every_worker(tmp_path):
    path = fake(tmp_path, "gcloud", FAKE_GCLOUD)
    env = {"PATH": f"{path}:{os.environ['PATH']}", "TPU": "my-v5e-16", "ZONE": "us-west4-a", "REPO": ROOT}
    configs, plans = dry("tpu_pod.sh", ["--set", "optim.lr=3e-4"], tmp_path, env)
    assert [c["optim"]["lr"] for c in configs] == [3e-4, 3e-4]
    assert plans == [f"jax.distributed: process {i} of 2, coordinator 10.0.0.2:8476 (flags or JAX_* variables)"
                     for i in (0, 1)]
    missing = subprocess.run(["bash", os.path.join(LAUNCH, "tpu_pod.sh"), "c.py", "w"], capture_output=True, text=True,
                             env={k: v for k, v in env.items() if k != "TPU"})
    assert missing.returncode != 0 and "set TPU to the name of the pod slice" in missing.stderr


@pytest.mark.parametrize("script", ["local_two_process.sh", "slurm_gpu.sbatch", "tpu_pod.sh"])
def test_a_recipe_without_its_arguments_says_how_to_call_it(script):
    out = subprocess.run(["bash", os.path.join(LAUNCH, script)], capture_output=True, text=True)
    assert out.returncode != 0 and "usage:" in out.stderr


def test_an_installed_mpi4py_is_no_cluster(monkeypatch):
    """jax's mpi4py detection is opt-in (present wherever the package is installed, as on NVIDIA's images): a plain
    run on such a machine is one process, not one waiting for a coordinator nobody named."""
    from jax._src import clusters

    from zoo import distributed
    for name in ("SLURM_JOB_ID", "OMPI_MCA_orte_hnp_uri", "TPU_WORKER_HOSTNAMES", "KUBERNETES_SERVICE_HOST"):
        monkeypatch.delenv(name, raising=False)
    mpi = [c for c in clusters.ClusterEnv._cluster_types if c.opt_in_only_method]
    assert mpi, "jax has no opt-in cluster detection any more: drop this test"
    for c in mpi:
        monkeypatch.setattr(c, "is_env_present", classmethod(lambda cls: True))
    assert not distributed._detected()
    assert distributed.plan(None) is None
