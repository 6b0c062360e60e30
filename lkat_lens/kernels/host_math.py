"""Launch arithmetic on the host, in plain Python integers.

Triton's triton.cdiv and triton.next_power_of_2 are constexpr functions (Triton 3.6 and 3.8): a call from Python
unwraps its arguments through Triton's constexpr machinery, about 6 µs a call on this project's CPU machine against
0.06 µs for the integer arithmetic, and an eager LKAT-T training step made about 650 such calls for its grids and
block sizes (cProfile on the H100 machine). The kernels keep tl.cdiv; the host code uses these.
"""

from __future__ import annotations


def cdiv(a: int, b: int) -> int:
    """ceil(a / b) for integers, b > 0 (triton.cdiv's value)."""
    return -(-a // b)


def next_power_of_2(n: int) -> int:
    """The smallest power of two at or above n, 0 for n <= 0 (triton.next_power_of_2's value for n >= 0)."""
    return 0 if n <= 0 else 1 << (n - 1).bit_length()
