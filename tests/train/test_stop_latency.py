"""The host never runs far ahead of the device: at most 2 train steps are ever dispatched but
unfinished, the progress bar counts finished steps, and a SIGTERM sent when step k has finished leaves
a checkpoint at step k, k + 1 or k + 2 (not at the end of a long queue). Steps are made slow with extra
device work inside the jitted step (matmuls feeding an extra metric), which is where a host that does
not wait would queue many of them. (A host callback would not do: it makes dispatch synchronous.)"""

import os
import signal
import threading
import time

import jax
import jax.numpy as jnp
import pytest

from conftest import replace
from tests.helpers.runs import run
from zoo.training import checkpoint, trainer


class SlowSteps:
    """Patches the trainer so each step does `matmuls` extra 256x256 matmuls on the device, and records,
    for every dispatch, how many steps are then dispatched and unfinished (the new one included)."""

    def __init__(self, monkeypatch, matmuls=40):
        self.in_flight, self.outs = [], []
        real_make, real_jit = trainer.make_train_step, trainer.Setup.jit_train_step

        def make(*a, **kw):
            f = real_make(*a, **kw)

            def train_step(state, batch):
                x = jnp.full((256, 256), 1e-3, jnp.float32) * state.step.astype(jnp.float32)
                x = jax.lax.fori_loop(0, matmuls, lambda i, x: jnp.tanh(x @ x), x)
                state, m = f(state, batch)
                return state, {**m, "slow": x[0, 0]}
            return train_step

        def jit(setup):
            f = real_jit(setup)

            def dispatch(state, batch):
                self.in_flight.append(1 + sum(not m["slow"].is_ready() for m in self.outs))
                state, m = f(state, batch)
                self.outs.append(m)
                return state, m
            return dispatch

        monkeypatch.setattr(trainer, "make_train_step", make)
        monkeypatch.setattr(trainer.Setup, "jit_train_step", jit)

    def finished(self) -> int:
        """Steps whose execution has finished (they finish in order)."""
        return sum(m["slow"].is_ready() for m in list(self.outs))


@pytest.fixture
def slow_cfg(tiny_cfg):
    # Logs, evals and saves only at the end: nothing else makes the host wait for the device.
    return replace(tiny_cfg, train=dict(steps=40, log_every=1000, save_every=1000, eval_every=0),
                   mesh=dict(data=1, fsdp=1, tensor=1))


def test_at_most_two_steps_are_in_flight_and_the_bar_counts_finished_steps(slow_cfg, tmp_path, monkeypatch):
    slow = SlowSteps(monkeypatch)
    shown = []

    class Bar(trainer.tqdm):
        def update(self, n=1):
            out = super().update(n)
            shown.append((self.n, slow.finished()))
            return out

    monkeypatch.setattr(trainer, "tqdm", Bar)
    monkeypatch.setattr(trainer, "_is_terminal", lambda: True)  # a bar even under pytest
    out = trainer.train(slow_cfg, str(tmp_path), devices=jax.devices()[:1], progress=True, quiet=False)
    assert int(out["state"].step) == 40 and len(slow.in_flight) == 40
    assert max(slow.in_flight) <= 2, slow.in_flight
    assert shown and shown[-1][0] == 40
    assert all(n <= done for n, done in shown), shown  # never ahead of the steps that ran


@pytest.mark.parametrize("k", [1, 5])
def test_sigterm_after_step_k_saves_at_most_two_steps_later(slow_cfg, tmp_path, monkeypatch, k):
    slow = SlowSteps(monkeypatch)
    sent = []

    def watch():  # SIGTERM as soon as step k has finished on the device
        while not sent and not over.is_set():
            done = slow.finished()
            if done >= k:
                sent.append(done)
                os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(0.0005)
    over = threading.Event()
    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        out = run(replace(slow_cfg, train=dict(steps=300)), tmp_path, devices=jax.devices()[:1])
    finally:
        over.set()
        watcher.join()
    saved = checkpoint.latest_step(str(tmp_path))
    assert sent and out["interrupted"]
    assert sent[0] <= saved <= sent[0] + 2 and int(out["state"].step) == saved, (sent, saved)
    assert max(slow.in_flight) <= 2
