"""data.streaming=true (zoo.data.stream, zoo.training.data_state): a local source read as a stream, each process
tokenizing its own shard of the documents, training rows shuffled in pools; a resumed run continues bit for
bit, also across the stream's epochs; the split by document matches the token store's; the limits refuse
in one line."""

import json
import os

import numpy as np
import pytest

from conftest import replace
from tests.helpers import tiny_configs
from tests.helpers.runs import losses, run, write_jsonl
from zoo.configuration import Config, DataConfig
from zoo.data import stream
from zoo.data.store import doc_hash
from zoo.data.tokenizers import get_tokenizer
from zoo.errors import ConfigError, TrainError, ZooDataError
from zoo.training import data_state

TOK = get_tokenizer("bytes")


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """40 short documents in 3 JSONL files (so 2 processes split them by document, not by file)."""
    from pydoc_data.topics import topics
    texts = [topics[k][:100] for k in sorted(topics)[:40]]
    d = tmp_path_factory.mktemp("streamed")
    for i in range(3):
        write_jsonl(d / f"part{i}.jsonl", [{"body": t} for t in texts[i::3]])
    return str(d), texts


def data_cfg(src, **kw):
    return DataConfig(source=src, text_column="body", tokenizer="bytes", seq_len=24, streaming=True,
                      **{"val_fraction": 0.2, "shuffle_rows": 5, **kw})


def batches(cfg, process=0, processes=1, global_batch=4):
    return stream.StreamBatches(stream.Cursor(cfg, TOK, process, processes), cfg.seq_len, global_batch, 7,
                                cfg.shuffle_rows, process, processes)


def test_a_resumed_stream_goes_on_bit_for_bit_from_any_step_across_epochs(corpus):
    cfg = data_cfg(corpus[0])
    full = batches(cfg)
    want = [full(i)["inputs"] for i in range(80)]  # 80 x 4 rows of 25 tokens: over two epochs of ~3k tokens
    assert full.cursor.epoch >= 2
    for k in (1, 2, 7, 19, 31, 44, 71):
        first = batches(cfg)
        for i in range(k):
            first(i)
        state = json.loads(json.dumps(first.state(k)))  # as the file keeps it
        again = batches(cfg)
        again.restore(k, state)
        for i in range(k, 80):
            np.testing.assert_array_equal(again(i)["inputs"], want[i])


def test_rows_hold_only_training_documents_and_processes_split_them(corpus):
    src, texts = corpus
    cfg = data_cfg(src, shuffle_rows=1)
    train_docs = [t for t in texts if doc_hash(t) >= cfg.val_fraction]
    val_docs = [t for t in texts if doc_hash(t) < cfg.val_fraction]
    assert train_docs and val_docs
    seen = []
    for p in range(2):
        cur = stream.Cursor(cfg, TOK, p, 2)
        docs = []
        while cur.epoch == 0:
            cur.take(1)
            if cur.off == 1 and cur.epoch == 0:
                docs.append(bytes(cur.doc[:-1].astype(np.uint8)).decode())
        seen.append(docs)
    assert not set(seen[0]) & set(seen[1])  # each document read by one process
    assert sorted(seen[0] + seen[1]) == sorted(train_docs)  # every training document, no held-out one
    rows = batches(cfg)(0)["inputs"]
    joined = "".join(t + "\0" for t in train_docs)
    assert bytes(rows[0].astype(np.uint8)).decode(errors="replace") in joined.replace("\0", chr(TOK.eot_token))
    ev = stream.eval_batches(cfg, TOK, 4, 2)
    held = ("".join(val_docs)).encode()
    assert bytes(ev[0]["inputs"][0][:10].astype(np.uint8)) in held


def test_pools_shuffle_rows_and_processes_see_different_rows(corpus):
    cfg = data_cfg(corpus[0])
    plain = batches(data_cfg(corpus[0], shuffle_rows=1))(0)["inputs"]
    shuffled = batches(cfg)(0)["inputs"]
    assert not np.array_equal(plain, shuffled)
    a, b = batches(cfg, 0, 2)(0)["inputs"], batches(cfg, 1, 2)(0)["inputs"]
    assert a.shape == b.shape == (2, 24) and not np.array_equal(a, b)


def test_the_limits_refuse_in_one_line(corpus, tmp_path):
    cfg = data_cfg(corpus[0])
    one = batches(cfg)
    one(0)
    two = batches(cfg, 0, 2)
    with pytest.raises(ZooDataError, match="split over 1 processes and this resume has 2"):
        two.restore(1, one.state(1))
    with pytest.raises(ZooDataError, match="data.shuffle_rows=3: the run streamed with 5"):
        batches(data_cfg(corpus[0], shuffle_rows=3)).restore(1, one.state(1))
    with pytest.raises(ZooDataError, match="read in order: step 5 was asked for"):
        one(5)
    with pytest.raises(ZooDataError, match="text_column='missing' is not a column"):
        stream.check_stream(DataConfig(source=corpus[0], text_column="missing", streaming=True))
    with pytest.raises(ConfigError, match="data.streaming=true streams text for task=gpt_lm"):
        replace(tiny_configs.bert("bert_mlm", str(tmp_path)), data=dict(streaming=True))
    empty = write_jsonl(tmp_path / "held.jsonl", [{"body": "x"}])  # one document: held out or alone
    with pytest.raises(ZooDataError, match="no training document|fewer than data.seq_len"):
        batches(data_cfg(empty, val_fraction=0.999))(0)


def streamed_run(cache_dir, src) -> Config:
    cfg = tiny_configs.gpt_lm(cache_dir)  # 6 steps, a checkpoint every 3, dropout on
    return replace(cfg, data=dict(source=src, text_column="body", streaming=True, val_fraction=0.2, shuffle_rows=8),
                   train=dict(eval_every=3, eval_batches=1, keep=1))


def states(workdir):
    return {int(n.split(".")[0]) for n in os.listdir(os.path.join(workdir, "data_state"))}


def checkpointed(workdir):
    return {int(n) for n in os.listdir(os.path.join(workdir, "checkpoints")) if n.isdigit()}


def test_states_of_steps_no_longer_checkpointed_are_pruned(tmp_path):
    os.makedirs(tmp_path / "data_state")
    for step in (1, 2, 3, 5, 7):
        (tmp_path / "data_state" / f"{step}.p0.json").write_text("{}")
    (tmp_path / "data_state" / "2.p1.json").write_text("{}")  # another process's: its own to prune
    data_state.prune(str(tmp_path), [3, 5])
    assert sorted(os.listdir(tmp_path / "data_state")) == ["2.p1.json", "3.p0.json", "5.p0.json", "7.p0.json"]


def test_a_streamed_run_resumes_bit_for_bit_and_keeps_only_live_states(cache_dir, corpus, tmp_path):
    cfg = streamed_run(cache_dir, corpus[0])
    full = run(cfg, tmp_path / "full")
    run(cfg, tmp_path / "part", stop_at_step=3)
    assert states(tmp_path / "part") == checkpointed(tmp_path / "part") == {3}
    resumed = run(cfg, tmp_path / "part", resume=True)
    assert losses(tmp_path / "part") == losses(tmp_path / "full")
    for a, b in zip(*(map(np.asarray, __import__("jax").tree.leaves(r["state"].params)) for r in (full, resumed))):
        np.testing.assert_array_equal(a, b)
    assert states(tmp_path / "part") == checkpointed(tmp_path / "part")  # 6, and 3 if the guard keeps it as good
    os.remove(tmp_path / "part" / "data_state" / "6.p0.json")
    with pytest.raises(TrainError, match=r"6.p0.json is missing: a run with data.streaming=true resumes"):
        run(replace(cfg, train=dict(steps=8)), tmp_path / "part", resume=True)
