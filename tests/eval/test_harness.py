"""lm-evaluation-harness's `--model zoo` (zoo.harness): on the same tiny random GPT-2 and Llama weights and
the same BPE tokenizer, three local tasks (multiple choice, generate_until, loglikelihood_rolling:
tests/eval/harness_tasks) give per-request log-likelihoods within 1e-4 of the harness's own `hf` model, the
same acc/acc_norm, the same generated text and the same greedy flags; `until` strings cut the text; any
number of requests compiles once per shape bucket; `stride=` scores as zoo-eval's sliding window; bad
model_args are one error line."""

import json
import os

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="torch is not installed: the reference is the harness's hf model")
transformers = pytest.importorskip("transformers", reason="transformers is not installed")
lm_eval = pytest.importorskip("lm_eval", reason="lm-eval is not installed (pip install lm-eval)")

from lm_eval.api.instance import Instance  # noqa: E402
from lm_eval.api.registry import get_model  # noqa: E402
from lm_eval.tasks import TaskManager  # noqa: E402

from tests.helpers import hf_runs  # noqa: E402
from zoo import hf  # noqa: E402
from zoo.cli import lm_eval as zoo_lm_eval  # noqa: E402
from zoo.errors import ConfigError, ZooDataError  # noqa: E402
from zoo import harness  # noqa: E402
from zoo.eval import perplexity as ppl  # noqa: E402
from zoo.infer import sample  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TASK_DIR = os.path.join(ROOT, "tests", "eval", "harness_tasks")
TASKS = ["zoo_choice", "zoo_generate", "zoo_rolling"]
one_torch_thread = hf_runs.one_torch_thread  # autouse
CONTEXT = 32  # the models' positions: the long rows are cut on the left, the long document takes windows


@pytest.fixture(scope="module", autouse=True)
def at_root():
    """The tasks' data_files are relative to the repository root, where the harness resolves them."""
    old = os.getcwd()
    os.chdir(ROOT)
    yield
    os.chdir(old)


@pytest.fixture(scope="module")
def dirs(tmp_path_factory):
    """name -> checkpoint directory: a BPE tokenizer trained on the tasks' text, a tiny GPT-2 beside it (and a zoo
    run converted from it), a tiny Llama with the same tokenizer files."""
    from tokenizers import ByteLevelBPETokenizer
    texts = [line for f in ("choice", "generate", "docs") for line in open(os.path.join(TASK_DIR, f + ".jsonl"))]
    bpe = ByteLevelBPETokenizer()
    bpe.train_from_iterator(texts * 3, vocab_size=320, special_tokens=["<|endoftext|>"], show_progress=False)
    V, eot = bpe.get_vocab_size(), bpe.token_to_id("<|endoftext|>")
    gpt2, llama = tmp_path_factory.mktemp("gpt2"), tmp_path_factory.mktemp("llama")
    bpe.save_model(str(gpt2))
    torch.manual_seed(0)
    transformers.GPT2LMHeadModel(transformers.GPT2Config(
        n_layer=2, n_embd=32, n_head=4, vocab_size=V, n_positions=CONTEXT, bos_token_id=eot, eos_token_id=eot,
    )).eval().save_pretrained(gpt2)
    transformers.AutoTokenizer.from_pretrained(gpt2).save_pretrained(llama)
    transformers.LlamaForCausalLM(transformers.LlamaConfig(
        vocab_size=V, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=CONTEXT, bos_token_id=eot, eos_token_id=eot,
        initializer_range=0.2, attn_implementation="eager")).eval().save_pretrained(llama)
    run = str(tmp_path_factory.mktemp("gpt2_run") / "run")
    hf.from_hf(str(gpt2), run, verbose=False)
    return {"gpt2": str(gpt2), "gpt2_run": run, "llama": str(llama)}


@pytest.fixture(scope="module")
def lms(dirs):
    """name -> (the harness's hf model, zoo's) on the same weights; zoo reads GPT-2 from its converted run."""
    from lm_eval.models.huggingface import HFLM
    return {name: (HFLM(pretrained=dirs[name], batch_size=8, device="cpu"),
                   harness.ZooLM(run=dirs[zoo_dir], batch_size=8))
            for name, zoo_dir in (("gpt2", "gpt2_run"), ("llama", "llama"))}


def evaluate(lm):
    tasks = TaskManager(include_path=TASK_DIR, include_defaults=False)  # the harness's own 10,000: seconds to index
    return lm_eval.simple_evaluate(model=lm, tasks=TASKS, task_manager=tasks,
                                   log_samples=True, verbosity="ERROR")


def responses(out, task):
    return [s["resps"] for s in sorted(out["samples"][task], key=lambda s: s["doc_id"])]


@pytest.mark.parametrize("name", ["gpt2", "llama"])
def test_tasks_equal_the_harness_hf_model(lms, name):
    theirs, ours = (evaluate(lm) for lm in lms[name])
    assert ours["results"]["zoo_choice"]["acc,none"] == theirs["results"]["zoo_choice"]["acc,none"]
    assert ours["results"]["zoo_choice"]["acc_norm,none"] == theirs["results"]["zoo_choice"]["acc_norm,none"]
    a, b = responses(theirs, "zoo_choice"), responses(ours, "zoo_choice")
    assert [len(q) for q in a] == [len(q) for q in b] == [3, 3, 2, 2, 2, 3]
    for qa, qb in zip(a, b):
        np.testing.assert_allclose([r[0][0] for r in qb], [r[0][0] for r in qa], atol=1e-4, rtol=0)
        assert [r[0][1] for r in qb] == [r[0][1] for r in qa]
    assert responses(ours, "zoo_generate") == responses(theirs, "zoo_generate")
    assert all(r[0] for r in responses(ours, "zoo_generate"))  # some text: the cut is not everything
    rolling = [r[0][0] for r in responses(ours, "zoo_rolling")]
    np.testing.assert_allclose(rolling, [r[0][0] for r in responses(theirs, "zoo_rolling")], atol=1e-4, rtol=0)
    ll_per_token = -np.asarray(rolling) / [len(lms[name][1].tok_encode(json.loads(line)["text"]))
                                            for line in open(os.path.join(TASK_DIR, "docs.jsonl"))]
    assert np.all(ll_per_token > 1.0)  # a random model: the sums are real sums, not zeros


def requests(kind, args):
    return [Instance(request_type=kind, doc={}, arguments=a, idx=i) for i, a in enumerate(args)]


def test_until_cuts_the_text_and_greedy_continuations_are_flagged(lms):
    hf_lm, lm = lms["gpt2"]
    prompts = ["The cat sat on the", "Two plus two is", "Which is bigger"]
    whole = lm.generate_until(requests("generate_until", [(p, {"max_gen_toks": 10}) for p in prompts]))
    assert whole == hf_lm.generate_until(requests("generate_until", [(p, {"max_gen_toks": 10}) for p in prompts]))
    stop = whole[0][len(whole[0]) // 2:][:3]  # a piece of the first answer, from its middle
    cut = lm.generate_until(requests("generate_until", [(p, {"max_gen_toks": 10, "until": [stop]}) for p in prompts]))
    assert cut == [w.split(stop)[0] for w in whole] and len(cut[0]) < len(whole[0])
    # A greedy answer is greedy token for token; the same answer with one token changed is not.
    pairs = [(p, w) for p, w in zip(prompts, whole)] + [(prompts[0], whole[0][:-1] + "Z")]
    ours = lm.loglikelihood(requests("loglikelihood", pairs))
    theirs = hf_lm.loglikelihood(requests("loglikelihood", pairs))
    assert [g for _, g in ours] == [g for _, g in theirs] == [True, True, True, False]
    np.testing.assert_allclose([x for x, _ in ours], [x for x, _ in theirs], atol=1e-4, rtol=0)


def test_one_compilation_per_shape_bucket(dirs):
    lm = harness.ZooLM(run=dirs["gpt2_run"], batch_size=16)  # 16 rows: a shape no other test compiles
    before = harness._row_scores._cache_size()
    # Rows of 17 to 32 input tokens (length bucket 32), 9 to 16 of them (row bucket 16): one shape.
    for n in (9, 16, 12):
        lm.loglikelihood(requests("loglikelihood", [("x" * (14 + i), " yes") for i in range(n)]))
    assert harness._row_scores._cache_size() == before + 1
    before = sample._generate._cache_size()
    for n in (9, 16, 12):  # prompts of 17 to 24 ids (bucket: the 28 that leave room for 4 new), 9 to 16 rows
        lm.generate_until(requests("generate_until", [("y" * (17 + i % 8), {"max_gen_toks": 4}) for i in range(n)]))
    assert sample._generate._cache_size() == before + 1


def test_stride_scores_as_zoo_eval_sliding_window(lms):
    lm = lms["gpt2"][1]
    text = json.loads(open(os.path.join(TASK_DIR, "docs.jsonl")).readlines()[1])["text"]
    assert len(lm.tok_encode(text)) > 2 * CONTEXT  # three windows or more
    default = lm.loglikelihood_rolling(requests("loglikelihood_rolling", [(text,)]))[0]
    lm.stride = 8
    try:
        sliding = lm.loglikelihood_rolling(requests("loglikelihood_rolling", [(text,)]))[0]
    finally:
        lm.stride = None
    expect = ppl.document_logliks(lm.model, lm.params, [lm.tok_encode(text)], prefix=lm.prefix_token_id,
                                  context=CONTEXT + 1, stride=8)[0]
    assert sliding == pytest.approx(expect, abs=1e-4)
    assert abs(sliding - default) > 1e-2  # more context for each token after the first window


def test_a_bos_adding_tokenizer_encodes_as_the_hf_model_encodes(lms, dirs, tmp_path):
    """With a tokenizer that puts a BOS first (as Llama's does), zoo's tok_encode and the pairs zoo-eval's choice
    scoring encodes are the `hf` model's: the BOS by default, none where the text starts with it or it is refused."""
    import copy
    from tokenizers import processors
    from zoo.data.tokenizers import get_tokenizer
    from zoo.eval.choice import encode_pair
    theirs = transformers.AutoTokenizer.from_pretrained(dirs["llama"])
    theirs.backend_tokenizer.post_processor = processors.TemplateProcessing(
        single="<|endoftext|> $A", special_tokens=[("<|endoftext|>", theirs.eos_token_id)])
    theirs.save_pretrained(tmp_path)
    hf_lm, zoo_lm = (copy.copy(m) for m in lms["llama"])
    hf_lm.tokenizer = transformers.AutoTokenizer.from_pretrained(tmp_path)
    zoo_lm.tok = get_tokenizer(str(tmp_path))
    bos = hf_lm.prefix_token_id
    assert zoo_lm.prefix_token_id == bos and hf_lm.tok_encode("the cat")[0] == bos
    for text in ("the cat sat", "<|endoftext|>the cat", " leading space"):
        for add in (None, False, True):
            assert zoo_lm.tok_encode(text, add_special_tokens=add) == hf_lm.tok_encode(text, add_special_tokens=add)
    for context, continuation in (("the cat", " sat"), ("question: ", "answer")):
        assert encode_pair(zoo_lm.tok, context, continuation, bos) == hf_lm._encode_pair(context, continuation)


def test_registered_beside_the_harness_models(dirs):
    assert get_model("zoo") is harness.ZooLM
    assert get_model("hf").__name__ == "HFLM"  # registering zoo first does not hide the harness's table
    lm = get_model("zoo").create_from_arg_string(f"run={dirs['gpt2']},batch_size=2,max_length=16",
                                                 {"batch_size": None, "device": "cpu"})
    assert (lm.batch_size, lm.max_length, lm.max_gen_toks) == (2, 16, 256)


def test_bad_model_args_are_one_error_line(dirs, capsys):
    with pytest.raises(ConfigError, match=r"unknown model_args key 'pretrained' for --model zoo; valid keys: run, "):
        harness.ZooLM(run=dirs["gpt2"], pretrained="gpt2")
    with pytest.raises(ZooDataError, match=r"run='/nonexistent/run' is neither a zoo run"):
        harness.ZooLM(run="/nonexistent/run")
    with pytest.raises(ConfigError, match="model_args batch_size='many' must be a whole number >= 1"):
        harness.ZooLM(run=dirs["gpt2"], batch_size="many")
    for args, message in ((["run=/nonexistent/run"], "run='/nonexistent/run' is neither a zoo run (no checkpoints/) "
                                                    "nor a Hugging Face checkpoint directory (no config.json)"),
                          ([f"run={dirs['gpt2']}", "dtype=float32"], "unknown model_args key 'dtype' for --model zoo; "
                                                                  "valid keys: run, batch_size, max_length, "
                                                                  "max_gen_toks, stride, add_bos_token, seed")):
        rc = zoo_lm_eval.main(["--model_args", *args, "--tasks", "zoo_choice", "--include_path", TASK_DIR])
        assert (rc, capsys.readouterr().err.strip().splitlines()) == (2, [f"error: {message}"])
