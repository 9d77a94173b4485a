"""What the Hugging Face tests share: converting their saved checkpoints, one torch thread, a causal LM's
logits in transformers, and a checkpoint directory with its config.json edited.

A test module imports `one_torch_thread` (an autouse, module-scoped fixture) to run torch on one thread.
"""

import json
import os

import numpy as np
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


def hf_logits(model, ids):
    """A transformers causal LM's logits of token ids `ids` ([B, T]), as numpy."""
    import torch
    with torch.no_grad():
        return model(torch.tensor(np.asarray(ids))).logits.numpy()


def edited(src, dst, **fields) -> str:
    """A copy of checkpoint directory `src` whose config.json has `fields` set (its weights linked, not copied)."""
    os.makedirs(dst)
    os.symlink(os.path.join(src, "model.safetensors"), os.path.join(dst, "model.safetensors"))
    with open(os.path.join(dst, "config.json"), "w") as f:
        json.dump({**json.load(open(os.path.join(src, "config.json"))), **fields}, f)
    return str(dst)
