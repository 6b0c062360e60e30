"""kernels.host_math: the host's launch arithmetic gives Triton's own triton.cdiv and triton.next_power_of_2 values
(the kernels' grids and block sizes depend on them)."""

from __future__ import annotations

import triton

from lkat_lens.kernels.host_math import cdiv, next_power_of_2

# grids and block sizes the kernels take: small counts, token counts up to 2048² (16,389), batch x tokens x heads
SIZES = [*range(0, 300), 1023, 1024, 1025, 16389, 25728, 3_215_232, 2**31 - 1, 2**31, 2**40 + 3]


def test_cdiv_is_tritons():
    for a in SIZES:
        for b in (1, 2, 3, 16, 17, 64, 128, 4096):
            assert cdiv(a, b) == triton.cdiv(a, b), (a, b)


def test_next_power_of_2_is_tritons():
    for n in SIZES:
        assert next_power_of_2(n) == triton.next_power_of_2(n), n
