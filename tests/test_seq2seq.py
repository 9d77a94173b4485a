"""seq2seq: batches, bad input, the trainer's invariants (1 vs 8 devices, exact resume), init_from of
another family, learning the offline task, BLEU, and the translate CLI."""

import json
import os

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from conftest import replace
from tests.helpers import plain_losses
from zoo import seq2seq_data, tasks, trainer, translate
from zoo.config import Config, ConfigError, DataConfig, EncDecConfig, OptimConfig, TrainConfig
from zoo.tokenizers import ByteTokenizer, ZooDataError

TOK = ByteTokenizer()
SP = seq2seq_data.specials(TOK)  # EOS 256 (the tokenizer's eot), BOS 257, PAD 258


@pytest.fixture
def s2s_cfg(cache_dir):
    """A 1+1-layer encoder-decoder on the offline task, dropout and label smoothing on."""
    return Config(
        task="seq2seq",
        model=EncDecConfig(vocab_size=264, max_len=32, num_encoder_layers=1, num_decoder_layers=1, d_model=32,
                           num_heads=4, d_ff=64, dropout=0.1, label_smoothing=0.1, pre_ln=True),
        data=DataConfig(source="builtin", tokenizer="bytes", seq_len=16, cache_dir=cache_dir),
        optim=OptimConfig(lr=1e-3, schedule="cosine", warmup=2),
        train=TrainConfig(steps=6, batch_size=16, log_every=1, eval_every=0, save_every=3, keep=5),
    )


def run(cfg, workdir, **kw):
    return trainer.train(cfg, str(workdir), progress=False, **kw)


def losses(workdir):
    with open(os.path.join(workdir, "metrics.jsonl")) as f:
        return {r["step"]: r["loss"] for r in map(json.loads, f) if "loss" in r}


def write_jsonl(path, rows):
    with open(path, "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in rows)
    return str(path)


# ---- data ---------------------------------------------------------------------------------------
def test_builtin_task_reverses_the_words_of_corpus_phrases(s2s_cfg):
    sources, targets = seq2seq_data.load_pairs(s2s_cfg.data, TOK)
    pairs = dict(zip(sources, targets))
    assert pairs["but not with"] == "with not but"
    assert all(len(s) <= 15 for s in sources) and len(sources) > 5000  # phrases that fit data.seq_len=16


def test_batches_are_padded_per_batch_and_a_pure_function_of_the_step(s2s_cfg):
    cfg = replace(s2s_cfg, data=dict(seq_len=32))
    data = tasks.build(cfg).make_data(cfg, 0, 1)
    b = data.train(5)
    again = seq2seq_data.seq2seq_data(cfg, 0, 1).train(5)
    assert all(np.array_equal(b[k], again[k]) for k in b)
    assert not np.array_equal(data.train(6)["src"], b["src"])
    S, T = b["src"].shape[1], b["tgt_out"].shape[1]
    src_len, tgt_len = b["src_valid"].sum(1), b["weights"].sum(1).astype(int)
    assert S in (16, 32) and S == seq_lens_bucket(src_len.max()) and T == seq_lens_bucket(tgt_len.max())
    np.testing.assert_array_equal(b["src_valid"], b["src"] != SP.pad)
    np.testing.assert_array_equal(b["tgt_in"][:, 0], SP.bos)  # decoder input = BOS + target shifted right
    np.testing.assert_array_equal(b["tgt_in"][:, 1:], b["tgt_out"][:, :-1])
    np.testing.assert_array_equal(b["weights"] > 0, b["tgt_out"] != SP.pad)
    np.testing.assert_array_equal(b["tgt_out"][np.arange(16), tgt_len - 1], SP.eos)  # targets end in EOS
    np.testing.assert_array_equal(tgt_len, src_len + 1)  # word reversal keeps the length
    # Two processes' rows, stacked, are the one-process batch (same padded shape on both).
    halves = [seq2seq_data.seq2seq_data(cfg, i, 2).train(5) for i in range(2)]
    for k in b:
        np.testing.assert_array_equal(np.concatenate([h[k] for h in halves]), b[k])


def seq_lens_bucket(n):
    return max(8, 1 << (int(n) - 1).bit_length())


def test_local_pairs_with_nested_columns(s2s_cfg, tmp_path):
    rows = [{"translation": {"de": f"Hallo {i}", "en": f"Hello {i}"}} for i in range(40)]
    path = write_jsonl(tmp_path / "wmt.jsonl", rows)
    cfg = replace(s2s_cfg, data=dict(source=path, source_column="translation.de", target_column="translation.en"))
    sources, targets = seq2seq_data.load_pairs(cfg.data, TOK)
    assert sources[3] == "Hallo 3" and targets[3] == "Hello 3"


@pytest.mark.parametrize("field, value, fragment", [
    ("source_column", "src", "data.source_column='src' is not a column of"),
    ("target_column", "tgt", "data.target_column='tgt' is not a column of"),
    ("source_column", "translation.fr", "data.source_column='translation.fr': column 'translation' has no key 'fr'; "
                                        "keys: de, en"),
])
def test_a_missing_column_is_named(s2s_cfg, tmp_path, field, value, fragment):
    rows = [{"translation": {"de": "Hallo", "en": "Hello"}, "source": "a", "target": "b"}] * 4
    cfg = replace(s2s_cfg, data=dict(source=write_jsonl(tmp_path / "d.jsonl", rows), **{field: value}))
    with pytest.raises(ZooDataError) as e:
        seq2seq_data.load_pairs(cfg.data, TOK)
    assert fragment in str(e.value) and "\n" not in str(e.value)


def test_long_sequences_are_truncated_and_counted(s2s_cfg, tmp_path, capsys):
    rows = [{"source": "short", "target": "tiny"}] * 10 + [{"source": "x" * 30, "target": "y" * 30}]
    cfg = replace(s2s_cfg, data=dict(source=write_jsonl(tmp_path / "d.jsonl", rows), seq_len=8, val_fraction=0.5))
    train, val = seq2seq_data.split_pairs(cfg, TOK, SP)
    assert "truncated 1 sources and 1 targets (target + EOS) of 11 pairs to data.seq_len=8" in capsys.readouterr().out
    both = [train, val]
    long_tgt = [p.tgt.ids[p.tgt.offsets[i]:p.tgt.offsets[i + 1]] for p in both for i in range(len(p))
                if p.tgt.lengths[i] == 8]
    assert len(long_tgt) == 1 and SP.eos not in long_tgt[0]  # a cut target has no EOS
    assert max(p.src.lengths.max() for p in both if len(p)) == 8


def test_vocabulary_too_small_for_the_specials(s2s_cfg):
    cfg = replace(s2s_cfg, model=dict(vocab_size=258))
    with pytest.raises(ZooDataError, match=r"model.vocab_size=258 .* \(257\) \+ BOS \+ PAD = 259"):
        tasks.build(cfg).make_data(cfg, 0, 1)


def test_a_checkpoint_framing_frames_sources_targets_and_decoder_inputs(s2s_cfg):
    """BART's framing (seq2seq.json of a converted checkpoint): <s> text </s> sources, cut inside the
    text so that both specials stay; targets <s> text </s>; decoder input </s> <s> text; pad 1."""
    tok = ByteTokenizer()
    tok.seq2seq = {"decoder_start": 2, "eos": 2, "pad": 1, "src_prefix": [0], "src_suffix": [2], "tgt_prefix": [0],
                   "beam_style": "hf", "length_penalty": 1.0, "early_stopping": False}
    sp = seq2seq_data.specials(tok)
    assert (sp.bos, sp.vocab_needed, sp.beam_style) == (2, 3, "hf")
    pairs, n_src, n_tgt = seq2seq_data.encode_pairs(tok, sp, ["abc", "x" * 20], ["de", "y" * 20], seq_len=8)
    assert (n_src, n_tgt) == (1, 1)
    src = [pairs.src.ids[pairs.src.offsets[i]:pairs.src.offsets[i + 1]].tolist() for i in range(2)]
    assert src == [[0, 97, 98, 99, 2], [0, *[120] * 6, 2]]
    b = seq2seq_data.make_batch(pairs, np.arange(2), slice(None), sp, seq_len=8)
    np.testing.assert_array_equal(b["tgt_out"][0], [0, 100, 101, 2, 1, 1, 1, 1])
    np.testing.assert_array_equal(b["tgt_in"][0], [2, 0, 100, 101, 2, 1, 1, 1])
    np.testing.assert_array_equal(b["src"][0], [0, 97, 98, 99, 2, 1, 1, 1])
    assert 2 not in b["tgt_out"][1]  # a cut target has no EOS
    src_BS, valid_BS = seq2seq_data.encode_sources(tok, ["ab"], seq_len=8)
    np.testing.assert_array_equal(src_BS[0][valid_BS[0]], [0, 97, 98, 2])
    with pytest.raises(ZooDataError, match=r"input 'abcdefg' is 9 tokens, above the model's data.seq_len=8"):
        seq2seq_data.encode_sources(tok, ["abcdefg"], seq_len=8)
    tok.seq2seq = {**tok.seq2seq, "beam_style": "fairseq"}
    with pytest.raises(ZooDataError, match=r"seq2seq.json beam_style='fairseq'; choose one of gnmt, hf"):
        seq2seq_data.specials(tok)


def test_label_smoothing_matches_optax():
    logits = jax.random.normal(jax.random.PRNGKey(0), (2, 5, 11))
    tgt = jax.random.randint(jax.random.PRNGKey(1), (2, 5), 0, 11)
    w = jnp.array([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]], jnp.float32)
    ref = optax.softmax_cross_entropy(logits, optax.smooth_labels(jax.nn.one_hot(tgt, 11), 0.1))
    got = plain_losses.smoothed_cross_entropy(logits, tgt, w, 0.1)
    np.testing.assert_allclose(got, jnp.sum(ref * w), rtol=1e-5)


# ---- the trainer's invariants -------------------------------------------------------------------
@pytest.mark.parametrize("mesh", [(8, 1, 1), (2, 2, 2)])
def test_eight_devices_match_one(s2s_cfg, tmp_path, mesh):
    cfg = replace(s2s_cfg, train=dict(steps=3))
    one = run(replace(cfg, mesh=dict(data=1, fsdp=1, tensor=1)), tmp_path / "one", devices=jax.devices()[:1])
    d, f, t = mesh
    many = run(replace(cfg, mesh=dict(data=d, fsdp=f, tensor=t)), tmp_path / "many")
    assert many["setup"].mesh.devices.size == 8
    assert losses(tmp_path / "many") == pytest.approx(losses(tmp_path / "one"), rel=1e-5)
    for a, b in zip(jax.tree.leaves(jax.device_get(many["state"].params)),
                    jax.tree.leaves(jax.device_get(one["state"].params))):
        # atol: key biases get exactly-zero gradients (softmax ignores a per-query constant), so their
        # values are Adam-normalised rounding noise of ~1e-7 that no layout can reproduce.
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def test_resume_reproduces_the_uninterrupted_run_bit_for_bit(s2s_cfg, tmp_path):
    full = run(s2s_cfg, tmp_path / "full", devices=jax.devices()[:2])
    part = run(s2s_cfg, tmp_path / "part", stop_at_step=3, devices=jax.devices()[:2])
    assert int(part["state"].step) == 3
    resumed = run(s2s_cfg, tmp_path / "part", resume=True, devices=jax.devices()[:2])
    assert int(resumed["state"].step) == 6
    for a, b in zip(jax.tree.leaves(jax.device_get(full["state"])), jax.tree.leaves(jax.device_get(resumed["state"]))):
        np.testing.assert_array_equal(a, b)
    assert losses(tmp_path / "part") == losses(tmp_path / "full")


def test_init_from_a_checkpoint_of_another_family(s2s_cfg, tiny_cfg, tmp_path):
    run(replace(tiny_cfg, train=dict(steps=1)), tmp_path / "gpt", devices=jax.devices()[:1])
    s = trainer.setup(s2s_cfg, jax.devices()[:1])
    with pytest.raises(ConfigError, match="holds a gpt model; this config trains a encdec model"):
        trainer.init_from(s, s.init_state(jax.random.PRNGKey(0)), str(tmp_path / "gpt"))
    with pytest.raises(ValueError, match="holds a gpt model; zoo.translate needs an encdec"):
        translate.load(str(tmp_path / "gpt"))


def test_evaluation_records_bleu_and_exact_match(s2s_cfg, tmp_path):
    out = run(replace(s2s_cfg, train=dict(steps=2, eval_every=2, eval_batches=1)), tmp_path, devices=jax.devices()[:1])
    last = out["records"][-1]
    assert 0 <= last["eval_bleu"] <= 100 and 0 <= last["eval_exact_match"] <= 1


@pytest.mark.parametrize("head", [{}, dict(tie_output=False, share_embeddings=False, logits_bias=True)])
def test_label_smoothing_applies_to_the_training_loss_only(s2s_cfg, head):
    """The task's fused loss (any output head: tied, or an untied lm_head with a logits bias) against
    cross-entropy of the model's logits: values, and gradients of the training loss."""
    task = tasks.build(replace(s2s_cfg, model=dict(dropout=0.0, **head)))
    params = nn.unbox(task.init(jax.random.PRNGKey(0)))
    if "logits_bias" in params:
        params["logits_bias"] = jax.random.normal(jax.random.PRNGKey(2), params["logits_bias"].shape)
    batch = task.make_data(s2s_cfg, 0, 1).train(0)
    logits = lambda p: task.model.apply({"params": p}, batch["src"], batch["src_valid"], batch["tgt_in"])
    plain, _ = plain_losses.token_cross_entropy(logits(params), batch["tgt_out"], batch["weights"])
    eval_loss, aux = task.loss(params, batch, jax.random.PRNGKey(1), False)
    smoothed = lambda p: plain_losses.smoothed_cross_entropy(logits(p), batch["tgt_out"], batch["weights"], 0.1)
    train_loss, grads = jax.value_and_grad(lambda p: task.loss(p, batch, jax.random.PRNGKey(1), True)[0])(params)
    np.testing.assert_allclose(eval_loss, plain, rtol=1e-6)
    np.testing.assert_allclose(train_loss, smoothed(params), rtol=1e-5)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6), grads, jax.grad(smoothed)(params))
    assert aux["tokens"] == batch["src_valid"].sum() + batch["weights"].sum()  # source + target tokens


# ---- learning, BLEU, translation ----------------------------------------------------------------
@pytest.fixture(scope="module")
def learned(tmp_path_factory):
    """A 2+2-layer, width-64 model trained on the short phrases (<= 15 bytes) of the offline task."""
    root = tmp_path_factory.mktemp("learned")
    cfg = Config(
        task="seq2seq",
        model=EncDecConfig(vocab_size=264, max_len=16, num_encoder_layers=2, num_decoder_layers=2, d_model=64,
                           num_heads=4, d_ff=256, dropout=0.0, positions="sinusoidal", pre_ln=True,
                           activation="gelu", embed_scale=True),
        data=DataConfig(source="builtin", tokenizer="bytes", seq_len=16, cache_dir=str(root / "cache")),
        optim=OptimConfig(lr=2e-3, schedule="cosine", warmup=50, weight_decay=0.01, b2=0.98),
        train=TrainConfig(steps=1600, batch_size=32, log_every=400, eval_every=0, save_every=1600, eval_batches=4),
    )
    out = run(cfg, root / "run", devices=jax.devices()[:1])
    return cfg, out, str(root / "run")


def test_a_tiny_model_learns_the_offline_task(learned):
    cfg, out, _ = learned
    task = out["setup"].task
    data = task.make_data(cfg, 0, 1)
    scores = task.evaluate_extra(out["state"].params, data)  # greedy over the 128 held-out pairs
    assert scores["eval_exact_match"] >= 0.95, scores
    assert scores["eval_bleu"] >= 90, scores


def test_translate_cli_reverses_a_held_out_phrase(learned, capsys):
    cfg, out, workdir = learned
    _, val = seq2seq_data.split_pairs(cfg, TOK, SP)
    # The first of 8 held-out phrases that greedy decoding reverses (the model gets >= 95% right, tested
    # above; which ones it misses depends on the numerics of training).
    srcs = [TOK.decode(val.src.ids[val.src.offsets[i]:val.src.offsets[i + 1]]) for i in range(8)]
    hyps = translate.translate(*translate.load(workdir), srcs, beam=1)
    src = next(s for s, h in zip(srcs, hyps) if h == seq2seq_data.reverse_words(s))
    assert translate.main([workdir, "--text", src, "--beam", "4"]) == 0
    assert capsys.readouterr().out.strip() == seq2seq_data.reverse_words(src)
    assert translate.main([workdir, "--text", src, "--beam", "1"]) == 0
    assert capsys.readouterr().out.strip() == seq2seq_data.reverse_words(src)


@pytest.mark.parametrize("argv, fragment", [
    (["--text", "a b c", "--beam", "0"], "error: beam size 0 must be >= 1"),
    (["--text", "x" * 17], "is 17 tokens, above the model's data.seq_len=16"),
])
def test_translate_cli_errors(learned, capsys, argv, fragment):
    assert translate.main([learned[2], *argv]) == 2
    err = capsys.readouterr().err
    assert fragment in err and err.count("\n") == 1
