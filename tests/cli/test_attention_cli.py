"""zoo-attention on a run of each family (its tiny config's initial weights, saved as a run): a PNG, and
one line per drawn head saying where its weight goes; --kind, --layer and --head pick panels; bad input
is one `error:` line."""

import functools

import flax.linen as nn
import jax
import pytest

from tests.helpers import tiny_configs
from zoo import tasks
from zoo.cli import attention
from zoo.training.checkpoint import save_weights

PNG = b"\x89PNG\r\n\x1a\n"
BUILD = {"gpt": tiny_configs.gpt_lm, "bert": functools.partial(tiny_configs.bert, "bert_mlm"),
         "encdec": tiny_configs.seq2seq}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """family -> a run directory holding its tiny config's initial weights (a weights-only checkpoint, as
    zoo-convert writes one: what the command reads of a trained run, without the training)."""
    root = tmp_path_factory.mktemp("attention_runs")
    for family, build in BUILD.items():
        cfg = build(str(root / "cache"))
        save_weights(str(root / family), nn.unbox(tasks.build(cfg).init(jax.random.PRNGKey(0))), cfg)
    return {family: str(root / family) for family in BUILD}


# family, text, the attention layers drawn (kind, layers) and heads per layer of its tiny config.
CASES = [("gpt", "To be, or not to be", [("self-attention", 2)], 4),
         ("bert", 'The "wh[MASK]le" statement', [("self-attention", 2)], 2),
         ("encdec", "tiny words here", [("encoder self-attention", 1), ("decoder self-attention", 1),
                                           ("cross-attention", 1)], 4)]


@pytest.mark.parametrize("family, text, kinds, heads", CASES, ids=[c[0] for c in CASES])
def test_a_png_and_a_line_per_head_for_each_family(runs, family, text, kinds, heads, tmp_path, capsys):
    out = tmp_path / "attention.png"
    assert attention.main([runs[family], "--text", text, "--out", str(out)]) == 0
    assert out.read_bytes()[:8] == PNG
    lines = capsys.readouterr().out.splitlines()
    expected = [f"{kind} layer {layer} head {h}: " for kind, n in kinds for layer in range(n) for h in range(heads)]
    assert [line[:len(e)] for line, e in zip(lines, expected)] == expected and len(lines) == len(expected) + 1
    self_lines = [line for line in lines[:-1] if not line.startswith("cross")]
    assert all(" previous " in line and ", distance " in line for line in self_lines)
    assert all(", peak " in line for line in lines[:-1] if line.startswith("cross"))
    rows = sum(n for _, n in kinds)
    assert lines[-1] == f"wrote {out}: {rows * heads} panels, {rows} attention layers x {heads} heads"


def test_kind_layer_and_head_pick_the_panels(runs, tmp_path, capsys):
    out = tmp_path / "one.png"
    assert attention.main([runs["gpt"], "--text", "To be", "--layer", "1", "--head", "2", "--out", str(out)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 2 and lines[0].startswith("self-attention layer 1 head 2: previous ")
    assert lines[1] == f"wrote {out}: 1 panel, 1 attention layer x 1 head"
    assert out.read_bytes()[:8] == PNG
    assert attention.main([runs["encdec"], "--text", "tiny words here", "--target", "here words tiny",
                           "--kind", "cross", "--out", str(out)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split(":")[0] for line in lines[:-1]] == [f"cross-attention layer 0 head {h}" for h in range(4)]


def test_bad_input_is_one_error_line(runs, tmp_path, capsys):
    out = str(tmp_path / "x.png")
    assert attention.main([runs["gpt"], "--text", "To be", "--layer", "5", "--out", out]) == 2
    assert attention.main([runs["gpt"], "--text", "To be", "--head", "4", "--out", out]) == 2
    assert attention.main([runs["gpt"], "--text", "To be", "--kind", "cross", "--out", out]) == 2
    assert attention.main([runs["gpt"], "--text", "To be", "--target", "eb oT", "--out", out]) == 2
    assert attention.main([runs["gpt"], "--text", "x" * 33, "--out", out]) == 2
    assert attention.main([str(tmp_path / "nowhere"), "--text", "To be", "--out", out]) == 2
    err = capsys.readouterr().err.splitlines()
    assert err[:5] == ["error: --layer 5 is not a layer of this run; choose 0..1",
                       "error: --head 4 is not a head of this run; choose 0..3",
                       "error: --kind cross: a gpt run has self",
                       f"error: --target is the decoder's text of an encoder-decoder run; {runs['gpt']!r} is a gpt run",
                       "error: --text is 33 tokens, more than the run's data.seq_len=32 it trained on; shorten it"]
    assert len(err) == 6 and err[5].startswith("error: no checkpoint in ")
