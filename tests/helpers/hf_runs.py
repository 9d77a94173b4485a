"""What the Hugging Face tests share: converting their saved checkpoints, and one torch thread.

A test module imports `one_torch_thread` (an autouse, module-scoped fixture) to run torch on one thread.
"""

import pytest

from zoo import hf


@pytest.fixture(scope="module", autouse=True)
def one_torch_thread():
    """Tiny models: torch's threads only contend with XLA's on a small CPU (2 threads: ~100x slower here)."""
    import torch
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def convert_all(hf_dirs: dict, tmp_path_factory) -> dict:
    """name -> (run directory, from_hf's report) of each checkpoint directory in `hf_dirs`."""
    out = {}
    for name, (src, _) in hf_dirs.items():
        run = str(tmp_path_factory.mktemp(name) / "run")
        out[name] = (run, hf.from_hf(src, run, verbose=False))
    return out
