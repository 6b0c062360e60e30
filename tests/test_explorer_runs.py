"""The explorer and `lkat-lens figures` on a run folder: telemetry over epochs, snapshots to compare and slide over."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from local_server import dash_browser
from selenium.webdriver.common.keys import Keys
from selenium.webdriver.support.ui import WebDriverWait

from lkat_lens import train
from lkat_lens.apps.explorer import create_app
from lkat_lens.apps.views import training
from lkat_lens.figures_cli import make_figures
from lkat_lens.runs import RunFolder, checkpoint_of, run_folder_of

BROWSER = shutil.which("chromium") and shutil.which("chromedriver")
EPOCHS = 3


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory) -> Path:
    """A real 3-epoch digits run with telemetry and a snapshot after every epoch (6 steps an epoch)."""
    out = tmp_path_factory.mktemp("runs")
    argv = ["--epochs", str(EPOCHS), "--batch-size", "256", "--threads", "1", "--snapshot-every", "1"]
    assert train.main([*argv, "--name", "snap", "--out-dir", str(out)]) == 0
    return out / "snap"


def test_run_folder_names_its_checkpoint_snapshots_and_telemetry(run_dir, tmp_path):
    run = RunFolder(run_dir)
    assert run.checkpoint == run_dir / "best.pt" and checkpoint_of(run_dir) == run.checkpoint
    assert [e for e, _ in run.snapshots] == list(range(1, EPOCHS + 1))
    epochs = [r["epoch"] for r in run.telemetry() if r["kind"] == "epoch"]
    assert epochs == list(range(1, EPOCHS + 1))
    assert run_folder_of(run_dir / "last.pt") == run and run_folder_of(tmp_path / "x.pt") is None
    with pytest.raises(FileNotFoundError, match="without best.pt or last.pt"):
        checkpoint_of(tmp_path)


def test_figures_of_a_run_folder_include_the_telemetry(run_dir, tmp_path):
    paths = make_figures(run_dir, tmp_path, fmt="html", blocks="0", edges=2, num_images=8, overlay_images=1)
    names = {p.stem for p in paths}
    assert {"training_kan_output_residual_ratio", "training_gate_half_life_median", "training_resid_norm"} <= names
    html = (tmp_path / "training_kan_grid_span_share.html").read_text()
    assert "block 0" in html and "block 3" in html


def test_training_view_reads_the_run(run_dir):
    app = create_app(run_dir, num_images=8, edges=3, probe_images=32)
    state = app.explorer_state
    assert state.labels() == ["snap/best.pt"] + [f"snap/epoch_{e:03d}.pt" for e in range(1, EPOCHS + 1)]
    assert len(state.checkpoints) == 1  # snapshots load when first picked
    ckpt = state[0]
    fig = training.telemetry(ckpt, "kan_output_residual_ratio", [2])
    assert {trace.name for trace in fig.data} == {"block 2 · fc1", "block 2 · fc2"}
    assert all(list(trace.x) == list(range(1, EPOCHS + 1)) for trace in fig.data)
    assert training.snapshot_marks(state, ckpt) == {1: "1", 2: "2", 3: "3"}
    curves = training.snapshot_curves(state, ckpt, 1, 2)
    assert curves.layout.title.text.startswith("epoch 2: block 1 fc1") and len(curves.data) == 3 * 3
    assert state[2].path == run_dir / "epoch_002.pt"  # the snapshot is a checkpoint like the others
    assert training.telemetry(state.at(run_dir / "epoch_001.pt"), "grad_norm", None).data


@pytest.mark.skipif(not BROWSER, reason="needs Debian's chromium and chromium-driver on PATH")
def test_training_tab_in_the_browser(run_dir):
    app = create_app(run_dir, num_images=8, edges=3, probe_images=32)
    with dash_browser(app) as duo:
        duo.wait_for_page(url=duo.server_url + "/?block=1&tab=training&compare=2")
        script = (
            "const g = document.querySelector('#' + arguments[0] + ' .js-plotly-plot');"
            "return g && g.data && g.data.length ? JSON.stringify([g.data.map(t => t.name), g.layout.title.text]) "
            ": null;"
        )
        names, title = json.loads(
            WebDriverWait(duo.driver, 60).until(lambda d: d.execute_script(script, "telemetry-figure"))
        )
        assert set(names) == {"block 1 · fc1", "block 1 · fc2"} and "dormant below 1e-3" in title
        _, title = json.loads(
            WebDriverWait(duo.driver, 60).until(lambda d: d.execute_script(script, "snapshot-curves"))
        )
        assert title.startswith(f"epoch {EPOCHS}: block 1 fc1")
        marks = duo.find_elements("#snapshot-epoch .dash-slider-mark")
        assert [m.text for m in marks] == [str(e) for e in range(1, EPOCHS + 1)]
        thumb = duo.find_element("#snapshot-epoch [role=slider]")
        thumb.send_keys(Keys.HOME)  # slide back to the first snapshot: the block's curves are redrawn from it
        WebDriverWait(duo.driver, 60).until(
            lambda d: (json.loads(d.execute_script(script, "snapshot-curves") or "[[], '']")[1] or "").startswith(
                "epoch 1: block 1 fc1"
            )
        )
        duo.wait_for_contains_text("#compare", "snap/epoch_002.pt", timeout=30)
