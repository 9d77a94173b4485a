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
