"""Fitted formulas print as readable maths: no "+ -", no "1·", powers as superscripts, true minus signs."""

import pytest

from lkat_lens.analyses.symbolic import SymbolicFit


@pytest.mark.parametrize(
    ("name", "a", "b", "c", "d", "text"),
    [
        ("x^3", -8.399, -2.6, 1.0, -9.189, "(−8.399x − 2.6)³ − 9.189"),
        ("x^2", 1.0, 0.0, 2.5, 0.0, "2.5·x²"),
        ("tanh", 3.0, 0.0, -1.0, 1.0, "−tanh(3x) + 1"),
        ("gaussian", 0.5, 1.25, -0.7, 0.0, "−0.7·gaussian(0.5x + 1.25)"),
        ("x", 2.0, -1.0, 3.0, 0.5, "6x − 2.5"),
        ("0", 1.0, 0.0, 1.0, -0.25, "−0.25"),
    ],
)
def test_formula_is_readable(name, a, b, c, d, text):
    assert SymbolicFit(name, a, b, c, d, r2=1.0, complexity=1).formula() == text
