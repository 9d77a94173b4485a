"""Distillation's divergence against TRL: zoo.tasks.distill.divergence equals TRL's GKDTrainer.generalized_jsd_loss
(its mean over the unmasked tokens) on random logits at beta 0 (the forward KL(teacher || student), as TRL names it),
0.5 (the generalised JSD) and 1 (the reverse KL), temperatures 1 and 2. TRL leaves out Hinton's T^2, which zoo's loss
multiplies in (zoo.tasks.distill.mixed_loss): the divergence itself is compared."""

import jax.numpy as jnp
import numpy as np
import pytest

pytest.importorskip("trl", reason="trl is not installed: the GKD parity test runs TRL's generalized_jsd_loss")
torch = pytest.importorskip("torch")
gkd = pytest.importorskip("trl.experimental.gkd.gkd_trainer")

from zoo.tasks import distill  # noqa: E402


@pytest.mark.parametrize("beta", [0.0, 0.5, 1.0])
@pytest.mark.parametrize("temperature", [1.0, 2.0])
def test_divergence_is_trls_generalized_jsd(beta, temperature):
    r = np.random.default_rng(0)
    z, u = (r.normal(size=(3, 5, 11)).astype(np.float32) * 2 for _ in range(2))
    labels = r.integers(0, 11, (3, 5))
    labels[0, :2] = labels[2, 4] = -100  # prompt and padding positions TRL leaves out
    want = gkd.GKDTrainer.generalized_jsd_loss(torch.tensor(z), torch.tensor(u), labels=torch.tensor(labels),
                                               beta=beta, temperature=temperature)
    mask = labels != -100
    d = np.asarray(distill.divergence(jnp.asarray(z), jnp.asarray(u), temperature, beta))
    np.testing.assert_allclose(d[mask].sum() / mask.sum(), float(want), rtol=1e-5, atol=1e-7)
