"""The fused loss's chunk budget per platform (zoo.nn.losses.chunk_budget): CPU keeps its small chunks,
GPU/TPU take a few large ones (a share of device memory when the device reports it)."""

from zoo.nn import losses

GB = 1e9
GPT2_B16 = (16, 1024, 50257)  # 3.3 GB of float32 logits


def test_cpu_keeps_the_64mb_chunks():
    assert losses.chunk_budget("cpu") == losses.CHUNK_BYTES == 64 * 2 ** 20
    assert losses.chunk_budget() == losses.CHUNK_BYTES  # the tests run on CPU
    assert losses.num_chunks(*GPT2_B16) == losses.num_chunks(*GPT2_B16, chunk_bytes=losses.CHUNK_BYTES) == 64


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
    """Compiled for a TPU from this CPU host (zoo.aot), the budget is the TPU's, not the host's 64 MB, and it
    holds the rows one chip holds: llama3_1b's loss on v5e-8 was cut in 512 chunks over the global batch."""
    import jax

    from zoo.aot import target
    from zoo.config import MeshConfig
    from zoo.train import sharding
    mesh = sharding.make_mesh(MeshConfig(data=2, fsdp=2, tensor=1, expert=1),
                              target.devices(target.parse("v5e:2x2")))
    with jax.set_mesh(mesh):
        assert losses.chunk_budget() == losses.ACCEL_CHUNK_BYTES and losses.local_rows(32) == 8
        assert losses.local_rows(6) == 6  # rows the data axes do not divide: counted whole
        assert losses.num_chunks(32, 1024, 50257) == 2
    assert losses.local_rows(32) == 32 and losses.num_chunks(32, 1024, 50257) == 128  # no mesh: the CPU's own
