"""Odd inputs: property tests of the RBF op and the KAN layer, and images of every kind through the eval transform."""

from __future__ import annotations

import io

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from PIL import Image
from tolerance import assert_close

import lkat_lens
from lkat_lens.data import DataError
from lkat_lens.images import load_image
from lkat_lens.kernels.rbf import rbf_grid_linear
from lkat_lens.models import KAN_BASES, KANLayer

DTYPES = [torch.float64, torch.float32, torch.bfloat16, torch.float16]
# The largest finite magnitude drawn per dtype (bf16 rounds values near the fp32 maximum up to inf).
MAX_ABS = {torch.float64: 1e300, torch.float32: 3e38, torch.bfloat16: 3e38, torch.float16: 6e4}
FEW = settings(max_examples=40, deadline=None)


@st.composite
def rbf_cases(draw) -> tuple[torch.Tensor, torch.Tensor, float, float]:
    """(x, weight, grid_min, grid_max): any dtype, 0-3 dims, shared [G]/[1, G] or channel [D, G] weights."""
    dtype = draw(st.sampled_from(DTYPES))
    shape = tuple(draw(st.lists(st.integers(1, 5), min_size=0, max_size=3)))
    big = MAX_ABS[dtype]
    values = st.one_of(st.floats(-4, 4), st.floats(-big, big, allow_nan=False, allow_infinity=False))
    n = int(np.prod(shape)) if shape else 1
    x = torch.tensor(draw(st.lists(values, min_size=n, max_size=n)), dtype=torch.float64).reshape(shape).to(dtype)
    G = draw(st.integers(2, 12))
    form = draw(st.sampled_from(["shared", "shared1", "channel"] if shape else ["shared", "shared1"]))
    wshape = {"shared": (G,), "shared1": (1, G), "channel": (shape[-1] if shape else 1, G)}[form]
    gen = torch.Generator().manual_seed(draw(st.integers(0, 2**31)))
    weight = torch.randn(wshape, generator=gen, dtype=torch.float64).to(dtype)
    lo = draw(st.floats(-3, 1))
    return x, weight, lo, lo + draw(st.floats(0.1, 4))


def rbf_float64(x: torch.Tensor, weight: torch.Tensor, grid_min: float, grid_max: float) -> torch.Tensor:
    """sum_g w_g exp(-((x - c_g) / h)^2) in float64, written out independently of the library."""
    G = weight.shape[-1]
    centers = torch.linspace(grid_min, grid_max, G, dtype=torch.float64)
    h = (grid_max - grid_min) / (G - 1)
    phi = torch.exp(-(((x.double().unsqueeze(-1) - centers) / h) ** 2))
    w = weight.double().reshape(-1) if weight.dim() == 1 or weight.shape[0] == 1 else weight.double()
    return (phi * w).sum(-1)


def offset_error(dtype: torch.dtype, lo: float, hi: float, G: int) -> float:
    """A bound on the error of t = (x - c) / h computed in the op's precision (the centers are rounded to it)."""
    eps = torch.finfo(torch.float64 if dtype == torch.float64 else torch.float32).eps
    return eps * (max(abs(lo), abs(hi)) * (G - 1) / (hi - lo) + 100 + G)


@FEW
@given(rbf_cases())
def test_rbf_torch_backend_matches_float64_and_is_finite(case):
    x, weight, lo, hi = case
    y = rbf_grid_linear(x, weight, lo, hi, backend="torch")
    ref = rbf_float64(x, weight, lo, hi)
    assert y.dtype == x.dtype and y.shape == x.shape and torch.isfinite(y).all()
    dt = offset_error(x.dtype, lo, hi, weight.shape[-1])
    bound = 2 * dt * weight.double().abs().sum(-1) + torch.finfo(x.dtype).eps * ref.abs()
    assert ((y.double() - ref).abs() <= bound).all(), (y, ref)


@FEW
@given(rbf_cases())
def test_rbf_gradients_are_finite_and_match_float64(case):
    x, weight, lo, hi = case
    if x.dtype not in (torch.float32, torch.float64):
        x, weight = x.float(), weight.float()
    xg, wg = x.clone().requires_grad_(), weight.clone().requires_grad_()
    rbf_grid_linear(xg, wg, lo, hi, backend="torch").sum().backward()
    xr, wr = x.double().requires_grad_(), weight.double().requires_grad_()
    rbf_float64(xr, wr, lo, hi).sum().backward()
    assert torch.isfinite(xg.grad).all() and torch.isfinite(wg.grad).all()
    dt = offset_error(x.dtype, lo, hi, weight.shape[-1])
    inv_h = (weight.shape[-1] - 1) / (hi - lo)
    assert ((xg.grad.double() - xr.grad).abs() <= 4 * dt * inv_h * weight.double().abs().sum(-1)).all()
    assert ((wg.grad.double() - wr.grad).abs() <= 2 * dt * max(x.numel(), 1)).all()


@st.composite
def kan_cases(draw, max_abs: float, plain: bool) -> tuple[KANLayer, torch.Tensor]:
    """A seeded KANLayer of any basis (with all options unless `plain`) and a finite input batch."""
    d_in, d_out = draw(st.integers(1, 8)), draw(st.integers(1, 8))
    options = (
        {}
        if plain
        else {
            "use_layernorm": draw(st.booleans()),
            "use_base_update": draw(st.booleans()),
            "gated": draw(st.booleans()),
        }
    )
    torch.manual_seed(draw(st.integers(0, 2**31)))
    layer = KANLayer(d_in, d_out, num_grids=draw(st.integers(2, 8)), basis=draw(st.sampled_from(KAN_BASES)), **options)
    batch = tuple(draw(st.lists(st.integers(1, 4), min_size=0, max_size=2)))
    n = int(np.prod(batch, dtype=int)) * d_in
    bound = float(np.float32(max_abs))
    values = draw(st.lists(st.floats(-bound, bound, width=32), min_size=n, max_size=n))
    return layer, torch.tensor(values, dtype=torch.float32).reshape(*batch, d_in)


@FEW
@given(kan_cases(1e4, plain=False))
def test_kan_layer_output_is_finite_for_every_option(case):
    layer, x = case
    y = layer(x)
    assert y.shape == (*x.shape[:-1], layer.out_features) and torch.isfinite(y).all()


@FEW
@given(kan_cases(3e38, plain=True))
def test_kan_layer_output_is_finite_up_to_the_fp32_maximum(case):
    """Far outside the grid every Gaussian is exactly 0, so even |x| ~ 3e38 gives a finite output."""
    layer, x = case
    assert torch.isfinite(layer(x)).all()


DATA = {
    "img_size": 16,
    "mean": [0.5, 0.5, 0.5],
    "std": [0.25, 0.25, 0.25],
    "crop_pct": 0.875,
    "interpolation": "bicubic",
}


def png_roundtrip(picture: Image.Image) -> Image.Image:
    """The image as a user's file gives it back: written as PNG and opened again."""
    buffer = io.BytesIO()
    picture.save(buffer, format="PNG")
    return Image.open(io.BytesIO(buffer.getvalue()))


PICTURES = {
    "wrong-size": lambda: Image.new("RGB", (40, 25), (200, 10, 10)),
    "1x1": lambda: Image.new("RGB", (1, 1), (200, 10, 10)),
    "grayscale": lambda: Image.new("L", (20, 20), 128),
    "rgba": lambda: Image.new("RGBA", (20, 20), (200, 10, 10, 0)),
    "16-bit": lambda: png_roundtrip(Image.fromarray(np.full((20, 20), 40000, dtype=np.uint16))),
    "palette": lambda: Image.new("RGB", (20, 20), (200, 10, 10)).convert("P"),
    "huge": lambda: Image.new("RGB", (6000, 4000), (200, 10, 10)),
}


def file_bytes(picture: Image.Image, fmt: str = "PNG") -> bytes:
    """The picture as a user's file holds it."""
    buffer = io.BytesIO()
    picture.save(buffer, format=fmt)
    return buffer.getvalue()


NOTES = {  # what load_image must say it did to each kind
    "wrong-size": ["resized and center-cropped 40x25"],
    "1x1": ["resized and center-cropped 1x1"],
    "grayscale": ["converted L to RGB"],
    "rgba": ["dropped the alpha channel", "converted RGBA to RGB"],
    "16-bit": ["scaled I;16 (16-bit) gray to 8 bits", "converted L to RGB"],
    "palette": ["converted P to RGB"],
    "huge": ["resized and center-cropped 6000x4000"],
}


@pytest.mark.parametrize("kind", list(PICTURES))
def test_load_image_turns_any_picture_into_the_model_input_and_says_what_it_did(kind, tmp_path):
    """Every kind becomes a finite [3, 16, 16] normalised input, from bytes or from a file, with its notes."""
    content = file_bytes(PICTURES[kind]())
    path = tmp_path / "picture.png"
    path.write_bytes(content)
    for loaded in (load_image(content, DATA), load_image(path, DATA)):
        x = loaded.tensor
        assert x.shape == (3, 16, 16) and x.dtype == torch.float32 and torch.isfinite(x).all()
        assert x.min() >= -2.0 - 1e-6 and x.max() <= 2.0 + 1e-6  # (v - 0.5) / 0.25 for v in [0, 1]
        for note in NOTES[kind]:
            assert any(n.startswith(note) for n in loaded.notes), (note, loaded.notes)


def test_uniform_picture_maps_to_its_exact_normalised_colour():
    """A flat (200, 10, 10) picture of any size, 1x1 included, is that colour everywhere after loading."""
    expected = (torch.tensor([200, 10, 10]) / 255 - 0.5) / 0.25
    for kind in ("wrong-size", "1x1", "huge"):
        x = load_image(file_bytes(PICTURES[kind]()), DATA).tensor
        assert torch.allclose(x, expected[:, None, None].expand(3, 16, 16), atol=1e-5), kind


def test_sixteen_bit_gray_is_scaled_to_eight_bits_not_clipped():
    """A 16-bit PNG of 40000 is the 8-bit gray round(40000 / 257) = 156, not the 255 a plain convert() gives."""
    deep = load_image(file_bytes(PICTURES["16-bit"]()), DATA).tensor
    shallow = load_image(file_bytes(Image.new("L", (20, 20), 156)), DATA).tensor
    assert_close(deep, shallow)


def _truncated_png() -> bytes:
    noisy = Image.fromarray(np.random.default_rng(0).integers(0, 255, (64, 64, 3), dtype=np.uint8))
    return file_bytes(noisy)[:600]


BAD_FILES = {
    "truncated-png": (_truncated_png, "corrupt or truncated"),
    "png-header-only": (lambda: b"\x89PNG\r\n\x1a\n" + b"\x00" * 50, "not an image file"),
    "text": (lambda: b"just text, not an image", "not an image file"),
    "empty": (lambda: b"", "is empty"),
    "too-many-pixels": (lambda: file_bytes(Image.new("L", (5000, 3000))), "over the limit of 10,000,000"),
}


@pytest.mark.parametrize("case", list(BAD_FILES))
def test_bad_image_files_are_refused_with_one_message(case):
    make, match = BAD_FILES[case]
    with pytest.raises(DataError) as err:
        load_image(make(), DATA, max_pixels=10_000_000)
    assert match in str(err.value) and "\n" not in str(err.value)


def test_missing_image_file_is_refused(tmp_path):
    with pytest.raises(DataError, match="no such file"):
        load_image(tmp_path / "nothing.png", DATA)


def test_loaded_pictures_run_through_a_model_to_finite_logits():
    torch.manual_seed(0)
    model = lkat_lens.create_model("lkat_micro", num_classes=10).eval()
    batch = torch.stack([load_image(file_bytes(make()), DATA).tensor for make in PICTURES.values()])
    with torch.no_grad():
        assert torch.isfinite(model(batch)).all()
