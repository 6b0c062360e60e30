"""The CPU end-to-end run of tests/test_evaluate.py: train lkat_micro on shapes at 16², then score its Integrated
Gradients maps against the noise map on the object masks.

    python benchmarks/e2e_shapes.py [--seeds 0 1] [--out benchmarks/results/e2e_shapes-cpu.json]

The run: the real trainer, patch 4, 400 steps of 64 images (8 epochs of 3200 images, drawn once with
--cache-images), lr 5e-3, one torch thread; then a Study of its best.pt on the 96 validation images. Prints and
writes, per seed: top-1 on those images, IG's and the noise map's relevance mass, pointing game and positive AUC,
and the seconds of training and of evaluation (wall clock; run the seeds on an otherwise idle machine).
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

from common import RESULTS, environment, write_result  # benchmarks/ is the script folder

from lkat_lens import train
from lkat_lens.study import Study

EPOCHS, STEPS_PER_EPOCH, BATCH = 8, 50, 64
METRICS = ("relevance_mass", "pointing_game", "positive_auc")


def train_argv(seed: int, out_dir: Path) -> list[str]:
    """The trainer's arguments of the run."""
    argv = f"--data shapes --img-size 16 --model lkat_micro --patch-size 4 --threads 1 --epochs {EPOCHS} --seed {seed}"
    argv += f" --batch-size {BATCH} --train-images {BATCH * STEPS_PER_EPOCH} --val-images 96 --lr 5e-3"
    argv += f" --warmup-epochs 1 --workers 0 --cache-images --no-telemetry --name e2e --out-dir {out_dir}"
    return argv.split()


def run(seed: int, out_dir: Path) -> dict:
    """Train, evaluate and return the numbers of one seed (the checkpoints stay in out_dir/e2e)."""
    start = time.perf_counter()
    if train.main(train_argv(seed, out_dir)) != 0:
        raise RuntimeError(f"training with seed {seed} failed")
    trained = time.perf_counter()
    ig_steps = (("integrated_gradients", (("n_steps", 16),)),)  # 32 steps gave the same three scores
    study = Study.open(
        out_dir / "e2e" / "best.pt", device="cpu", num_images=96, mprt_images=0, method_settings=ig_steps
    )
    ig = study.map_evaluation("integrated_gradients", explain="label").summary()
    noise = study.map_evaluation("random", explain="label").summary()
    return {
        "seed": seed,
        "top1": study.sample_top1,
        "integrated_gradients": {name: ig[name] for name in METRICS},
        "random": {name: noise[name] for name in METRICS},
        "train_s": trained - start,
        "evaluate_s": time.perf_counter() - trained,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    parser.add_argument("--out", type=Path, default=RESULTS / "e2e_shapes-cpu.json")
    args = parser.parse_args()
    rows = []
    for seed in args.seeds:
        with tempfile.TemporaryDirectory() as scratch:
            rows.append(run(seed, Path(scratch)))
        print(json.dumps(rows[-1]))
    write_result(args.out, {"runs": rows, **environment()})


if __name__ == "__main__":
    main()
