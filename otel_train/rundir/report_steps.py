"""The steps the report's timeline shows, and why each one.

As the first pass over the span files goes, :class:`TimelinePicks` keeps a handful of step
records (the first step, the slowest eval step, the slowest step without monitoring) and a
fixed-size sample of step times whose median is the typical step, so a run of 1M steps costs
the same as one of 300. :func:`choose_timeline` turns them, with the slowest step, into the
list the page shows: one entry per step, sorted by step, each labelled with why it is there
(``first step, warm-up``, ``slowest``, ``eval``, ``typical (median)``, ``slowest without
monitoring``). One step per reason: the eval steps of a run look alike, so one stands for
them; a step with several reasons is shown once with every label.

Usage::

    picks = TimelinePicks(skip_steps=5)
    picks.offer(record, monitored=True)                 # every step of every rank
    choose_timeline(picks, slowest, warmup_step_count=5)  # [(0, ["first step, warm-up"]), ...]
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

# A step without monitoring this much slower than the typical one earns its own timeline;
# closer, it would be a near-duplicate of the typical step.
_DISTINCT_SLOW_FACTOR = 1.5


@dataclass
class StepRecord:
    """One step of one rank: its time, and its phases when kept in detail."""

    rank: int
    step: int
    start_ns: int
    end_ns: int
    slow: bool = False
    # (label, kind, start_ns, end_ns, parent_is_root): label is the phase name, data[loader]
    phases: list[tuple[str, str, int, int, bool]] = field(default_factory=list)

    @property
    def seconds(self) -> float:
        """Wall time of the step."""
        return (self.end_ns - self.start_ns) / 1e9

    def breakdown(self) -> dict[str, float]:
        """Seconds per top-level phase label (monitoring phases included)."""
        out: dict[str, float] = {}
        for label, _kind, s, e, top in self.phases:
            if top:
                out[label] = out.get(label, 0.0) + (e - s) / 1e9
        return out


class TimelinePicks:
    """Candidates for the timeline, kept within fixed bounds during the first pass.

    ``skip_steps``: steps before this index are warm-up, neither typical nor the eval or
    training step shown for contrast (the first step has its own entry).
    """

    def __init__(self, skip_steps: int = 1, sample_size: int = 2001, seed: int = 0) -> None:
        self.skip_steps = skip_steps
        self.first: StepRecord | None = None
        self.first_eval: StepRecord | None = None
        self.slowest_eval: StepRecord | None = None
        self.slowest_training: StepRecord | None = None
        self.sample_size = sample_size
        self._sample: list[tuple[float, int]] = []
        self._offered = 0
        self._rng = random.Random(seed)  # the same run gives the same page

    def offer(self, rec: StepRecord, monitored: bool) -> None:
        """Consider one step of one rank (``monitored``: it ran a monitoring phase)."""
        if self.first is None or rec.step < self.first.step:
            self.first = rec
        steady = rec.step >= self.skip_steps
        if monitored:
            if self.first_eval is None or rec.step < self.first_eval.step:
                self.first_eval = rec
            if steady and (self.slowest_eval is None or rec.seconds > self.slowest_eval.seconds):
                self.slowest_eval = rec
            return
        if not steady:
            return
        if self.slowest_training is None or rec.seconds > self.slowest_training.seconds:
            self.slowest_training = rec
        # Reservoir sampling: every steady step has the same chance to be in the sample.
        self._offered += 1
        if len(self._sample) < self.sample_size:
            self._sample.append((rec.seconds, rec.step))
        else:
            i = self._rng.randrange(self._offered)
            if i < self.sample_size:
                self._sample[i] = (rec.seconds, rec.step)

    def typical(self) -> tuple[int, float] | None:
        """(step, seconds) of the median steady step without monitoring, or None."""
        if not self._sample:
            return None
        ordered = sorted(self._sample)
        seconds, step = ordered[(len(ordered) - 1) // 2]
        return step, seconds


def choose_timeline(picks: TimelinePicks, slowest: list[StepRecord],
                    warmup_step_count: int = 0) -> list[tuple[int, list[str]]]:
    """The steps to show, sorted by step, each with the reasons it is shown."""
    labels: dict[int, list[str]] = {}

    def add(step: int, label: str) -> None:
        labels.setdefault(step, []).append(label)

    if picks.first is not None:
        add(picks.first.step, "first step, warm-up" if warmup_step_count else "first step")
    if slowest:
        add(slowest[0].step, "slowest")
    evaluation = picks.slowest_eval or picks.first_eval
    if evaluation is not None:
        add(evaluation.step, "eval")
    typical = picks.typical()
    if typical is not None:
        add(typical[0], "typical (median)")
    training = picks.slowest_training
    if (training is not None and typical is not None
            and training.seconds > _DISTINCT_SLOW_FACTOR * typical[1]
            and "slowest" not in labels.get(training.step, [])):
        add(training.step, "slowest without monitoring")
    return sorted(labels.items())
