"""task=embed's gradient cache (embed.mini_batch, zoo.tasks.grad_cache): the loss and the parameter gradient equal
plain MNRL's on the same batch (hard negatives, the symmetric loss) for chunk sizes that divide the batch and that
do not, with LoRA adapters, and with the batch sharded over 8 devices; the compiled step holds far less memory
for activations; a bad setting is refused in one line."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import linen as nn
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from conftest import replace
from tests.helpers.tiny_configs import bert as cfg_for
from zoo import tasks
from zoo.errors import ConfigError

B, K, T = 8, 3, 32  # anchor, positive, hard negative


def _batch(rows: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    lengths_BK = rng.integers(4, T + 1, size=(rows, K))
    return {"inputs": rng.integers(5, 260, size=(rows, K, T)).astype(np.int32),
            "valid": np.arange(T) < lengths_BK[..., None], "weights": np.ones(rows, np.float32)}


def _task(tmp, mini_batch: int, **model):
    cfg = replace(cfg_for("embed", str(tmp)), embed=dict(symmetric=True, mini_batch=mini_batch))
    return tasks.build(replace(cfg, model=model) if model else cfg)


def _grad(task, params, batch, train=False):
    """(loss, grads) of the task's summed loss, jitted (train=False: no dropout, so the chunks see the same net)."""
    (loss, _), grads = jax.jit(jax.value_and_grad(task.loss, has_aux=True), static_argnums=3)(
        params, batch, jax.random.PRNGKey(1), train)
    return float(loss), grads


def _assert_close(grads, ref):
    """Every leaf within 1e-5 of its own largest value (a leaf that is ~0 in exact arithmetic, the key bias under
    softmax, within 1e-7)."""
    for (path, g), r in zip(jax.tree_util.tree_flatten_with_path(grads)[0], jax.tree.leaves(ref)):
        r = np.asarray(r)
        np.testing.assert_allclose(np.asarray(g), r, rtol=0, atol=1e-5 * np.abs(r).max() + 1e-7,
                                   err_msg=jax.tree_util.keystr(path))


@pytest.fixture(scope="module")
def plain(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("embed_cached")
    task = _task(tmp, 0)
    params = nn.unbox(task.init(jax.random.PRNGKey(0)))
    loss, grads = _grad(task, params, _batch(B))
    assert loss > 1.0 and max(float(jnp.abs(g).max()) for g in jax.tree.leaves(grads)) > 1e-2  # can be wrong
    return tmp, params, loss, grads


def test_the_cached_loss_and_gradient_equal_plain_mnrl(plain):
    """Chunks of 2 divide the 8 rows (4 chunks); chunks of 3, which do not (the last padded), are the LoRA and the
    8-device tests' (one compile fewer here)."""
    tmp, params, loss, grads = plain
    got, g = _grad(_task(tmp, 2), params, _batch(B))
    assert got == pytest.approx(loss, rel=1e-5)
    _assert_close(g, grads)


def test_the_cached_gradient_with_lora_adapters_equals_plain(plain):
    tmp, _, _, _ = plain
    lora = dict(lora_rank=2, lora_alpha=4.0)
    task, cached = _task(tmp, 0, **lora), _task(tmp, 3, **lora)
    params = nn.unbox(task.init(jax.random.PRNGKey(0)))
    leaves, treedef = jax.tree_util.tree_flatten_with_path(params)
    rng = np.random.default_rng(2)  # lora_b starts at zero: nonzero adapters, so they change the forward
    params = jax.tree_util.tree_unflatten(treedef, [
        jnp.asarray(rng.normal(0, 0.1, x.shape), x.dtype) if "lora_b" in jax.tree_util.keystr(p) else x
        for p, x in leaves])
    loss, grads = _grad(task, params, _batch(B))
    got, g = _grad(cached, params, _batch(B))
    assert got == pytest.approx(loss, rel=1e-5)
    _assert_close(g, grads)
    assert any("lora_a" in jax.tree_util.keystr(p) and float(jnp.abs(x).max()) > 1e-4
               for p, x in jax.tree_util.tree_flatten_with_path(g)[0])


def test_eight_devices_with_the_batch_sharded_give_the_gradient_of_one(plain):
    """The similarity matrix still spans every device's rows: the sharded batch, chunked, gives the 1-device
    plain loss and gradient (16 rows over 8 devices, chunks of 3: a padded last chunk across devices)."""
    tmp, params, _, _ = plain
    batch = _batch(16, seed=3)
    loss, grads = _grad(_task(tmp, 0), params, batch)
    mesh = Mesh(np.asarray(jax.devices()[:8]), ("data",))
    sharded = jax.device_put(batch, NamedSharding(mesh, P("data")))
    replicated = jax.device_put(params, NamedSharding(mesh, P()))
    got, g = _grad(_task(tmp, 3), replicated, sharded)
    assert got == pytest.approx(loss, rel=1e-5)
    _assert_close(g, grads)


def test_the_cached_step_holds_less_memory(plain):
    """The compiled gradient of 64 triples: chunks of 8 keep one chunk's activations, not the batch's."""
    tmp, params, _, _ = plain

    def temp_bytes(mini_batch):
        fn = jax.jit(jax.value_and_grad(_task(tmp, mini_batch).loss, has_aux=True), static_argnums=3)
        return fn.lower(params, _batch(64), jax.random.PRNGKey(1), True).compile().memory_analysis() \
            .temp_size_in_bytes

    full, cached = temp_bytes(0), temp_bytes(8)
    assert cached < full / 3, (full, cached)


def test_a_bad_mini_batch_is_refused_in_one_line(tmp_path):
    with pytest.raises(ConfigError, match=r"^embed.mini_batch=-1 must be 0 \(off\) or a positive number"):
        replace(cfg_for("embed", str(tmp_path)), embed=dict(mini_batch=-1))
