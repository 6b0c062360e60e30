"""The suite's float comparison: absolute tolerance per unit of the compared values' magnitude."""

import pytest
import torch
from tolerance import assert_close, magnitude


def test_rounding_next_to_large_values_passes_and_real_errors_fail():
    big = torch.tensor([300.0, 0.0])
    assert_close(torch.tensor([300.0, 5.7e-5]), big)  # a "zero" off by float32 rounding of 300
    with pytest.raises(AssertionError):
        assert_close(torch.tensor([300.0, 0.01]), big)
    with pytest.raises(AssertionError):
        assert_close(torch.tensor([1.0, 2e-5]), torch.tensor([1.0, 0.0]))  # small values keep the stated atol


def test_magnitude_ignores_non_finite_values_and_is_at_least_one():
    assert magnitude(torch.tensor([float("inf"), -4.0])) == 4.0
    assert magnitude(torch.tensor([1e-3])) == 1.0
