"""zoo as a library: zoo.load's Pretrained generates what zoo-sample prints and transformers' greedy generate gives,
token for token (one prompt, and prompts of different lengths in one batch); its log-probabilities equal
transformers'; a loop of one's own over loss_fn starts at the trainer's first-step loss and goes down; zoo.train
from Python equals `python train.py` bit for bit; `import zoo` imports no jax; every public name is documented;
bad input raises a typed one-line error before any model is built."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="torch is not installed: the reference runs transformers (PyTorch)")
transformers = pytest.importorskip("transformers", reason="transformers is not installed")

import jax  # noqa: E402
import optax  # noqa: E402

import zoo  # noqa: E402
from conftest import replace  # noqa: E402
from tests.helpers import hf_runs, processes, tiny_configs, tiny_lms  # noqa: E402
from zoo import tasks  # noqa: E402
from zoo.api import decoder  # noqa: E402
from zoo.cli import sample as zoo_sample  # noqa: E402
from zoo.errors import ArgumentError, CheckpointError, ConfigError, FamilyError  # noqa: E402
from zoo.training import checkpoint, runs  # noqa: E402

one_torch_thread = hf_runs.one_torch_thread  # autouse
PROMPTS = ["Hi", "The cat sat", "0123456789 abcdef"]
NEW = 10


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    """(Hugging Face directory, zoo run converted from it, transformers model) of the tiny random Llama."""
    src = tmp_path_factory.mktemp("llama") / "hf"
    torch_model = tiny_lms.llama(src)
    run = str(tmp_path_factory.mktemp("llama") / "run")
    zoo.hf.from_hf(str(src), run, verbose=False)
    return str(src), run, torch_model


def reference(torch_model, prompts: list[list[int]]) -> list[list[int]]:
    """transformers' greedy generate over the left-padded batch, each row cut before its first end-of-text."""
    P, eot = max(map(len, prompts)), tiny_lms.EOT
    ids = torch.tensor([[0] * (P - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (P - len(p)) + [1] * len(p) for p in prompts])
    with torch.no_grad():
        out = torch_model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=NEW, do_sample=False,
                                   eos_token_id=eot, pad_token_id=eot)
    return [r[P:r.index(eot, P)] if eot in r[P:] else r[P:] for r in out.tolist()]


def test_generate_equals_zoo_sample_and_transformers_for_one_prompt_and_a_batch(llama, capsys):
    src, run, torch_model = llama
    for source in (src, run):  # in memory from the Hugging Face directory, and the converted run
        lm = zoo.load(source)
        ids = [lm.tokenize(p) for p in PROMPTS]
        want = reference(torch_model, ids)
        assert len({tuple(w) for w in want}) == 3 and all(w for w in want)
        assert decoder.generate_ids(lm, ids, max_new_tokens=NEW) == want
        assert lm.generate(PROMPTS, max_new_tokens=NEW) == [lm.detokenize(w) for w in want]
        for p, w in zip(PROMPTS, want):  # one prompt alone: a string in, a string out, the same tokens
            assert decoder.generate_ids(lm, [lm.tokenize(p)], max_new_tokens=NEW) == reference(torch_model,
                                                                                                 [lm.tokenize(p)])
            assert lm.generate(p, max_new_tokens=NEW) == lm.detokenize(w)
    args = ["--temperature", "0", "--max-new-tokens", str(NEW)]
    assert zoo_sample.main([run, *[a for p in PROMPTS for a in ("--prompt", p)], *args]) == 0
    printed = capsys.readouterr().out.split("--- prompt ")[1:]
    assert printed == [f"{i}\n{p}{lm.generate(p, max_new_tokens=NEW)}\n" for i, p in enumerate(PROMPTS)]
    assert zoo_sample.main([run, "--prompt", PROMPTS[1], *args]) == 0
    assert capsys.readouterr().out == PROMPTS[1] + lm.generate(PROMPTS[1], max_new_tokens=NEW) + "\n"


def test_sampling_n_and_stop_strings(llama):
    lm = zoo.load(llama[1])
    a = lm.generate("The", max_new_tokens=8, temperature=1.0, seed=3, n=3)
    assert a == lm.generate("The", max_new_tokens=8, temperature=1.0, seed=3, n=3) and len(set(a)) == 3
    both = lm.generate(["The", "Hi"], max_new_tokens=8, temperature=1.0, seed=3, n=2)
    assert len(both) == 2 and all(len(x) == 2 for x in both)
    full = lm.generate("The", max_new_tokens=NEW)
    assert lm.generate("The", max_new_tokens=NEW, stop=full[3:5]) == full[:full.index(full[3:5])]


def test_single_prompts_of_nearby_lengths_share_one_program(llama):
    from zoo.infer import sample
    lm = zoo.load(llama[1])
    lm.generate("warm", max_new_tokens=5)
    before = sample._generate._cache_size()
    for prompt in ("abcdefghij", "abcdefghijkl", "abcdefghij klmn"):  # 10, 12 and 15 tokens: one bucket of 16
        lm.generate(prompt, max_new_tokens=5)
    assert sample._generate._cache_size() == before + 1


def test_logprobs_equal_transformers(llama):
    src, _, torch_model = llama
    lm = zoo.load(src)
    texts = ["Hello world", "a", "The cat sat on the mat."]
    got = lm.logprobs(texts)
    for text, lp in zip(texts, got):
        ids = [tiny_lms.EOT, *lm.tokenize(text)]  # the first token conditioned on end-of-text, as zoo-eval does
        logits = hf_runs.hf_logits(torch_model, [ids])[0]
        want = torch.log_softmax(torch.tensor(logits), -1).numpy()[np.arange(len(ids) - 1), ids[1:]]
        assert lp.shape == (len(ids) - 1,)
        np.testing.assert_allclose(lp, want, atol=1e-4)
    assert lm.logprobs(texts[0]).shape == got[0].shape
    n = sum(len(x) for x in got)
    assert lm.loss(texts) == pytest.approx(-sum(x.sum() for x in got) / n, rel=1e-6)


def test_a_long_text_is_scored_in_windows_as_zoo_eval_scores_it(llama):
    from zoo.eval.perplexity import document_logliks
    lm = zoo.load(llama[1])
    text = "the quick brown fox jumps over the lazy dog " * 3  # 132 tokens, the window is 32
    lp = lm.logprobs(text)
    ids = lm.tokenize(text)
    total = document_logliks(lm.model, lm.params, [ids], prefix=tiny_lms.EOT, context=lm.config.window,
                             stride=lm.config.window // 2)[0]
    assert lp.shape == (len(ids),) and lp.sum() == pytest.approx(total, rel=1e-5)


def test_an_optax_loop_over_loss_fn_starts_at_the_trainers_first_step_loss_and_learns(tmp_path, cache_dir):
    cfg = replace(tiny_configs.gpt_lm(cache_dir), model=dict(dropout=0.0), train=dict(steps=2, save_every=2))
    base = zoo.train(cfg, workdir=str(tmp_path / "base"), quiet=True)
    sets = {"train.steps": 1, "train.batch_size": 8, "data.seq_len": 32, "data.cache_dir": cache_dir}
    tuned = zoo.train(init_from=base.workdir, workdir=str(tmp_path / "ft"), overrides=sets, quiet=True)
    lm = base.load()
    batch = tasks.build(tuned.config).make_data(tuned.config, 0, 1).train(0)  # the trainer's first batch
    loss, metrics = jax.jit(lm.loss_fn)(lm.params, batch)
    assert float(loss) == pytest.approx(tuned.records[0]["loss"], rel=1e-5)
    assert float(metrics["weight"]) == batch["weights"].sum()

    texts = ["def add(a, b):\n    return a + b\n", "for i in range(10):\n    print(i)\n"] * 2
    batch = lm.batch(texts)
    assert set(batch) == {"inputs", "targets", "weights", "positions", "segment_ids"}
    opt = optax.adam(3e-3)
    params, state = lm.params, opt.init(lm.params)

    @jax.jit
    def step(params, state, batch):
        (loss, _), grads = jax.value_and_grad(lm.loss_fn, has_aux=True)(params, batch)
        updates, state = opt.update(grads, state, params)
        return optax.apply_updates(params, updates), state, loss
    losses = []
    for _ in range(25):
        params, state, loss = step(params, state, batch)
        losses.append(float(loss))
    assert losses[-1] < 0.6 * losses[0]
    assert lm.with_params(params).loss(texts) < lm.loss(texts)


def test_zoo_train_equals_train_py_bit_for_bit(tmp_path, cache_dir):
    sets = {"train.steps": 3, "train.batch_size": 8, "data.seq_len": 32, "train.eval_every": 3, "train.log_every": 1,
            "train.sample_tokens": 0, "data.cache_dir": cache_dir, "model.num_layers": 2}
    ours = zoo.train("gpt_tiny", workdir=str(tmp_path / "py"), overrides=sets, quiet=True)
    argv = [a for k, v in sets.items() for a in ("--set", f"{k}={v}")]
    p = subprocess.run([sys.executable, "train.py", "gpt_tiny", "--workdir", str(tmp_path / "cli"), *argv],
                       cwd=processes.ROOT, env=processes.environment(8), capture_output=True, text=True)
    assert p.returncode == 0, p.stderr[-2000:]
    py, cli = (runs.load_params(str(tmp_path / d)) for d in ("py", "cli"))
    assert jax.tree.all(jax.tree.map(lambda a, b: bool(np.array_equal(a, b)), py, cli))
    keys = ("step", "loss", "grad_norm", "param_norm", "eval_loss")
    read = [[{k: r.get(k) for k in keys} for r in map(json.loads, open(tmp_path / d / "metrics.jsonl"))]
            for d in ("py", "cli")]
    assert read[0] == read[1] == [{k: r.get(k) for k in keys} for r in ours.records] and ours.step == 3
    assert ours.config == runs.load_config(str(tmp_path / "cli"))


def test_import_zoo_imports_no_jax():
    code = ("import sys, time; t = time.perf_counter(); import zoo; t = time.perf_counter() - t; "
            "print(t, 'jax' in sys.modules, 'flax' in sys.modules, sorted(zoo.__all__) == sorted(set(zoo.__all__)))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert out[1:] == ["False", "False", "True"] and float(out[0]) < 0.5


def test_every_public_name_has_a_docstring():
    names = [getattr(zoo, n) for n in zoo.__all__]
    methods = [getattr(cls, m) for cls in (zoo.Pretrained, zoo.Run) for m in vars(cls)
               if not m.startswith("_") and callable(getattr(cls, m))]
    undocumented = [getattr(x, "__qualname__", repr(x)) for x in names + methods if not (x.__doc__ or "").strip()]
    assert not undocumented and len(methods) >= 17


@pytest.fixture(scope="module")
def bert():
    return zoo.load("bert_tiny")


def bad_calls(run, bert):
    """(what, the call, the exception class, a piece of its one line)."""
    lm = zoo.load(run)
    return [
        ("a missing path", lambda: zoo.load("/no/such/run"), CheckpointError, "'/no/such/run': no such file"),
        ("an unknown preset", lambda: zoo.load("gpt_huge"), CheckpointError, "presets: gpt_tiny"),
        ("a directory of no kind", lambda: zoo.load(os.path.dirname(run)), CheckpointError, "none zoo reads"),
        ("a bad dtype", lambda: zoo.load(run, dtype="int8"), ArgumentError, "dtype='int8'"),
        ("step on a preset", lambda: zoo.load("gpt_tiny", step=2), ArgumentError, "step=2"),
        ("messages and a conversation mixed", lambda: lm.chat(["Hi", [{"role": "user", "content": "Hi"}]]),
         ArgumentError, "messages=['Hi', "),
        ("an empty message in a batch", lambda: lm.chat(["Hi", ""]), ArgumentError, "messages=['Hi', '']"),
        ("a message without content", lambda: lm.chat([{"role": "user"}]), ValueError, "content"),
        ("max_new_tokens=0", lambda: lm.generate("x", max_new_tokens=0), ArgumentError, "max_new_tokens=0"),
        ("a negative temperature", lambda: lm.generate("x", temperature=-1), ArgumentError, "temperature=-1"),
        ("an infinite temperature", lambda: lm.generate("x", temperature=float("inf")), ArgumentError, "inf"),
        ("top_k past the vocabulary", lambda: lm.generate("x", top_k=10 ** 9), ArgumentError, "top_k=1000000000"),
        ("no prompts", lambda: lm.generate([]), ArgumentError, "prompts=[]"),
        ("a BERT asked to generate", lambda: bert.generate("x"), FamilyError, "offers fill_mask"),
        ("a decoder asked to classify", lambda: lm.classify("x"), FamilyError, "needs a bert_cls model"),
        ("a save format", lambda: lm.save("/tmp/x", format="onnx"), ArgumentError, "format='onnx'"),
        ("peft without adapters", lambda: lm.save("/tmp/x", format="peft"), ArgumentError, "holds none"),
        ("resume without a workdir", lambda: zoo.train(resume=True), ArgumentError, "give workdir="),
        ("an unknown config key", lambda: zoo.config("gpt_tiny", train={"nosuch": 1}), ConfigError, "train.nosuch"),
        ("overrides as a string", lambda: zoo.train("gpt_tiny", overrides="train.steps=3"), ArgumentError,
         "overrides='train.steps=3'"),
        ("a step the run does not hold", lambda: zoo.load(run, step=999), ArgumentError, "step=999: "),
        ("a stop that is no string", lambda: lm.generate("x", stop=5), ArgumentError, "stop=5"),
        ("a lone surrogate in a prompt", lambda: lm.generate("a\ud800"), ArgumentError, "lone surrogate"),
        ("a lone surrogate in a message", lambda: lm.chat("\udc80"), ArgumentError, "message 0's content"),
        ("a lone surrogate to score", lambda: lm.logprobs(["ok", "\udc80"]), ArgumentError, "texts[1] holds"),
        ("another family's params", lambda: lm.with_params(bert.params), ArgumentError, "not a tree of this model's"),
        ("params of None", lambda: lm.with_params(None), ArgumentError, "params=None"),
        ("empty params", lambda: lm.with_params({}), ArgumentError, "params=dict {}"),
        ("an empty chat message", lambda: lm.chat(""), ArgumentError, "messages=''"),
        ("a workdir that is no path", lambda: zoo.train("gpt_tiny", workdir=5), ArgumentError, "workdir=5"),
    ]


def test_bad_input_raises_one_typed_line_before_any_model_is_built(llama, bert, monkeypatch):
    cases = bad_calls(llama[1], bert)
    built = []
    monkeypatch.setattr(tasks, "build", lambda *a: built.append(a) or pytest.fail("a model was built"))
    monkeypatch.setattr(runs, "load_weights", lambda *a, **k: pytest.fail("a checkpoint was read"))
    for what, call, kind, piece in cases:
        with pytest.raises(kind) as e:
            call()
        assert piece in str(e.value) and "\n" not in str(e.value), what
    assert not built


def test_save_as_zoo_and_as_hugging_face_round_trips(llama, tmp_path):
    lm = zoo.load(llama[1])
    lm.save(str(tmp_path / "zoo"), verbose=False)
    lm.save(str(tmp_path / "hf"), format="hf", verbose=False)
    for out in ("zoo", "hf"):
        back = zoo.load(str(tmp_path / out))
        assert jax.tree.all(jax.tree.map(lambda a, b: bool(np.array_equal(a, b)), back.params, lm.params))
        assert back.generate(PROMPTS, max_new_tokens=NEW) == lm.generate(PROMPTS, max_new_tokens=NEW)
    with pytest.raises(zoo.errors.ConversionError, match="not empty"):
        lm.save(str(tmp_path / "zoo"))
    assert checkpoint.all_steps(str(tmp_path / "zoo")) == [0]


def test_presets_dtype_and_a_mesh(llama):
    from zoo.configuration import MeshConfig
    from zoo.training import sharding
    lm = zoo.load(llama[1], dtype="bfloat16")
    assert {x.dtype.name for x in jax.tree.leaves(lm.params)} == {"bfloat16"} and lm.config.model.dtype == "bfloat16"
    assert isinstance(lm.generate("Hi", max_new_tokens=3), str)
    mesh = sharding.make_mesh(MeshConfig(data=2, fsdp=2, tensor=2))
    sharded = zoo.load(llama[1], mesh=mesh)
    embed = sharded.params["wte"]["embedding"]
    assert len(embed.sharding.device_set) == 8 and not embed.sharding.is_fully_replicated
    assert sharded.generate(PROMPTS, max_new_tokens=NEW) == zoo.load(llama[1]).generate(PROMPTS, max_new_tokens=NEW)
    fresh = zoo.load("llama_tiny", seed=1)
    assert fresh.kind == "preset" and fresh.config.model.num_layers == 4
    for lm in (zoo.load(llama[0]), zoo.load(llama[1]), fresh):  # a Hugging Face directory, a run, a preset
        # on the device already: host arrays would be copied there again by every jitted call
        assert all(isinstance(x, jax.Array) for x in jax.tree.leaves(lm.params)), lm.kind
    model, params, tok, cfg = fresh  # unpacks as zoo.from_pretrained's tuple did
    assert params is fresh.params and tok.n_vocab == 257
