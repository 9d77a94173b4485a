"""Fixtures shared by the Hugging Face parity tests."""

import pytest

from zoo import hf


@pytest.fixture(scope="module")
def runs(hf_dirs, tmp_path_factory):
    """name -> (run directory, from_hf's report) of each checkpoint of the test module's `hf_dirs`."""
    out = {}
    for name, (src, _) in hf_dirs.items():
        run = str(tmp_path_factory.mktemp(name) / "run")
        out[name] = (run, hf.from_hf(src, run, verbose=False))
    return out
