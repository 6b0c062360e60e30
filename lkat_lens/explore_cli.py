"""`lkat-lens explore`: serve the interactive explorer of one or more checkpoints (127.0.0.1, debug off)."""

from __future__ import annotations

import argparse
import errno
import socket


def cmd_explore(args: argparse.Namespace) -> None:
    """Load the checkpoints and serve the explorer until interrupted."""
    from lkat_lens.apps.explorer import create_app

    check_port_free(args.host, args.port)
    app = create_app(
        args.checkpoints,
        data=args.data,
        data_dir=args.data_dir,
        masks_dir=args.masks,
        num_images=args.num_images,
        edges=args.edges,
        probe_images=args.probe_images,
        device=args.device,
        batch_size=args.batch_size,
    )
    print(f"lkat-lens explorer on http://{args.host}:{args.port}/ (Ctrl+C to stop)")
    app.run(host=args.host, port=args.port, debug=args.debug)


def check_port_free(host: str, port: int) -> None:
    """Refuse a port another program already listens on, before any checkpoint is loaded."""
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM) as probe:
        try:
            probe.bind((host, port))
        except OSError as err:
            if err.errno == errno.EADDRINUSE:
                raise ValueError(f"port {port} on {host} is in use; pick another one with --port") from None
            raise ValueError(f"cannot listen on {host}:{port} ({err.strerror})") from None
