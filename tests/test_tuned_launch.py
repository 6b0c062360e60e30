"""kernels.tuned: an autotuned kernel goes through Triton's autotuner once per key, then launches with the
configuration the autotuner chose, with the same results.

The kernels run on CPU through the Triton interpreter, in a child process started with TRITON_INTERPRET=1 unless this
process already runs that way (see triton_interpreter.py). The autotuner's timing is replaced by one that runs the
candidate and ranks it by the tile it reports (the widest wins), so that its choice is not its first configuration.
"""

from __future__ import annotations

import os
from unittest import mock

import pytest
import torch
import triton
import triton.language as tl
import triton_interpreter
from triton.runtime.autotuner import Autotuner

from lkat_lens.kernels import tuned
from lkat_lens.kernels.tuned import TunedKernel

INTERPRET = os.environ.get("TRITON_INTERPRET", "0") == "1"
BLOCKS = (16, 64, 32)


@triton.jit
def _double(x_ptr, out_ptr, tile_ptr, n, BLOCK: tl.constexpr):
    """out = 2 x over n elements; program 0 writes the tile width it ran with."""
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=offs < n) * 2, mask=offs < n)
    if tl.program_id(0) == 0:
        tl.store(tile_ptr, BLOCK)


def _widest_wins(fn, quantiles=None, **_):
    """A stand-in for the autotuner's timing: run the candidate once; the wider its tile, the faster it counts."""
    fn()
    return [1.0 / _TILE[0].item()] * (len(quantiles) if quantiles else 1)


_TILE: list[torch.Tensor] = []


def interpreter_measurements() -> dict:
    autotuner = triton.autotune(
        configs=[triton.Config({"BLOCK": b}) for b in BLOCKS], key=["n"], do_bench=_widest_wins
    )(_double)
    kernel = TunedKernel(autotuner)
    runs = []
    original = Autotuner.run

    def counted(self, *args, **kwargs):
        runs.append(args[3])
        return original(self, *args, **kwargs)

    calls = []
    with mock.patch.object(Autotuner, "run", counted):
        for n, dtype in ((100, torch.float32), (100, torch.float32), (100, torch.float32), (37, torch.float32),
                         (37, torch.float32), (100, torch.float16)):  # fmt: skip
            x = torch.arange(n, dtype=dtype)
            out, tile = torch.full_like(x, -1.0), torch.zeros(1, dtype=torch.int32)
            _TILE[:] = [tile]
            kernel[lambda m, n=n: (triton.cdiv(n, m["BLOCK"]),)](x, out, tile, n)
            calls.append({"n": n, "dtype": str(dtype), "right": torch.equal(out, 2 * x), "tile": tile.item()})
    return {"calls": calls, "autotuner_runs": runs, "capped": capped_measurements()}


def capped_measurements() -> dict:
    """With MAX_KEYS = 2, five calls over three sizes: the keys the kernel keeps and whether each call was right."""
    kernel = TunedKernel(triton.autotune(configs=[triton.Config({"BLOCK": 16})], key=["n"])(_double))
    right = []
    with mock.patch.object(tuned, "MAX_KEYS", 2):
        for n in (5, 6, 7, 7, 5):
            x = torch.arange(n, dtype=torch.float32)
            out, tile = torch.full_like(x, -1.0), torch.zeros(1, dtype=torch.int32)
            kernel[lambda m, n=n: (triton.cdiv(n, m["BLOCK"]),)](x, out, tile, n)
            right.append(torch.equal(out, 2 * x))
    return {"keys": sorted(key[0][3] for key in kernel._chosen), "right": right}


@pytest.fixture(scope="module")
def interp() -> dict:
    return triton_interpreter.measurements(__file__, INTERPRET, interpreter_measurements)


def test_every_launch_computes_the_kernels_result(interp: dict) -> None:
    assert all(call["right"] for call in interp["calls"]), interp["calls"]


def test_the_autotuner_runs_once_per_key_and_its_choice_is_launched(interp: dict) -> None:
    """Keys (n, dtypes): (100, fp32) three calls, (37, fp32) two, (100, fp16) one; the autotuner sees each key's
    first call only, and every call runs the configuration it chose (the widest tile, not its first configuration)."""
    assert interp["autotuner_runs"] == [100, 37, 100], interp
    assert [call["tile"] for call in interp["calls"]] == [max(BLOCKS)] * 6, interp["calls"]


def test_a_kernel_keeps_at_most_max_keys_keys_and_starts_the_others_through_the_autotuner(interp: dict) -> None:
    """A size past the cap (n = 7) is not kept, and its calls are still right."""
    assert interp["capped"] == {"keys": [5, 6], "right": [True] * 5}, interp["capped"]


def test_direct_launches_pass_triton_s_hooks_only_while_a_chain_holds_one() -> None:
    """The hooks a direct launch hands the launcher: None for both while Triton's enter and exit chains are empty (no
    launch metadata is built then), both chains as they are once either holds a hook."""
    assert tuned._hooks() == (None, None)
    runtime = triton.knobs.runtime
    for chain in (runtime.launch_enter_hook, runtime.launch_exit_hook):
        hook = mock.Mock()
        chain.add(hook)
        try:
            assert tuned._hooks() == (runtime.launch_enter_hook, runtime.launch_exit_hook)
        finally:
            chain.remove(hook)
    assert tuned._hooks() == (None, None)


if __name__ == "__main__":
    triton_interpreter.report(interpreter_measurements)
