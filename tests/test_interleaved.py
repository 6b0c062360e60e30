"""benchmarks/interleaved.py: the profiles --profile adds, one step of each run and phase (on the CPU here)."""

from __future__ import annotations

import torch
from benchmark_script import imported


def linear_run(bench_model, width: int):
    """A bench_model.TrainingRun of one Linear on the CPU: an AdamW training step and a no-grad forward."""
    model = torch.nn.Linear(width, 3)
    x = torch.randn(4, width)
    opt = torch.optim.AdamW(model.parameters())

    def train_step():
        model(x).square().sum().backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    def infer():
        with torch.no_grad():
            model(x)

    return bench_model.TrainingRun(model, x, train_step, infer, opt)


def test_profiles_are_one_step_of_each_run_and_phase_in_its_mode():
    with imported("interleaved") as interleaved, imported("bench_model") as bench_model:
        runs = {"a": linear_run(bench_model, 5), "b": linear_run(bench_model, 7)}
        got = interleaved.profiles(runs, top=40, device="cpu")
        assert set(got) == {f"{run} {phase}" for run in runs for phase in interleaved.PHASES}
        for run in runs:
            ops = {phase: {op["op"] for op in got[f"{run} {phase}"]["top_ops"]} for phase in interleaved.PHASES}
            # the Linear's weight gradient is an mm in the backward, which only the training step runs
            assert "aten::mm" in ops["train_step"] and "aten::mm" not in ops["infer"]
            assert "aten::addmm" in ops["infer"]
        assert not runs["a"].model.training and not runs["b"].model.training  # each left in its last phase's mode


def test_a_profile_counts_the_steps_copies_by_where_they_were_made():
    """profile_step's copy_callers: each host aten::copy_ under its outermost event and direct caller."""
    target, source = torch.zeros(8), torch.ones(8)

    def step():
        with torch.profiler.record_function("phase_a"):
            target.copy_(source)
            with torch.profiler.record_function("inner"):
                target.copy_(source)
                target.copy_(source)
        target.copy_(source)

    with imported("profile_step") as profile:
        got = profile.profile_step(step, "cpu")["copy_callers"]
    assert got == {"phase_a > inner": 2, "phase_a": 1, "(the step itself)": 1}
