"""The `lkat-lens` command line: answers --help and argument errors without importing torch; one-line user errors."""

from __future__ import annotations

import shutil
import socket
import subprocess
import sys

import lkat_lens_cli
from lkat_lens.figures import export

NO_TORCH = """
import sys, lkat_lens_cli
try:
    lkat_lens_cli.main({argv!r})
except SystemExit as end:
    print("exit", end.code)
print("torch imported:", "torch" in sys.modules)
"""


def run_cli_in_fresh_interpreter(argv: list[str]) -> subprocess.CompletedProcess:
    code = NO_TORCH.format(argv=argv)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)


def test_help_and_argument_errors_never_import_torch():
    shown = run_cli_in_fresh_interpreter(["--help"])
    assert "exit 0" in shown.stdout and "torch imported: False" in shown.stdout
    assert all(name in shown.stdout for name in ("train", "info", "analyze", "figures", "explore"))
    wrong = run_cli_in_fresh_interpreter(["figures", "ckpt.pt", "--format", "gif"])
    assert "exit 2" in wrong.stdout and "torch imported: False" in wrong.stdout
    assert "invalid choice: 'gif'" in wrong.stderr


def test_console_script_is_installed():
    assert shutil.which("lkat-lens", path=str(sys.exec_prefix) + "/bin") or shutil.which("lkat-lens")


def test_figure_formats_match_the_figure_export():
    assert lkat_lens_cli.FIGURE_FORMATS == export.FORMATS


def test_train_subcommand_is_the_trainer(capsys):
    try:
        lkat_lens_cli.main(["train", "--help"])
    except SystemExit as end:
        assert end.code == 0
    shown = capsys.readouterr().out
    assert "usage: lkat-lens train" in shown and "--epochs" in shown


def test_explore_on_a_port_in_use_exits_2_before_loading(digits_checkpoint):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        argv = ["-m", "lkat_lens_cli", "explore", str(digits_checkpoint), "--port", str(port)]
        done = subprocess.run([sys.executable, *argv], capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    assert done.stderr == f"lkat-lens: error: port {port} on 127.0.0.1 is in use; pick another one with --port\n"
    assert "running on" not in done.stdout.lower()


def test_counts_below_their_minimum_are_argument_errors():
    """--batch-size, --num-images, --edges, --probe-images and --mprt-images below their minimum: argparse's
    one-line error naming the option, exit 2, before torch is imported."""
    cases = [(command, "--batch-size", "0", 1) for command in ("analyze", "figures", "evaluate", "explore")] + [
        ("analyze", "--num-images", "0", 1),
        ("explore", "--num-images", "-3", 1),
        ("figures", "--edges", "0", 1),
        ("explore", "--edges", "0", 1),
        ("analyze", "--probe-images", "1", 2),
        ("explore", "--probe-images", "1", 2),
        ("evaluate", "--mprt-images", "-1", 0),
    ]
    for command, option, value, minimum in cases:
        done = run_cli_in_fresh_interpreter([command, "ckpt.pt", option, value])
        assert "exit 2" in done.stdout and "torch imported: False" in done.stdout, (command, option)
        error = f"lkat-lens {command}: error: argument {option}: must be at least {minimum}, got {int(value)}\n"
        assert done.stderr.endswith(error), done.stderr
    done = run_cli_in_fresh_interpreter(["figures", "ckpt.pt", "--edges", "many"])
    assert done.stderr.endswith("argument --edges: invalid int value: 'many'\n"), done.stderr


def test_device_errors_are_one_line(digits_checkpoint, capsys):
    """Issue 15: --device on analyze; a bad value exits 2 with one message."""
    assert lkat_lens_cli.main(["analyze", str(digits_checkpoint), "--device", "tpu9"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "unknown device 'tpu9'; use cpu, cuda or cuda:N" in err
