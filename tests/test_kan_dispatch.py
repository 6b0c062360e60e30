"""The KAN path choice (kernels/kan_dispatch.py) with plain torch stand-ins for the paths, on the CPU."""

from __future__ import annotations

import time

import pytest
import torch

from lkat_lens.kernels import kan_dispatch


class Paths:
    """Stand-in layer paths y = x W^T: exact, wrong, failing, slow; records the rows each path saw."""

    def __init__(self) -> None:
        self.rows: dict[str, list[int]] = {}

    def __call__(self, path: str, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        self.rows.setdefault(path, []).append(x.numel() // x.shape[-1])
        if path == "broken":
            raise RuntimeError("no kernel image for this device")
        if path == "slow":
            time.sleep(0.02)
        y = x @ weight.T
        return 1.1 * y if path == "wrong" else y


@pytest.fixture(autouse=True)
def fresh_cache():
    kan_dispatch.clear_choices()
    yield
    kan_dispatch.clear_choices()


def inputs(rows: int, train: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    x = torch.randn(rows, 8, requires_grad=train)
    return x, torch.randn(4, 8, requires_grad=train)


def test_fastest_correct_path_is_chosen_once_and_cached():
    paths = Paths()
    with pytest.warns(Warning) as caught:
        chosen = kan_dispatch.choose_path("k", ["torch", "wrong", "broken", "slow", "good"], paths, inputs(64), "slow")
    assert chosen == "good"
    assert {str(w.message).split(" ")[2] for w in caught} == {"'wrong'", "'broken'"}
    calls = sum(map(len, paths.rows.values()))
    assert kan_dispatch.choose_path("k", ["good"], paths, inputs(64), "slow") == "good"
    assert sum(map(len, paths.rows.values())) == calls and kan_dispatch.cached_choices() == {"k": "good"}


def test_torch_checks_only_a_row_slice_and_is_never_timed():
    """The torch reference never sees more than CHECK_ROWS rows; kernel paths are timed at full size."""
    paths = Paths()
    rows = kan_dispatch.CHECK_ROWS * 3
    assert kan_dispatch.choose_path("big", ["torch", "good", "slow"], paths, inputs(rows), "slow") == "good"
    assert max(paths.rows["torch"]) == kan_dispatch.CHECK_ROWS
    assert max(paths.rows["good"]) == rows and max(paths.rows["slow"]) == rows


def test_torch_when_no_path_is_correct_and_the_only_passing_path_untimed():
    paths = Paths()
    with pytest.warns(Warning):
        assert kan_dispatch.choose_path("none", ["wrong", "broken"], paths, inputs(32), "wrong") == "torch"
    assert kan_dispatch.choose_path("one", ["good"], paths, inputs(32, train=False), "good") == "good"
    assert max(paths.rows["good"]) == 32 and len(paths.rows["good"]) == 1  # checked on the slice, not timed


def test_gradients_of_every_input_are_compared():
    """A path whose weight gradient is wrong (output and dx right) is not taken."""

    def run(path: str, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        if path == "bad-dw":
            return x @ (weight.detach() + 0 * weight).T  # dW = 0
        return x @ weight.T

    with pytest.warns(Warning, match="differs from torch"):
        assert kan_dispatch.choose_path("dw", ["bad-dw"], run, inputs(16), "bad-dw") == "torch"


def test_a_one_off_stall_does_not_decide_the_choice():
    """A path that stalls once while timed (a first launch's compile, another process on the GPU) still wins when it
    is the faster path in every other round: 2 ms a call against 0, with one 60 ms stall."""
    calls = {"torch": 0, "steady": 0, "stalls": 0}

    def run(path: str, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        calls[path] += 1
        if path == "steady":
            time.sleep(0.002)
        elif path == "stalls" and calls[path] == 5:  # after the check and two untimed calls: in the first timed round
            time.sleep(0.06)
        return x @ weight.T

    assert kan_dispatch.choose_path("stall", ["stalls", "steady"], run, inputs(64, train=False), "steady") == "stalls"


def test_a_span_checks_the_paths_away_from_the_batchs_rows():
    """A path that is right at x = 0 only passes a check on a batch of zeros (LKAT's fc2 inputs at initialisation);
    with a span the check draws its rows over it and refuses that path; the right one is still taken."""

    def run(path: str, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        return (x.clamp(-0.1, 0.1) if path == "right-at-zero" else x) @ weight.T

    x, weight = inputs(64)
    zeros = (torch.zeros_like(x).requires_grad_(), weight)
    assert kan_dispatch.choose_path("zeros", ["right-at-zero"], run, zeros, "torch") == "right-at-zero"
    with pytest.warns(Warning, match="differs from torch"):
        chosen = kan_dispatch.choose_path("span", ["right-at-zero"], run, zeros, "torch", span=(-3.0, 3.0))
    assert chosen == "torch"
    assert kan_dispatch.choose_path("span-good", ["good"], Paths(), zeros, "torch", span=(-3.0, 3.0)) == "good"
