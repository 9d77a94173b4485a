"""data.mix_source (issue #54 item 1): conversations trained beside a small set of the user's own, so a fine-tune
keeps answering other questions as its base did. Its examples train and are never held out (the validation set
stays the user's); `zoo_general` is the general questions zoo ships; without it a run is as before; a source that
cannot be read is one line naming data.mix_source."""

import dataclasses

import numpy as np
import pytest

from tests.helpers.runs import write_jsonl
from tests.tasks.test_sft_task import CHATS, sft_cfg
from zoo.data import zoo_commands
from zoo.errors import ZooDataError
from zoo.tasks import sft


def trained_text(data) -> str:
    """Every answer byte the training rows hold (the bytes tokenizer: ids 0-255 are bytes)."""
    ex = data.train.ex
    return bytes(int(t) for t, w in zip(ex.targets, ex.weights) if w > 0 and t < 256).decode("utf-8", "replace")


def with_mix(cfg, mix: str):
    return dataclasses.replace(cfg, data=dataclasses.replace(cfg.data, mix_source=mix))


def test_mixed_conversations_train_beside_the_users_and_are_never_held_out(tmp_path, capsys):
    cfg = sft_cfg(tmp_path, write_jsonl(tmp_path / "mine.jsonl", [{"messages": m} for m in CHATS]))
    alone = sft.SftTask(cfg).make_data(cfg, 0, 1)
    said_alone = capsys.readouterr().out
    mixed = sft.SftTask(cfg).make_data(with_mix(cfg, "zoo_general"), 0, 1)
    said = capsys.readouterr().out
    general = len(zoo_commands.GENERAL)
    assert mixed.packed_examples == alone.packed_examples + general  # epochs (zoo.training.sizing) count them
    assert "Berlin" in trained_text(mixed) and "Berlin" not in trained_text(alone)
    # the validation set is the user's own, unchanged
    assert len(mixed.eval) == len(alone.eval) and all(
        np.array_equal(a[k], b[k]) for a, b in zip(alone.eval, mixed.eval) for k in a)
    n_val = said_alone.split(" train, ")[1].split(" validation")[0]
    assert (f"data: {len(CHATS)} examples from {cfg.data.source}: {alone.packed_examples + general} train ({general} "
            f"of them from data.mix_source=zoo_general, none held out), {n_val} validation") in said
    assert "mix_source" not in said_alone


def test_a_file_of_your_own_mixes_in_too_and_an_unreadable_one_names_its_setting(tmp_path):
    cfg = sft_cfg(tmp_path, write_jsonl(tmp_path / "mine.jsonl", [{"messages": m} for m in CHATS]))
    extra = [[{"role": "user", "content": "name a colour"}, {"role": "assistant", "content": "teal"}]] * 3
    mix = write_jsonl(tmp_path / "general.jsonl", [{"messages": m} for m in extra])
    alone = sft.SftTask(cfg).make_data(cfg, 0, 1)
    mixed = sft.SftTask(cfg).make_data(with_mix(cfg, mix), 0, 1)
    assert mixed.packed_examples == alone.packed_examples + 3 and "teal" in trained_text(mixed)
    bad = with_mix(cfg, str(tmp_path / "nosuch.jsonl"))
    with pytest.raises(ZooDataError, match=r"^data.mix_source='.*nosuch.jsonl': no such file"):
        sft.SftTask.check_data(bad, vocab=False)
