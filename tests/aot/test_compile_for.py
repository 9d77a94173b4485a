"""--compile-for: a run's train step compiled for a TPU topology by libtpu's compile-only client on this CPU host
(zoo.aot). Every family's tiny config compiles for v5e:2x2 and reports what a user needs to know before renting the
pod: bytes per device beside the chip's HBM and whether it fits, FLOPs (XLA's beside zoo's count), collectives,
kernels, an estimated step time; a mesh with fsdp, tensor and expert axes compiles for v5p-16 with the collectives
those axes need; a model too large for the chip is reported not to fit; bad targets are one line.

The configs are the shipped tiny ones cut to one or two layers and short rows: a TPU compile costs seconds
whatever the width, and the suite compiles seven."""

import json
import sys

import pytest

import zoo
from zoo.aot import target as targets
from zoo.cli import train
from zoo.errors import ConfigError

SMALL = ["data.seq_len=32", "train.batch_size=8"]
TINY = {  # every family's tiny config, as a run of it would compile (one or two layers)
    "gpt": ("gpt_tiny", ["model.num_layers=1"]),
    "llama, GQA + sliding window": ("llama_tiny", ["model.num_layers=2", "model.sliding_window=16",
                                                   "model.global_every=2", "train.grad_accum=2"]),
    "bert": ("bert_tiny_mlm", ["model.num_layers=1"]),
    "t5-style encoder-decoder": ("encdec_tiny", ["model.num_encoder_layers=1", "model.num_decoder_layers=1"]),
    "gpt + LoRA": ("gpt_tiny", ["model.num_layers=1", "model.lora_rank=4"]),
}
KEYS = {"target", "fits", "kernels", "flops_per_device", "model_flops", "bytes_per_device", "collective_bytes",
        "compile_seconds", "estimate", "mesh", "chip"}


@pytest.fixture(scope="module")
def reports():
    return {name: zoo.compile_for(config, "v5e:2x2", overrides=SMALL + sets) for name, (config, sets) in TINY.items()}


@pytest.mark.parametrize("name", list(TINY))
def test_every_family_compiles_for_v5e_and_says_it_fits(reports, name):
    r = reports[name]
    assert KEYS <= set(r)
    assert r["target"] == "v5e:2x2" and r["chips"] == r["devices"] == 4 and r["chip"]["device_kind"] == "TPU v5 lite"
    assert r["mesh"]["data"] == 4  # mesh.data=-1 fills the 4 chips
    mem = r["bytes_per_device"]
    assert r["fits"] and 0 < mem["params"] < mem["total"] < r["hbm_per_device"] == 16e9
    # XLA's count of the partitioned program (a microbatch loop's body counted once: loop_trips), times the
    # devices, is zoo's 6N(+attention) count give or take the optimizer's and the norms' elementwise work.
    assert r["loop_trips"] == (2 if name.startswith("llama") else 1)
    assert 0.8 < r["flops_per_device"] * r["loop_trips"] * r["devices"] / r["model_flops"] < 1.6
    # Data parallel: the gradients are summed across the 4 chips, and nothing else moves.
    assert r["collective_bytes"]["all-reduce"] > 0 and r["collective_bytes"]["all-to-all"] == 0
    assert r["estimate"]["step_s"] > 0 and 0 < r["estimate"]["mfu"] < 1
    if name.startswith(("gpt", "llama")):  # causal attention over 32 tokens: XLA's (splash takes 128-token blocks)
        assert not any("splash" in k for k in r["kernels"])


def test_lora_keeps_no_optimizer_state_for_the_frozen_base(reports):
    plain, lora = reports["gpt"], reports["gpt + LoRA"]
    assert lora["bytes_per_device"]["optimizer"] < plain["bytes_per_device"]["optimizer"] / 5
    assert lora["bytes_per_device"]["params"] > plain["bytes_per_device"]["params"]  # base + adapters


def test_fsdp_tensor_and_expert_axes_on_v5p_run_zoos_pallas_kernels():
    """A mixture of experts over fsdp, tensor and expert axes on a v5p-16 (8 chips), at 128-token rows with a
    sliding window: the collectives those axes need, and zoo's Pallas kernels (zoo.nn.tpu_kernels): splash
    attention forward and backward, megablox's grouped matmul for the experts and their weight gradients."""
    r = zoo.compile_for("moe_tiny", "v5p-16", overrides=["model.num_layers=1", "data.seq_len=128", "train.batch_size=4",
                                                         "model.sliding_window=64", "mesh.data=1", "mesh.fsdp=2",
                                                         "mesh.tensor=2", "mesh.expert=2"])
    assert r["chips"] == r["devices"] == 8 and r["mesh"] == {"data": 1, "fsdp": 2, "tensor": 2, "expert": 2}
    c = r["collective_bytes"]
    assert r["fits"] and c["all-gather"] > 0  # fsdp gathers its weights for the matmuls
    assert c["all-reduce"] + c["reduce-scatter"] > 0
    kernels = " ".join(r["kernels"])
    assert "tpu_custom_call:splash_mha_fwd" in kernels and "tpu_custom_call:splash_mha_dkv" in kernels
    assert "tpu_custom_call:gmm" in r["kernels"] and "tpu_custom_call:tgmm" in r["kernels"]


def test_a_model_too_large_for_the_chip_does_not_fit():
    r = zoo.compile_for("gpt_tiny", "v5e:2x2", overrides=SMALL + ["model.num_layers=1", "model.d_model=8192",
                                                                  "model.num_heads=64", "model.d_ff=65536"])
    # 1.1e9 params in float32, replicated on each chip, and twice that again in Adam's moments: 13 GB per chip.
    assert not r["fits"] and r["bytes_per_device"]["params"] + r["bytes_per_device"]["optimizer"] > 16e9


def test_the_command_prints_one_json_object_and_writes_nothing(tmp_path, monkeypatch, capfd):
    monkeypatch.chdir(tmp_path)  # where runs/ would go
    argv = ["gpt_tiny", "--compile-for", "v5e-4", "--json", *(f"--set={s}" for s in SMALL + TINY["gpt"][1])]
    assert train.train_main(argv) == 0
    out, err = capfd.readouterr()
    r = json.loads(out)
    assert r["fits"] and r["topology"] == "v5e:2x2" and not list(tmp_path.iterdir())
    assert "libtpu" not in err.lower() and "TPU_WORKER_HOSTNAMES" not in err  # libtpu kept quiet


@pytest.mark.parametrize("name, says", [
    ("h100:8", "not a target zoo knows: GENERATION:TOPOLOGY"),
    ("v5e:2x2x2", "a v5e topology has 2 dimensions"),
    ("v5p-6", "v5p-6 is not a slice Cloud TPU sells (v5p-N counts TensorCores, 2 a chip)"),
    ("v5e:3x3", "libtpu cannot describe topology v5e:3x3"),
])
def test_a_bad_target_is_one_line(name, says):
    with pytest.raises(ConfigError, match=r"^--compile-for .*") as e:
        targets.devices(targets.parse(name))
    assert says in str(e.value) and "\n" not in str(e.value)


def test_slice_names_count_chips_or_cores_as_cloud_tpu_does():
    assert targets.parse("v5e-8").topology == "v5e:2x4"
    assert (t := targets.parse("v5p-16")).topology == "v5p:2x2x2" and t.chips == 8
    assert (t := targets.parse("v6e:2x2/2")).slices == 2 and t.chips == 8
    assert len(targets.devices(targets.parse("v5e:2x2/2"))) == 8


def test_without_libtpu_the_line_says_how_to_install_it(monkeypatch):
    monkeypatch.setitem(sys.modules, "libtpu", None)  # import libtpu fails as it does where it is not installed
    with pytest.raises(ConfigError, match=r"needs libtpu: pip install 'zoo\[tpu\]'"):
        targets.devices(targets.parse("v5e:2x2"))


def test_generation_compiles_with_its_kv_cache_over_the_chips(capsys):
    """zoo-sample SOURCE --compile-for (zoo.compile_for(..., program="generate")): 2 prompts x 2 samples = 4 rows."""
    from zoo.cli import sample
    assert sample.main(["llama_tiny", "--compile-for", "v5e:2x2", "--prompt", "a", "--prompt", "b", "--num-samples",
                        "2", "--prompt-len", "16", "--max-new-tokens", "16", "--json"]) == 0
    r = json.loads(capsys.readouterr().out)
    assert r["program"] == "generate of llama_tiny (bfloat16): 4 rows x 16 prompt + 16 new tokens"
    assert r["mesh"]["tensor"] == 4 and r["fits"]  # served tensor-parallel over the 4 chips
    # llama_tiny's cache: 4 layers x K and V x 4 rows x 32 positions x 2 kv heads x 32 dims, bfloat16 (and the
    # cache's int32 position counters).
    assert 0 <= r["kv_cache_bytes"] - 4 * 2 * 4 * 32 * 2 * 32 * 2 < 64
    assert r["bytes_per_device"]["total"] >= r["bytes_per_device"]["params"] + r["bytes_per_device"]["kv_cache"]
    e = r["estimate"]
    assert e["per_token_s"] > 0 and e["tokens_per_s"] == pytest.approx(4 / e["per_token_s"])


def test_zoo_serves_engine_compiles_its_decode_chunk_and_prefill(capsys):
    """zoo-serve SOURCE --compile-for: the engine's own two programs (zoo.engine.programs.decode_chunk over every slot
    and the whole cache, the prefill of the longest prompt), with the cache the slots and --max-len make."""
    from zoo.cli import serve
    args = ["llama_tiny", "--compile-for", "v5e:2x2", "--slots", "4", "--max-len", "32", "--chunk", "2"]
    assert serve.main(args + ["--json"]) == 0
    r = json.loads(capsys.readouterr().out)
    assert r["engine"] == {"slots": 4, "max_len": 32, "chunk": 2, "scan_layers": False,
                           "paged_attention": "pages gathered (head dim 32: the TPU kernel's blocks are whole "
                                              "128-lane tiles)"}
    assert r["fits"] and r["mesh"]["tensor"] == 4
    # 4 slots x 32 positions in pages of 16 (zoo.engine.pages), and the scratch page; its 2 KV heads do not divide
    # the 4 chips: whole
    assert 0 <= r["kv_cache_bytes"] - 4 * 2 * (4 * 32 + 16) * 2 * 32 * 2 < 64
    assert r["bytes_per_device"]["kv_cache"] == r["prefill"]["bytes_per_device"]["kv_cache"] == r["kv_cache_bytes"]
    assert r["prefill"]["flops_per_device"] > 0 and r["prefill"]["bytes_per_device"]["total"] > r["kv_cache_bytes"]
    assert r["estimate"]["tokens_per_s"] == pytest.approx(4 / r["estimate"]["per_token_s"])
    assert serve.main(args[:3] + ["--slots", "0"]) == 2
    assert capsys.readouterr().err.strip() == "error: --slots 0 must be >= 1"


def test_zoo_serve_decodes_with_the_tpu_paged_attention_kernel_where_it_takes_the_model(capsys):
    """Compiled for a TPU, the engine's decode holds jax's ragged paged-attention kernel (a tpu_custom_call per layer,
    run per chip's share of the KV heads: Qwen3-0.6B's 8 over 4 chips) and writes each token into the combined pool
    in place: no copy of a pool in the program. A model whose head dim is not 128 is refused in one line."""
    import re
    from zoo.aot import report
    from zoo.cli import serve
    texts = []
    compiled = report.compiled

    def spy(fn, fixed):
        c = fn()
        texts.append(c.as_text())
        return compiled(lambda: c, fixed)
    args = ["qwen3_0_6b", "--compile-for", "v5e:2x2", "--slots", "4", "--max-len", "64", "--chunk", "2",
            "--scan-layers"]
    report.compiled = spy
    try:
        assert serve.main(args + ["--json"]) == 0
    finally:
        report.compiled = compiled
    r = json.loads(capsys.readouterr().out)
    assert r["engine"]["paged_attention"] == "the tpu Pallas kernel" and r["fits"]
    assert "tpu_custom_call:ragged_paged_attention_kernel" in r["kernels"]
    assert not any("ragged" in k for k in r["prefill"]["kernels"])  # a prefill gathers the pages
    # the pool: 28 layers of 4 x 64 slots in pages of 16 and the scratch page, a chip's 2 x 2 combined heads of 128
    pool = r"bf16\[28,17,16,4,128\]"
    assert re.search(pool, texts[0]) and not re.search(r"copy(-start)?[.0-9]* = " + pool, texts[0])
    assert serve.main(["smollm2_135m"] + args[1:] + ["--paged-kernel", "tpu"]) == 2
    assert capsys.readouterr().err.strip() == ("error: --paged-kernel tpu: head dim 64: the TPU kernel's blocks are "
                                               "whole 128-lane tiles")


def test_a_zoo_process_on_a_host_without_a_tpu_hears_nothing_from_libtpu():
    """libtpu is installed (the tpu and test extras): jax starting in any zoo process (a bench worker, a user's
    script) with no JAX_PLATFORMS set still prints none of libtpu's lines about worker hostnames."""
    import os
    import subprocess
    env = {k: v for k, v in os.environ.items()
           if k not in ("JAX_PLATFORMS", "TPU_WORKER_HOSTNAMES", "TPU_ACCELERATOR_TYPE", "ALLOW_MULTIPLE_LIBTPU_LOAD")}
    p = subprocess.run([sys.executable, "-c", "import zoo, jax; print(jax.devices()[0].platform)"], env=env,
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0 and p.stdout.strip() == "cpu", p.stderr[-2000:]
    assert "TPU_WORKER_HOSTNAMES" not in p.stderr and "accelerator type" not in p.stderr, p.stderr[-2000:]
