"""Preference tuning (task=dpo) against TRL: zoo's DPO loss and metrics equal those of TRL's `DPOTrainer`
(`compute_loss` in training mode, its own collator and fused log-prob head) to 1e-4, on the same tiny random
Llama policy, the same reference (the policy with noise added, so rewards are non-zero) and the same batch of
pairs of different lengths, for `sigmoid` (DPO), `ipo` (length-normalised) and `robust` (label smoothing 0.2);
and zoo's `sigmoid` with label smoothing 0.2 (cDPO) against the cDPO formula computed from TRL's log-probs
(TRL 1.16's `sigmoid` ignores label_smoothing). Plain-text pairs with a tokenizer that adds a BOS (as Llama's, Mistral's
and Gemma's do): zoo's rows are TRL's ids, BOS first, and its metrics TRL's."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

trl = pytest.importorskip("trl", reason="trl is not installed: the DPO parity test runs TRL's DPOTrainer")
torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from tests.helpers import hf_runs, tiny_lms  # noqa: E402
from zoo import hf  # noqa: E402
from zoo.configuration import PreferenceConfig  # noqa: E402
from zoo.tasks import preference  # noqa: E402

one_torch_thread = hf_runs.one_torch_thread  # autouse: torch on one thread

EOT = tiny_lms.EOT
BETA = 0.1
# (prompt length, chosen length, rejected length) of each pair, the answers' end-of-text excluded
SHAPES = [(3, 5, 2), (7, 2, 6), (4, 8, 8), (5, 1, 4), (2, 6, 3), (6, 3, 1)]


def make_pairs():
    """[(prompt ids, chosen ids, rejected ids)]: random bytes, each answer ending in the end-of-text id."""
    rng = np.random.default_rng(0)
    ids = lambda n: [int(i) for i in rng.integers(0, 256, n)]  # noqa: E731
    return [(ids(p), ids(c) + [EOT], ids(r) + [EOT]) for p, c, r in SHAPES]


def zoo_batch(pairs):
    """zoo's pair batch: rows prompt + answer, right-padded with 0 to the longest row; weight 1 on the targets that
    are answer tokens."""
    L = max(len(p) + max(len(c), len(r)) for p, c, r in pairs)
    ids = np.zeros((len(pairs), 2, L), np.int32)
    mask = np.zeros((len(pairs), 2, L - 1), np.float32)
    for b, (p, c, r) in enumerate(pairs):
        for k, a in enumerate((c, r)):
            ids[b, k, :len(p) + len(a)] = p + a
            mask[b, k, len(p) - 1:len(p) + len(a) - 1] = 1.0  # target t is token t + 1
    return {"inputs": ids[:, :, :-1], "targets": ids[:, :, 1:], "weights": mask,
            "pair_weights": np.ones(len(pairs), np.float32)}


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """(policy dir, reference dir, pairs, zoo batch with the reference's log-probs, zoo's policy params and cfg, zoo's
    reference params)."""
    root = tmp_path_factory.mktemp("dpo_trl")
    policy_dir, ref_dir = str(root / "policy"), str(root / "reference")
    policy = tiny_lms.llama(policy_dir)
    torch.manual_seed(1)
    with torch.no_grad():
        for p in policy.parameters():
            p.add_(0.2 * torch.randn_like(p))
    policy.save_pretrained(ref_dir)  # the reference: the policy with noise added
    pairs = make_pairs()
    batch = {k: jnp.asarray(v) for k, v in zoo_batch(pairs).items()}
    _, params, _, cfg = hf.from_pretrained(policy_dir)
    _, ref_params, _, _ = hf.from_pretrained(ref_dir)
    cfg = dataclasses.replace(cfg, task="dpo", dpo=PreferenceConfig())
    ref_B2 = preference.DpoTask(cfg).logps(ref_params, batch, train=False, rng=jax.random.PRNGKey(0))[0]
    return policy_dir, ref_dir, pairs, dict(batch, ref=ref_B2), params, cfg, ref_params


def byte_tokenizer():
    """A tokenizer for TRL's checks only (the batch is collated from ids): one token a character, id = byte."""
    from tokenizers import Tokenizer, pre_tokenizers
    from tokenizers.models import WordLevel
    vocab = {chr(i): i for i in range(256)} | {"<eot>": EOT}
    tok = Tokenizer(WordLevel(vocab, unk_token="<eot>"))
    tok.pre_tokenizer = pre_tokenizers.Split(pattern="", behavior="isolated")
    return transformers.PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<eot>", pad_token="<eot>")


def trl_loss(models, tmp_path, loss, eps):
    """(TRL's loss, its train metrics, its summed log-probs of the policy and the reference [B, 2])."""
    import datasets
    policy_dir, ref_dir, pairs, batch, _, _, _ = models
    policy = transformers.LlamaForCausalLM.from_pretrained(policy_dir, dtype=torch.float32)
    reference = transformers.LlamaForCausalLM.from_pretrained(ref_dir, dtype=torch.float32)
    args = trl.DPOConfig(output_dir=str(tmp_path), report_to="none", use_cpu=True, bf16=False, fp16=False,
                         beta=BETA, loss_type=loss, label_smoothing=eps, precompute_ref_log_probs=False,
                         max_length=None, per_device_train_batch_size=len(pairs))
    dummy = datasets.Dataset.from_list([{"prompt": "ab", "chosen": "c", "rejected": "d"}])
    trainer = trl.DPOTrainer(model=policy, ref_model=reference, args=args, train_dataset=dummy,
                             processing_class=byte_tokenizer())
    inputs = trainer.data_collator([{"prompt_ids": p, "chosen_ids": c, "rejected_ids": r} for p, c, r in pairs])
    # TRL's rows are [all chosen; all rejected], right-padded with its pad token (the end-of-text here, zoo's 0;
    # after a row's end, under a causal mask, either is never read): the same tokens as zoo's where attended, and
    # the answer tokens marked as zoo marks them
    B = len(pairs)
    flat = lambda x: np.concatenate([np.asarray(x)[:, 0], np.asarray(x)[:, 1]])  # noqa: E731  [B, 2, T] -> [2B, T]
    zoo_rows = np.concatenate([flat(batch["inputs"]), flat(batch["targets"])[:, -1:]], axis=1)
    lengths = [len(p) + len(c) for p, c, _ in pairs] + [len(p) + len(r) for p, _, r in pairs]
    attended = inputs["attention_mask"].numpy()
    assert inputs["input_ids"].shape == zoo_rows.shape and attended.sum(1).tolist() == lengths
    np.testing.assert_array_equal(np.where(attended == 1, inputs["input_ids"].numpy(), 0), zoo_rows)
    np.testing.assert_array_equal(inputs["completion_mask"].numpy()[:, 1:], flat(batch["weights"]))
    policy.train()  # TRL logs under "train" in training mode
    value = trainer.compute_loss(trainer.model, inputs).item()
    with torch.no_grad():  # the summed log-probs as _compute_loss takes them
        labels = inputs["input_ids"].masked_fill(inputs["completion_mask"] == 0, -100)
        kw = dict(input_ids=inputs["input_ids"], attention_mask=inputs["attention_mask"], labels=labels,
                  fused_lm_head=True)
        pi = trainer.model(**kw).log_probs.sum(1).reshape(2, B).T
        ref = trainer.ref_model(**kw).log_probs.sum(1).reshape(2, B).T
    metrics = {k: v[-1] for k, v in trainer._metrics["train"].items()}
    return value, metrics, pi.double(), ref.double()


def zoo_loss(models, loss, eps):
    """(zoo's loss, its train metrics, its summed log-probs of the policy [B, 2]) of the batch."""
    _, _, _, batch, params, cfg, _ = models
    cfg = dataclasses.replace(cfg, dpo=PreferenceConfig(loss=loss, beta=BETA, label_smoothing=eps))
    task = preference.DpoTask(cfg)
    loss_sum, aux = task.loss(params, batch, jax.random.PRNGKey(0), False)
    totals = {k: float(v) for k, v in aux.items()}
    pi = task.logps(params, batch, train=False, rng=jax.random.PRNGKey(0))[0]
    # TRL averages the loss over the pairs; zoo sums it weighted by pair_weights (all 1 here)
    return float(loss_sum) / totals["weight"], task.train_metrics(totals), np.asarray(pi, np.float64)


@pytest.mark.parametrize("loss,eps", [("sigmoid", 0.0), ("ipo", 0.0), ("robust", 0.2)])
def test_loss_and_metrics_equal_trl(models, tmp_path, loss, eps):
    theirs, their_metrics, their_pi, _ = trl_loss(models, tmp_path, loss, eps)
    ours, our_metrics, our_pi = zoo_loss(models, loss, eps)
    np.testing.assert_allclose(our_pi, their_pi.numpy(), rtol=1e-5, atol=1e-4)
    diffs = {"loss": abs(ours - theirs)} | {k: abs(our_metrics[k] - their_metrics[k]) for k in preference.METRICS}
    # absolute, or relative for the summed log-probs (about -30)
    assert all(d <= 1e-4 * max(1.0, abs(their_metrics[k]) if k.startswith("logps/") else 1.0)
               for k, d in diffs.items()), diffs
    # the test can fail: the policy and the reference differ, so the rewards and the loss are far from 0 and ln 2
    assert min(abs(our_metrics["rewards/chosen"]), abs(our_metrics["rewards/margins"])) > 0.1, our_metrics
    assert 0 < our_metrics["rewards/accuracies"] < 1 and abs(ours - float(np.log(2))) > 0.1, (ours, our_metrics)


def test_sigmoid_label_smoothing_is_cdpo(models, tmp_path):
    """cDPO: -(1 - eps) log sigmoid(beta d) - eps log sigmoid(-beta d), d from TRL's log-probs. TRL 1.16 dropped the
    smoothing from its `sigmoid` loss (label_smoothing only reaches robust, exo_pair and the aot losses), so its
    trainer's loss cannot be the reference here: the formula is, on TRL's own log-probs."""
    eps = 0.2
    _, _, pi, ref = trl_loss(models, tmp_path, "sigmoid", 0.0)
    d = (pi[:, 0] - ref[:, 0]) - (pi[:, 1] - ref[:, 1])
    F = torch.nn.functional
    expect = (-(1 - eps) * F.logsigmoid(BETA * d) - eps * F.logsigmoid(-BETA * d)).mean().item()
    ours, _, _ = zoo_loss(models, "sigmoid", eps)
    plain, _, _ = zoo_loss(models, "sigmoid", 0.0)
    assert abs(ours - expect) < 1e-4, (ours, expect)
    assert abs(ours - plain) > 0.05, (ours, plain)  # the smoothing moves the loss


# Plain-text pairs (TRL's standard format) through each side's own tokenization, with a tokenizer that puts a BOS
# first as Llama's does: TRL tokenizes `tokenizer(prompt + chosen + eos_token)`, zoo zoo.tasks.preference.encode_pairs.
PLAIN = [{"prompt": "The cat", "chosen": " sat on the mat.", "rejected": " ran"},
         {"prompt": "Two and two make", "chosen": " four", "rejected": " five, or six!"},
         {"prompt": "Hi", "chosen": " there", "rejected": " you all"}]
BOS = 257


def bos_tokenizer_dir(path) -> str:
    """byte_tokenizer's vocabulary plus a BOS (id 257) that its post-processor puts before every text, as the
    tokenizers of Llama 2/3, Mistral and Gemma do, saved as a Hugging Face tokenizer directory."""
    from tokenizers import Tokenizer, pre_tokenizers, processors
    from tokenizers.models import WordLevel
    tok = Tokenizer(WordLevel({chr(i): i for i in range(256)} | {"<eot>": EOT, "<s>": BOS}, unk_token="<eot>"))
    tok.pre_tokenizer = pre_tokenizers.Split(pattern="", behavior="isolated")
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", BOS)])
    transformers.PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="<eot>",
                                         pad_token="<eot>").save_pretrained(path)
    return str(path)


def test_plain_text_pairs_start_with_the_bos_as_trls_and_give_its_logps(models, tmp_path):
    import datasets
    import json
    from zoo.configuration import DataConfig
    from zoo.data.tokenizers import get_tokenizer
    policy_dir, ref_dir, _, _, params, cfg, ref_params = models
    tok_dir = bos_tokenizer_dir(tmp_path / "tok")
    theirs_tok = transformers.AutoTokenizer.from_pretrained(tok_dir)
    assert theirs_tok("ab")["input_ids"] == [BOS, 97, 98]  # the reference adds a BOS to plain text
    args = trl.DPOConfig(output_dir=str(tmp_path / "trl"), report_to="none", use_cpu=True, bf16=False, fp16=False,
                         beta=BETA, precompute_ref_log_probs=False, max_length=None, per_device_train_batch_size=3)
    trainer = trl.DPOTrainer(model=transformers.LlamaForCausalLM.from_pretrained(policy_dir, dtype=torch.float32),
                             ref_model=transformers.LlamaForCausalLM.from_pretrained(ref_dir, dtype=torch.float32),
                             args=args, train_dataset=datasets.Dataset.from_list(PLAIN), processing_class=theirs_tok)
    rows = list(trainer.train_dataset)
    trainer.model.train()
    trainer.compute_loss(trainer.model, trainer.data_collator(rows))
    their = {k: v[-1] for k, v in trainer._metrics["train"].items()}

    source = tmp_path / "pairs.jsonl"
    source.write_text("".join(json.dumps(r) + "\n" for r in PLAIN))
    dcfg = DataConfig(source=str(source), tokenizer=tok_dir, seq_len=32)
    pairs, _, _ = preference.encode_pairs(dcfg, get_tokenizer(tok_dir), "")
    for b, r in enumerate(rows):  # the same ids: BOS, prompt, answer, end-of-text
        for k, answer in enumerate(("chosen_ids", "rejected_ids")):
            want = r["prompt_ids"] + r[answer]
            assert want[0] == BOS and pairs.ids[b, k, :len(want)].tolist() == want
            assert pairs.mask[b, k].sum() == len(r[answer])
    batch = {k: jnp.asarray(v) for k, v in pairs.rows(np.arange(len(PLAIN))).items()}
    cfg = dataclasses.replace(cfg, task="dpo", dpo=PreferenceConfig(beta=BETA))
    task = preference.DpoTask(cfg)
    batch["ref"] = task.logps(ref_params, batch, train=False, rng=jax.random.PRNGKey(0))[0]
    _, aux = task.loss(params, batch, jax.random.PRNGKey(0), False)
    ours = task.train_metrics({k: float(v) for k, v in aux.items()})
    print({k: (ours[k], their[k]) for k in ("logps/chosen", "logps/rejected", "rewards/margins")})
    for k in preference.METRICS:
        assert abs(ours[k] - their[k]) <= 1e-4 * max(1.0, abs(their[k])), (k, ours[k], their[k])
