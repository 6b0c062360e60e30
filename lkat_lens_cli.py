"""The `lkat-lens` command line: one subcommand per job; user errors exit 2 with one message.

This module sits outside the `lkat_lens` package on purpose: `import lkat_lens` imports torch and timm (it
registers the models with timm), which takes seconds, while `lkat-lens --help` and argument errors must answer
at once. Each subcommand imports its front end only once its arguments are parsed (docs/architecture.md).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence

UserError = (FileNotFoundError, ValueError)  # lkat_lens.checkpoint.CheckpointError is a ValueError
FIGURE_FORMATS = ("png", "svg", "pdf", "html")  # lkat_lens.figures.export.FORMATS (a test keeps them equal)


def cmd_info(args: argparse.Namespace) -> None:
    """Print a checkpoint's model card."""
    from lkat_lens.checkpoint import load
    from lkat_lens.study import format_card, model_card

    model, info = load(args.checkpoint, variant=args.variant)
    print(format_card(model_card(model, info)))


def cmd_analyze(args: argparse.Namespace) -> None:
    """Run every analysis on a sample of the checkpoint's data and write a JSON report; under torchrun the ranks
    share the streamed statistics out (rank 0 writes the report)."""
    import torch

    from lkat_lens import distributed
    from lkat_lens.analyses.serialize import write_json
    from lkat_lens.report import analyze
    from lkat_lens.study import Study

    torch.manual_seed(args.seed)
    device = args.device
    if distributed.launched_by_torchrun():
        device = distributed.setup(args.device or "auto").device
    try:
        study = Study.open(
            args.checkpoint,
            variant=args.variant,
            data=args.data,
            data_dir=args.data_dir,
            masks_dir=args.masks,
            num_images=args.num_images,
            probe_images=args.probe_images,
            attribution_images=args.attribution_images,
            device=device,
            batch_size=args.batch_size,
            progress=args.progress,
        )
        report = analyze(study, progress=args.progress)
    finally:
        distributed.teardown()
    if report is None:  # a rank other than 0
        return
    write_json(report, args.out)
    if study.device.type == "cuda":
        print(f"peak GPU memory: {torch.cuda.max_memory_allocated(study.device) / 2**30:.2f} GiB")
    print(f"wrote {args.out} ({', '.join(k for k in report if k not in ('checkpoint', 'model', 'data', 'sample'))})")


def cmd_figures(args: argparse.Namespace) -> None:
    """Write every figure of a checkpoint to args.out."""
    from lkat_lens.figures_cli import cmd_figures as run

    run(args)


def cmd_evaluate(args: argparse.Namespace) -> None:
    """Score every relevance map against the object masks."""
    from lkat_lens.evaluate import cmd_evaluate as run

    run(args)


def cmd_explore(args: argparse.Namespace) -> None:
    """Serve the explorer."""
    from lkat_lens.explore_cli import cmd_explore as run

    run(args)


def cmd_patch(args: argparse.Namespace) -> None:
    """Patch, ablate and attribute one image against a corruption; write JSON and figures."""
    from lkat_lens.patch_cli import cmd_patch as run

    run(args)


def at_least(minimum: int) -> Callable[[str], int]:
    """An argparse `type=`: an int of at least `minimum` (argparse prints the error and exits 2)."""

    def parse(text: str) -> int:
        value = int(text)  # a ValueError reads "invalid int value: 'x'"
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be at least {minimum}, got {value}")
        return value

    parse.__name__ = "int"
    return parse


def add_data_arguments(parser: argparse.ArgumentParser, num_images: int) -> None:
    """Where a subcommand's images come from and how many it analyses."""
    parser.add_argument(
        "--data",
        help="dataset name (default: the checkpoint's); 'images': every image file under --data-dir, without labels",
    )
    parser.add_argument("--data-dir", default="data", help="where cifar/imagefolder data or plain images live")
    parser.add_argument(
        "--masks",
        metavar="DIR",
        help="object masks of the held-out images: one PNG per image with its file stem (nonzero = object), "
        "as DIR/<class>/<stem>.png or DIR/<stem>.png (shapes draws its own)",
    )
    parser.add_argument("--num-images", type=at_least(1), default=num_images, help="held-out images analysed")
    parser.add_argument("--device", help="where the model runs: cpu, cuda or cuda:N (default: cuda when available)")
    parser.add_argument("--batch-size", type=at_least(1), default=64, help="images per forward pass of the statistics")


def add_progress_argument(parser: argparse.ArgumentParser) -> None:
    """--progress / --no-progress: the bars naming each step and pass, with images done and an ETA."""
    parser.add_argument(
        "--progress", action=argparse.BooleanOptionalAction, help="progress bars (default: when stderr is a terminal)"
    )


def add_checkpoint_argument(parser: argparse.ArgumentParser) -> None:
    """The checkpoint, and the variant for a reference-code state_dict."""
    parser.add_argument("checkpoint")
    parser.add_argument("--variant", help="registry name, for a reference-code state_dict")


def build_parser() -> argparse.ArgumentParser:
    """The argument parser with every subcommand (defining it imports nothing heavy)."""
    parser = argparse.ArgumentParser(prog="lkat-lens", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("train", help="train LKAT or a baseline (`lkat-lens train --help` lists its options)")

    info = sub.add_parser("info", help="print a checkpoint's model card")
    add_checkpoint_argument(info)
    info.set_defaults(func=cmd_info)

    analyze = sub.add_parser("analyze", help="run every analysis and write a JSON report")
    add_checkpoint_argument(analyze)
    add_data_arguments(analyze, num_images=64)
    analyze.add_argument("--probe-images", type=at_least(2), default=256, help="training images the probes fit on")
    analyze.add_argument("--attribution-images", type=int, default=4)
    analyze.add_argument("--seed", type=int, default=0)
    analyze.add_argument("--out", default="report.json")
    add_progress_argument(analyze)
    analyze.set_defaults(func=cmd_analyze)

    figs = sub.add_parser("figures", help="write edge-function grids, gate, norm, attention and attribution figures")
    add_checkpoint_argument(figs)
    add_data_arguments(figs, num_images=64)
    figs.add_argument("--out", default="figures", help="output folder")
    figs.add_argument("--format", choices=FIGURE_FORMATS, default="png", dest="fmt")
    figs.add_argument("--blocks", default="all", help="'all' or block numbers such as 0,5,11")
    figs.add_argument(
        "--edges", type=at_least(1), default=16, help="edge functions per layer grid (most important first)"
    )
    figs.add_argument("--overlay-images", type=int, default=4, help="images shown with attention/attribution maps")
    figs.add_argument("--seed", type=int, default=0)
    add_progress_argument(figs)
    figs.set_defaults(func=cmd_figures)

    evaluate = sub.add_parser(
        "evaluate",
        help="are the maps right? score attributions, class-token attention and rollouts against object masks",
    )
    add_checkpoint_argument(evaluate)
    add_data_arguments(evaluate, num_images=64)
    evaluate.add_argument(
        "--methods", default="all", help="'all' or a comma-separated list, e.g. integrated_gradients,rollout,random"
    )
    evaluate.add_argument(
        "--explain", choices=("predicted", "label"), default="predicted", help="the class each map explains"
    )
    evaluate.add_argument(
        "--mprt-images", type=at_least(0), default=16, help="images of the randomisation test (0: none)"
    )
    evaluate.add_argument("--out", default="evaluation", help="output folder (evaluation.json and figures)")
    evaluate.add_argument("--format", choices=FIGURE_FORMATS, default="png", dest="fmt")
    evaluate.add_argument("--seed", type=int, default=0)
    evaluate.set_defaults(func=cmd_evaluate)

    explore = sub.add_parser("explore", help="serve the interactive explorer of one or more checkpoints")
    explore.add_argument("checkpoints", nargs="+", help="one or more lkat-lens checkpoints, shown side by side")
    add_data_arguments(explore, num_images=32)
    explore.add_argument(
        "--edges", type=at_least(1), default=8, help="edge functions per layer grid (most important first)"
    )
    explore.add_argument(
        "--probe-images", type=at_least(2), default=256, help="training images the linear probes fit on"
    )
    explore.add_argument("--host", default="127.0.0.1", help="interface to bind (default: local only)")
    explore.add_argument("--port", type=int, default=8050)
    explore.add_argument("--debug", action="store_true", help="Dash debug mode (reloader, tracebacks in the page)")
    explore.set_defaults(func=cmd_explore)
    patch = sub.add_parser(
        "patch", help="activation patching, ablations with controls, direct logit attribution and the logit lens"
    )
    add_checkpoint_argument(patch)
    patch.add_argument("--clean", required=True, help="a sample image index (e.g. 3) or an image file")
    patch.add_argument(
        "--corrupt", required=True, help="noise, blur, shuffle (seeded), or a sample image index or an image file"
    )
    patch.add_argument("--target", type=int, help="class whose logit is measured (default: the clean prediction)")
    patch.add_argument("--points", default="all", help="hook points to patch: 'all' or e.g. resid_pre,heads,gate,fc1")
    patch.add_argument(
        "--ablate", default="heads", help="hook point ablated four ways (zero/mean/noise/resample), or none"
    )
    patch.add_argument("--reference-images", type=int, default=16, help="sample images the ablations draw from")
    patch.add_argument("--data", help="dataset name (default: the checkpoint's)")
    patch.add_argument("--data-dir", default="data", help="where cifar/imagefolder data live")
    patch.add_argument("--device", help="where the model runs: cpu, cuda or cuda:N (default: cuda when available)")
    patch.add_argument("--seed", type=int, default=0)
    patch.add_argument("--format", choices=FIGURE_FORMATS, default="png", dest="fmt")
    patch.add_argument("--out", default="interventions", help="output folder")
    patch.set_defaults(func=cmd_patch)
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
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["train"]:  # the trainer parses its own options (python -m lkat_lens.train is the same)
        from lkat_lens.train import main as train

        return train(argv[1:], prog="lkat-lens train")
    args = build_parser().parse_args(argv)
    return run_user_command(lambda: args.func(args))


if __name__ == "__main__":
    sys.exit(main())
