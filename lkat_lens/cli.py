"""The `lkat-lens` command line: one subcommand per job; user errors exit 2 with one message."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence

import torch

from .checkpoint import CheckpointError

UserError = (CheckpointError, FileNotFoundError, ValueError)


def cmd_info(args: argparse.Namespace) -> None:
    """Print a checkpoint's model card."""
    from .checkpoint import load
    from .study import format_card, model_card

    model, info = load(args.checkpoint, variant=args.variant)
    print(format_card(model_card(model, info)))


def cmd_analyze(args: argparse.Namespace) -> None:
    """Run every analysis on a sample of the checkpoint's data and write a JSON report."""
    from .report import analyze, write_report
    from .study import Study

    torch.manual_seed(args.seed)
    study = Study.open(
        args.checkpoint,
        variant=args.variant,
        data=args.data,
        data_dir=args.data_dir,
        num_images=args.num_images,
        probe_images=args.probe_images,
        attribution_images=args.attribution_images,
    )
    report = analyze(study)
    write_report(report, args.out)
    print(f"wrote {args.out} ({', '.join(k for k in report if k not in ('checkpoint', 'model', 'data', 'sample'))})")


def build_parser() -> argparse.ArgumentParser:
    """The argument parser with every subcommand."""
    parser = argparse.ArgumentParser(prog="lkat-lens", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    info = sub.add_parser("info", help="print a checkpoint's model card")
    info.add_argument("checkpoint")
    info.add_argument("--variant", help="registry name, for a reference-code state_dict")
    info.set_defaults(func=cmd_info)

    analyze = sub.add_parser("analyze", help="run every analysis and write a JSON report")
    analyze.add_argument("checkpoint")
    analyze.add_argument("--data", help="dataset name (default: the checkpoint's)")
    analyze.add_argument("--data-dir", default="data", help="where cifar/imagefolder data live")
    analyze.add_argument("--num-images", type=int, default=64, help="held-out images analysed")
    analyze.add_argument("--probe-images", type=int, default=256, help="training images the probes fit on")
    analyze.add_argument("--attribution-images", type=int, default=4)
    analyze.add_argument("--seed", type=int, default=0)
    analyze.add_argument("--variant", help="registry name, for a reference-code state_dict")
    analyze.add_argument("--out", default="report.json")
    analyze.set_defaults(func=cmd_analyze)

    from . import figures_cli

    figs = sub.add_parser("figures", help="write edge-function grids, gate, norm, attention and attribution figures")
    figures_cli.add_arguments(figs)
    figs.set_defaults(func=figures_cli.cmd_figures)

    from . import explore_cli

    explore = sub.add_parser("explore", help="serve the interactive explorer of one or more checkpoints")
    explore_cli.add_arguments(explore)
    explore.set_defaults(func=explore_cli.cmd_explore)
    return parser


def run_user_command(func: Callable[[], None]) -> int:
    """Run `func`; a user error prints one line on stderr and returns exit code 2."""
    try:
        func()
    except UserError as err:
        print(f"lkat-lens: error: {err}", file=sys.stderr)
        return 2
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the `lkat-lens` console script."""
    args = build_parser().parse_args(argv)
    return run_user_command(lambda: args.func(args))


if __name__ == "__main__":
    sys.exit(main())
