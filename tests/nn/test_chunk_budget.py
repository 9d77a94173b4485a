"""The fused loss's chunk budget per platform (zoo.nn.losses.chunk_budget, num_chunks): a CPU takes the count
that moves the fewest bytes under a memory cap, GPU/TPU a few large chunks (a share of device memory when the
device reports it)."""

from zoo.nn import losses

GB = 1e9
GPT2_B16 = (16, 1024, 50257)  # 3.3 GB of float32 logits


def test_a_cpu_takes_the_chunk_count_that_moves_the_fewest_bytes():
    assert losses.chunk_budget("cpu") == losses.CHUNK_BYTES == 256 * 2 ** 20
    assert losses.chunk_budget() == losses.CHUNK_BYTES  # the tests run on CPU
    # zoo-bench's gpt_train shape: 64 MB of logits as four 16 MB chunks that stay in cache (one chunk before)
    assert losses.num_chunks(8, 256, 8192, D=256) == 4
    # SmolLM2's vocabulary and width: its 113 MB gradient accumulator, read and written per chunk, outweighs
    # the 192 MB of logits passing through memory: one chunk (4 under the old 64 MB budget)
    assert losses.num_chunks(2, 512, 49152, D=576) == 1
    # the memory cap still holds: 768 MB of logits in chunks of at most CHUNK_BYTES
    n = losses.num_chunks(8, 512, 49152, D=576)
    assert 8 * 512 // n * 49152 * 4 <= losses.CHUNK_BYTES and n == 4
    for B, T, V, D in [(8, 256, 8192, 256), (2, 512, 49152, 576), (16, 128, 30522, 256)]:
        n = losses.num_chunks(B, T, V, D=D)
        fits = [m for m in range(1, T + 1) if T % m == 0 and B * (T // m) * V * 4 <= losses.CHUNK_BYTES]
        assert losses.cpu_traffic(n, B, T, V, D) == min(losses.cpu_traffic(m, B, T, V, D) for m in fits)
    # without the width, as before: the fewest chunks under the cap
    assert losses.num_chunks(*GPT2_B16) == losses.num_chunks(*GPT2_B16, chunk_bytes=losses.CHUNK_BYTES) == 16
    assert losses.num_chunks(*GPT2_B16, D=768, platform="gpu", chunk_bytes=losses.CHUNK_BYTES) == 16


def test_accelerators_take_a_few_large_chunks():
    h100 = losses.chunk_budget("gpu", memory_bytes=0.75 * 80 * GB)  # jax's default 75% of an 80 GB H100
    h200 = losses.chunk_budget("gpu", memory_bytes=0.75 * 141 * GB)
    assert losses.num_chunks(*GPT2_B16, chunk_bytes=h100) == 4
    assert losses.num_chunks(*GPT2_B16, chunk_bytes=h200) == 2
    assert losses.num_chunks(32, 1024, 50257, chunk_bytes=h100) == 8
    assert losses.chunk_budget("tpu") == losses.chunk_budget("gpu", memory_bytes=None) == losses.ACCEL_CHUNK_BYTES
    assert 2 <= losses.num_chunks(*GPT2_B16, chunk_bytes=losses.ACCEL_CHUNK_BYTES) <= 8


def test_the_memory_share_is_clamped():
    lo, hi = losses.ACCEL_CHUNK_RANGE
    assert losses.chunk_budget("gpu", memory_bytes=4 * GB) == lo  # a small card: still 256 MB chunks
    assert losses.chunk_budget("gpu", memory_bytes=10_000 * GB) == hi


def test_a_step_traced_for_a_tpu_mesh_takes_the_tpu_budget_over_its_own_rows():
    """Compiled for a TPU from this CPU host (zoo.aot), the budget is the TPU's, not the host's, and it
    holds the rows one chip holds: llama3_1b's loss on v5e-8 was cut in 512 chunks over the global batch."""
    import jax

    from zoo.aot import target
    from zoo.configuration import MeshConfig
    from zoo.training import sharding
    mesh = sharding.make_mesh(MeshConfig(data=2, fsdp=2, tensor=1, expert=1),
                              target.devices(target.parse("v5e:2x2")))
    with jax.set_mesh(mesh):
        assert losses.chunk_budget() == losses.ACCEL_CHUNK_BYTES and losses.local_rows(32) == 8
        assert losses.local_rows(6) == 6  # rows the data axes do not divide: counted whole
        assert losses.num_chunks(32, 1024, 50257) == 2
    assert losses.local_rows(32) == 32 and losses.num_chunks(32, 1024, 50257) == 32  # no mesh: the CPU's own
