"""`shapes`: a procedural image-classification set whose class is the *form* of one object, with its pixel mask.

Every image is drawn on the fly from (seed, split, index) alone, at any resolution: a textured background
(a two-colour gradient, sine stripes, smooth colour blobs, pixel noise), 1-3 distractor strokes of forms no class
has (straight lines, open arcs, zigzags; each shorter than the object), then the class object on top: one of
FORMS at a random position (wholly inside the image), size (SIZE_RANGE of the image side, its circumscribed
circle), rotation and colour. Colours are drawn independently of the class, so only the form tells the class.

The object is drawn last, so nothing covers it: `mask(i)` is True exactly on the object's pixels, all visible
(where it lies over a distractor, the object's pixels win). Labels are balanced: image i has label i % len(FORMS).
A scene is drawn in image-relative units before any pixel, so the same index gives the same scene at every size.

`python -m lkat_lens.shapes export OUT --img-size 224` writes OUT/{train,val}/<form>/<index>.png (an ImageFolder)
and OUT/masks/{train,val}/<form>/<index>.png (255 on the object), so `--data imagefolder --data-dir OUT
--masks OUT/masks/val` reproduces the val masks.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable
from dataclasses import dataclass, replace
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image, ImageDraw
from torch.utils.data import DataLoader, Dataset

FORMS = ("circle", "square", "triangle", "star", "cross", "ring")
DISTRACTORS = ("line", "arc", "zigzag")
SPLITS = {"train": 0, "val": 1}  # mixed into the seed: the two splits draw from different streams
DEFAULT_SIZES = {"train": 10_000, "val": 2_000}
SIZE_RANGE = (0.3, 0.6)  # object diameter (circumscribed circle) as a fraction of the image side
MIN_CONTRAST = 0.5  # Euclidean RGB distance (in [0, 1] units) of a drawn colour from the background under it

NOISE_SEED = 20261124

Color = tuple[float, float, float]


@dataclass(frozen=True)
class Stroke:
    """One drawn form in image-relative units: a class object (FORMS) or a distractor (DISTRACTORS)."""

    form: str
    cx: float
    cy: float
    radius: float  # class object: circumscribed radius; line/zigzag: half length; arc: arc radius
    angle: float  # rotation (radians); arcs: start angle
    color: Color
    width: float = 0.0  # distractors' stroke width
    extent: float = 0.0  # arcs: swept angle (radians); zigzags: number of segments


@dataclass(frozen=True)
class Background:
    """The texture under the strokes."""

    color_a: Color
    color_b: Color
    gradient_angle: float
    stripe_color: Color
    stripe_angle: float
    stripe_freq: float  # cycles per image side
    stripe_phase: float
    blobs: np.ndarray  # [g, g, 3] smooth colour offsets, upsampled to the image
    noise: float  # std of the per-pixel noise
    noise_offset: tuple[float, float]  # where (in image sides) the image's window into the noise tile starts


@dataclass(frozen=True)
class Scene:
    """Everything one image shows; `render` turns it into pixels at any size."""

    label: int
    background: Background
    distractors: tuple[Stroke, ...]
    target: Stroke


def make_scene(rng: np.random.Generator, label: int) -> Scene:
    """A random scene whose class object has form FORMS[label]."""
    background = Background(
        color_a=_rand_color(rng),
        color_b=_rand_color(rng),
        gradient_angle=rng.uniform(0, 2 * math.pi),
        stripe_color=tuple(rng.uniform(-0.15, 0.15, 3)),
        stripe_angle=rng.uniform(0, math.pi),
        stripe_freq=rng.uniform(2.0, 10.0),
        stripe_phase=rng.uniform(0, 2 * math.pi),
        blobs=rng.uniform(-0.15, 0.15, (int(rng.integers(3, 7)),) * 2 + (3,)).astype(np.float32),
        noise=rng.uniform(0.0, 0.05),
        noise_offset=(float(rng.uniform()), float(rng.uniform())),
    )
    radius = rng.uniform(*SIZE_RANGE) / 2
    cx, cy = rng.uniform(radius, 1 - radius, 2)
    target = Stroke(FORMS[label], cx, cy, radius, rng.uniform(0, 2 * math.pi), _contrasting(rng, background, cx, cy))
    distractors = tuple(_distractor(rng, background, radius) for _ in range(int(rng.integers(1, 4))))
    return Scene(label, background, distractors, target)


def _rand_color(rng: np.random.Generator) -> Color:
    return tuple(float(c) for c in rng.uniform(0.0, 1.0, 3))


def _contrasting(rng: np.random.Generator, background: Background, x: float, y: float) -> Color:
    """A random colour at least MIN_CONTRAST from the background's gradient colour at (x, y)."""
    under = np.asarray(_gradient_color(background, x, y))
    for _ in range(100):
        color = np.asarray(_rand_color(rng))
        if np.linalg.norm(color - under) >= MIN_CONTRAST:
            break
    else:  # the farthest corner of the RGB cube is always >= sqrt(3) / 2 away
        color = (under < 0.5).astype(float)
    return tuple(float(c) for c in color)


def _gradient_color(background: Background, x: float, y: float) -> Color:
    t = _gradient_t(background.gradient_angle, np.float64(x), np.float64(y))
    a, b = np.asarray(background.color_a), np.asarray(background.color_b)
    return tuple(a + float(t) * (b - a))


def _gradient_t(angle: float, x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Position along the gradient direction, 0..1 over the image."""
    c, s = math.cos(angle), math.sin(angle)
    low = min(0.0, c) + min(0.0, s)
    return (x * c + y * s - low) / (abs(c) + abs(s))


def _distractor(rng: np.random.Generator, background: Background, target_radius: float) -> Stroke:
    """A stroke of a non-class form, smaller than the class object, anywhere in the image."""
    form = DISTRACTORS[int(rng.integers(len(DISTRACTORS)))]
    cx, cy = rng.uniform(0.05, 0.95, 2)
    radius = target_radius * rng.uniform(0.4, 0.8)
    width = rng.uniform(0.012, 0.035)
    extent = rng.uniform(math.pi / 3, 1.1 * math.pi) if form == "arc" else float(rng.integers(2, 5))
    color = _contrasting(rng, background, cx, cy)
    return Stroke(form, cx, cy, radius, rng.uniform(0, 2 * math.pi), color, width, extent)


# ------------------------------------------------------------------------------------------------- drawing


def render(scene: Scene, size: int, *, target: bool = True) -> np.ndarray:
    """The scene as uint8 RGB [size, size, 3] (without its class object when `target` is False)."""
    canvas = _background(scene.background, size)
    for stroke in scene.distractors + ((scene.target,) if target else ()):
        canvas[stroke_mask(stroke, size)] = np.round(np.asarray(stroke.color) * 255).astype(np.uint8)
    return canvas


def stroke_mask(stroke: Stroke, size: int) -> np.ndarray:
    """bool [size, size]: the pixels the stroke covers."""
    layer = Image.new("L", (size, size), 0)
    draw = ImageDraw.Draw(layer)
    _DRAWERS[stroke.form](draw, stroke, size)
    return np.asarray(layer) > 0


@lru_cache(maxsize=8)
def _pixel_centres(size: int) -> tuple[np.ndarray, np.ndarray]:
    """x [1, size] and y [size, 1] of the pixel centres in image units."""
    c = ((np.arange(size, dtype=np.float32) + 0.5) / size).astype(np.float32)
    return c[None, :], c[:, None]


@lru_cache(maxsize=32)
def _interp_matrix(size: int, g: int) -> np.ndarray:
    """[size, g] bilinear weights from a g-point grid (at cell centres) to the size pixel centres."""
    pos = np.clip((np.arange(size) + 0.5) / size * g - 0.5, 0, g - 1)
    lo = np.minimum(np.floor(pos).astype(int), g - 2) if g > 1 else np.zeros(size, int)
    frac = pos - lo
    m = np.zeros((size, g), np.float32)
    m[np.arange(size), lo] = 1 - frac
    if g > 1:
        m[np.arange(size), lo + 1] = frac
    return m


@lru_cache(maxsize=8)
def _noise_tile(size: int) -> np.ndarray:
    """float32 [2 size, 2 size, 3] of fixed standard normal noise; each image adds a window of it (drawing fresh
    noise per image would take half of the rendering time)."""
    return np.random.default_rng(NOISE_SEED).standard_normal((2 * size, 2 * size, 3), dtype=np.float32)


def _background(bg: Background, size: int) -> np.ndarray:
    """uint8 [size, size, 3]: gradient + stripes + blobs + noise."""
    x, y = _pixel_centres(size)
    t = _gradient_t(bg.gradient_angle, x, y)[..., None]
    a = np.asarray(bg.color_a, np.float32)
    img = a + t * (np.asarray(bg.color_b, np.float32) - a)
    phase = 2 * math.pi * bg.stripe_freq * (x * math.cos(bg.stripe_angle) + y * math.sin(bg.stripe_angle))
    img = img + np.sin(phase + bg.stripe_phase)[..., None] * np.asarray(bg.stripe_color, np.float32)
    m = _interp_matrix(size, bg.blobs.shape[0])
    img += np.einsum("ia,abc,jb->ijc", m, bg.blobs, m, optimize=True)
    if bg.noise > 0:
        ox, oy = (int(o * size) for o in bg.noise_offset)
        img += bg.noise * _noise_tile(size)[oy : oy + size, ox : ox + size]
    return np.clip(img * 255 + 0.5, 0, 255).astype(np.uint8)


def _polygon(stroke: Stroke, size: int, radii: list[float]) -> list[tuple[float, float]]:
    """Vertices at the given radii (fractions of the stroke's), evenly spaced in angle from stroke.angle."""
    n = len(radii)
    return [
        (
            (stroke.cx + stroke.radius * r * math.cos(stroke.angle + 2 * math.pi * k / n)) * size,
            (stroke.cy + stroke.radius * r * math.sin(stroke.angle + 2 * math.pi * k / n)) * size,
        )
        for k, r in enumerate(radii)
    ]


def _box(stroke: Stroke, size: int, fraction: float = 1.0) -> list[float]:
    r = stroke.radius * fraction
    return [(stroke.cx - r) * size, (stroke.cy - r) * size, (stroke.cx + r) * size, (stroke.cy + r) * size]


def _draw_circle(draw: ImageDraw.ImageDraw, s: Stroke, size: int) -> None:
    draw.ellipse(_box(s, size), fill=255)


def _draw_ring(draw: ImageDraw.ImageDraw, s: Stroke, size: int) -> None:
    draw.ellipse(_box(s, size), fill=255)
    draw.ellipse(_box(s, size, 0.55), fill=0)


def _draw_square(draw: ImageDraw.ImageDraw, s: Stroke, size: int) -> None:
    draw.polygon(_polygon(s, size, [1.0] * 4), fill=255)


def _draw_triangle(draw: ImageDraw.ImageDraw, s: Stroke, size: int) -> None:
    draw.polygon(_polygon(s, size, [1.0] * 3), fill=255)


def _draw_star(draw: ImageDraw.ImageDraw, s: Stroke, size: int) -> None:
    draw.polygon(_polygon(s, size, [1.0, 0.42] * 5), fill=255)


def _draw_cross(draw: ImageDraw.ImageDraw, s: Stroke, size: int) -> None:
    """A plus sign: four arms of half-width 0.3 (circumscribed radius 1)."""
    w, r = 0.3, math.sqrt(1 - 0.3**2)
    outline = [
        (w, r),
        (w, w),
        (r, w),
        (r, -w),
        (w, -w),
        (w, -r),
        (-w, -r),
        (-w, -w),
        (-r, -w),
        (-r, w),
        (-w, w),
        (-w, r),
    ]
    c, sn = math.cos(s.angle), math.sin(s.angle)
    draw.polygon(
        [
            ((s.cx + s.radius * (u * c - v * sn)) * size, (s.cy + s.radius * (u * sn + v * c)) * size)
            for u, v in outline
        ],
        fill=255,
    )


def _line_width(s: Stroke, size: int) -> int:
    return max(1, round(s.width * size))


def _draw_line(draw: ImageDraw.ImageDraw, s: Stroke, size: int) -> None:
    dx, dy = s.radius * math.cos(s.angle), s.radius * math.sin(s.angle)
    draw.line(
        [((s.cx - dx) * size, (s.cy - dy) * size), ((s.cx + dx) * size, (s.cy + dy) * size)], 255, _line_width(s, size)
    )


def _draw_arc(draw: ImageDraw.ImageDraw, s: Stroke, size: int) -> None:
    start = math.degrees(s.angle)
    draw.arc(_box(s, size), start, start + math.degrees(s.extent), fill=255, width=_line_width(s, size))


def _draw_zigzag(draw: ImageDraw.ImageDraw, s: Stroke, size: int) -> None:
    """`extent` segments along the stroke's direction, alternating sideways by a third of its length."""
    n = int(s.extent)
    c, sn = math.cos(s.angle), math.sin(s.angle)
    points = []
    for k in range(n + 1):
        u = s.radius * (2 * k / n - 1)
        v = s.radius * 0.35 * (1 if k % 2 else -1)
        points.append(((s.cx + u * c - v * sn) * size, (s.cy + u * sn + v * c) * size))
    draw.line(points, 255, _line_width(s, size), joint="curve")


_DRAWERS: dict[str, Callable[[ImageDraw.ImageDraw, Stroke, int], None]] = {
    "circle": _draw_circle,
    "square": _draw_square,
    "triangle": _draw_triangle,
    "star": _draw_star,
    "cross": _draw_cross,
    "ring": _draw_ring,
    "line": _draw_line,
    "arc": _draw_arc,
    "zigzag": _draw_zigzag,
}


# ------------------------------------------------------------------------------------------------- dataset


class ShapesDataset(Dataset):
    """The `split` of the shapes set at `img_size`: ds[i] -> (PIL RGB image, label), ds.mask(i) -> bool mask."""

    classes = list(FORMS)

    def __init__(
        self,
        split: str,
        img_size: int,
        transform: Callable[[Image.Image], Any] | None = None,
        *,
        num_images: int | None = None,
        seed: int = 0,
    ) -> None:
        if split not in SPLITS:
            raise ValueError(f"split must be 'train' or 'val', got {split!r}")
        if img_size < 8:
            raise ValueError(f"shapes needs an image size of at least 8 pixels, got {img_size}")
        num_images = DEFAULT_SIZES[split] if num_images is None else int(num_images)
        if num_images < 1:
            raise ValueError(f"shapes needs at least one {split} image, got {num_images}")
        self.split, self.img_size, self.transform, self.seed = split, int(img_size), transform, int(seed)
        self.targets = [i % len(FORMS) for i in range(num_images)]
        self.pixels: torch.Tensor | None = None  # uint8 [N, S, S, 3] once draw_all() has run

    def draw_all(self, workers: int = 0, batch_size: int = 256) -> ShapesDataset:
        """Draw every image once, over `workers` processes, into memory (uint8, N x S x S x 3 bytes): later reads
        cost the transform only, not the drawing (3-4 ms per 224² image). Returns self."""
        drawn = torch.empty(len(self), self.img_size, self.img_size, 3, dtype=torch.uint8)
        # its own generator: a loader draws its workers' base seed, which must not move the global torch RNG
        loader = DataLoader(_Pixels(self), batch_size=batch_size, num_workers=workers, generator=torch.Generator())
        start = 0
        for batch in loader:
            drawn[start : start + len(batch)] = batch
            start += len(batch)
        self.pixels = drawn
        return self

    def __len__(self) -> int:
        return len(self.targets)

    def scene(self, index: int) -> Scene:
        """The scene of image `index` (the same at every image size)."""
        if not 0 <= index < len(self):
            raise IndexError(f"index {index} out of range for {len(self)} {self.split} images")
        rng = np.random.default_rng([self.seed, SPLITS[self.split], index])
        return make_scene(rng, self.targets[index])

    def image(self, index: int) -> Image.Image:
        """Image `index` as a PIL RGB image of img_size x img_size, before the transform."""
        if self.pixels is not None:
            return Image.fromarray(self.pixels[index].numpy(), "RGB")
        return Image.fromarray(render(self.scene(index), self.img_size), "RGB")

    def mask(self, index: int) -> np.ndarray:
        """bool [img_size, img_size]: True exactly on the class object's pixels (all of them are visible)."""
        return stroke_mask(self.scene(index).target, self.img_size)

    def __getitem__(self, index: int) -> tuple[Any, int]:
        img = self.image(index)
        return (self.transform(img) if self.transform else img), self.targets[index]


class _Pixels(Dataset):
    """The images of a ShapesDataset as uint8 tensors [S, S, 3], drawn (for draw_all's loader)."""

    def __init__(self, shapes: ShapesDataset) -> None:
        self.shapes = shapes

    def __len__(self) -> int:
        return len(self.shapes)

    def __getitem__(self, index: int) -> torch.Tensor:
        return torch.from_numpy(render(self.shapes.scene(index), self.shapes.img_size))


def with_target_color(scene: Scene, color: Color) -> Scene:
    """The same scene with its class object painted `color`."""
    return replace(scene, target=replace(scene.target, color=color))


# -------------------------------------------------------------------------------------------------- export


def export(out: str | Path, img_size: int, sizes: dict[str, int], seed: int = 0) -> None:
    """Write the splits as an ImageFolder (out/<split>/<form>/<index>.png) and masks (out/masks/<split>/...)."""
    out = Path(out)
    for split, num in sizes.items():
        ds = ShapesDataset(split, img_size, num_images=num, seed=seed)
        for form in FORMS:
            (out / split / form).mkdir(parents=True, exist_ok=True)
            (out / "masks" / split / form).mkdir(parents=True, exist_ok=True)
        width = len(str(num - 1))
        for i in range(num):
            rel = Path(FORMS[ds.targets[i]]) / f"{i:0{width}d}.png"
            ds.image(i).save(out / split / rel)
            Image.fromarray(ds.mask(i).astype(np.uint8) * 255, "L").save(out / "masks" / split / rel)


def main(argv: list[str] | None = None) -> int:
    """`python -m lkat_lens.shapes export OUT`: write the shapes set to disk."""
    p = argparse.ArgumentParser(prog="python -m lkat_lens.shapes", description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="command", required=True)
    e = sub.add_parser("export", help="write OUT/{train,val}/<form>/*.png and OUT/masks/{train,val}/<form>/*.png")
    e.add_argument("out")
    e.add_argument("--img-size", type=int, default=224)
    e.add_argument("--train", type=int, default=DEFAULT_SIZES["train"], help="training images")
    e.add_argument("--val", type=int, default=DEFAULT_SIZES["val"], help="validation images")
    e.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    for flag in ("img_size", "train", "val"):
        if getattr(args, flag) < 1:
            p.error(f"--{flag.replace('_', '-')} must be positive")
    try:
        export(args.out, args.img_size, {"train": args.train, "val": args.val}, args.seed)
    except (ValueError, OSError) as err:
        p.exit(2, f"{p.prog}: error: {err}\n")
    print(f"wrote {args.train} train and {args.val} val images with masks to {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
