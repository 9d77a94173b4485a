"""zoo-bench's embed workload (zoo.bench.embed_speed): zoo's .embed and its peer, sentence-transformers' encode, embed
the same pydoc sentences with the same checkpoint (their vectors sum alike) and report texts/s and real tokens/s,
so the row's zoo / st-torch ratio is a texts/s ratio; the peer belongs to this workload only."""

import pytest

from zoo.bench import embed_speed, run, shapes, torch_peer


def test_the_texts_are_pydoc_sentences_the_same_every_time():
    texts = embed_speed.sentences(300)
    assert texts == embed_speed.sentences(300) and len(set(texts)) > 250
    assert all(len(t) >= embed_speed.MIN_CHARS for t in texts) and texts[0].endswith(".")
    assert [embed_speed.texts_per_round(b) for b in (1, 32, 256)] == [64, 128, 1024]
    assert [s["name"] for s in shapes.specs(["embed"], "cpu")] == ["minilm-B1", "minilm-B32", "minilm-B256"]
    assert "embed" not in shapes.workloads_with("gpu") and "embed" in shapes.PEER_WORKLOADS


def test_zoo_and_sentence_transformers_embed_the_same_texts_and_the_row_has_their_ratio():
    spec = {**shapes.specs(["embed"], "cpu", names=["minilm-B32"])[0]}
    zoo, st = embed_speed.ZooEmbed(spec), torch_peer.make("st-torch", spec)
    reports = [(w.round(), w.final()) for w in (zoo, st)]
    (z_round, z_final), (s_round, s_final) = reports
    assert z_final["texts"] == s_final["texts"] == 128
    assert z_final["vector_sum"] == pytest.approx(s_final["vector_sum"], abs=1e-3)  # the same vectors
    assert z_final["tokens_per_s"] / z_final["sequences_per_s"] == pytest.approx(
        s_final["tokens_per_s"] / s_final["sequences_per_s"])  # the same real tokens a text
    row = run.summarise(spec, (zoo.ready(), [z_round], z_final), {"st-torch": (st.ready(), [s_round], s_final,
                                                                                  z_final)})
    assert row["ratio_sequences_per_s"] == pytest.approx(z_final["sequences_per_s"] / s_final["sequences_per_s"])
    with pytest.raises(ValueError, match="embed's peer is st-torch"):
        torch_peer.make("hf-torch", spec)
    with pytest.raises(ValueError, match="st-torch is the embed and embed_train workloads' peer, not gpt_train's"):
        torch_peer.make("st-torch", shapes.specs(["gpt_train"], "cpu")[0])


def test_the_train_workload_trains_the_same_pairs_on_both_sides_and_the_row_has_their_ratio(monkeypatch):
    """embed_train (zoo.bench.embed_train_speed): zoo's trainer step and sentence-transformers' MNRL step on the
    same pairs, the same real tokens a step and about the same loss."""
    from zoo.bench import common, embed_train_speed
    monkeypatch.setattr(common, "ROUND_SECONDS", 0.0)  # one step a round: the host is slow
    (spec,) = shapes.specs(["embed_train"], "cpu", batch=8, seq_len=32)
    assert spec["name"] == "minilm-T64-B16+T32+B8" and "embed_train" in shapes.PEER_WORKLOADS
    zoo, st = embed_train_speed.ZooEmbedTrain(spec), torch_peer.make("st-torch", spec)
    assert zoo.k == st.k == 1 and zoo.i == st.i == 3  # calibrated on steps 0-2: the same rows next
    reports = [(w.round(), w.final()) for w in (zoo, st)]
    (z_round, z_final), (s_round, s_final) = reports
    assert zoo.round_tokens == st.round_tokens and 8 * 2 * 10 < zoo.round_tokens[0] <= 8 * 2 * 32
    # The same batch after the same steps (pairs of one pydoc topic, hard in-batch negatives): the same loss up to
    # dropout's draws (2.50 and 2.63 once)
    assert z_final["loss"] == pytest.approx(s_final["loss"], rel=0.3)
    row = run.summarise(spec, (zoo.ready(), [z_round], z_final), {"st-torch": (st.ready(), [s_round], s_final,
                                                                                  z_final)})
    assert row["workload"] == "embed_train" and row["ratio_tokens_per_s"] == pytest.approx(
        z_final["tokens_per_s"] / s_final["tokens_per_s"])
