"""Converting the test modules' saved Hugging Face checkpoints, shared by the T5 and BART tests."""

from zoo import hf


def convert_all(hf_dirs: dict, tmp_path_factory) -> dict:
    """name -> (run directory, from_hf's report) of each checkpoint directory in `hf_dirs`."""
    out = {}
    for name, (src, _) in hf_dirs.items():
        run = str(tmp_path_factory.mktemp(name) / "run")
        out[name] = (run, hf.from_hf(src, run, verbose=False))
    return out
