"""Reinforcement learning from rewards (task=grpo) against TRL: zoo's GRPO advantages, loss and metrics equal those
of TRL's `GRPOTrainer` to 1e-4 on the same tiny random Llama and the same fixed batch (no sampling): 2 prompts x
G=4 completions of different lengths, some ending with the end-of-text id, some cut at max_completion_tokens, one
of them empty but for its end-of-text.

zoo's policy is the Llama with random non-zero LoRA adapters, its reference the same params with the adapters off
(zoo.nn.lora.adapters_off); TRL's policy is zoo's merged weights exported as a transformers directory
(zoo.hf.convert.export), its reference the base Llama. TRL runs its own code end to end: the fixed completions come in
through its `rollout_func` hook, so `_generate_and_score_completions` pads them, scores them (a reward function
that reads each row's fixed reward), normalises the rewards within each group and computes the reference's
log-probs (logging reward, reward_std, frac_reward_zero_std and rewards/NAME/mean); `_compute_loss` (training mode,
num_iterations=1: old_per_token_logps None) then gives the loss and logs kl and clip_ratio. Compared, for zoo's
bnpo, grpo and dr_grpo (and bnpo against TRL's default dapo, which is bnpo on one process): `group_advantages`
vs TRL's advantages, `GrpoTask.loss` (loss_sum / aux["weight"]) vs TRL's loss, `GrpoTask.train_metrics`' kl,
clip_ratio and reward figures (rl.reward_sums) vs TRL's, and the per-token log-probs of the policy and the
reference that the losses take. With one step per sample the ratio is 1, so
clip_ratio is 0 on both sides. Both take the loss's log-probabilities at the sampling temperature (the logits
divided by it): compared at 1 (both defaults) and at 0.7."""

import dataclasses

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

trl = pytest.importorskip("trl", reason="trl is not installed: the GRPO parity test runs TRL's GRPOTrainer")
torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from tests.helpers import hf_runs, tiny_lms  # noqa: E402
from zoo import hf, tasks  # noqa: E402
from zoo.configuration import RlConfig  # noqa: E402
from zoo.hf.convert import export  # noqa: E402
from zoo.nn import lora  # noqa: E402
from zoo.tasks import rl  # noqa: E402
from zoo.training import freeze  # noqa: E402

one_torch_thread = hf_runs.one_torch_thread  # autouse: torch on one thread

EOT = tiny_lms.EOT
G, M = 4, 6  # completions per prompt, max_completion_tokens
BETA, EPSILON = 0.04, 0.2
PROMPTS = [3, 5]  # the prompts' lengths
# each completion: (its length, the end-of-text excluded; whether it ended): lengths M are cut at M
COMPLETIONS = [[(2, True), (M, False), (4, True), (0, True)],
               [(M - 1, True), (1, True), (M, False), (3, True)]]
REWARDS = np.asarray([1.0, 0.0, 0.5, 2.0, 0.3, -1.0, 0.3, 1.2], np.float32)


def make_rows():
    """[(prompt ids, completion ids as TRL gets them: the end-of-text included where the completion ended)]."""
    rng = np.random.default_rng(0)
    ids = lambda n: [int(i) for i in rng.integers(0, 256, n)]  # noqa: E731
    rows = []
    for p, group in zip(PROMPTS, COMPLETIONS):
        prompt = ids(p)
        rows += [(prompt, ids(n) + ([EOT] if ended else [])) for n, ended in group]
    return rows


def zoo_batch(rows):
    """zoo's GRPO batch as GrpoTask.rollout builds it: rows prompt + completion (+ its end), right-padded with 0 to
    the rollout's length (the longest prompt's power-of-two bucket + M); weight 1 on the completion's targets."""
    T = (1 << (max(PROMPTS) - 1).bit_length()) + M
    inputs, targets = np.zeros((len(rows), T), np.int32), np.zeros((len(rows), T), np.int32)
    weights = np.zeros((len(rows), T), np.float32)
    for r, (p, c) in enumerate(rows):
        seq = p + c
        n = len(seq) - 1
        inputs[r, :n], targets[r, :n] = seq[:-1], seq[1:]
        weights[r, len(p) - 1:n] = 1.0
    return {"inputs": inputs, "targets": targets, "weights": weights, "advantages": rl.group_advantages(REWARDS, G)}


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """(base dir, policy dir: the merged weights, rows, zoo's LoRA params, zoo's cfg)."""
    root = tmp_path_factory.mktemp("grpo_trl")
    base_dir, policy_dir = str(root / "base"), str(root / "policy")
    tiny_lms.llama(base_dir)
    _, base_params, _, cfg = hf.from_pretrained(base_dir)
    cfg = dataclasses.replace(cfg, task="grpo", model=dataclasses.replace(cfg.model, lora_rank=4, lora_alpha=8.0),
                              grpo=RlConfig(num_generations=G, max_completion_tokens=M, beta=BETA, epsilon=EPSILON))
    spec = cfg.model.lora_spec
    # the adapters: A as initialised, B random (not zero), on the converted base
    init = freeze.flat(nn.unbox(tasks.build(cfg).init(jax.random.PRNGKey(0))))
    base_flat = freeze.flat(base_params)
    assert set(base_flat) == {k for k in init if not lora.is_adapter(k)}
    keys = iter(jax.random.split(jax.random.PRNGKey(1), len(init)))
    params = {k: base_flat[k] if k in base_flat else
              v if k.endswith("lora_a") else 0.3 * jax.random.normal(next(keys), v.shape, v.dtype)
              for k, v in init.items()}
    params = freeze.unflat(params)
    plain = dataclasses.replace(cfg, task="gpt_lm", model=dataclasses.replace(cfg.model, lora_rank=0))
    export(plain, lora.merge(params, spec), policy_dir, verbose=False)
    return base_dir, policy_dir, make_rows(), params, cfg


def byte_tokenizer():
    """A tokenizer for TRL's checks and its decoding of the completions (the batch is ids): one token a character,
    id = byte, the end-of-text its pad token."""
    from tokenizers import Tokenizer, pre_tokenizers
    from tokenizers.models import WordLevel
    vocab = {chr(i): i for i in range(256)} | {"<eot>": EOT}
    tok = Tokenizer(WordLevel(vocab, unk_token="<eot>"))
    tok.pre_tokenizer = pre_tokenizers.Split(pattern="", behavior="isolated")
    return transformers.PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<eot>", pad_token="<eot>")


def fixed_reward(prompts, completions, reward, **kwargs):
    """Each row's reward: the `reward` column of TRL's inputs."""
    return list(reward)


def trl_run(models, tmp_path, loss_type, monkeypatch, temperature=1.0):
    """(TRL's advantages, its loss, its train metrics) of the fixed batch."""
    import datasets
    base_dir, policy_dir, rows, _, _ = models
    monkeypatch.setenv("TRL_EXPERIMENTAL_SILENCE", "1")  # rollout_func: "experimental"

    def rollout(prompts, trainer):  # the fixed completions instead of sampled ones; no sampler log-probs
        assert len(prompts) == len(rows)
        return {"prompt_ids": [p for p, _ in rows], "completion_ids": [c for _, c in rows], "logprobs": None}

    policy = transformers.AutoModelForCausalLM.from_pretrained(policy_dir, dtype=torch.float32)
    base = transformers.AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32)
    args = trl.GRPOConfig(output_dir=str(tmp_path), report_to="none", use_cpu=True, bf16=False, fp16=False,
                          num_generations=G, max_completion_length=M, per_device_train_batch_size=len(rows),
                          beta=BETA, epsilon=EPSILON, loss_type=loss_type, temperature=temperature, num_iterations=1,
                          scale_rewards="group")
    dummy = datasets.Dataset.from_list([{"prompt": "ab"}])
    trainer = trl.GRPOTrainer(model=policy, reward_funcs=fixed_reward, args=args, train_dataset=dummy,
                              processing_class=byte_tokenizer(), rollout_func=rollout)
    # TRL built its reference from the policy's directory (a policy instance, beta > 0): the base's weights instead
    trainer.ref_model.load_state_dict(base.state_dict())
    trainer.model.train()  # training mode: TRL logs under "train"
    trainer.current_gradient_accumulation_steps = 1  # what the training loop sets: one micro-batch a step
    inputs = [{"prompt": f"prompt {r // G}", "reward": float(REWARDS[r])} for r in range(len(rows))]
    with torch.no_grad():
        scored = trainer._generate_and_score_completions(inputs)
        assert scored.get("old_per_token_logps") is None and "ref_per_token_logps" in scored
        # TRL's rows: the prompt left-padded, the completion right-padded, as the rows are
        assert scored["completion_mask"].sum(1).tolist() == [len(c) for _, c in rows]
        assert scored["prompt_mask"].sum(1).tolist() == [len(p) for p, _ in rows]
        loss = trainer._compute_loss(trainer.model, scored).item()
        # the per-token log-probs _compute_loss takes (the policy's recomputed as it does), on the completions
        ids = torch.cat([scored["prompt_ids"], scored["completion_ids"]], 1)
        attended = torch.cat([scored["prompt_mask"], scored["completion_mask"]], 1)
        pi = trainer._get_per_token_logps_and_entropies(trainer.model, ids, attended, M)[0]
    metrics = {k: v[-1] for k, v in trainer._metrics["train"].items()}
    mask = scored["completion_mask"].bool().numpy()
    logps = {"policy": pi.double().numpy()[mask], "reference": scored["ref_per_token_logps"].double().numpy()[mask]}
    return scored["advantages"].double().numpy(), loss, metrics, logps


def zoo_run(models, loss_type, temperature=1.0):
    """(zoo's advantages, its loss as TRL reports it, its train metrics, the per-token log-probs of its policy and
    its reference on the completion's targets, row by row) of the same batch."""
    _, _, rows, params, cfg = models
    cfg = dataclasses.replace(cfg, grpo=dataclasses.replace(cfg.grpo, loss_type=loss_type, temperature=temperature))
    task = tasks.build(cfg)  # GrpoTask with the adapters
    batch = {k: jnp.asarray(v) for k, v in zoo_batch(rows).items()}
    rng = jax.random.PRNGKey(0)
    loss_sum, aux = task.loss(params, batch, rng, True)
    totals = {k: float(v) for k, v in aux.items()}
    totals.update(rl.reward_sums(REWARDS, REWARDS[:, None], ["fixed_reward"], G))  # what the rollout adds
    with lora.intercept(task.spec, True):  # as task.loss runs the policy, and its reference (the adapters off)
        pi = task.inner.token_logps(params, batch, True, rng)[0]
        with lora.adapters_off():
            ref = task.inner.token_logps(params, batch, False, rng)[0]
    mask = np.asarray(batch["weights"]) > 0
    logps = {"policy": np.asarray(pi, np.float64)[mask], "reference": np.asarray(ref, np.float64)[mask]}
    return (np.asarray(batch["advantages"], np.float64), float(loss_sum) / totals["weight"],
            task.train_metrics(totals), logps)


@pytest.mark.parametrize("zoo_loss,trl_loss,temperature", [("bnpo", "bnpo", 1.0), ("grpo", "grpo", 1.0),
                                                           ("dr_grpo", "dr_grpo", 1.0), ("bnpo", "dapo", 1.0),
                                                           ("bnpo", "bnpo", 0.7)])
def test_advantages_loss_and_metrics_equal_trl(models, tmp_path, monkeypatch, zoo_loss, trl_loss, temperature):
    their_adv, theirs, their_metrics, their_logps = trl_run(models, tmp_path, trl_loss, monkeypatch, temperature)
    our_adv, ours, our_metrics, our_logps = zoo_run(models, zoo_loss, temperature)
    np.testing.assert_allclose(our_adv, their_adv, rtol=0, atol=1e-4)
    for k in ("policy", "reference"):  # the completion tokens in the same order: rows, then positions
        np.testing.assert_allclose(our_logps[k], their_logps[k], rtol=0, atol=1e-4, err_msg=k)
    diffs = {"loss": abs(ours - theirs), "kl": abs(our_metrics["kl"] - their_metrics["kl"]),
             "clip_ratio": abs(our_metrics["clip_ratio"] - their_metrics["clip_ratio/region_mean"]),
             **{k: abs(our_metrics[k] - their_metrics[k]) for k in ("reward", "reward_std", "frac_reward_zero_std")},
             "rewards/NAME": abs(our_metrics["rewards/fixed_reward"] - their_metrics["rewards/fixed_reward/mean"])}
    assert max(diffs.values()) <= 1e-4, (diffs, ours, theirs, our_metrics["kl"], their_metrics["kl"])
    # the test can fail: the adapters move the policy from its reference, every group's rewards differ
    assert our_metrics["kl"] > 1e-2, our_metrics
    assert np.abs(our_adv).min() > 0.1, our_adv


def test_the_averagings_differ(models):
    """The three loss types give different losses on this batch (so each comparison above tells them apart)."""
    losses = {t: zoo_run(models, t)[1] for t in ("bnpo", "grpo", "dr_grpo")}
    values = sorted(losses.values())
    assert min(b - a for a, b in zip(values, values[1:])) > 1e-2, losses
