"""`lkat-lens explore`: serve the interactive explorer of one or more checkpoints (127.0.0.1, debug off)."""

from __future__ import annotations

import argparse


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The `explore` subcommand's arguments."""
    parser.add_argument("checkpoints", nargs="+", help="one or more lkat-lens checkpoints, shown side by side")
    parser.add_argument("--data", help="dataset name (default: the checkpoint's)")
    parser.add_argument("--data-dir", default="data", help="where cifar/imagefolder data live")
    parser.add_argument("--num-images", type=int, default=32, help="held-out images analysed and shown")
    parser.add_argument("--edges", type=int, default=8, help="edge functions per layer grid (most important first)")
    parser.add_argument("--probe-images", type=int, default=256, help="training images the linear probes are fitted on")
    parser.add_argument("--host", default="127.0.0.1", help="interface to bind (default: local only)")
    parser.add_argument("--port", type=int, default=8050)
    parser.add_argument("--debug", action="store_true", help="Dash debug mode (reloader, tracebacks in the page)")


def cmd_explore(args: argparse.Namespace) -> None:
    """Load the checkpoints and serve the explorer until interrupted."""
    from lkat_lens.apps.explorer import create_app

    if args.num_images < 1:
        raise ValueError(f"--num-images must be at least 1, got {args.num_images}")
    if args.edges < 1:
        raise ValueError(f"--edges must be at least 1, got {args.edges}")
    if args.probe_images < 2:
        raise ValueError(f"--probe-images must be at least 2, got {args.probe_images}")
    app = create_app(
        args.checkpoints,
        data=args.data,
        data_dir=args.data_dir,
        num_images=args.num_images,
        edges=args.edges,
        probe_images=args.probe_images,
    )
    print(f"lkat-lens explorer on http://{args.host}:{args.port}/ (Ctrl+C to stop)")
    app.run(host=args.host, port=args.port, debug=args.debug)
