"""tuned.kernel_table (the kernels a module launches, built at import and read by dict, which dynamo can trace) and
tuned.written_through (what a kernel writes a column slice through)."""

from __future__ import annotations

import pytest
import torch

from lkat_lens.kernels import tuned


def test_kernel_table_builds_every_key_once_and_looks_them_up() -> None:
    built = []

    @tuned.kernel_table(["a", ("b", 2)])
    def table(*key):
        built.append(key)
        return object()

    assert built == [("a",), ("b", 2)]  # all at decoration, a non-tuple key as one argument
    assert table("a") is table("a") and table("b", 2) is not table("a")
    assert built == [("a",), ("b", 2)]
    with pytest.raises(KeyError):
        table("c")


def test_written_through_gives_the_dense_tensor_and_the_slice_offset() -> None:
    dy = torch.zeros(2, 3, 10)
    columns = dy[..., 6:9]
    assert tuned.written_through(columns, None) == (columns, 0)
    target, offset = tuned.written_through(columns, (dy, 6))
    assert target is dy and offset == columns.storage_offset() - dy.storage_offset()
