"""Symbolic fit of a 1-D curve against a function library: y ~ c * f(a * x + b) + d, ranked by R².

In the spirit of pykan's `auto_symbolic`: for each library function, a grid search over (a, b) that is
zoomed in around the best cell a few times, scoring each cell by the R² of the linear least-squares fit
of c and d (the squared correlation of f(a x + b) with y); then c, d and R² of the best cell. Fits whose
R² is within `tol` of the best one count as ties and the simplest function (lowest complexity) wins.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import torch
import torch.nn.functional as F

_SERIAL_ELEMENTS = 32767


@dataclass(frozen=True)
class SymbolicFunction:
    """A library entry: f(z) and a complexity (pykan's convention: x 1, x² 2, exp/sin 2, tanh 3, ...)."""

    name: str
    fn: Callable[[torch.Tensor], torch.Tensor]
    complexity: int


def _gaussian(z: torch.Tensor) -> torch.Tensor:
    """exp(-z²)."""
    return torch.exp(-z.square())


LIBRARY: dict[str, SymbolicFunction] = {
    f.name: f
    for f in (
        SymbolicFunction("0", torch.zeros_like, 0),
        SymbolicFunction("x", lambda z: z, 1),
        SymbolicFunction("x^2", torch.square, 2),
        SymbolicFunction("x^3", lambda z: z**3, 3),
        SymbolicFunction("x^4", lambda z: z**4, 3),
        SymbolicFunction("exp", torch.exp, 2),
        SymbolicFunction("sin", torch.sin, 2),
        SymbolicFunction("tanh", torch.tanh, 3),
        SymbolicFunction("gaussian", _gaussian, 3),
        SymbolicFunction("silu", F.silu, 3),
        SymbolicFunction("softplus", F.softplus, 3),
        SymbolicFunction("abs", torch.abs, 3),
    )
}


@dataclass
class SymbolicFit:
    """One fitted candidate: y ~ c * f(a * x + b) + d with its R² on the fitted points."""

    name: str
    a: float
    b: float
    c: float
    d: float
    r2: float
    complexity: int

    def __call__(self, x: torch.Tensor, library: Mapping[str, SymbolicFunction] = LIBRARY) -> torch.Tensor:
        """Evaluate the fitted expression at x (float64)."""
        z = self.a * x.double() + self.b
        return self.c * library[self.name].fn(z) + self.d

    def formula(self) -> str:
        """The fitted expression as readable maths, e.g. "2.5·(1.2x − 0.3)³ − 9.189" or "−0.7·tanh(3x) + 1"."""
        inner = _affine(self.a, "x", self.b)
        if self.name == "0":
            outer = ""
        elif self.name == "x":
            return _affine(self.c * self.a, "x", self.c * self.b + self.d)  # c(ax + b) + d, collected
        elif self.name.startswith("x^"):
            power = self.name[2:].translate(SUPERSCRIPTS)
            outer = f"x{power}" if inner == "x" else f"({inner}){power}"
        else:
            outer = f"{self.name}({inner})"
        return _affine(self.c, outer, self.d) if outer else _number(self.d)


SUPERSCRIPTS = str.maketrans("0123456789", "⁰¹²³⁴⁵⁶⁷⁸⁹")
MINUS = "−"


def _number(value: float) -> str:
    """A number with 4 significant digits and a true minus sign."""
    return f"{value:.4g}".replace("-", MINUS)


def _affine(scale: float, term: str, offset: float) -> str:
    """scale·term + offset without "+ −", "1·" or "+ 0" (term: "x" or one bracketed expression)."""
    if f"{scale:.4g}" == "1":
        text = term
    elif f"{scale:.4g}" == "-1":
        text = f"{MINUS}{term}"
    else:
        text = f"{_number(scale)}{'' if term == 'x' else '·'}{term}"
    if f"{abs(offset):.4g}" != "0":
        text += f" {MINUS if offset < 0 else '+'} {_number(abs(offset))}"
    return text


@dataclass
class SymbolicFitResult:
    """The best fit and every candidate, best first (ties within `tol` of R² ordered simplest first)."""

    best: SymbolicFit
    ranking: list[SymbolicFit]
    tol: float

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: best fit with its formula, and the ranking."""
        return {
            "best": asdict(self.best) | {"formula": self.best.formula()},
            "ranking": [asdict(fit) for fit in self.ranking],
            "tol": self.tol,
        }


def _r2_grid(y: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
    """R² of the best affine fit of y by each row of values [..., P] (0 where a row is constant or not finite)."""
    yc = y - y.mean()
    mean = values.mean(-1, keepdim=True)
    vc = values - mean
    svv = vc.square().sum(-1)
    svy = (vc * yc).sum(-1)
    syy = yc.square().sum()
    # a row whose spread is at rounding level of its magnitude is numerically constant
    varying = svv > 1e-20 * (svv + y.numel() * mean.squeeze(-1).square())
    usable = torch.isfinite(svv) & torch.isfinite(svy) & varying & (syy > 0)
    return torch.where(usable, svy.square() / (svv * syy).clamp_min(1e-300), torch.zeros_like(svv))


def _search(x: torch.Tensor, y: torch.Tensor, fn: Callable, a_grid: torch.Tensor, b_grid: torch.Tensor) -> torch.Tensor:
    """R² [len(a_grid), len(b_grid)] of f(a x + b) for every grid point.

    Rows of a are taken in blocks below torch's parallel grain size (32768 elements): the many small ops
    then run on one thread each, which keeps the search fast on a busy machine.
    """
    rows = max(1, _SERIAL_ELEMENTS // (b_grid.numel() * x.numel()))
    return torch.cat([_r2_grid(y, fn(a[:, None, None] * x + b_grid[None, :, None])) for a in a_grid.split(rows)])


def _affine_fit(x: torch.Tensor, y: torch.Tensor, func: SymbolicFunction, a: float, b: float) -> SymbolicFit:
    """Least-squares c, d for fixed (a, b) and the resulting R² = 1 - SS_res / SS_tot."""
    v = func.fn(a * x + b)
    if not torch.isfinite(v).all():
        v = torch.zeros_like(v)
    vc, yc = v - v.mean(), y - y.mean()
    svv = float(vc.square().sum())
    c = float((vc * yc).sum()) / svv if svv > 0 else 0.0
    d = float(y.mean()) - c * float(v.mean())
    ss_res = float((y - (c * v + d)).square().sum())
    ss_tot = float(yc.square().sum())
    energy = float(y.square().sum())
    if ss_tot > 1e-20 * energy:
        r2 = 1.0 - ss_res / ss_tot
    else:  # y is constant up to rounding: a perfect fit or none
        r2 = 1.0 if ss_res <= 1e-20 * energy else 0.0
    return SymbolicFit(func.name, float(a), float(b), c, d, r2, func.complexity)


def fit_function(
    x: torch.Tensor,
    y: torch.Tensor,
    func: SymbolicFunction,
    *,
    a_range: tuple[float, float] = (-10.0, 10.0),
    b_range: tuple[float, float] = (-10.0, 10.0),
    grid_number: int = 101,
    refine_number: int = 21,
    refinements: int = 4,
) -> SymbolicFit:
    """Fit y ~ c * f(a x + b) + d for one function: zoomed grid search over (a, b), least squares for c, d.

    A grid_number² search over the ranges, then `refinements` searches of refine_number² points within one
    cell either side of the best point so far.
    """
    x, y = x.detach().double().flatten(), y.detach().double().flatten()
    if x.shape != y.shape or x.numel() < 3:
        raise ValueError(f"x and y must have the same length >= 3, got {tuple(x.shape)} and {tuple(y.shape)}")
    (a_lo, a_hi), (b_lo, b_hi) = a_range, b_range
    best_a, best_b = 1.0, 0.0
    for number in [grid_number] + [refine_number] * refinements:
        a_grid = torch.linspace(a_lo, a_hi, number, dtype=torch.float64)
        b_grid = torch.linspace(b_lo, b_hi, number, dtype=torch.float64)
        r2 = _search(x, y, func.fn, a_grid, b_grid)
        if not r2.max() > 0:  # nothing fits (e.g. the "0" function): keep the last point
            break
        i, j = divmod(int(r2.argmax()), number)
        best_a, best_b = float(a_grid[i]), float(b_grid[j])
        da, db = (a_hi - a_lo) / (number - 1), (b_hi - b_lo) / (number - 1)
        a_lo, a_hi, b_lo, b_hi = best_a - da, best_a + da, best_b - db, best_b + db
    return _affine_fit(x, y, func, best_a, best_b)


def fit_symbolic(
    x: torch.Tensor,
    y: torch.Tensor,
    library: Mapping[str, SymbolicFunction] | Sequence[str] | None = None,
    *,
    a_range: tuple[float, float] = (-10.0, 10.0),
    b_range: tuple[float, float] = (-10.0, 10.0),
    grid_number: int = 101,
    refine_number: int = 21,
    refinements: int = 4,
    tol: float = 1e-6,
) -> SymbolicFitResult:
    """Fit a curve y(x) against every library function and rank the fits by R² (ties: simplest first)."""
    if library is None:
        funcs = list(LIBRARY.values())
    elif isinstance(library, Mapping):
        funcs = list(library.values())
    else:
        unknown = [name for name in library if name not in LIBRARY]
        if unknown:
            raise ValueError(f"unknown library functions {unknown}; known: {list(LIBRARY)}")
        funcs = [LIBRARY[name] for name in library]
    if not funcs:
        raise ValueError("the function library is empty")
    search = dict(
        a_range=a_range, b_range=b_range, grid_number=grid_number, refine_number=refine_number, refinements=refinements
    )
    fits = [fit_function(x, y, f, **search) for f in funcs]
    top = max(fit.r2 for fit in fits)
    ranking = sorted(fits, key=lambda f: (f.r2 < top - tol, f.complexity if f.r2 >= top - tol else 0, -f.r2))
    return SymbolicFitResult(ranking[0], ranking, tol)
