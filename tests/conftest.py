"""Shared fixtures: a real (short) digits training run, a seeded lkat_micro and images of its size."""

import os
from pathlib import Path

import pytest
import torch
from test_data import write_image_folder

import lkat_lens
from lkat_lens import train

# The files that take longest (seconds from a file's first test to its last on one of `make test`'s two workers, on
# this project's 2-core CPU machine, 2026-11-29), slowest first. `make test` hands whole files to its workers
# (pytest-xdist --dist loadfile) in collection order (--no-loadscope-reorder: xdist's default order is by number of
# tests, which started the 174-s end-to-end run 344 s into a 593-s run), so these are collected first and the short
# files fill in behind them, and the two workers finish close together.
SLOW_FILES = (
    "test_evaluate.py",  # 174 s: the shapes end-to-end run
    "test_explorer.py",  # 136 s: the browser tests
    "test_gla_core_trace.py",  # 76 s: four traces, each in a child process
    "test_distributed_stats.py",  # 72 s: torchrun
    "test_gla_short.py",  # 54 s: the Triton interpreter suites, each in a child process
    "test_figures.py",
    "test_gla_input.py",
    "test_train.py",
    "test_robustness_training.py",
    "test_gla_core.py",
    "test_explorer_runs.py",
    "test_chunk_states.py",
    "test_rbf_kernel.py",
    "test_flat_params.py",
    "test_kan_gemm.py",
    "test_robustness_app_load.py",
    "test_custom_ops.py",
    "test_compile_guards.py",  # 22 s
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Collect SLOW_FILES first, slowest first; the rest keep their order."""

    def rank(item: pytest.Item) -> int:
        name = item.path.name
        return SLOW_FILES.index(name) if name in SLOW_FILES else len(SLOW_FILES)

    items.sort(key=rank)  # stable: tests inside a file keep their order


DEFAULT_TORCH_THREADS = torch.get_num_threads()  # before any fixture's training run sets the process's count
if os.environ.get("PYTEST_XDIST_WORKER"):  # `make test` runs two workers on the 2-core machine: a core each
    torch.set_num_threads(1)


@pytest.fixture(scope="session")
def digits_checkpoint(tmp_path_factory) -> Path:
    """best.pt of a short lkat_micro run on digits (a real training run, a few optimizer steps)."""
    out = tmp_path_factory.mktemp("runs")
    argv = [
        "--epochs",
        "1",
        "--max-steps",
        "6",
        "--batch-size",
        "64",
        "--threads",
        "1",
        "--name",
        "micro",
        "--out-dir",
        str(out),
    ]
    assert train.main(argv) == 0
    return out / "micro" / "best.pt"


@pytest.fixture(scope="module")
def lkat():
    """A seeded, randomly initialised lkat_micro in eval mode (one per test module)."""
    torch.manual_seed(0)
    return lkat_lens.create_model("lkat_micro", num_classes=10).eval()


@pytest.fixture(scope="module")
def images() -> torch.Tensor:
    """Two random 16x16 RGB images, the input size of lkat_micro."""
    return torch.randn(2, 3, 16, 16, generator=torch.Generator().manual_seed(1))


@pytest.fixture
def default_torch_threads(keep_torch_threads):
    """torch's own thread count (as at start-up) for the test, then the process's count back: the session's trainer
    fixtures leave the process at their --threads 1, which a timed requirement on this machine must not inherit."""
    torch.set_num_threads(DEFAULT_TORCH_THREADS)


@pytest.fixture
def keep_torch_threads():
    """The trainer sets torch's thread count for the process; put it back after the test."""
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    """An ImageFolder tree: 3 classes (ant, bee, cow), 4 train and 2 val images each, 12x12 RGB."""
    root = tmp_path_factory.mktemp("imagefolder")
    write_image_folder(root, ["ant", "bee", "cow"], per_class=(4, 2))
    return root


@pytest.fixture(scope="session")
def shapes_checkpoint(tmp_path_factory) -> Path:
    """best.pt of lkat_micro after two optimizer steps on shapes at 16² (object masks; the pipeline, not accuracy)."""
    out = tmp_path_factory.mktemp("shapes")
    argv = "--data shapes --img-size 16 --model lkat_micro --threads 1 --epochs 1 --max-steps 2 --batch-size 16"
    argv += f" --train-images 64 --val-images 24 --no-telemetry --name s --out-dir {out}"
    assert train.main(argv.split()) == 0
    return out / "s" / "best.pt"
