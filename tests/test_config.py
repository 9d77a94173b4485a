"""Config: overrides are type-checked, bad values name their field, JSON round-trips, every shipped
config file loads and builds its model."""

import glob
import json

import jax
import pytest

from zoo import tasks
from zoo.configuration import Config, from_dict
from zoo.overrides import apply_overrides, load_config_file
from zoo.errors import ConfigError
from zoo.models.encdec import EncDecConfig
from zoo.models.gpt import GptConfig


def test_override_parses_types():
    cfg = apply_overrides(Config(), ["optim.lr=1e-3", "train.steps=20", "model.scan_layers=true",
                                     "data.source=hub:wikitext/wikitext-2-raw-v1", "mesh.data=2"])
    assert cfg.optim.lr == 1e-3 and cfg.train.steps == 20 and cfg.model.scan_layers is True
    assert cfg.data.source == "hub:wikitext/wikitext-2-raw-v1" and cfg.mesh.data == 2


def test_overrides_of_one_section_are_checked_together():
    """A shape that only fits once every override is in (SmolLM2's 9 heads and 3 key/value heads over the
    llama_tiny file's 4 and 2) holds; one that does not fit still names the key; the later of two wins."""
    cfg = load_config_file("configs/llama_tiny.py")
    cfg = apply_overrides(cfg, ["model.d_model=576", "model.num_heads=9", "model.num_kv_heads=3", "optim.lr=1",
                                "optim.lr=2"])
    assert (cfg.model.num_heads, cfg.model.num_kv_heads, cfg.optim.lr) == (9, 3, 2.0)
    with pytest.raises(ConfigError, match="model.num_kv_heads=2 must divide model.num_heads=9"):
        apply_overrides(load_config_file("configs/llama_tiny.py"), ["model.d_model=576", "model.num_heads=9"])


@pytest.mark.parametrize("assignment, fragment", [
    ("optim.lrr=1", "valid keys in optim: lr, schedule"),
    ("nope=1", "valid top-level keys: task, init_from"),
    ("foo.bar=1", "sections: model, data, optim, train, mesh"),
    ("train.steps=ten", "expected a value of type int"),
    ("model.scan_layers=maybe", "expected a value of type bool"),
    ("optim.schedule=exp", "choose one of cosine, linear, noam, constant, wsd"),
    ("model.num_heads=5", "model.d_model=768 is not divisible by model.num_heads=5"),
    ("data.seq_len=2048", "data.seq_len=2048 is above model.max_len=1024"),
    ("train.grad_accum=5", "train.batch_size=32 is not divisible by train.grad_accum=5"),
    ("optim.lr", "expected key=value"),
    ("optim.b1=2", "optim.b1=2.0 must be in [0, 1)"),
    ("optim.b2=-1", "optim.b2=-1.0 must be in [0, 1)"),
    ("optim.weight_decay=-1", "optim.weight_decay=-1.0 must be >= 0"),
    ("optim.eps=0", "optim.eps=0.0 must be positive"),
    ("optim.lr=inf", "optim.lr=inf must be a finite number"),
    ("optim.lr=nan", "optim.lr=nan must be a finite number"),
    ("train.eval_every=-1", "train.eval_every=-1 must be >= 0"),
    ("train.sample_tokens=-5", "train.sample_tokens=-5 must be >= 0"),
])
def test_bad_override_names_the_key(assignment, fragment):
    with pytest.raises(ConfigError) as e:
        apply_overrides(Config(), [assignment])
    assert fragment in str(e.value) and "\n" not in str(e.value)


def test_json_round_trip():
    cfg = apply_overrides(Config(), ["optim.lr=0.5", "model.num_layers=3"])
    again = from_dict(json.loads(cfg.to_json()))
    assert again == cfg and isinstance(again.model, GptConfig)


def test_a_run_saved_with_model_label_smoothing_loads_it_into_train():
    d = json.loads(Config(task="seq2seq", model=EncDecConfig()).to_json())
    d["model"]["label_smoothing"] = 0.1  # where runs saved it before it moved
    assert from_dict(d).train.label_smoothing == 0.1


def test_missing_config_file():
    with pytest.raises(ConfigError, match="configs/nope.py' does not exist"):
        load_config_file("configs/nope.py")


@pytest.mark.parametrize("path", sorted(glob.glob("configs/*.py")))
def test_every_config_file_loads_and_builds(path):
    cfg = load_config_file(path)
    assert isinstance(cfg, Config)
    task = tasks.build(cfg)
    shapes = jax.eval_shape(task.init, jax.random.PRNGKey(0))
    assert sum(x.size for x in jax.tree.leaves(shapes)) > 0
    assert task.flops_per_token(cfg.data.seq_len) > 0
