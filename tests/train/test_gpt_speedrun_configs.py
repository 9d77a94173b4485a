"""configs/gpt_speedrun.py and configs/gpt_speedrun_tiny.py: the speedrun's switches at GPT-2 124M's shape (its
parameters counted by hand) and at a CPU's, which trains: its loss falls from the first steps."""

import math

import jax
import jax.numpy as jnp

from conftest import replace
from tests.helpers.runs import losses, run
from zoo.overrides import load_config_file
from zoo.models.gpt import Gpt


def test_the_124m_speedrun_has_its_switches_and_parameters():
    cfg = load_config_file("configs/gpt_speedrun.py")
    m = cfg.model
    assert (m.mlp, m.positions, m.norm, m.final_softcap, cfg.optim.name, cfg.optim.schedule) == \
        ("relu2", "rope", "rmsnorm", 15.0, "muon", "wsd")
    assert m.qk_norm and m.zero_init_proj and m.unet_skips and m.value_embeds == 3 and not m.tie_embeddings
    assert m.head_dim == 128
    shapes = jax.eval_shape(lambda: Gpt(m).init(jax.random.PRNGKey(0), jnp.zeros((1, 8), jnp.int32)))
    V, D, F, L, H = 50304, 768, 3072, 12, 128
    # Two [V, D] tables; per block q, k, v, out [D, D], fc and proj [D, F], two norms [D], q/k norms [H]; ln_f;
    # one skip weight per mirrored pair; 3 value tables [V, D] (6 heads of 128) and two lambdas in each of the 6
    # layers that read them. No biases.
    want = 2 * V * D + L * (4 * D * D + 2 * D * F + 2 * D + 2 * H) + D + L // 2 + 3 * V * D + 6 * 2
    assert sum(x.size for x in jax.tree.leaves(shapes["params"])) == want == 278_124_306


def test_the_tiny_speedrun_trains_on_the_cpu(cache_dir, tmp_path):
    cfg = load_config_file("configs/gpt_speedrun_tiny.py")
    cfg = replace(cfg, data=dict(seq_len=64, cache_dir=cache_dir), optim=dict(warmup=1),
                  train=dict(steps=6, batch_size=8, log_every=1, eval_every=0, save_every=6, sample_tokens=0))
    run(cfg, tmp_path / "run", devices=jax.devices()[:1])
    loss = losses(tmp_path / "run")
    assert all(math.isfinite(v) for v in loss.values()), loss
    assert loss[6] < loss[1] - 0.3, loss
