"""What an RL or preference run's own figures say when it goes wrong, watched on the host at each logged step as
zoo.training.guard watches the loss. Their loss says little (GRPO's is near 0 whatever happens; DPO's falls while the
answers get worse), so a run that went wrong ended normally: GRPO at lr 5e-4 on 2 prompts x 4 rose from reward
1.375 to 2.0 by step 4, then fell to 0.875 and 0.0, its KL to the base 0.15 -> 5.07 -> 9.95 nats a token, every
completion at the length cap, a model answering 'free free free.' to everything; DPO on a set already preferred
10/10 pushed the chosen answers down with the rejected ones (logps/chosen -3.5 -> -7.3 nats).

A task names what is watched (its WATCH: "reward" for zoo.tasks.rl, "preference" for zoo.tasks.preference); the
trainer makes the watch (`of`), hands it each logged record (`check`) and, at the end, lets it name what it kept
(`finish`). A warning is one line on stderr naming the metric, its values and what to try, said once a run; the
run goes on (these are symptoms, not NaNs: a user may see them and still want the run).

Reward: the checkpoint of step k holds the params that sampled the rollout of step k + 1 (as zoo.training.guard's
losses), so a checkpoint's reward is that of the record covering step k + 1. The saved step with the best one so far
is kept whatever `train.keep` rotates out (zoo.training.checkpoint_manager.KeepLatestAndGood.best, beside the guard's
last good step) and named at the end with its path.
"""

from __future__ import annotations

import sys

from zoo.training.checkpoint_manager import mark_best, step_dir

# A collapse: the mean reward, after rising above where it started, falls below where it started and below
# REWARD_FALL x its best (or, rewards at or under 0, below the start by more than the whole rise again) for
# SUSTAINED logged records running. Calm runs rise unevenly (the shipped GRPO config: 0.12 0.38 0.93 1.05 1.11 1.23
# by 5-step means) and dip by less; the user's run fell from 2.0 to 0.875, then 0.0, under its 1.375 start.
REWARD_FALL = 0.5
# KL to the reference per completion token: GRPO's beta (0.04, TRL's and DeepSeekMath's) keeps a healthy run
# around 0.01-0.1; above 1 nat a token the policy's answers are ones the base would almost never give (the user's:
# 5.07, then 9.95).
KL_MAX = 1.0
# The share of completions that reached grpo.max_completion_tokens without ending: a policy that forgot how to stop
# (repeating 'free free free') has all of them there. Warned only when the share rose to it: a run that starts
# there has a cap too short for its answers, not a collapse.
CAP_SHARE = 0.9
# DPO: the chosen answers' summed log-probability this many nats under where it started, and by more than
# CHOSEN_SHARE of its starting size, while the margin rose: both answers pushed down, the chosen less (the user's:
# -3.5 -> -7.3, more than doubled); greedy answers get worse although accuracy holds. A healthy run lowers the
# chosen answers' summed log-probability a little too (a 100-token answer losing 0.02 nats a token is 2 nats): the
# share keeps long answers from being warned of for that.
CHOSEN_DROP = 2.0
CHOSEN_SHARE = 0.5
SUSTAINED = 2  # logged records in a row a condition must hold before it is said (one noisy batch is not a trend)


def of(task, main: bool = True):
    """The watch `task` names (its WATCH), or one that watches nothing."""
    kind = getattr(task, "WATCH", None)
    return {"reward": RewardWatch, "preference": PreferenceWatch}.get(kind, Watch)(main)


class Watch:
    """Watches nothing: the base of the two below (warnings said once a run, on stderr, by process 0)."""

    def __init__(self, main: bool = True):
        self.main, self.said, self.runs = main, {}, {}

    def check(self, step: int, record: dict, mngr=None) -> list[str]:
        """The warnings newly said at logged step `step` (its record: the task's train_metrics)."""
        return []

    def finish(self, mngr, workdir: str, say=print) -> None:
        """At the end of the run: name what was kept."""

    def _held(self, name: str, holds: bool) -> bool:
        """Whether condition `name` has now held for SUSTAINED records running."""
        self.runs[name] = self.runs.get(name, 0) + 1 if holds else 0
        return self.runs[name] >= SUSTAINED

    def _say(self, name: str, line: str, out: list) -> None:
        if name in self.said:
            return
        self.said[name] = line
        out.append(line)
        if self.main:
            print(line, file=sys.stderr, flush=True)


def _values(xs: list[float]) -> str:
    """A metric's course in a few values: the first, up to 3 middle ones, the last."""
    show = xs if len(xs) <= 5 else [xs[0], *xs[1:-1][-3:], xs[-1]]
    return " -> ".join(f"{x:.4g}" for x in show)


class RewardWatch(Watch):
    """GRPO's reward, KL and completion length (the module's docstring); the best reward's step kept."""

    def __init__(self, main: bool = True):
        super().__init__(main)
        self.spans: list[tuple[int, int, float]] = []  # (first step, last step, mean reward) of each record
        self.rewards: list[float] = []
        self.kls: list[float] = []
        self.capped: list[float] = []
        self.best_record = None  # (step, reward) of the record with the best reward

    def check(self, step: int, record: dict, mngr=None) -> list[str]:
        if "reward" not in record:
            return []
        out, r = [], float(record["reward"])
        self.spans.append((self.spans[-1][1] + 1 if self.spans else step, step, r))
        self.rewards.append(r)
        start, best = self.rewards[0], max(self.rewards)
        if self.best_record is None or r > self.best_record[1]:
            self.best_record = (step, r)
        fell = best > start and r < start and (r < REWARD_FALL * best if best > 0 else best - r > 2 * (best - start))
        if self._held("reward", fell):
            self._say("reward", f"warning: step {step}: the mean reward collapsed from its best {best:.4g} (step "
                                f"{self.best_record[0]}) to {r:.4g}, under its start {start:.4g} "
                                f"(reward {_values(self.rewards)}): the policy is unlearning; try a lower optim.lr, "
                                f"a higher grpo.beta (a LoRA run), or more completions (grpo.num_generations)", out)
        if "kl" in record:
            self.kls.append(float(record["kl"]))
            if self._held("kl", self.kls[-1] > KL_MAX):
                self._say("kl", f"warning: step {step}: the KL to the reference is {self.kls[-1]:.3g} nats a "
                                f"completion token, over {KL_MAX:g} for {SUSTAINED} logged steps (kl "
                                f"{_values(self.kls)}): the policy left its base far behind; try a lower optim.lr or "
                                f"a higher grpo.beta", out)
        if "completions/clipped_ratio" in record:
            self.capped.append(float(record["completions/clipped_ratio"]))
            if self._held("cap", self.capped[0] < CAP_SHARE <= self.capped[-1]):
                self._say("cap", f"warning: step {step}: {self.capped[-1]:.0%} of the completions reached "
                                 f"grpo.max_completion_tokens without ending (at the start {self.capped[0]:.0%}; "
                                 f"completions/clipped_ratio {_values(self.capped)}): the policy no longer stops, "
                                 f"often a collapse into repetition; try a lower optim.lr or a higher grpo.beta", out)
        if mngr is not None:
            self.keep_best(mngr)
        return out

    def reward_of(self, k: int) -> float | None:
        """The reward sampled by checkpoint k's params: that of the record covering step k + 1."""
        for lo, hi, r in self.spans:
            if lo <= k + 1 <= hi:
                return r
        return None

    def keep_best(self, mngr) -> None:
        """Mark (protect from rotation) the saved step with the best reward so far, this process's or before a
        resume's (the policy's best_value)."""
        policy = mngr.zoo_policy
        if policy is None:
            return
        best = (policy.best, policy.best_value) if policy.best is not None else None
        for k in sorted(mngr.all_steps()):
            r = self.reward_of(k)
            if r is not None and (best is None or r >= best[1]):  # ties: the later, more trained step
                best = (k, r)
        if best is not None:
            mark_best(mngr, *best)

    def finish(self, mngr, workdir: str, say=print) -> None:
        """One line naming the best reward's checkpoint (a warning, on stderr, when the reward collapsed)."""
        policy = mngr.zoo_policy
        if policy is None or policy.best is None or not self.rewards or not self.main:
            return
        k, r = policy.best, policy.best_value
        line = (f"best training reward {r:.4g} (the last {self.rewards[-1]:.4g}) was sampled from the params of step "
                f"{k}: {step_dir(workdir, k)}, kept whatever train.keep rotates out; go on from it with --resume "
                f"{workdir} --step {k}")
        if "reward" in self.said:
            print(f"warning: the mean reward collapsed; {line}", file=sys.stderr, flush=True)
        else:
            say(line)


class PreferenceWatch(Watch):
    """DPO's chosen log-probability against its margin (the module's docstring)."""

    def __init__(self, main: bool = True):
        super().__init__(main)
        self.chosen: list[float] = []
        self.margins: list[float] = []

    def check(self, step: int, record: dict, mngr=None) -> list[str]:
        if "logps/chosen" not in record or "rewards/margins" not in record:
            return []
        out = []
        self.chosen.append(float(record["logps/chosen"]))
        self.margins.append(float(record["rewards/margins"]))
        c0, c, m0, m = self.chosen[0], self.chosen[-1], self.margins[0], self.margins[-1]
        if self._held("chosen", c < c0 - max(CHOSEN_DROP, CHOSEN_SHARE * abs(c0)) and m > m0):
            self._say("chosen", f"warning: step {step}: the chosen answers' log-probability fell {c0 - c:.3g} nats "
                                f"({_values(self.chosen)}) while the margin rose ({m0:.3g} -> {m:.3g}): DPO is pushing "
                                f"the chosen answers down with the rejected ones, and greedy answers get worse; try a "
                                f"lower optim.lr, a higher dpo.beta or fewer train.steps", out)
        return out
