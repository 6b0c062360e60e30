"""kernels.tuned.specialise: TunedKernel starts a compiled kernel again only for calls whose key it shares, so the
key must tell apart every two calls that Triton's own binder would specialise differently (else a kernel compiled for
16-byte-aligned pointers or a divisible size would run on other ones). Checked without a GPU against the binder Triton
builds for an sm_90 target, on the arguments of every kernel an LKAT layer launches (caught by
benchmarks/kernel_registers.py) and on variants of them: each tensor moved off its 16-byte alignment, each integer set
to 1, 16 and 17 and past 32 bits."""

from __future__ import annotations

import importlib
import itertools
import sys
from pathlib import Path

import pytest
import torch
from triton.backends.compiler import GPUTarget
from triton.compiler import make_backend
from triton.runtime.jit import create_function_from_signature

from lkat_lens.kernels.tuned import specialise

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


@pytest.fixture(scope="module")
def launches() -> list[tuple]:
    """(kernel, args, keyword arguments) of every launch of an LKAT layer's kernels, caught before they reach a
    device."""
    with pytest.MonkeyPatch.context() as patch:
        patch.syspath_prepend(str(BENCHMARKS))
        tool = importlib.import_module("kernel_registers")
        caught = []
        for launcher in tool.lkat_layer(T=33, heads=2).values():
            with tool.caught_launches() as found:
                launcher()
            for kernel, args, kwargs, configs in found:  # with the first configuration its autotuner tries
                config = {k: v for k, v in configs[0].all_kwargs().items() if v is not None} if configs else {}
                caught.append((kernel, args, kwargs | config))
    sys.modules.pop("kernel_registers", None)
    return caught


def _misaligned(t: torch.Tensor) -> torch.Tensor:
    """t's values in a tensor whose data starts one element past a 16-byte boundary."""
    storage = torch.empty(t.numel() + 1, dtype=t.dtype)
    return storage[1:].view(t.shape).copy_(t)


def _variants(args: tuple) -> list[tuple]:
    """The arguments, and copies with one tensor misaligned or one integer changed."""
    out = [args]
    for i, arg in enumerate(args):
        if isinstance(arg, torch.Tensor) and arg.numel():
            out.append((*args[:i], _misaligned(arg), *args[i + 1 :]))
        elif isinstance(arg, int) and not isinstance(arg, bool):
            out += [(*args[:i], value, *args[i + 1 :]) for value in (1, 16, 17, 2**31 + 16)]
    return out


def test_the_key_separates_what_tritons_binder_specialises_apart(launches) -> None:
    backend = make_backend(GPUTarget("cuda", 90, 32))
    assert len({id(kernel) for kernel, _, _ in launches}) >= 7  # GLA input, short GLA and output path, each way
    for kernel, args, kwargs in launches:
        binder = create_function_from_signature(kernel.signature, kernel.params, backend)
        triton_of, ours_of = {}, {}
        for variant in _variants(args):
            triton_key = str(binder(*variant, **kwargs)[1])
            ours = specialise(variant)[0]
            triton_of.setdefault(ours, set()).add(triton_key)
            ours_of.setdefault(triton_key, set()).add(ours)
        merged = {k: v for k, v in triton_of.items() if len(v) > 1}
        assert not merged, (kernel.__name__, merged)
        assert len(ours_of) > 2, kernel.__name__  # the variants did change Triton's specialisation


def key(args: tuple) -> tuple:
    return specialise(args)[0]


def test_equal_calls_share_a_key_and_pointers_do_not_enter_it() -> None:
    """Two calls with different tensors of the same dtype and alignment and the same other values share a key; a
    tensor's dtype or alignment or another argument's value sets a call apart (a float's too: it may be a constexpr)."""
    a, b = torch.zeros(64), torch.ones(64)
    assert key((a, 7, 0.5, True)) == key((b, 7, 0.5, True))
    apart = [(a, 7, 0.5, False), (a, 8, 0.5, True), (a, 7, 1.5, True), (a.half(), 7, 0.5, True)]
    apart.append((_misaligned(a), 7, 0.5, True))
    assert len({key(args) for args in [(a, 7, 0.5, True), *apart]}) == 6
    assert len({key((a, n)) for n in itertools.chain((1, 16, 17), (2**31, 2**63))}) == 5


def test_a_direct_launch_passes_tensors_as_their_data_pointers_and_the_rest_as_it_is() -> None:
    """Triton's launcher takes an integer for a pointer as it is: a view's pointer is its first element's."""
    a, view = torch.zeros(64), torch.ones(64)[3:]
    args = (a, 7, view, 0.5, None, True, 2**40)
    keyed, pointers = specialise(args)
    assert pointers == [a.data_ptr(), 7, view.data_ptr(), 0.5, None, True, 2**40]
    assert keyed == ((torch.float32, True), 7, (torch.float32, False), 0.5, None, True, 2**40)
