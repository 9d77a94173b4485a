"""trainer.init_from: a run starts from another run's parameters (a GPT's, a pretrained BERT encoder
under a fresh classifier head) and refuses a checkpoint of another width or another model family."""

import jax
import numpy as np
import pytest

from conftest import replace
from tests.helpers import tiny_configs
from tests.helpers.runs import run
from zoo.errors import ConfigError
from zoo.training import checkpoint, trainer


def gpt_weights(cfg, workdir):
    """A GPT checkpoint (weights only, as a converted model's): what the refusals of another family read."""
    s = trainer.setup(cfg, jax.devices()[:1])
    checkpoint.save_weights(str(workdir), s.init_state(jax.random.PRNGKey(0)).params, cfg)


def test_init_from_copies_params(tiny_cfg, tmp_path):
    src = run(tiny_cfg, tmp_path / "src")  # the invariants' resume run: its programs are the compile cache's
    s = trainer.setup(tiny_cfg, jax.devices()[:1])
    state = trainer.init_from(s, s.init_state(jax.random.PRNGKey(7)), str(tmp_path / "src"))
    np.testing.assert_array_equal(jax.device_get(state.params["wte"]["embedding"]),
                                  jax.device_get(src["state"].params["wte"]["embedding"]))
    wider = replace(tiny_cfg, model=dict(d_model=128))
    s2 = trainer.setup(wider, jax.devices()[:1])
    with pytest.raises(ConfigError, match=r"param \['h_0'\].* has shape"):
        trainer.init_from(s2, s2.init_state(jax.random.PRNGKey(0)), str(tmp_path / "src"))


def test_init_from_copies_the_encoder_and_refuses_other_families_and_widths(cache_dir, tmp_path):
    src = run(tiny_configs.bert("bert_mlm", cache_dir), tmp_path / "mlm")["state"].params
    cls_cfg = tiny_configs.bert("bert_cls", cache_dir)
    s = trainer.setup(cls_cfg, jax.devices()[:1])
    state = trainer.init_from(s, s.init_state(jax.random.PRNGKey(7)), str(tmp_path / "mlm"))
    np.testing.assert_array_equal(jax.device_get(state.params["bert"]["encoder"]["layer_1"]["mlp"]["fc"]["kernel"]),
                                  jax.device_get(src["bert"]["encoder"]["layer_1"]["mlp"]["fc"]["kernel"]))
    np.testing.assert_array_equal(jax.device_get(state.params["bert"]["embed"]["word"]["embedding"]),
                                  jax.device_get(src["bert"]["embed"]["word"]["embedding"]))
    assert not np.any(jax.device_get(state.params["cls_head"]["out"]["kernel"]))  # the head starts fresh
    wider = replace(cls_cfg, model=dict(d_model=64))
    s2 = trainer.setup(wider, jax.devices()[:1])
    with pytest.raises(ConfigError, match=r"param \['bert'\].* has shape .* \(model width or size differs\)"):
        trainer.init_from(s2, s2.init_state(jax.random.PRNGKey(0)), str(tmp_path / "mlm"))
    gpt_weights(tiny_configs.gpt_lm(cache_dir), tmp_path / "gpt")
    with pytest.raises(ConfigError, match="holds a gpt model; this config trains a bert model"):
        trainer.init_from(s, s.init_state(jax.random.PRNGKey(0)), str(tmp_path / "gpt"))


def test_init_from_a_checkpoint_of_another_family(s2s_cfg, tiny_cfg, tmp_path):
    gpt_weights(tiny_cfg, tmp_path / "gpt")
    s = trainer.setup(s2s_cfg, jax.devices()[:1])
    with pytest.raises(ConfigError, match="holds a gpt model; this config trains a encdec model"):
        trainer.init_from(s, s.init_state(jax.random.PRNGKey(0)), str(tmp_path / "gpt"))
