"""Mixtures of experts (zoo.nn.moe) from and to Hugging Face, beside the parity of their rows in
tests/hf/parity_table.py (mixtral: 4 experts, 2 per token, grouped-query attention, expert width 28; qwen3_moe:
q/k norms, head width 24 over width 40, top-2 of 4 left unnormalised; logits, KV-cached greedy continuations, an
export with per-expert keys as transformers saves them, and back, in tests/hf/test_parity_decoders.py): export
picks the architecture by the q/k norms and refuses what none holds, in one line; Qwen3-MoE's dense layers are
refused.
"""

import dataclasses

import pytest

torch = pytest.importorskip("torch", reason="torch is not installed: HF parity tests need transformers (PyTorch)")
transformers = pytest.importorskip("transformers", reason="transformers is not installed")

from tests.helpers import hf_runs  # noqa: E402
from tests.helpers.hf_runs import hf_refs_fixture  # noqa: F401,E402  (the session's references)
from zoo import hf  # noqa: E402
from zoo.errors import ConversionError  # noqa: E402
from zoo.hf.convert import export_converter  # noqa: E402

one_torch_thread = hf_runs.one_torch_thread  # autouse: torch on one thread
edited = hf_runs.edited


def test_export_picks_the_architecture_by_qk_norms_and_refuses_what_none_holds(hf_refs):
    mixtral, qwen = (hf_refs.converted(n).config.model for n in ("mixtral", "qwen3_moe"))
    assert export_converter(mixtral).ARCHITECTURES[0] == "MixtralForCausalLM"
    assert export_converter(qwen).ARCHITECTURES[0] == "Qwen3MoeForCausalLM"
    assert export_converter(dataclasses.replace(mixtral, num_experts=0)).ARCHITECTURES[0] == "LlamaForCausalLM"
    assert export_converter(dataclasses.replace(qwen, num_experts=0)).ARCHITECTURES[0] == "Qwen3ForCausalLM"
    for bad in (dict(moe_norm_topk=False), dict(qkv_bias=True), dict(sliding_window=8, qk_norm=True)):
        with pytest.raises(ConversionError, match=r"no Hugging Face equivalent; .* or as Mixtral: positions=rope, "
                                                  r"norm=rmsnorm, mlp=swiglu, no biases, qk_norm off, num_experts > 0"
                           ) as e:
            export_converter(dataclasses.replace(mixtral, **bad))
        assert "\n" not in str(e.value)


@pytest.mark.parametrize("fields,message", [
    (dict(decoder_sparse_step=2), r"^Qwen3-MoE with dense MLP layers \(decoder_sparse_step=2, mlp_only_layers=\[\]\) "
                                  r"is not supported; supported: experts in every layer"),
    (dict(mlp_only_layers=[1]), r"^Qwen3-MoE with dense MLP layers \(decoder_sparse_step=1, mlp_only_layers=\[1\]\)")])
def test_qwen3_moe_dense_layers_are_refused_in_one_line(hf_refs, tmp_path, fields, message):
    bad = edited(hf_refs.directory("qwen3_moe"), tmp_path / "bad", **fields)
    with pytest.raises(ConversionError, match=message) as e:
        hf.from_hf(bad, str(tmp_path / "run"), verbose=False)
    assert "\n" not in str(e.value)
