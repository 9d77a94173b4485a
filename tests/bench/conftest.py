"""The benchmark's workers are processes of their own: they run on what a user's CPU shows them, one
device, not the 8 emulated devices of the test session (tests/conftest.py)."""

import os

import pytest

EMULATION = "--xla_force_host_platform_device_count"


@pytest.fixture
def one_device(monkeypatch):
    """Workers started in this test see one CPU device: the session's device-count flag is left out of
    the XLA_FLAGS they inherit. (Eight emulated devices on two cores make a benchmark step an all-reduce
    among eight threads, which under a loaded machine can outwait XLA's 40 s rendezvous and abort.)"""
    flags = [f for f in os.environ.get("XLA_FLAGS", "").split() if not f.startswith(EMULATION)]
    monkeypatch.setenv("XLA_FLAGS", " ".join(flags))
