"""Fault injection: damaged checkpoints fall back to the previous step, a diverged run never saves a
non-finite state, one run per workdir, and a failed save ends the run in seconds with one line."""

import glob
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time

import jax
import numpy as np
import pytest

from conftest import replace
from tests.helpers.processes import config_file
from tests.helpers.runs import run
from zoo.cli import train as train_cli
from zoo.cli.train import train_main
from zoo.errors import CheckpointError, TrainError
from zoo.training import checkpoint, orbax_errors, runs, trainer
from zoo.training.checksums import fingerprint

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture(scope="module")
def base(tmp_path_factory, cache_dir):
    """(cfg, workdir) of a 4-step tiny GPT run checkpointed at steps 2 and 4; copy it before damaging it."""
    from tests.helpers import tiny_configs
    cfg = replace(tiny_configs.gpt_lm(cache_dir), train=dict(steps=4, save_every=2, keep=5))
    work = str(tmp_path_factory.mktemp("faults") / "base")
    run(cfg, work)
    return cfg, work


def copy_of(base, tmp_path) -> str:
    work = str(tmp_path / "run")
    shutil.copytree(base[1], work)
    return work


def biggest_array_file(step_dir: str, item: str = "params") -> str:
    return max(glob.glob(f"{step_dir}/{item}/ocdbt.process_0/d/*"), key=os.path.getsize)


def _truncate(path):
    with open(path, "r+b") as f:
        f.truncate(os.path.getsize(path) // 2)


def _scribble(path):  # 64 random bytes in the middle of an array file
    with open(path, "r+b") as f:
        f.seek(os.path.getsize(path) // 2)
        f.write(np.random.default_rng(0).bytes(64))


def _alter_digest(step_dir):  # the arrays intact, their recorded checksum off by one: a mismatch for sure
    path = f"{step_dir}/digest/metadata"
    with open(path) as f:
        digest = json.load(f)
    digest["params"]["['wte']['embedding']"] ^= 1
    with open(path, "w") as f:
        json.dump(digest, f)


def _widen_config(step_dir):  # the step's config edited to another model width: it no longer describes its arrays
    path = f"{step_dir}/config/metadata"
    with open(path) as f:
        cfg = json.load(f)
    cfg["model"]["d_model"] *= 2
    with open(path, "w") as f:
        json.dump(cfg, f)


SCRIBBLED = r"does not match its saved checksum|missing or truncated"
DAMAGE = {  # what happens to step 4 -> the one-line reason (a regex)
    "truncated params data": (lambda d: _truncate(biggest_array_file(d)), re.escape("missing or truncated")),
    # Random bytes land in a chunk's data (the file still parses: the checksum catches it) or in its
    # framing (tensorstore refuses it): either way the step is refused.
    "random bytes in params": (lambda d: _scribble(biggest_array_file(d)), SCRIBBLED),
    "random bytes in optimizer state": (lambda d: _scribble(biggest_array_file(d, "train")), SCRIBBLED),
    "a checksum that disagrees": (_alter_digest, re.escape("params['wte']['embedding'] does not match its saved "
                                                           "checksum: the files are damaged")),
    "params item deleted": (lambda d: shutil.rmtree(f"{d}/params"), re.escape('Item "params" was not found')),
    "train item deleted": (lambda d: shutil.rmtree(f"{d}/train"), re.escape('Item "train" was not found')),
    "array store deleted": (lambda d: shutil.rmtree(f"{d}/params/ocdbt.process_0"), re.escape("missing or truncated")),
    "truncated _METADATA": (lambda d: _truncate(f"{d}/params/_METADATA"), re.escape("JSONDecodeError")),
    # The config restores with its state or the step is not taken: never step 4's state under step 2's config.
    "config item deleted": (lambda d: shutil.rmtree(f"{d}/config"), re.escape('Item "config" was not found')),
    # Checksums deleted are checksums lost, not a checkpoint from before checksums: the step is refused.
    "digest deleted": (lambda d: shutil.rmtree(f"{d}/digest"),
                       re.escape("its digest/ (the checksums every step of this run has) is missing")),
    "a config that does not describe its arrays": (_widen_config, re.escape(
        "its config does not describe its own arrays: params['h_0']")),
    # ... and so are they with the run's .checksummed marker deleted too: the step's own metadata names its digest
    "digest and the run's marker deleted": (lambda d: (shutil.rmtree(f"{d}/digest"), os.remove(
        os.path.join(os.path.dirname(d), checkpoint.CHECKSUMMED))),
        re.escape("its digest/ (the checksums every step of this run has) is missing")),
}


def _before_checksums(step_dir):
    """A step as zoo wrote it before checkpoints carried checksums: no digest/, and none named in its metadata."""
    shutil.rmtree(os.path.join(step_dir, "digest"))
    path = os.path.join(step_dir, "_CHECKPOINT_METADATA")
    with open(path) as f:
        meta = json.load(f)
    meta["item_handlers"].pop("digest", None)
    with open(path, "w") as f:
        json.dump(meta, f)


@pytest.mark.parametrize("damage", sorted(DAMAGE))
def test_a_damaged_step_is_reported_and_the_previous_one_restores(base, tmp_path, capsys, damage):
    cfg, _ = base
    work = copy_of(base, tmp_path)
    do, reason = DAMAGE[damage]
    do(checkpoint.step_dir(work, 4))
    s = trainer.setup(cfg)
    step, state = checkpoint.restore_latest(work, s.abstract_state)
    assert step == 2 and int(state.step) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"warning: checkpoint {checkpoint.step_dir(work, 4)} does not restore: ")
    assert re.search(reason, err[0]), err[0]
    assert err[0].endswith("; trying step 2")
    # Moved aside, not deleted: checkpoints/ holds only what restores; the damaged step is kept to inspect.
    assert checkpoint.all_steps(work) == [2]
    assert [p.split("-")[0] for p in os.listdir(os.path.join(work, "checkpoints-damaged"))] == ["4"]


def test_readers_fall_back_too_and_stop_naming_every_step_tried(base, tmp_path, capsys):
    cfg, _ = base
    work = copy_of(base, tmp_path)
    _alter_digest(checkpoint.step_dir(work, 4))
    params = runs.load_params_of(work, cfg)
    assert fingerprint_equal(params, runs.load_params(base[1], step=2))
    assert "checkpoints/4 does not restore" in capsys.readouterr().err
    _truncate(f"{checkpoint.step_dir(work, 2)}/params/_METADATA")
    with pytest.raises(CheckpointError, match=r"no checkpoint in .* restores; tried step 4 \(.*checksum.*\), "
                                              r"step 2 \(JSONDecodeError"):
        runs.load_params_of(work, cfg)


def fingerprint_equal(a, b) -> bool:
    return fingerprint(a)[0] == fingerprint(b)[0]


def test_resume_past_a_damaged_step_reproduces_the_uninterrupted_run(base, tmp_path):
    cfg, _ = base
    work = copy_of(base, tmp_path)
    _alter_digest(checkpoint.step_dir(work, 4))
    with open(os.path.join(work, "config.json")) as f:
        config_before = f.read()
    longer = replace(cfg, train=dict(steps=6))
    resumed = run(longer, work, resume=True)
    straight = run(longer, tmp_path / "straight")
    assert fingerprint_equal(resumed["state"].params, straight["state"].params)
    with open(os.path.join(work, "metrics.jsonl")) as f:
        assert [json.loads(line)["step"] for line in f] == [1, 2, 3, 4, 5, 6]  # 3-4 relogged once, not twice
    assert config_before != open(os.path.join(work, "config.json")).read()  # rewritten, after the restore


def test_a_failed_restore_changes_nothing_in_the_run(base, tmp_path):
    cfg, _ = base
    work = copy_of(base, tmp_path)
    shutil.rmtree(f"{checkpoint.step_dir(work, 2)}/train")
    _alter_digest(checkpoint.step_dir(work, 4))
    before = {p: open(os.path.join(work, p), "rb").read() for p in ("config.json", "metrics.jsonl")}
    with pytest.raises(CheckpointError, match=r"no checkpoint in .* restores; tried step 4 \(.*checksum.*\), step 2 \("
                                              r"KeyError: Item \"train\" was not found"):
        run(replace(cfg, train=dict(steps=8, log_every=2)), work, resume=True)
    assert before == {p: open(os.path.join(work, p), "rb").read() for p in before}


def test_divergence_saves_nothing_non_finite_and_a_lower_lr_resumes(base, tmp_path):
    cfg, _ = base
    work = copy_of(base, tmp_path)
    # lr 1e30: step 5's update overflows the params although its loss and gradients were finite.
    huge = replace(cfg, optim=dict(lr=1e30, schedule="constant", warmup=0),
                   train=dict(steps=8, save_every=1, log_every=1))
    with pytest.raises(TrainError) as e:
        run(huge, work, resume=True)
    msg = str(e.value)
    assert "\n" not in msg and "non-finite (NaN/Inf) at step 5" in msg
    assert f"the newest checkpoint, step 4 in {checkpoint.ckpt_dir(work)}, is finite" in msg
    assert checkpoint.all_steps(work) == [4, 2]
    params = runs.load_params(work)
    assert all(np.isfinite(np.asarray(x)).all() for x in jax.tree.leaves(params))
    out = run(replace(cfg, optim=dict(lr=1e-4), train=dict(steps=6)), work, resume=True)
    assert int(out["state"].step) == 6 and np.isfinite(out["records"][-1]["loss"])


def test_a_non_finite_state_is_never_saved(base, tmp_path):
    cfg, _ = base
    s = trainer.setup(cfg)
    state = s.init_state(jax.random.PRNGKey(0))
    state = state.replace(opt_state=jax.tree.map(lambda x: x * np.float32("nan") if x.dtype == np.float32 else x,
                                                 state.opt_state))
    mngr = checkpoint.manager(str(tmp_path))
    with pytest.raises(checkpoint.NonFiniteState, match="optimizer state hold NaN/Inf"):
        checkpoint.save(mngr, state, cfg)
    checkpoint.finish(mngr)
    assert checkpoint.all_steps(str(tmp_path)) == []


HOLD = """
import sys, time
from zoo.training.workdir import claim
with claim(sys.argv[1]):
    print("held", flush=True)
    time.sleep(600)
"""


def test_one_run_per_workdir_and_a_killed_holder_does_not_block(base, tmp_path, capsys):
    work = str(tmp_path / "run")
    holder = subprocess.Popen([sys.executable, "-c", HOLD, work], stdout=subprocess.PIPE, text=True, cwd=ROOT)
    try:
        assert holder.stdout.readline().strip() == "held"
        argv = [config_file(base[0], tmp_path), "--workdir", work]  # base's run: its programs are compiled
        assert train_main(argv) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert err == [f"error: workdir {work!r} is in use by another training run (pid {holder.pid}); wait for "
                       f"it to end or pick another --workdir"]
        assert checkpoint.all_steps(work) == []
        # --resume beside a run that has no checkpoint yet: the lock's refusal, before any config is read.
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(train_cli, "resolve", lambda a: pytest.fail("the config was read before the lock"))
            assert train_main(["--resume", work]) == 2
        assert capsys.readouterr().err.strip() == err[0]
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    assert train_main(argv) == 0  # the kernel released the dead holder's lock
    assert checkpoint.all_steps(work) == [4, 2]


FULL_DISK = """
import resource, signal, sys
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # writes past the limit fail with EFBIG, as on a full disk
resource.setrlimit(resource.RLIMIT_FSIZE, (60_000, 60_000))
from zoo.cli.train import main
sys.exit(main(sys.argv[1:]))
"""


TENSORSTORE = ('OUT_OF_RANGE: Error opening "zarr" driver: Error writing "h_2.ln_1.bias/.zarray" in OCDBT database at '
               'local file "/r/checkpoints/2.orbax-checkpoint-tmp/": Failed to write 731523 bytes to file 25: '
               'File too large')


@pytest.mark.parametrize("message, expected", [
    (TENSORSTORE + " [os_error_code='27']", "File too large"),
    (TENSORSTORE + " [tensorstore_spec='{\\\"context\\\": {}}'] [os_error_code='27']", "File too large"),  # seen in CI
    ("Failed to write: No space left on device [os_error_code=28]", "No space left on device"),
    ("[Errno 30] Read-only file system: '/r/checkpoints'", "[Errno 30] Read-only file system: '/r/checkpoints'"),
    ("something else\nand more", "ValueError: something else")])
def test_the_reason_of_a_failed_save_is_the_os_error(message, expected):
    assert orbax_errors.reason(ValueError(message)) == expected


def test_a_failing_save_ends_the_run_within_seconds_with_one_line(base, tmp_path):
    work = str(tmp_path / "run")
    env = {**os.environ, "XLA_FLAGS": ""}
    env.pop("JAX_COMPILATION_CACHE_DIR", None)  # the file-size limit would fail the cache's writes too (a warning)
    t = time.perf_counter()
    cfg = replace(base[0], train=dict(steps=40, save_every=2, log_every=1, batch_size=8))  # 98 kB embedding
    out = subprocess.run([sys.executable, "-c", FULL_DISK, config_file(cfg, tmp_path), "--workdir", work, "--quiet"],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    took = time.perf_counter() - t
    err = [line for line in out.stderr.splitlines() if line.strip()]
    assert out.returncode == 2, out.stderr[-3000:]
    assert len(err) == 1 and re.match(rf"error: saving checkpoints in {re.escape(checkpoint.ckpt_dir(work))} failed( \(at step \d+\))?: ", err[0]), err
    assert "File too large" in err[0]
    records = [json.loads(line) for line in open(os.path.join(work, "metrics.jsonl"))]
    assert records[-1]["step"] <= 6  # stopped at the next save or log step, not after 40 steps (nor a hang)
    assert took < 120


def test_a_step_pruned_while_it_is_read_is_not_reported_as_damage(base, tmp_path, capsys):
    """zoo-sample beside a run with keep=1: the step it listed is deleted by the trainer before it is read."""
    work = copy_of(base, tmp_path)
    read = []

    def load(step):
        read.append(step)
        if step == 4 and len(read) == 1:  # the trainer prunes it between the listing and the read
            shutil.rmtree(checkpoint.step_dir(work, 4))
            raise FileNotFoundError(f"{checkpoint.step_dir(work, 4)}/params")
        return runs.load_params(work, step=step)

    assert checkpoint.first_restorable(work, load)[0] == 2 and read == [4, 2]
    assert capsys.readouterr().err == ""  # no "does not restore" warning: nothing is damaged
    # A damaged step that is still there is reported as before.
    shutil.rmtree(os.path.join(checkpoint.step_dir(work, 2), "params"))
    with pytest.raises(CheckpointError, match="restores; tried step 2"):
        checkpoint.first_restorable(work, lambda s: runs.load_params(work, step=s))


def test_a_step_half_deleted_as_it_is_read_is_not_reported_as_damage(base, tmp_path, capsys):
    """The rotation of a run training beside the reader (keep=1) is halfway through step 4 when the reader fails on
    it: the step is still listed, its params gone; it is looked for again and, gone a moment later, not blamed."""
    import threading
    work = copy_of(base, tmp_path)
    os.utime(os.path.join(work, "metrics.jsonl"))  # the run is writing now
    read = []

    def load(step):
        read.append(step)
        if step == 4 and len(read) == 1:
            shutil.rmtree(os.path.join(checkpoint.step_dir(work, 4), "params"))  # the deletion has begun ...
            threading.Timer(0.3, shutil.rmtree, [checkpoint.step_dir(work, 4)]).start()  # ... and ends in 0.3 s
            raise FileNotFoundError(f"{checkpoint.step_dir(work, 4)}/params")
        return runs.load_params(work, step=step)

    assert checkpoint.first_restorable(work, load)[0] == 2 and read == [4, 2]
    assert capsys.readouterr().err == ""


def test_resume_from_a_chosen_step_redoes_the_steps_after_it_and_keeps_the_newer_ones(base, tmp_path, capsys):
    """--resume DIR --step N: the run goes on from N (bit for bit the steps it had made after it); the newer
    checkpoints are moved aside, not deleted."""
    work = copy_of(base, tmp_path)
    want = jax.device_get(runs.load_params(work, step=4))
    assert train_main(["--resume", work, "--step", "3"]) == 2
    assert capsys.readouterr().err.strip() == f"error: --step 3: {work!r} holds checkpoints at steps 2, 4"
    assert train_main(["--resume", work, "--step", "2", "--quiet"]) == 0
    assert checkpoint.all_steps(work) == [4, 2]
    assert [p.split("-")[0] for p in os.listdir(os.path.join(work, "checkpoints-superseded"))] == ["4"]
    got = jax.device_get(runs.load_params(work, step=4))
    assert all(np.array_equal(a, b) for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want)))


def test_a_run_from_before_checksums_is_read_unverified_and_says_so_once(base, tmp_path, capsys):
    work = copy_of(base, tmp_path)
    os.remove(os.path.join(checkpoint.ckpt_dir(work), checkpoint.CHECKSUMMED))
    for st in (2, 4):
        _before_checksums(checkpoint.step_dir(work, st))
    for _ in range(2):
        runs.load_params(work)
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"note: {checkpoint.ckpt_dir(work)} was written before checkpoints carried checksums; read "
                   f"unverified"]


def test_a_checkpoints_link_out_of_the_run_is_refused_and_nothing_is_written_there(base, tmp_path, capsys):
    """--resume of a run whose checkpoints/ is a symlink into another run would write that run's steps."""
    other = copy_of(base, tmp_path)
    work = str(tmp_path / "linked")
    os.makedirs(work)
    for name in ("config.json", "metrics.jsonl"):
        shutil.copy(os.path.join(other, name), work)
    os.symlink(checkpoint.ckpt_dir(other), checkpoint.ckpt_dir(work))
    before = sorted(os.listdir(checkpoint.ckpt_dir(other)))
    assert train_main(["--resume", work, "--set", "train.steps=6"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"error: {checkpoint.ckpt_dir(work)} is a link to "), err
    assert "outside the run" in err[0]
    assert sorted(os.listdir(checkpoint.ckpt_dir(other))) == before


def test_a_step_of_another_family_copied_into_the_run_is_refused_by_name(base, tmp_path, capsys, cache_dir):
    """A BERT step copied into a GPT run's checkpoints/ is not the run's: every reader passes it over, saying why."""
    from tests.helpers import tiny_configs
    bert = str(tmp_path / "bert")
    run(replace(tiny_configs.bert("bert_mlm", cache_dir), train=dict(steps=2, save_every=2)), bert)
    work = copy_of(base, tmp_path)
    shutil.copytree(checkpoint.step_dir(bert, 2), checkpoint.step_dir(work, 6))
    capsys.readouterr()
    assert runs.load_config(work).model.family == "gpt"
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"warning: checkpoint {checkpoint.step_dir(work, 6)} does not restore: "
                                                "its config is a bert model's (task=bert_mlm) but the run trains a "
                                                "gpt model (task=gpt_lm, config.json)"), err
    assert err[0].endswith("trying step 4")
    with pytest.raises(CheckpointError, match="a step of another run"):
        runs.load_config(work, step=6)


def test_a_truncated_array_file_is_one_line_in_a_reader_of_its_own(base, tmp_path):
    """In a process of its own (so the echoes Orbax's still-running reads print at the loop's close would show):
    zoo-sample past a truncated array file says one line and samples from step 2; no "Exception ignored" or
    "Event loop is closed" traceback follows."""
    work = copy_of(base, tmp_path)
    _truncate(biggest_array_file(checkpoint.step_dir(work, 4)))
    env = {**os.environ, "XLA_FLAGS": ""}
    out = subprocess.run([sys.executable, "-m", "zoo.cli.sample", work, "--prompt", "ab", "--max-new-tokens", "2"],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    err = [line for line in out.stderr.splitlines() if line.strip()]
    assert out.returncode == 0 and len(err) == 1, out.stderr[:1500]
    assert err[0].startswith(f"warning: checkpoint {checkpoint.step_dir(work, 4)} does not restore: an array file is "
                             f"missing or truncated") and err[0].endswith("trying step 2")


ECHO = """
import gc, zoo.training.checkpoint  # holds the read echoes back, as any reader of checkpoints does
async def _read_array_index_and_device_put(): pass
async def another_coroutine(): pass
_read_array_index_and_device_put(); another_coroutine(); gc.collect()
"""


def test_a_read_of_orbax_collected_unawaited_is_held_back_and_no_other_coroutine_is():
    """A damaged step's reads that Orbax never started are collected with "coroutine ... was never awaited"
    (RuntimeWarning, at whatever line the collector ran): held back like its other echoes; another coroutine's is
    said as Python says it."""
    out = subprocess.run([sys.executable, "-c", ECHO], capture_output=True, text=True, timeout=120,
                         env={**os.environ, "XLA_FLAGS": ""})
    assert out.returncode == 0, out.stderr[-1500:]
    assert "another_coroutine' was never awaited" in out.stderr
    assert "_read_array_index_and_device_put" not in out.stderr


def test_a_save_killed_midway_leaves_nothing_said_on_the_next_resume(base, tmp_path):
    """kill -9 during a save leaves STEP.orbax-checkpoint-tmp: the resumed run removes it before saving, so Orbax's
    'WARNING:absl:Attempted to create temporary directory ... already exists' never reaches the console."""
    work = copy_of(base, tmp_path)
    tmp = os.path.join(checkpoint.ckpt_dir(work), "6.orbax-checkpoint-tmp")
    shutil.copytree(checkpoint.step_dir(work, 4), tmp)
    os.remove(os.path.join(tmp, "commit_success.txt"))
    env = {**os.environ, "XLA_FLAGS": ""}
    out = subprocess.run([sys.executable, "train.py", "--resume", work, "--set", "train.steps=6", "--set",
                          "train.save_every=2", "--quiet"], cwd=ROOT, env=env, capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "absl" not in out.stderr and "orbax-checkpoint-tmp" not in out.stderr + out.stdout, out.stderr
    assert checkpoint.all_steps(work)[0] == 6 and not os.path.exists(tmp)
