"""data.mix_source=replay (issue #54): the base's own greedy answers to zoo's general questions (or a file's prompts)
are generated before the first step and mixed in as any mix source is; they are kept in the run, so a resume reads
them back instead of generating again and trains on the same rows; a bad value is refused in one line."""

import dataclasses
import json
import os

import flax.linen as nn
import jax
import numpy as np
import pytest

from tests.helpers.runs import run, write_jsonl
from tests.tasks.test_sft_task import CHATS, sft_cfg
from zoo.configuration import DataConfig
from zoo.data import chat, zoo_commands
from zoo.data.tokenizers import get_tokenizer
from zoo.errors import ConfigError, ZooDataError
from zoo.eval import generation
from zoo.infer.sample import generate, stop_ids
from zoo.tasks import sft, sft_replay

PROMPTS = [{"prompt": "name a colour"}, {"prompt": "say hi"},
           {"messages": [{"role": "system", "content": "Be terse."}, {"role": "user", "content": "count to 3"},
                         {"role": "assistant", "content": "1 2 3"}]}]  # a chat with its answer: its question replays


def replay_cfg(tmp_path, mix: str, **data):
    mine = write_jsonl(tmp_path / "mine.jsonl", [{"messages": m} for m in CHATS])
    return sft_cfg(tmp_path, mine, mix_source=mix, replay_max_new_tokens=6, **data)


def test_the_mixed_rows_are_the_bases_greedy_answers(tmp_path, capsys):
    cfg = replay_cfg(tmp_path, "replay:" + write_jsonl(tmp_path / "prompts.jsonl", PROMPTS))
    task = sft.SftTask(cfg)
    params = nn.unbox(jax.jit(task.init)(jax.random.PRNGKey(0)))
    task.prepare_data(lambda: params, str(tmp_path / "run"), resume=False)
    data = task.make_data(cfg, 0, 1)
    said = capsys.readouterr().out
    # each answer, decoded alone (zoo.infer.sample.generate, greedy) as zoo-sample --chat would
    tok, template = get_tokenizer("bytes"), sft.template_of(cfg.data)
    asked = [[{"role": "user", "content": "name a colour"}], [{"role": "user", "content": "say hi"}],
             [{"role": "system", "content": "Be terse."}, {"role": "user", "content": "count to 3"}]]
    expected = []
    for conv in asked:
        ids = tok.encode_with_offsets(chat.render(template, conv, add_generation_prompt=True,
                                                  variables=chat.specials(tok, "bytes")))[0]
        out = generate(task.model, params, ids, 6, temperature=0.0, eos_id=stop_ids(tok), vocab_limit=tok.n_vocab,
                       window=cfg.window)[0]
        expected.append(conv + [{"role": "assistant", "content": tok.decode(out)}])
    assert task.replayed == expected
    assert [json.loads(line)["messages"] for line in data.files["replay.jsonl"].splitlines()] == expected
    # those conversations train, beside the user's, as any data.mix_source's do
    mixed = sft.encode_rows(cfg.data, tok, template, expected)[0]
    ex = data.train.ex
    trained = {tuple(ex.inputs[ex.offsets[i]:ex.offsets[i + 1]].tolist()) for i in range(len(ex))}
    assert len(mixed) == 3 and all(tuple(ids[:-1].tolist()) in trained for ids, _ in mixed)
    assert "the base answered 3 prompts greedily in " in said and "from data.mix_source=replay:" in said


def test_a_resume_reads_the_answers_back_and_trains_on_the_same_rows(tmp_path, monkeypatch, capsys):
    cfg = replay_cfg(tmp_path, "replay")
    built = []  # the training examples of each run: a resume's are the first run's, bit for bit
    make_data = sft.SftTask.make_data
    monkeypatch.setattr(sft.SftTask, "make_data", lambda self, *a: built.append(make_data(self, *a)) or built[-1])
    run(cfg, tmp_path / "run", stop_at_step=3)
    assert f"the base answered {len(zoo_commands.GENERAL)} prompts greedily" in capsys.readouterr().out
    kept = (tmp_path / "run" / "replay.jsonl").read_text()
    assert len(kept.splitlines()) == len(zoo_commands.GENERAL)
    monkeypatch.setattr(generation, "greedy_ids", lambda *a, **k: pytest.fail("a resume generated again"))
    run(cfg, tmp_path / "run", resume=True)
    assert f"{len(zoo_commands.GENERAL)} base answers read back from the run's replay.jsonl" in capsys.readouterr().out
    assert (tmp_path / "run" / "replay.jsonl").read_text() == kept
    (a, b), n = [d.train.ex for d in built], len(built[0].train.ex)
    assert n == built[0].packed_examples and n > len(zoo_commands.GENERAL)
    assert all(np.array_equal(getattr(a, k), getattr(b, k)) for k in ("inputs", "targets", "weights", "offsets"))
    other = dataclasses.replace(cfg.data, mix_source="replay:" + write_jsonl(tmp_path / "p.jsonl", PROMPTS))
    with pytest.raises(ZooDataError, match=r"^data.mix_source='replay:.*': its prompts are not those the run began"):
        sft_replay.read_back(other, str(tmp_path / "run"))
    os.remove(tmp_path / "run" / "replay.jsonl")  # gone: the trained params are no longer the base
    with pytest.raises(ZooDataError, match=r"^data.mix_source='replay': .*replay.jsonl is missing"):
        sft_replay.read_back(cfg.data, str(tmp_path / "run"))


@pytest.mark.parametrize("value, error", [
    ("replay:", r"^data.mix_source='replay:': name a JSONL file of prompts after 'replay:'"),
    ("replay:{tmp}/nosuch.jsonl", r"^data.mix_source='replay:.*nosuch.jsonl': no such file"),
    ("replay:{tmp}/bad.jsonl", r"^data.mix_source='replay:.*bad.jsonl': .*bad.jsonl:2: got keys 'question'; each line"),
    ("replay:{tmp}/nouser.jsonl", r"^data.mix_source=.*nouser.jsonl:1: 'messages' holds no user message"),
])
def test_a_bad_replay_value_is_refused_in_one_line(tmp_path, value, error):
    write_jsonl(tmp_path / "bad.jsonl", [{"prompt": "ok"}, {"question": "what?"}])
    write_jsonl(tmp_path / "nouser.jsonl", [{"messages": [{"role": "system", "content": "x"}]}])
    cfg = replay_cfg(tmp_path, value.format(tmp=tmp_path))
    with pytest.raises(ZooDataError, match=error) as e:
        sft.SftTask.check_data(cfg, vocab=False)
    assert "\n" not in str(e.value)
    with pytest.raises(ConfigError, match=r"^data.replay_max_new_tokens=0 must be positive"):
        DataConfig(source="x", replay_max_new_tokens=0)
    with pytest.raises(ZooDataError, match="generates before the data"):  # make_data alone has no base answers
        sft.SftTask(replay_cfg(tmp_path, "replay")).make_data(replay_cfg(tmp_path, "replay"), 0, 1)
    assert sft_replay.is_replay("replay") and not sft_replay.is_replay("replayed.jsonl")


def test_a_lora_run_replays_the_model_it_starts_from_adapters_merged(tmp_path):
    """The trainer hands the adapted task its whole params (the adapters zero at the start of a real run; here
    random): the answers are the plain model's on the merged weights, as sampling a LoRA run reads it."""
    from zoo import tasks
    from zoo.nn import lora
    cfg = replay_cfg(tmp_path, "replay:" + write_jsonl(tmp_path / "prompts.jsonl", PROMPTS[:2]))
    cfg = dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, lora_rank=4, lora_alpha=8.0))
    adapted = tasks.build(cfg)
    params = nn.unbox(jax.jit(adapted.init)(jax.random.PRNGKey(0)))
    params = jax.tree_util.tree_map_with_path(  # adapters that move the answers
        lambda p, x: 3.0 * jax.random.normal(jax.random.PRNGKey(1), x.shape) if "lora_b" in jax.tree_util.keystr(p)
        else x, params)
    adapted.prepare_data(lambda: params, str(tmp_path / "run"), resume=False)
    plain = tasks.plain(cfg)
    plain.prepare_data(lambda: lora.merge(params, cfg.model.lora_spec), str(tmp_path / "run"), resume=False)
    assert adapted.inner.replayed == plain.replayed and len(plain.replayed) == 2
