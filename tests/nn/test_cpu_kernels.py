"""zoo's C++ attention kernels on the CPU (zoo.nn.cpu_kernels, zoo/nn/decode_attention.cc): their answers against
the einsum attention (over gathered pages, over a dense cache), the engine and zoo.infer.sample decoding by them,
their build once per machine, and a machine that cannot build them (no compiler) gathering the pages under auto
and refusing `cpu` in one line."""

import os
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import zoo
from tests.helpers.engine_runs import greedy_tokens, shared_prompts
from zoo.errors import ArgumentError
from zoo.nn import cpu_kernels, paged_kernels
from zoo.nn.attention import einsum_attention


def _case(seed, B, N, K, H, PAGE=16, NP=6):
    rng = np.random.default_rng(seed)
    P = B * NP + 1
    q = jnp.asarray(rng.normal(size=(B, 1, N, H)), jnp.float32)
    kv = jnp.asarray(rng.normal(size=(P, PAGE, 2 * K, H)) * 2, jnp.float32)
    table = jnp.asarray(rng.permutation(np.arange(1, P)).reshape(B, NP), jnp.int32)
    return q, kv, table


def _gathered(q, kv, pos, table, softcap):
    B, NP, PAGE = q.shape[0], table.shape[1], kv.shape[1]
    gathered = kv[table.reshape(-1)].reshape(B, NP * PAGE, *kv.shape[2:])
    mask = (jnp.arange(NP * PAGE)[None, :] <= pos)[:, None, None, :]
    return einsum_attention(q, gathered[:, :, 0::2], gathered[:, :, 1::2], mask=mask, softcap=softcap)


@pytest.mark.parametrize("N,K,H,softcap", [(9, 3, 64, 0.0), (4, 4, 32, 0.0), (8, 2, 128, 30.0), (6, 3, 48, 5.0)])
def test_the_kernel_answers_the_gathered_attention_of_each_row_up_to_its_position(N, K, H, softcap):
    """Rows at positions 0, 15, 16 (a page's first slot), 50 and 95 (the table's last) and a free row (-1), over
    pages scattered through the pool, grouped and plain heads, head dims the kernel knows (32, 64, 128) and one it
    takes at run time (48), with and without soft-capping: the gathered einsum attention's answer."""
    q, kv, table = _case(N + H, 6, N, K, H)
    pos = jnp.array([[0], [15], [16], [50], [95], [-1]], jnp.int32)
    got = jax.jit(lambda *a: paged_kernels.attend(*a, softcap=softcap, kernel="cpu"))(q, kv, pos, table)
    want = _gathered(q, kv, pos, table, softcap)
    np.testing.assert_allclose(np.asarray(got[:5]), np.asarray(want[:5]), rtol=2e-5, atol=2e-6)
    assert np.all(np.isfinite(np.asarray(got[5])))  # a free row reads its first slot; its output is unused


def test_a_page_id_outside_the_pool_reads_the_scratch_page_instead_of_memory_beyond_it():
    q, kv, table = _case(3, 2, 4, 2, 64)
    bad = table.at[1, 0].set(10_000)
    pos = jnp.array([[10], [10]], jnp.int32)
    got = paged_kernels.attend(q, kv, pos, bad, kernel="cpu")
    want = _gathered(q, kv, pos, bad.at[1, 0].set(0), 0.0)
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=2e-5, atol=2e-6)


def test_the_engine_on_a_cpu_decodes_by_the_kernel_the_tokens_of_the_gathered_pages():
    """llama_tiny (4 query heads on 2 key/value heads): auto takes the kernel on this CPU, the pool one array of
    keys and values; four prompts (one sharing another's pages), 20 greedy tokens each, the same tokens as off."""
    from zoo.cli.serve import attention_of
    from zoo.engine.batching import Engine
    lm, prompts, got = zoo.load("llama_tiny"), shared_prompts(), {}
    for kernel in ("off", "auto"):
        engine = Engine(lm, slots=4, max_len=128, chunk=4, paged_kernel=kernel)
        attn = engine.cache["h_0"]["attn"]
        assert engine.kernel == (None if kernel == "off" else "cpu")
        assert attention_of(engine) == ("attention over the gathered pages" if kernel == "off" else
                                        "attention by zoo's CPU kernel")  # zoo-serve's start-up line says which
        assert attn["cached_value"].shape[0] == (0 if kernel == "auto" else attn["cached_key"].shape[0])
        got[kernel] = greedy_tokens(engine, prompts)
    assert got["auto"] == got["off"] and [len(t) for t in got["off"]] == [20] * 4


def test_the_kernel_is_built_once_a_machine_and_read_back_by_the_next_process(tmp_path, monkeypatch):
    """A fresh cache root: the first build writes one library under kernels/ (no temporary left), named for this
    source, jaxlib, compiler and CPU; asked again, the file is there and nothing is compiled."""
    monkeypatch.setenv("ZOO_CACHE_DIR", str(tmp_path))
    path = cpu_kernels.library_path()
    assert os.path.dirname(path) == str(tmp_path / "kernels") and not os.path.exists(path)
    cpu_kernels.build(path)
    assert os.listdir(tmp_path / "kernels") == [os.path.basename(path)]
    calls = []
    monkeypatch.setattr(cpu_kernels, "build", calls.append)
    monkeypatch.setattr(cpu_kernels, "_load", cpu_kernels._load.__wrapped__)  # a new process: nothing loaded yet
    assert cpu_kernels.unavailable() is None and calls == []
    monkeypatch.setenv("CXX", "g++")  # another compiler: another build
    assert cpu_kernels.library_path() != path


def test_without_a_compiler_auto_gathers_and_cpu_is_refused_in_one_line(tmp_path, monkeypatch):
    from zoo.engine.batching import Engine
    monkeypatch.setenv("ZOO_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("CXX", "no-such-compiler")
    monkeypatch.setattr(cpu_kernels, "_load", cpu_kernels._load.__wrapped__)
    why = "no C++ compiler (no-such-compiler; set CXX) to build zoo's CPU attention kernel"
    assert cpu_kernels.unavailable() == why
    lm = zoo.load("llama_tiny")
    assert paged_kernels.for_model("auto", lm.config.model, "float32") == (None, why)
    assert Engine(lm, slots=2, max_len=64).kernel is None  # auto: the pages gathered
    with pytest.raises(ArgumentError, match=f"^{re.escape('--paged-kernel cpu: ' + why)}$"):
        Engine(lm, slots=2, max_len=64, paged_kernel="cpu")
    assert not os.path.exists(tmp_path / "kernels") or os.listdir(tmp_path / "kernels") == []


def test_a_build_the_compiler_refuses_is_said_in_one_line_and_leaves_no_file(tmp_path, monkeypatch):
    monkeypatch.setenv("CXX", "false")  # a compiler that fails
    with pytest.raises(cpu_kernels.Unavailable, match=r"^false could not build zoo's CPU attention kernel: "):
        cpu_kernels.build(str(tmp_path / "k.so"))
    assert os.listdir(tmp_path) == []


def test_what_the_cpu_kernel_cannot_take_is_named():
    cfg = zoo.models.PRESETS["smollm2_135m"]
    assert paged_kernels.for_model("auto", cfg, "float32", platform="cpu") == ("cpu", None)
    assert paged_kernels.for_model("cpu", cfg, "bfloat16", platform="cpu") == (
        None, "dtypes bfloat16 (it takes float32)")
    assert paged_kernels.for_model("cpu", zoo.models.PRESETS["mistral_7b"], "float32", platform="cpu") == (
        None, "a sliding window")
    assert paged_kernels.for_model("cpu", cfg, "float32", platform="tpu") == (None, "the cpu kernel runs on a CPU only")


@pytest.mark.parametrize("N,K,H,softcap", [(9, 3, 64, 0.0), (4, 4, 48, 5.0)])
def test_the_dense_kernel_answers_each_rows_attention_over_its_first_slots(N, K, H, softcap):
    """A dense cache [B, S, K, H] of keys and one of values, rows reading 1, 17 (a block and one), 40 (every slot)
    and 33 slots: the einsum attention masked to those slots."""
    rng = np.random.default_rng(N)
    B, S = 4, 40
    q = jnp.asarray(rng.normal(size=(B, 1, N, H)), jnp.float32)
    k, v = (jnp.asarray(rng.normal(size=(B, S, K, H)) * 2, jnp.float32) for _ in range(2))
    lengths = jnp.array([1, 17, 40, 33], jnp.int32)
    got = jax.jit(lambda *a: cpu_kernels.attend_dense(*a, scale=H ** -0.5, softcap=softcap))(q[:, 0], k, v, lengths)
    mask = (jnp.arange(S)[None, :] < lengths[:, None])[:, None, None, :]
    want = einsum_attention(q, k, v, mask=mask, softcap=softcap)[:, 0]
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=2e-5, atol=2e-6)


def test_left_padded_prompts_decode_by_the_kernel_the_tokens_of_xlas_attention(monkeypatch):
    """zoo.infer.sample's batch of prompts of 3, 9 and 5 tokens (left-padded: each row at its own positions, its
    padding below 0), 12 greedy tokens each, with the kernel and with ZOO_CPU_KERNEL=off: the same tokens, and only
    the first program calls the kernel."""
    from zoo.infer import sample
    lm = zoo.load("llama_tiny")
    model, params = lm.decoding()
    rng = np.random.default_rng(1)
    prompts = [rng.integers(1, 256, n).tolist() for n in (3, 9, 5)]
    got, calls = {}, {}
    for side in ("on", "off"):
        monkeypatch.setenv("ZOO_CPU_KERNEL", side)
        jax.clear_caches()  # traced again, under this side
        got[side] = sample.generate_batch(model, params, prompts, 12, temperature=0.0)
        ids = jnp.zeros((1, 4), jnp.int32)
        calls[side] = "zoo_dense_decode_f32" in sample._generate.lower(
            params, ids, jax.random.PRNGKey(0), model=model, max_new_tokens=2, temperature=0.0, top_k=0, top_p=1.0,
            vocab_limit=model.cfg.vocab_size, eos_id=None).as_text()
    assert got["on"] == got["off"] and [len(t) for t in got["on"]] == [12] * 3
    assert calls == {"on": True, "off": False}
