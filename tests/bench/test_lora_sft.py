"""zoo-bench's fine-tuning workloads on CPU: lora_train (adapters on a frozen base that zoo's worker writes
first, PEFT's LoRA beside it) and sft_train (packed vs padded chat rows, their real tokens counted)."""

import json

import jax
import pytest

from zoo.bench import shapes
from zoo.cli import bench

TINY_LLAMA = dict(L=1, D=64, N=2, K=1, F=128, V=512, T=32, B=8)


def _tiny_lora():
    spec = shapes.specs(["lora_train"], "cpu")[0]
    tiny = shapes._lora(shapes._llama(**TINY_LLAMA))
    return {**spec, **tiny, "name": "tiny"}


def test_the_new_workloads_have_shapes_in_every_set():
    for s in shapes.SHAPE_SETS:
        lora = shapes.specs(["lora_train"], s)
        llama = shapes.specs(["llama_train"], s)
        assert [(x["batch"], x["seq_len"], x["hf"]) for x in lora] == [(x["batch"], x["seq_len"], x["hf"])
                                                                       for x in llama]  # llama_train's shapes
        assert all({"model.lora_rank=16", "model.lora_alpha=32.0"} <= set(x["overrides"]) for x in lora)
        assert all(x["lora"] == {"rank": 16, "alpha": 32.0, "targets": list(shapes.LORA_TARGETS_HF)} for x in lora)
        sft = shapes.specs(["sft_train"], s)
        assert [("data.packing=True" in x["overrides"], "data.packing=False" in x["overrides"]) for x in sft] == \
            [(True, False), (False, True)]
        assert sft[0]["batch"] == sft[1]["batch"] and sft[0]["seq_len"] == sft[1]["seq_len"]
        assert not any(o.startswith("init_from") for x in sft for o in x["overrides"])
    assert "lora_train" in shapes.PEER_WORKLOADS and "sft_train" not in shapes.PEER_WORKLOADS


def test_a_tiny_lora_spec_trains_only_the_adapters_and_reports_mfu():
    from zoo import tasks
    from zoo.bench.worker import ZooTrain
    from zoo.overrides import apply_overrides, load_config_file
    spec = _tiny_lora()
    z = ZooTrain(spec, devices=jax.devices()[:1])
    try:
        before = jax.tree.map(lambda x: x.copy(), z.state.params)
        r = z.round()
        paths = [jax.tree_util.keystr(p) for p, _ in jax.tree_util.tree_leaves_with_path(z.state.params)]
        assert len(paths) == 2 * 7 and all(p.endswith(("['lora_a']", "['lora_b']")) for p in paths)
        assert z.state.frozen and int(z.state.step) > 2  # the base is held apart, and the step ran
        moved = jax.tree.map(lambda a, b: bool((a != b).any()), before, z.state.params)
        assert all(jax.tree.leaves(moved))  # every adapter trains (lora_b starts at zero)
        out = z.final()
        cfg = apply_overrides(load_config_file(spec["config"]), spec["overrides"])
        full = tasks.plain(cfg).flops_per_token(32)
        assert 0 < z.flops_per_token < full  # the frozen base's count: no weight gradients for it
        assert out["mfu"] == pytest.approx(z.tokens / r["step_s"] * z.flops_per_token / z.peak)
        assert 0 < out["mfu"] < 1 and z.settings["lora"]["rank"] == 16 and z.n_trainable == 16384
        state_mb = sum(x.nbytes for x in jax.tree.leaves(z.state)) / 2**20  # base, adapters, their moments
        assert state_mb < out["step_memory_mb"] == z.step_memory_mb < 50 * state_mb
    finally:
        z.prefetch.close()


def test_the_peers_lora_model_trains_only_its_adapters():
    from zoo.bench import torch_peer
    peer = torch_peer.make("hf-torch", _tiny_lora())
    train = {n for n, p in peer.model.named_parameters() if p.requires_grad}
    assert train and all(".lora_A." in n or ".lora_B." in n for n in train)
    assert len(train) == 2 * len(shapes.LORA_TARGETS_HF)  # one layer: every attention and MLP matrix
    assert peer.ready()["trainable_params"] == 16384  # zoo's adapters' count (the test above)
    before = {n: p.detach().clone() for n, p in peer.model.named_parameters()}
    peer.round()
    for n, p in peer.model.named_parameters():
        assert bool((p != before[n]).any()) == (n in train), n  # the base stays as it was
    assert peer.final()["tokens_per_s"] > 0


TINY_SFT = ["model.num_layers=1", "model.d_model=64", "model.num_heads=2", "model.num_kv_heads=1", "model.d_ff=128"]


def test_packed_sft_rows_hold_far_more_real_tokens_than_padded(tmp_path, capsys, one_device):
    out = tmp_path / "bench.jsonl"
    args = ["--workload", "sft_train", "--shapes", "cpu", "--rounds", "1", "--out", str(out)]
    assert bench.main(args + [f"--set={o}" for o in TINY_SFT]) == 0
    packed, padded = [json.loads(line) for line in out.read_text().splitlines()]
    assert packed["shape"].startswith("llama_tiny-packed") and padded["shape"].startswith("llama_tiny-padded")
    assert packed["real_token_frac"] > 0.85 and padded["real_token_frac"] < 0.4  # 94% and 27% at T=512
    for row in (packed, padded):
        assert row["real_tokens_per_s"] == pytest.approx(row["tokens_per_s"] * row["real_token_frac"])
        assert 0 < row["mfu"] < 1 and "peers" not in row
    table = capsys.readouterr().out.splitlines()[-4:]
    assert table[0].split(" | ")[4:6] == ["tokens_per_s", "real_tokens_per_s"]
    assert float(table[2].split(" | ")[5]) == pytest.approx(packed["real_tokens_per_s"], rel=1e-3)
