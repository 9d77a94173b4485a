"""Test setup: 8 emulated CPU devices (set before jax is imported), shared tiny configs."""

import os

os.environ["XLA_FLAGS"] = os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import dataclasses  # noqa: E402

import pytest  # noqa: E402

from zoo.config import Config, DataConfig, GptConfig, OptimConfig, TrainConfig  # noqa: E402


@pytest.fixture(scope="session")
def cache_dir(tmp_path_factory):
    """One token-store cache for the whole session: the built-in corpus is tokenized once."""
    return str(tmp_path_factory.mktemp("zoo_cache"))


@pytest.fixture
def tiny_cfg(cache_dir):
    """A GPT small enough to train a few steps in about a second, with dropout on."""
    return Config(
        task="gpt_lm",
        model=GptConfig(vocab_size=384, max_len=64, num_layers=2, d_model=64, num_heads=4, d_ff=128, dropout=0.1),
        data=DataConfig(source="builtin", tokenizer="bytes", seq_len=32, cache_dir=cache_dir),
        optim=OptimConfig(lr=1e-3, schedule="cosine", warmup=2),
        train=TrainConfig(steps=6, batch_size=16, log_every=1, eval_every=0, save_every=3, keep=5),
    )


def replace(cfg, **sections):
    """cfg with some fields of some sections replaced: replace(cfg, train=dict(steps=3))."""
    return dataclasses.replace(cfg, **{k: dataclasses.replace(getattr(cfg, k), **v) for k, v in sections.items()})
