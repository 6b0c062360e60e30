"""`--data images`: a plain folder of images without labels (accuracy and probes left out, with the reason)."""

import pytest
import torch
from PIL import Image
from test_data import write_image_folder

import lkat_lens_cli as cli
from lkat_lens import data as lkdata
from lkat_lens import report
from lkat_lens.checkpoint import load
from lkat_lens.study import NeedsLabelsError, Study


@pytest.fixture(scope="module")
def plain(tmp_path_factory):
    """12 PNGs in nested folders (train/ant/0.png, ...) plus a file that is no image."""
    root = tmp_path_factory.mktemp("plain")
    write_image_folder(root, ["ant", "bee"], per_class=(4, 2))
    (root / "notes.txt").write_text("not an image")
    return root


def test_every_image_file_under_the_folder_sorted_without_labels(plain):
    found = lkdata.build_dataset("images", "val", data_dir=plain)
    files = sorted(p for p in plain.rglob("*.png"))
    assert found.files == files and len(found) == 12 and found.classes == []
    image, label = found[3]
    assert label == lkdata.NO_LABEL == -1
    assert image.tobytes() == Image.open(files[3]).convert("RGB").tobytes()


def test_the_sample_is_the_eval_transform_of_the_files(plain, digits_checkpoint):
    info = load(digits_checkpoint)[1]
    sample = lkdata.load_sample(info.data, "val", 5, name="images", data_dir=plain)
    assert not sample.labelled and sample.labels.tolist() == [-1] * 5
    files = sorted(plain.rglob("*.png"))
    order = torch.randperm(12, generator=torch.Generator().manual_seed(0))[:5]
    transform = lkdata.eval_transform_for(info.data)
    want = torch.stack([transform(Image.open(files[int(i)]).convert("RGB")) for i in order])
    torch.testing.assert_close(sample.images, want, rtol=0, atol=0)


@pytest.mark.parametrize("setup", ["missing", "empty"])
def test_a_missing_or_empty_folder_is_one_clear_error(tmp_path, setup):
    root = tmp_path / "pictures"
    if setup == "empty":
        root.mkdir()
        (root / "readme.md").write_text("no pictures here")
    with pytest.raises(lkdata.DataError, match="not a folder" if setup == "missing" else "no image files"):
        lkdata.build_dataset("images", "val", data_dir=root)


def test_analyses_that_need_labels_say_so(plain, digits_checkpoint):
    study = Study.open(digits_checkpoint, data="images", data_dir=plain, num_images=4, device="cpu")
    assert not study.has_labels and study.class_name(-1) == "no label"
    for ask in (study.probes, lambda: study.sample_top1):
        with pytest.raises(NeedsLabelsError, match="needs labelled images"):
            ask()


def test_the_report_leaves_out_accuracy_and_probes_with_the_reason(plain, digits_checkpoint):
    study = Study.open(digits_checkpoint, data="images", data_dir=plain, num_images=6, device="cpu", progress=False)
    found = report.sample_report(study)
    assert found["sample"] == {"images": 6} and set(found["left_out"]) == {"top1_percent", "probes"}
    assert all("needs labelled images" in reason for reason in found["left_out"].values())
    assert "probes" not in report.analyses_for(study) and "attributions" in report.analyses_for(study)
    with torch.no_grad():
        predicted = study.model(study.images(slice(0, 2))).argmax(-1)
    assert torch.equal(study.attribution(slice(0, 2), "saliency").target, predicted)  # the predicted class


def test_analyze_of_a_missing_folder_is_one_line(digits_checkpoint, tmp_path, capsys):
    argv = ["analyze", str(digits_checkpoint), "--data", "images", "--data-dir", str(tmp_path / "no"), "--no-progress"]
    assert cli.main([*argv, "--out", str(tmp_path / "r.json")]) == 2
    assert "not a folder" in capsys.readouterr().err and not (tmp_path / "r.json").exists()


def test_the_explorer_says_why_it_has_no_probes(plain, digits_checkpoint):
    from lkat_lens.apps.callbacks import predictions_view
    from lkat_lens.apps.explorer import create_app
    from lkat_lens.apps.views import probes

    app = create_app(digits_checkpoint, data="images", data_dir=plain, num_images=3, edges=2, device="cpu")
    ckpt = app.explorer_state[0]
    assert "needs labelled images" in probes.probe_figure(ckpt, depth=1).layout.title.text
    assert "image 0 (no label) top-5 predictions" in str(predictions_view(ckpt, 0)[0])
