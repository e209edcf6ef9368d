"""An RL-style loop with the user's own phases, as an RL trainer times them.

Each step samples a problem, then: ``generation`` (sample a 'program' from the policy),
``test_generation`` (sample test inputs), ``log_probs`` (score the sample under the
policy), ``execution`` (run the program on the tests: the reward) and ``training`` (a
REINFORCE update). These names are the spans of each ``train.step`` trace, so the slow-step
breakdown such a loop prints by hand ("Generation: 45.2s, Test gen: 12.1s, ...") is the
trace itself. Steps whose generation is empty are skipped (``train.skipped``), as a
hand-written loop does; a reward log every ``--log-every`` steps is monitoring. ``--device``
(auto: the accelerator when present) chooses where the policy runs.

Usage::

    python examples/rl_custom_phases.py --steps 20
    python examples/rl_custom_phases.py --device cpu
"""

from __future__ import annotations

import argparse
import os
import random

import torch
from torch import nn

import otel_train
from otel_train.common.training_device import add_device_argument, device_from_arguments

OPS = ["+1", "-1", "*2", "noop", "<end>"]


class Policy(nn.Module):
    """A tiny recurrent policy over program tokens, conditioned on the problem target."""

    def __init__(self, hidden: int = 32) -> None:
        super().__init__()
        self.embed = nn.Embedding(len(OPS) + 1, hidden)
        self.cond = nn.Linear(1, hidden)
        self.rnn = nn.GRUCell(hidden, hidden)
        self.head = nn.Linear(hidden, len(OPS))

    def logits(self, target: float, tokens: list[int]) -> torch.Tensor:
        """Next-token logits after each prefix of ``tokens`` (teacher forcing)."""
        device = self.head.weight.device
        h = torch.tanh(self.cond(torch.tensor([[target]], device=device)))
        inp = [len(OPS)] + tokens
        out = []
        for tok in inp[:len(tokens) + 1]:
            h = self.rnn(self.embed(torch.tensor([tok], device=device)), h)
            out.append(self.head(h))
        return torch.cat(out)

    @torch.no_grad()
    def sample(self, target: float, max_len: int = 6) -> list[int]:
        """Sample a program (token ids) until ``<end>``."""
        tokens: list[int] = []
        for _ in range(max_len):
            probs = torch.softmax(self.logits(target, tokens)[-1], -1)
            tok = int(torch.multinomial(probs, 1))
            if OPS[tok] == "<end>":
                break
            tokens.append(tok)
        return tokens


def execute(program: list[int], tests: list[int], target: int) -> float:
    """Run the program on each test input; the reward is the share that hit the target."""
    passed = 0
    for x in tests:
        for tok in program:
            op = OPS[tok]
            x = x + 1 if op == "+1" else x - 1 if op == "-1" else x * 2 if op == "*2" else x
        passed += x == target
    return passed / max(1, len(tests))


def main(argv: list[str] | None = None) -> None:
    """Run ``--steps`` generate/execute/update steps."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--log-every", type=int, default=5)
    add_device_argument(parser)
    args = parser.parse_args(argv)
    device = device_from_arguments(parser, args)
    print(f"rl_custom_phases: training on {device.type} (--device {args.device})", flush=True)
    os.environ.setdefault("OTEL_TRAIN_SERVICE_NAME", "rl-discriminator")
    torch.manual_seed(0)
    rng = random.Random(0)
    problems = [{"id": f"p{i}", "start": s, "target": s * 2 + 1} for i, s in enumerate(range(5))]
    policy = Policy().to(device)
    opt = torch.optim.Adam(policy.parameters(), lr=1e-2)
    baseline, rewards, skipped = 0.0, [], 0
    with otel_train.start_run() as run:
        for i in range(args.steps):
            problem = rng.choice(problems)
            with run.step() as step:
                step.set_attribute("rl.problem", problem["id"])
                with step.phase("generation"):
                    program = policy.sample(float(problem["target"]))
                if not program:
                    skipped += 1
                    step.set_attribute("train.skipped", True)
                    continue
                with step.phase("test_generation"):
                    tests = [problem["start"]] + [problem["start"] + rng.choice((0, 0, 1))
                                                  for _ in range(3)]
                with step.phase("log_probs"):
                    logits = policy.logits(float(problem["target"]), program)
                    logp = torch.log_softmax(logits[:len(program)], -1)
                    logp = logp[torch.arange(len(program), device=device),
                                torch.tensor(program, device=device)].sum()
                with step.phase("execution"):
                    reward = execute(program, tests, problem["target"])
                with step.phase("training"):
                    loss = -(reward - baseline) * logp
                    opt.zero_grad()
                    loss.backward()
                    opt.step()
                baseline = 0.9 * baseline + 0.1 * reward
                rewards.append(reward)
                step.set_attribute("rl.reward", reward)
                if i % args.log_every == 0:
                    with step.monitor("reward_log"):
                        print(f"  step {i + 1}/{args.steps} reward {reward:.2f} "
                              f"(problem {problem['id']}, program "
                              f"{[OPS[t] for t in program]})")
        print(f"summary: {len(rewards)} successful steps, {skipped} skipped, "
              f"mean reward {sum(rewards) / max(1, len(rewards)):.2f}")


if __name__ == "__main__":
    main()
