"""What the Hugging Face tests share: the parity table's references built and converted once a session
(`hf_refs`), converting their saved checkpoints, one torch thread, a causal LM's logits in transformers, an
encoder row's padded inputs and transformers' outputs of them, and a checkpoint directory with its config.json
edited.

A test module imports `one_torch_thread` (an autouse, module-scoped fixture) to run torch on one thread, and
`hf_refs_fixture` to read the references of tests/hf/parity_table.py's rows (`hf_refs.reference("llama")`).
"""

import dataclasses
import json
import os

import numpy as np
import pytest

from tests.helpers import shared
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


def encoder_inputs(row, T=16, seed=0):
    """(ids, segments, valid): rows of T, 11 and 5 real tokens padded on the right (and, for a `left_pad` row, one
    of 9 padded on the left); no real token is the pad id (transformers numbers RoBERTa's positions by it)."""
    pad, V = row.kwargs.get("pad_token_id", 0), row.kwargs["vocab_size"]
    rng = np.random.default_rng(seed)
    valid = np.stack([np.arange(T) < n for n in (T, 11, 5)] + [np.arange(T) >= T - 9] * row.left_pad)
    ids = np.where(valid, rng.integers(pad + 1, V, valid.shape), pad).astype(np.int32)
    if row.segments == "random":
        segments = np.where(valid, rng.integers(0, 2, valid.shape), 0)
    elif row.segments == "split":  # segment 1 from position 6
        segments = (np.arange(T)[None] >= 6) & valid
    else:
        segments = np.zeros_like(ids)
    return ids, segments.astype(np.int32), valid


def encoder_outputs(row, model, ids, segments, valid):
    """A transformers encoder's outputs of the padded rows (their token types where the row has them)."""
    import torch
    t = lambda x: torch.tensor(np.asarray(x, np.int64))
    kw = {"token_type_ids": t(segments)} if row.segments else {}
    with torch.no_grad():
        return model(input_ids=t(ids), attention_mask=t(valid), **kw)


def edited(src, dst, **fields) -> str:
    """A copy of checkpoint directory `src` whose config.json has `fields` set (None: removed; its weights linked,
    not copied)."""
    os.makedirs(dst)
    os.symlink(os.path.join(src, "model.safetensors"), os.path.join(dst, "model.safetensors"))
    hf_cfg = {**json.load(open(os.path.join(src, "config.json"))), **fields}
    with open(os.path.join(dst, "config.json"), "w") as f:
        json.dump({k: v for k, v in hf_cfg.items() if v is not None}, f)
    return str(dst)


@dataclasses.dataclass(frozen=True)
class Converted:
    """A row's zoo run: its directory, what from_hf left unused, and the run as load_run reads it."""
    run: str
    unused: list
    model: object
    params: dict
    tokenizer: object
    config: object


class References:
    """The rows of tests/hf/parity_table.py, each built (torch seed, config, perturbed weights, saved) and
    converted once a session, whichever xdist worker asks first (tests/helpers/shared.py); each process loads
    the saved directories, so every test of every module reads the same reference."""

    def __init__(self, tmp_path_factory):
        self._factory, self._models, self._runs = tmp_path_factory, {}, {}

    def directory(self, name: str) -> str:
        """The row's transformers checkpoint directory (weights, config.json, the row's tokenizer)."""
        from tests.hf.parity_table import ROWS
        return str(shared.once(self._factory, f"hf-{name}", lambda path: build_reference(ROWS[name], path)))

    def reference(self, name: str):
        """(checkpoint directory, the transformers model it holds, in eval mode)."""
        src = self.directory(name)
        if name not in self._models:
            import transformers
            from tests.hf.parity_table import ROWS
            cls = getattr(transformers, ROWS[name].model)
            self._models[name] = cls.from_pretrained(src, attn_implementation="eager").eval()
        return src, self._models[name]

    def converted(self, name: str) -> Converted:
        """The row's directory converted by `hf.from_hf` (once a session) and loaded by load_run."""
        if name not in self._runs:
            from zoo.training import runs
            src = self.directory(name)

            def convert(path):
                report = hf.from_hf(src, str(path / "run"), verbose=False)
                (path / "unused.json").write_text(json.dumps(report["unused"]))
            path = shared.once(self._factory, f"hf-run-{name}", convert)
            self._runs[name] = Converted(str(path / "run"), json.loads((path / "unused.json").read_text()),
                                         *runs.load_run(str(path / "run")))
        return self._runs[name]


def check_conversion(row, run: Converted) -> None:
    """What the parity table says a row's conversion holds: nothing unused, its task, its zoo fields, the shapes of
    the params it names, none of those it says are absent, and its top-level params."""
    assert run.unused == []
    assert not row.task or run.config.task == row.task
    assert {k: getattr(run.config.model, k) for k in row.converts_to} == row.converts_to
    assert {path: param(run.params, path).shape for path in row.shapes} == row.shapes
    for path in row.absent:
        parent, key = path.rsplit("/", 1)
        assert key not in param(run.params, parent), path
    assert not row.param_keys or set(run.params) == set(row.param_keys)


def check_converts_back(exported: str, again: str, run: Converted) -> None:
    """An export `exported` converts back (into `again`) with nothing unused to the run's model and its params,
    to the bit."""
    import jax
    report = hf.from_hf(exported, again, verbose=False)
    assert report["unused"] == [] and report["config"].model == run.config.model
    assert jax.tree.structure(report["params"]) == jax.tree.structure(run.params)
    for x, y in zip(jax.tree.leaves(report["params"]), jax.tree.leaves(run.params)):
        np.testing.assert_array_equal(x, y)


def param(params, path: str):
    """The leaf or subtree at "a/b/c" of a params tree."""
    for key in path.split("/"):
        params = params[key]
    return params


def build_reference(row, path) -> None:
    """Save the row's small random transformers model (and its tokenizer) into `path`: seeded, with the weights
    its init leaves at ones or zeros (norms, biases, a zero router; or every weight) moved, so a swapped or dropped
    one shows."""
    import torch
    import transformers
    torch.manual_seed(row.seed)
    model = getattr(transformers, row.model)(getattr(transformers, row.config)(**row.kwargs)).eval()
    with torch.no_grad():
        for name, std in row.redraw:  # a weight of its own, drawn before the perturbation
            owner, attr = name.rsplit(".", 1)
            shape = getattr(model.get_submodule(owner), attr).shape
            setattr(model.get_submodule(owner), attr, torch.nn.Parameter(std * torch.randn(*shape)))
        for n, p in model.named_parameters():
            if "all" in row.perturb or ("norm" in row.perturb and "norm" in n) or \
                    ("bias" in row.perturb and n.endswith(".bias")):
                p.add_(row.scale * torch.randn_like(p))
            if "router" in row.perturb and n.endswith("mlp.gate.weight"):
                p.normal_(0.0, 0.2)
        for name, op, value in row.then:  # a parameter or a buffer (BART's final_logits_bias)
            owner, attr = name.rsplit(".", 1) if "." in name else ("", name)
            t = getattr(model.get_submodule(owner), attr)
            t.mul_(value) if op == "mul" else t.normal_(0.0, value)
    model.save_pretrained(str(path))
    if row.tokenizer:
        from tests.hf.parity_table import save_tokenizer
        save_tokenizer(row.tokenizer, path)


@pytest.fixture(scope="session", name="hf_refs")
def hf_refs_fixture(tmp_path_factory) -> References:
    """The parity table's references and their conversions, each built once a session on first use."""
    return References(tmp_path_factory)
