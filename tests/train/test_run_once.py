"""Programs a run executes once compile cheaply (zoo.training.run_once) without changing a bit, and a
checkpoint saved in one process compiles no per-shard slices (Orbax's replica-parallel writing is for
several processes)."""

import jax
import numpy as np
from jax import monitoring

from tests.helpers import tiny_configs
from zoo.training import checkpoint, run_once, trainer
from zoo.training.checksums import _check

# XLA:CPU's own level (tests/conftest.py compiles the suite at level 0)
XLA_DEFAULT = {"xla_backend_optimization_level": 2}
COMPILES = []
monitoring.register_event_duration_secs_listener(
    lambda event, secs, **_: COMPILES.append(secs) if event == "/jax/core/compile/backend_compile_duration" else None)


def bits(tree):
    return [np.asarray(jax.random.key_data(x) if jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key) else x)
            for x in jax.tree.leaves(jax.device_get(tree))]


def test_the_state_and_its_checksums_compiled_once_equal_xla_defaults_bit_for_bit(cache_dir, monkeypatch):
    # A user's XLA_FLAGS, without the suite's level 0 (which run_once would keep: its bits differ from level 2's)
    monkeypatch.setenv("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
    assert run_once.cpu_options() == {"xla_backend_optimization_level": 1}
    s = trainer.setup(tiny_configs.TINY["bert_mlm"](cache_dir))
    rng = jax.random.PRNGKey(3)
    cheap = s.init_state(rng)
    default = jax.jit(s.init_fn, out_shardings=s.state_shardings, compiler_options=XLA_DEFAULT)(rng)
    for a, b in zip(bits(cheap), bits(default)):
        np.testing.assert_array_equal(a, b)
    for a, b in zip(bits(run_once.jit(_check)(cheap)), bits(jax.jit(_check, compiler_options=XLA_DEFAULT)(cheap))):
        np.testing.assert_array_equal(a, b)


def test_a_sharded_save_in_one_process_compiles_only_its_checksums(cache_dir, tmp_path):
    cfg = tiny_configs.TINY["gpt_lm"](cache_dir)
    s = trainer.setup(cfg)  # 8 devices: 2x2x2, parameters replicated over data
    assert s.mesh.devices.size == 8
    state = s.init_state(jax.random.PRNGKey(0))
    before = len(COMPILES)
    with checkpoint.manager(str(tmp_path), async_save=False) as m:
        checkpoint.save(m, state, cfg)
    assert len(COMPILES) - before <= 2  # the params' and the optimizer state's checksums; no jit(slice)


def test_level_1_is_a_ceiling_a_lower_level_in_xla_flags_is_kept(monkeypatch):
    for flags, level in [("", 1), ("--xla_backend_optimization_level=2", 1), ("--xla_backend_optimization_level=3 "
                         "--xla_backend_optimization_level=0", 0), ("--xla_force_host_platform_device_count=8", 1)]:
        monkeypatch.setenv("XLA_FLAGS", flags)
        assert run_once.cpu_options() == {"xla_backend_optimization_level": level}, flags
