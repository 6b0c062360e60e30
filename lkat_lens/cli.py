"""The `lkat-lens` command line: one subcommand per job; user errors exit 2 with one message."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Sequence

from lkat_lens.checkpoint import CheckpointError

UserError = (CheckpointError, FileNotFoundError, ValueError)


def cmd_info(args: argparse.Namespace) -> None:
    """Print a checkpoint's model card as JSON."""
    from lkat_lens.checkpoint import load

    model, info = load(args.checkpoint, variant=args.variant)
    last = info.metrics[-1] if info.metrics else {}
    card = {
        "model": info.model_name,
        "kwargs": info.model_kwargs,
        "parameters": sum(p.numel() for p in model.parameters()),
        "data": {k: v for k, v in info.data.items() if k != "class_names"},
        "epoch": info.train.get("epoch"),
        "last_metrics": last,
    }
    print(json.dumps(card, indent=2, default=str))


def build_parser() -> argparse.ArgumentParser:
    """The argument parser with every subcommand."""
    parser = argparse.ArgumentParser(prog="lkat-lens", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    info = sub.add_parser("info", help="print a checkpoint's model card")
    info.add_argument("checkpoint")
    info.add_argument("--variant", help="registry name, for a reference-code state_dict")
    info.set_defaults(func=cmd_info)
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
