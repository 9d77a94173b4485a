"""Batched generation: prompts of different lengths, left-padded into one batch, give each row its own greedy
output token for token, equal to transformers' generate with left padding and an attention mask (a tiny
GPT-2: learned positions; a tiny Llama: rotary; a sliding window), stop per row at end-of-text, compile once
per length bucket, and zoo-sample takes several --prompt flags."""

import pytest

torch = pytest.importorskip("torch", reason="torch is not installed: the reference runs transformers (PyTorch)")
transformers = pytest.importorskip("transformers", reason="transformers is not installed")

import flax.linen as nn  # noqa: E402
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

from tests.helpers import tiny_lms  # noqa: E402
from tests.helpers import hf_runs  # noqa: E402
from zoo import hf  # noqa: E402
from zoo.cli import sample as zoo_sample  # noqa: E402
from zoo.infer import sample  # noqa: E402
from zoo.models.gpt import Gpt, GptConfig  # noqa: E402

PROMPTS = [[72, 101, 108], [84, 104, 101, 32, 99, 97, 116], [10, 20, 30, 40, 50, 60, 70, 80, 90, 100, 110, 120]]
NEW = 10
one_torch_thread = hf_runs.one_torch_thread  # autouse


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """name -> (zoo run directory, (model, params, tokenizer, cfg), the transformers model)."""
    out = {}
    for name, build in tiny_lms.BUILDERS.items():
        src = tmp_path_factory.mktemp(name) / "hf"
        torch_model = build(src)
        run = str(tmp_path_factory.mktemp(name) / "run")
        hf.from_hf(str(src), run, verbose=False)
        out[name] = (run, hf.from_pretrained(run), torch_model)
    return out


def reference(torch_model, prompts, eos_id):
    """transformers' greedy generate over the left-padded batch, each row cut before its first eos."""
    P = max(len(p) for p in prompts)
    ids = torch.tensor([[0] * (P - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (P - len(p)) + [1] * len(p) for p in prompts])
    with torch.no_grad():
        out = torch_model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=NEW, do_sample=False,
                                   eos_token_id=eos_id, pad_token_id=eos_id)
    rows = [row[P:] for row in out.tolist()]
    return [row[:row.index(eos_id)] if eos_id in row else row for row in rows]


@pytest.mark.parametrize("name", ["gpt2", "llama"])
def test_each_row_equals_its_own_output_and_transformers(models, name):
    _, (model, params, _, cfg), torch_model = models[name]
    greedy = dict(temperature=0.0, window=cfg.window)
    alone = [sample.generate(model, params, p, NEW, **greedy)[0] for p in PROMPTS]
    assert len({tuple(a) for a in alone}) == 3 and all(len(a) == NEW for a in alone)
    # An end-of-text the middle row says at its 4th token: that row stops there, the others go on (a row
    # without it, all NEW tokens: its unbatched output whole), as transformers' rows do.
    eos = alone[1][3]
    cut = [a[:a.index(eos)] if eos in a else a for a in alone]
    assert len(cut[1]) < NEW and max(len(c) for c in cut) > len(cut[1])
    batched = sample.generate_batch(model, params, PROMPTS, NEW, eos_id=eos, **greedy)
    assert batched == cut == reference(torch_model, PROMPTS, eos)


def test_a_sliding_window_counts_each_rows_own_positions():
    """Mistral's window (4 keys) over a batch: row distances are per row, not over the padded slots."""
    model = Gpt(GptConfig(vocab_size=64, max_len=32, num_layers=2, d_model=32, num_heads=4, num_kv_heads=2, d_ff=64,
                          sliding_window=4, positions="rope", norm="rmsnorm", mlp="swiglu", dropout=0.0))
    params = jax.jit(model.init)(jax.random.PRNGKey(0), jnp.zeros((1, 4), jnp.int32))["params"]
    params = jax.tree.map(lambda p: p * 4.0, nn.unbox(params))  # far from uniform attention
    batched = sample.generate_batch(model, params, [[5, 9], [1, 2, 3, 4, 5, 6]], 8, temperature=0.0)
    # The padded row (4 padding slots, as many as the window) as alone; the other row has no padding.
    assert batched[0] == sample.generate(model, params, [5, 9], 8, temperature=0.0)[0] != batched[1]


def test_one_compilation_per_length_bucket(models):
    _, (model, params, _, cfg), _ = models["gpt2"]
    run = lambda prompts: sample.generate_batch(model, params, prompts, 7, temperature=0.0, window=cfg.window)
    before = sample._generate._cache_size()
    outs = [run([list(range(1, n + 1)), [5] * m]) for n, m in ((9, 16), (12, 10), (16, 13))]  # bucket 16
    assert sample._generate._cache_size() == before + 1
    run([[1, 2, 3], [4, 5]])  # bucket 4: a second compilation
    assert sample._generate._cache_size() == before + 2
    assert all(len(row) == 7 for out in outs for row in out)


def test_a_batch_past_the_window_is_refused(models):
    _, (model, params, _, cfg), _ = models["gpt2"]
    with pytest.raises(ValueError, match="not cropped to the 32-token window: the longest prompt \\(30 tokens\\)"):
        sample.generate_batch(model, params, [[1] * 30, [2]], 5, window=cfg.window)
    with pytest.raises(ValueError, match="the prompt is empty"):
        sample.generate_batch(model, params, [[1], []], 5)


def test_cli_samples_several_prompts_in_one_batch(models, capsys):
    run = models["gpt2"][0]
    args = ["--temperature", "0", "--max-new-tokens", "8"]
    assert zoo_sample.main([run, "--prompt", "Hi", "--prompt", "The cat sat", *args]) == 0
    both = capsys.readouterr().out
    assert zoo_sample.main([run, "--prompt", "The cat sat", *args]) == 0
    alone = capsys.readouterr().out
    head, first, second = both.split("--- prompt ")
    assert head == "" and first.startswith("0\nHi") and second == "1\n" + alone
    assert len(alone) > len("The cat sat\n")


def test_runs_of_one_prompt_are_prefilled_once_and_decode_as_every_row_prefilled(models):
    """GRPO's G completions of a prompt (`group`): each run of equal prompts is prefilled once, its keys and values
    repeated to its rows. The greedy tokens are those of every row prefilled; sampled rows of a run still differ;
    the compiled program does a quarter of the prefill's work; prompts not in runs are prefilled row by row."""
    _, (model, params, _, cfg), _ = models["llama"]
    prompts = [p for p in PROMPTS[:2] for _ in range(4)]
    greedy = dict(temperature=0.0, window=cfg.window)
    assert sample.generate_batch(model, params, prompts, NEW, group=4, **greedy) == \
        sample.generate_batch(model, params, prompts, NEW, **greedy)
    drawn = sample.generate_batch(model, params, prompts, NEW, group=4, temperature=1.0, seed=3, window=cfg.window)
    assert len({tuple(d) for d in drawn[:4]}) > 1
    P = 8
    ids = jnp.asarray([[0] * (P - len(p)) + p for p in prompts])
    pad = jnp.asarray([P - len(p) for p in prompts])

    def flops(group):
        c = sample._generate.lower(params, ids, jax.random.PRNGKey(0), pad, model=model, max_new_tokens=1,
                                   temperature=0.0, top_k=0, top_p=1.0, vocab_limit=model.cfg.vocab_size, eos_id=None,
                                   group=group).compile().cost_analysis()
        return (c[0] if isinstance(c, list) else c)["flops"]
    assert flops(4) < 0.5 * flops(1)
    # not in runs of 4 (the second prompt's run broken): every row prefilled, the same tokens as group=1
    mixed = prompts[:5] + [PROMPTS[2]] + prompts[6:]
    assert sample.generate_batch(model, params, mixed, NEW, group=4, **greedy) == \
        sample.generate_batch(model, params, mixed, NEW, **greedy)
