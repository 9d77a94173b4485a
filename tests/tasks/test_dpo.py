"""Preference tuning (task=dpo): a LoRA run's reference is its base with the adapters off, so its first loss is
ln 2 exactly and its reference log-probabilities are the base's own; the precomputed reference is the initial
model's, kept in the run and read back on a resume; chosen and rejected are one forward pass, summed over the
answer tokens only; the losses follow their formulas; bad pairs and settings end in one line or a counted drop."""

import dataclasses
import math
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tests.helpers import tiny_configs
from tests.helpers.runs import run, write_jsonl
from zoo import tasks
from zoo.cli.train import train_main
from zoo.configuration import OptimConfig, PreferenceConfig
from zoo.errors import ConfigError, ZooDataError
from zoo.tasks import preference
from zoo.training import runs


@pytest.fixture(scope="module")
def base(tmp_path_factory, cache_dir):
    """A tiny GPT trained 6 steps: the base the LoRA and full preference runs start from."""
    work = tmp_path_factory.mktemp("dpo-base") / "run"
    cfg = dataclasses.replace(tiny_configs.gpt_lm(cache_dir), model=dataclasses.replace(
        tiny_configs.gpt_lm(cache_dir).model, dropout=0.0))
    run(cfg, work, devices=jax.devices()[:1])
    return str(work)


def dpo_cfg(base, cache_dir, **model):
    cfg = tiny_configs.dpo(cache_dir)
    m = dataclasses.replace(runs.load_config(base).model, **model)
    return dataclasses.replace(cfg, model=m, init_from=base, optim=OptimConfig(lr=1e-2, warmup=0),
                               train=dataclasses.replace(cfg.train, steps=4, log_every=1, eval_every=4, save_every=4))


def test_a_lora_run_starts_at_ln_2_against_its_base_with_the_adapters_off(base, tmp_path, cache_dir):
    cfg = dpo_cfg(base, cache_dir, lora_rank=4, lora_alpha=8.0)
    out = run(cfg, tmp_path / "lora", devices=jax.devices()[:1])
    first = out["records"][0]
    assert first["loss"] == pytest.approx(math.log(2), abs=1e-6)  # adapters start at zero: policy = reference
    assert first["rewards/chosen"] == pytest.approx(0, abs=1e-6) and first["rewards/margins"] == pytest.approx(0, abs=1e-6)
    assert out["records"][-1]["loss"] < math.log(2) - 1e-3  # and the adapters moved it
    # The reference the task computes (adapters off) is the base's own log-probabilities, on trained adapters.
    task = tasks.build(cfg)
    batch = out["setup"].task.make_data(cfg, 0, 1).train(0)
    params = out["setup"].full_params(out["state"])
    with jax.default_device(jax.devices()[0]):
        from zoo.nn import lora
        with lora.intercept(cfg.model.lora_spec, False), lora.adapters_off():
            ref = task.inner.logps(params, batch, False, jax.random.PRNGKey(0))[0]
        plain = tasks.build(dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, lora_rank=0)))
        want = plain.logps(runs.load_params_of(base, runs.load_config(base)), batch, False, jax.random.PRNGKey(0))[0]
        pol = task.inner.logps(params, batch, False, jax.random.PRNGKey(0))  # no interceptor: the base alone too
    np.testing.assert_allclose(np.asarray(ref), np.asarray(want), rtol=1e-5)
    assert np.abs(np.asarray(ref) - np.asarray(pol[0])).max() < 1e-4  # outside the interceptor: the base


def test_the_precomputed_reference_is_the_initial_models_and_stays_in_the_run(base, tmp_path, cache_dir):
    cfg = dpo_cfg(base, cache_dir)
    out = run(cfg, tmp_path / "full", devices=jax.devices()[:1])
    assert out["records"][0]["loss"] == pytest.approx(math.log(2), abs=1e-6)
    with np.load(tmp_path / "full" / preference.REFERENCE_FILE) as f:
        train_ref = f["train"]
    data = tasks.build(cfg).make_data(cfg, 0, 1)
    logps = preference.DpoTask(cfg).logps(runs.load_params_of(base, runs.load_config(base)),
                                          data.examples["train"].rows(np.arange(8)), False, jax.random.PRNGKey(0))[0]
    np.testing.assert_allclose(train_ref[:8], np.asarray(logps), rtol=1e-5)
    assert train_ref.shape == (len(data.examples["train"]), 2) and (train_ref < 0).all()


def test_the_log_probabilities_are_summed_over_the_answer_tokens_only(cache_dir):
    cfg = dataclasses.replace(tiny_configs.dpo(cache_dir), dpo=PreferenceConfig())
    task = tasks.build(cfg)
    params = jax.jit(task.init)(jax.random.PRNGKey(0))
    import flax.linen as nn
    params = nn.unbox(params)
    data = task.make_data(cfg, 0, 1)
    batch = data.examples["train"].rows(np.arange(4))
    lp, lengths, _ = task.logps(params, batch, False, jax.random.PRNGKey(0))
    logits = task.model.apply({"params": params}, batch["inputs"].reshape(8, -1))
    per_token = jnp.take_along_axis(jax.nn.log_softmax(logits), batch["targets"].reshape(8, -1)[..., None], -1)[..., 0]
    want = (per_token * batch["weights"].reshape(8, -1)).sum(-1).reshape(4, 2)
    np.testing.assert_allclose(np.asarray(lp), np.asarray(want), rtol=1e-5)
    # answers are the sums' digits and the end-of-text: 2 or 3 target tokens per row, never the prompt's
    assert set(np.asarray(lengths).ravel().tolist()) <= {2.0, 3.0}


@pytest.mark.parametrize("loss, want", [
    ("sigmoid", lambda d, dl, b, e: -(1 - e) * np.log(sig(b * d)) - e * np.log(sig(-b * d))),
    ("robust", lambda d, dl, b, e: (-(1 - e) * np.log(sig(b * d)) + e * np.log(sig(-b * d))) / (1 - 2 * e)),
    ("ipo", lambda d, dl, b, e: (dl - 1 / (2 * b)) ** 2),
])
def test_the_losses_follow_their_formulas(loss, want):
    pi = np.asarray([[-3.0, -5.0], [-7.0, -4.0]], np.float32)
    ref = np.asarray([[-4.0, -4.5], [-6.0, -6.0]], np.float32)
    lengths = np.asarray([[2.0, 4.0], [3.0, 1.0]], np.float32)
    cfg = PreferenceConfig(loss=loss, beta=0.3, label_smoothing=0.1 if loss != "ipo" else 0.0)
    got, chosen, rejected = preference.pair_loss(pi, ref, lengths, cfg)
    r = pi - ref
    d, dl = r[:, 0] - r[:, 1], r[:, 0] / lengths[:, 0] - r[:, 1] / lengths[:, 1]
    np.testing.assert_allclose(got, want(d, dl, 0.3, cfg.label_smoothing), rtol=1e-6)
    np.testing.assert_allclose(chosen, 0.3 * r[:, 0], rtol=1e-6)
    simpo, _, _ = preference.pair_loss(pi, None, lengths, PreferenceConfig(loss="simpo", beta=2.0, simpo_gamma=0.5))
    avg = pi / lengths
    np.testing.assert_allclose(simpo, -np.log(sig(2.0 * (avg[:, 0] - avg[:, 1]) - 0.5)), rtol=1e-6)


def sig(x):
    return 1 / (1 + np.exp(-x))


def test_pairs_with_the_same_answers_or_no_room_are_dropped_and_counted(tmp_path, cache_dir, capsys):
    rows = tiny_configs.preference_pairs(12)
    rows[0] = {"prompt": "1+1=", "chosen": "2", "rejected": "2"}
    rows[1] = {"prompt": "x" * 40, "chosen": "2", "rejected": "3"}  # the prompt fills the 16-token window
    path = write_jsonl(tmp_path / "p.jsonl", rows)
    cfg = dataclasses.replace(tiny_configs.dpo(cache_dir), data=dataclasses.replace(
        tiny_configs.dpo(cache_dir).data, source=str(path)))
    data = tasks.build(cfg).make_data(cfg, 0, 1)
    out = capsys.readouterr().out
    assert "12 preference pairs" in out and "1 dropped with chosen equal to rejected" in out
    assert "1 cut to data.seq_len + 1 = 17 tokens" in out and "1 dropped with no answer token left" in out
    assert len(data.examples["train"]) + len(data.examples["eval"]) == 10


BAD = [  # (what, a pair row or None, --set, the error's piece)
    ("a missing column", {"prompt": "a", "chosen": "b"}, [], "has no data.rejected_column='rejected' column"),
    ("an empty rejected answer", {"prompt": "a", "chosen": "b", "rejected": "  "}, [],
     "data.rejected_column='rejected' is empty"),
    ("beta <= 0", None, ["dpo.beta=0"], "dpo.beta=0.0 must be a positive number"),
    ("a reference for a reference-free loss", None, ["dpo.loss=simpo", "dpo.reference=precomputed"],
     "dpo.loss=simpo is reference-free; dpo.reference='precomputed' does not apply"),
    ("an unknown loss", None, ["dpo.loss=kto"], "dpo.loss='kto' is unknown; choose one of sigmoid, robust, ipo"),
]


@pytest.mark.parametrize("what, row, sets, piece", BAD, ids=[b[0] for b in BAD])
def test_bad_pairs_and_settings_are_one_line_and_leave_nothing(base, tmp_path, capsys, what, row, sets, piece):
    pairs = [dict(p) for p in tiny_configs.preference_pairs(6)]
    if row is not None:
        pairs[3] = row
    path = write_jsonl(tmp_path / "p.jsonl", [{k: p[k] for k in p if k in row} if row and len(row) < 3 else p
                                              for p in pairs])
    argv = ["--init-from", base, "--workdir", str(tmp_path / "w"), "--set", "task=dpo", "--set", f"data.source={path}",
            "--set", "data.seq_len=16", *[a for s in sets for a in ("--set", s)]]
    assert train_main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and piece in err[0], err
    assert not os.path.exists(tmp_path / "w")


def test_a_chat_format_pair_renders_the_prompt_once_and_the_answers_apart(tmp_path, cache_dir):
    rows = [{"prompt": [{"role": "user", "content": f"{a}+1?"}], "chosen": [{"role": "assistant", "content": str(a + 1)}],
             "rejected": [{"role": "assistant", "content": str(a + 2)}]} for a in range(8)]
    path = write_jsonl(tmp_path / "c.jsonl", rows)
    cfg = dataclasses.replace(tiny_configs.dpo(cache_dir), data=dataclasses.replace(
        tiny_configs.dpo(cache_dir).data, source=str(path), seq_len=48))
    tokenizer = tasks.build(cfg).make_data(cfg, 0, 1).tokenizer
    pairs = preference.encode_pairs(cfg.data, tokenizer, preference.template_of(cfg.data))[0]
    chosen, rejected = pairs.ids[0, 0], pairs.ids[0, 1]
    first_answer = int(np.argmax(pairs.mask[0, 0] > 0)) + 1  # the first answer token (ids are one ahead of mask)
    assert (chosen[:first_answer] == rejected[:first_answer]).all()  # the prompt's turns shared, token for token
    assert bytes(chosen[first_answer:first_answer + 1].tolist()) == b"1" and rejected[first_answer] == ord("2")
    with pytest.raises(ConfigError):
        PreferenceConfig(loss="ipo", reference="none")
    with pytest.raises(ZooDataError, match="leaves no preference pair"):
        preference.encode_pairs(dataclasses.replace(cfg.data, seq_len=4), tokenizer, preference.template_of(cfg.data))
    rows[5]["rejected"] = [{"role": "user", "content": "7"}]  # not the assistant's turn: no token to score, said so
    user = dataclasses.replace(cfg.data, source=write_jsonl(tmp_path / "u.jsonl", rows))
    with pytest.raises(ZooDataError, match=r"row 5 of data.source=.*: data.rejected_column='rejected' holds 'user' "
                                           r"messages only; an answer is the assistant's turn"):
        preference.encode_pairs(user, tokenizer, preference.template_of(cfg.data))


def test_a_dpo_lora_run_travels_as_a_peft_adapter_and_merged_and_answers(base, tmp_path, cache_dir):
    """As the chat run's: `to-hf --adapter` writes a CAUSAL_LM adapter transformers + PEFT open alone with zoo's
    logits, `to-hf` the merged model, and zoo.load answers with the tuned weights."""
    peft = pytest.importorskip("peft")
    torch = pytest.importorskip("torch")
    import zoo
    from zoo.cli import convert
    lora_run = str(tmp_path / "lora")
    run(dpo_cfg(base, cache_dir, lora_rank=4, lora_alpha=8.0), lora_run, devices=jax.devices()[:1])
    assert convert.main(["to-hf", lora_run, str(tmp_path / "adapter"), "--adapter"]) == 0
    assert convert.main(["to-hf", lora_run, str(tmp_path / "merged")]) == 0
    lm = zoo.load(lora_run)
    ids = np.asarray([lm.tokenize("3+4=7")])
    ours = np.asarray(jax.jit(lm.apply)(lm.params, {"inputs": ids}))
    with torch.no_grad():
        adapter = peft.AutoPeftModelForCausalLM.from_pretrained(str(tmp_path / "adapter")).eval()
        theirs = adapter(torch.tensor(ids)).logits.numpy()
    np.testing.assert_allclose(theirs, ours, atol=1e-4)
    assert zoo.load(str(tmp_path / "merged")).generate("3+4=", max_new_tokens=4) == lm.generate("3+4=",
                                                                                                  max_new_tokens=4)
    assert "generate" in lm.offers()
