"""The procedural shapes dataset: determinism, masks that cover exactly the class object, normalisation, export
to an ImageFolder with masks and back through --masks, mask errors, and a real training run on it."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

import lkat_lens_cli
from lkat_lens import data as lkdata
from lkat_lens import shapes
from lkat_lens import train as lktrain
from lkat_lens.study import Study

pytestmark = pytest.mark.usefixtures("keep_torch_threads")


def eval_info(img_size: int, crop_pct: float = 1.0) -> dict:
    """A checkpoint's data dict for shapes at `img_size`."""
    mean, std = lkdata.NORMALIZATION["shapes"]
    return {"name": "shapes", "img_size": img_size, "mean": list(mean), "std": list(std), "crop_pct": crop_pct}


def test_images_and_masks_are_deterministic_per_split_index_and_seed():
    a, b = shapes.ShapesDataset("train", 32), shapes.ShapesDataset("train", 32)
    for i in (0, 7, 9999):
        assert np.array_equal(np.asarray(a[i][0]), np.asarray(b[i][0])) and a[i][1] == b[i][1]
        assert np.array_equal(a.mask(i), b.mask(i))
    val, other_seed = shapes.ShapesDataset("val", 32), shapes.ShapesDataset("train", 32, seed=1)
    for other in (val, other_seed):
        assert not np.array_equal(np.asarray(a[3][0]), np.asarray(other[3][0]))
    # the same scene at every size: the class object keeps its place, size and colour
    big = shapes.ShapesDataset("train", 128)
    assert big.scene(5).target == a.scene(5).target and big.scene(5).distractors == a.scene(5).distractors
    assert (len(a), len(val), len(shapes.ShapesDataset("val", 16, num_images=30))) == (10_000, 2_000, 30)
    assert a.classes == list(shapes.FORMS) and a.targets[:7] == [0, 1, 2, 3, 4, 5, 0]
    image, label = a[2]
    assert image.mode == "RGB" and image.size == (32, 32) and a.mask(2).shape == (32, 32) and a.mask(2).dtype == bool


@pytest.mark.parametrize("size", [16, 64])
def test_mask_is_exactly_the_pixels_the_class_object_paints(size):
    """Independent of the mask code: repaint the object in two colours that differ in every channel; the pixels
    that change are the object's. Drawing the object changes nothing outside its mask."""
    ds = shapes.ShapesDataset("val", size)
    over_distractor = 0
    for i in range(36):
        scene = ds.scene(i)
        black = shapes.render(shapes.with_target_color(scene, (0.0, 0.0, 0.0)), size)
        white = shapes.render(shapes.with_target_color(scene, (1.0, 1.0, 1.0)), size)
        painted = (black != white).any(axis=-1)
        mask = ds.mask(i)
        assert mask.any() and np.array_equal(mask, painted), i
        full, without = np.asarray(ds[i][0]), shapes.render(scene, size, target=False)
        assert np.array_equal(full[~mask], without[~mask])
        assert (full[mask] == np.round(np.asarray(scene.target.color) * 255)).all()
        drawn_below = np.zeros_like(mask)
        for stroke in scene.distractors:
            drawn_below |= shapes.stroke_mask(stroke, size)
        over_distractor += int((drawn_below & mask).any())
    assert over_distractor > 0  # some objects lie over distractors, and their mask still holds all their pixels


def form_area_and_perimeter(form: str, r: float) -> tuple[float, float]:
    """Closed-form area and perimeter of a class form of circumscribed radius r."""
    if form == "circle":
        return math.pi * r**2, 2 * math.pi * r
    if form == "ring":
        return math.pi * r**2 * (1 - 0.55**2), 2 * math.pi * r * 1.55
    if form in ("square", "triangle"):
        n = 4 if form == "square" else 3
        return n / 2 * r**2 * math.sin(2 * math.pi / n), n * 2 * r * math.sin(math.pi / n)
    if form == "star":  # ten triangles centre - tip (r) - notch (0.42 r), 36 degrees apart
        edge = r * math.sqrt(1 + 0.42**2 - 2 * 0.42 * math.cos(math.pi / 5))
        return 10 * 0.5 * r * 0.42 * r * math.sin(math.pi / 5), 10 * edge
    w, arm = 0.3 * r, math.sqrt(1 - 0.3**2) * r  # plus sign: two bars 2w x 2arm, crossing in a 2w x 2w square
    return 2 * (2 * w) * (2 * arm) - (2 * w) ** 2, 8 * arm


def test_mask_has_the_area_of_the_form():
    """The mask's pixel count matches the form's closed-form area to within a one-pixel band along its outline."""
    size = 224
    ds = shapes.ShapesDataset("train", size)
    for i in range(12):
        target = ds.scene(i).target
        assert target.form == shapes.FORMS[ds.targets[i]]
        area, perimeter = form_area_and_perimeter(target.form, target.radius * size)
        assert abs(int(ds.mask(i).sum()) - area) <= perimeter, (i, target.form)
        ys, xs = np.nonzero(ds.mask(i))  # wholly inside, at the drawn position
        assert abs(xs.mean() + 0.5 - target.cx * size) < 0.1 * target.radius * size + 1


def test_normalisation_matches_the_generated_pixels():
    ds = shapes.ShapesDataset("train", 32)
    pixels = np.stack([shapes.render(ds.scene(i), 32) for i in range(1500)]).reshape(-1, 3) / 255.0
    mean, std = lkdata.NORMALIZATION["shapes"]
    np.testing.assert_allclose(pixels.mean(axis=0), mean, atol=1e-2)
    np.testing.assert_allclose(pixels.std(axis=0), std, atol=1e-2)
    assert lkdata.DEFAULT_IMG_SIZE["shapes"] == 224 and "shapes" in lkdata.DATASETS


def test_build_dataset_passes_size_and_options_and_reports_bad_ones():
    ds = lkdata.build_dataset("shapes", "val", img_size=24, options={"val_images": 40, "seed": 3})
    assert isinstance(ds, shapes.ShapesDataset) and (len(ds), ds.img_size, ds.seed) == (40, 24, 3)
    assert lkdata.build_dataset("shapes", "train").img_size == 224
    with pytest.raises(lkdata.DataError, match="no option"):
        lkdata.build_dataset("shapes", "val", options={"colours": 2})
    with pytest.raises(lkdata.DataError, match="at least one val image"):
        lkdata.build_dataset("shapes", "val", options={"val_images": 0})


def test_sample_masks_follow_the_eval_geometry():
    """With crop_pct 0.875 the images are resized 32 -> 36 and centre-cropped; the masks take the same path
    (nearest pixel: output j reads input floor((j + 0.5) * 32 / 36))."""
    ds = shapes.ShapesDataset("val", 32)
    for crop_pct in (1.0, 0.875):
        sample = lkdata.load_sample(eval_info(32, crop_pct), "val", 6)
        order = torch.randperm(len(ds), generator=torch.Generator().manual_seed(0))[:6].tolist()
        assert sample.masks.shape == (6, 32, 32) and sample.masks.dtype == torch.bool
        src = np.floor((np.arange(2, 34) + 0.5) * 32 / 36).astype(int) if crop_pct < 1 else np.arange(32)
        for k, i in enumerate(order):
            assert torch.equal(sample.masks[k], torch.from_numpy(ds.mask(i)[np.ix_(src, src)]))
            assert sample.labels[k] == ds.targets[i]


def exported(tmp_path: Path) -> Path:
    out = tmp_path / "shapes16"
    assert shapes.main(["export", str(out), "--img-size", "16", "--train", "6", "--val", "12"]) == 0
    return out


def test_export_round_trip_through_imagefolder_and_masks_dir(tmp_path):
    out = exported(tmp_path)
    assert sorted(p.name for p in (out / "train").iterdir()) == sorted(shapes.FORMS)
    assert len(list((out / "val").rglob("*.png"))) == 12 and len(list((out / "masks" / "val").rglob("*.png"))) == 12
    info = eval_info(16) | {"name": "imagefolder"}
    sample = lkdata.load_sample(info, "val", 12, data_dir=out, masks_dir=out / "masks" / "val")
    folder = lkdata.build_dataset("imagefolder", "val", data_dir=out)
    order = torch.randperm(12, generator=torch.Generator().manual_seed(0)).tolist()
    own = shapes.ShapesDataset("val", 16, num_images=12)
    to_tensor = lkdata.eval_transform_for(eval_info(16))
    for k, i in enumerate(order):
        index = int(Path(folder.samples[i][0]).stem)  # exported as <form>/<index>.png
        assert torch.equal(sample.masks[k], torch.from_numpy(own.mask(index)))
        assert torch.equal(sample.images[k], to_tensor(own.image(index)))
        assert folder.classes[sample.labels[k]] == shapes.FORMS[own.targets[index]]


def test_masks_dir_accepts_flat_and_rescaled_masks(tmp_path):
    out = exported(tmp_path)
    flat = tmp_path / "flat"
    flat.mkdir()
    for path in (out / "masks" / "val").rglob("*.png"):  # flat layout, twice the size, as a palette image
        Image.open(path).resize((32, 32), Image.NEAREST).convert("P").save(flat / path.name)
    info = eval_info(16) | {"name": "imagefolder"}
    nested = lkdata.load_sample(info, "val", 12, data_dir=out, masks_dir=out / "masks" / "val")
    assert torch.equal(lkdata.load_sample(info, "val", 12, data_dir=out, masks_dir=flat).masks, nested.masks)


def test_bad_masks_dir_is_one_clear_data_error(tmp_path):
    out = exported(tmp_path)
    info = eval_info(16) | {"name": "imagefolder"}
    masks = out / "masks" / "val"
    with pytest.raises(lkdata.DataError, match="masks folder .*nowhere does not exist"):
        lkdata.load_sample(info, "val", 4, data_dir=out, masks_dir=tmp_path / "nowhere")
    with pytest.raises(lkdata.DataError, match="no file names"):
        lkdata.load_sample(eval_info(16), "val", 4, masks_dir=masks)
    victim = next((masks / "ring").glob("*.png"))
    victim.unlink()
    with pytest.raises(lkdata.DataError, match=f"no mask for image .*{victim.name}"):
        lkdata.load_sample(info, "val", 12, data_dir=out, masks_dir=masks)
    Image.new("L", (16, 20)).save(victim)
    with pytest.raises(lkdata.DataError, match=f"mask {victim} is 16x20 .* different aspect ratio"):
        lkdata.load_sample(info, "val", 12, data_dir=out, masks_dir=masks)


def test_trainer_runs_on_shapes_and_analyses_rebuild_its_val_set(tmp_path, capsys):
    argv = "--data shapes --img-size 16 --model lkat_micro --threads 1 --epochs 1 --max-steps 2 --batch-size 16"
    argv += f" --train-images 64 --val-images 24 --no-telemetry --name s --out-dir {tmp_path}"
    assert lktrain.main(argv.split()) == 0, capsys.readouterr().err
    capsys.readouterr()
    ckpt = torch.load(tmp_path / "s" / "last.pt", map_location="cpu", weights_only=True)
    data = ckpt["data"]
    assert (data["name"], data["img_size"], data["class_names"], data["crop_pct"]) == (
        "shapes",
        16,
        list(shapes.FORMS),
        1.0,
    )
    assert data["options"] == {"train_images": 64, "val_images": 24, "seed": 0}
    study = Study.open(tmp_path / "s" / "best.pt", device="cpu", num_images=8)
    own = shapes.ShapesDataset("val", 16, num_images=24)
    order = torch.randperm(24, generator=torch.Generator().manual_seed(0))[:8].tolist()
    assert torch.equal(study.sample.masks, torch.stack([torch.from_numpy(own.mask(i)) for i in order]))
    for command in ("analyze", "figures", "explore"):  # --masks reaches the sample; a bad folder is one line, exit 2
        argv = [command, str(tmp_path / "s" / "best.pt"), "--device", "cpu", "--masks", str(tmp_path / "none")]
        assert lkat_lens_cli.main(argv + (["--port", "0"] if command == "explore" else [])) == 2
        err = capsys.readouterr().err  # after any progress bar: one error line
        assert err.splitlines()[-1] == f"lkat-lens: error: masks folder {tmp_path / 'none'} does not exist", command
        assert err.count("error") == 1, command


def test_dataset_size_flags_are_for_shapes_only():
    parse = lktrain.build_parser().parse_args
    with pytest.raises(lktrain.UsageError, match="--train-images applies to procedural datasets"):
        lktrain.resolve_config(parse(["--data", "digits", "--train-images", "10"]), None)
    with pytest.raises(lktrain.UsageError, match="--val-images is out of range"):
        lktrain.resolve_config(parse(["--data", "shapes", "--val-images", "0"]), None)
    with pytest.raises(lktrain.UsageError, match="--cache-images applies to procedural datasets"):
        lktrain.resolve_config(parse(["--data", "digits", "--cache-images"]), None)
    cfg = lktrain.resolve_config(parse(["--data", "shapes"]), None)
    assert (cfg.recipe, cfg.img_size, cfg.model) == ("shapes", 224, "lkat_tiny_patch16_224")


@pytest.mark.parametrize("workers", [0, 2])
def test_images_drawn_into_memory_are_the_images_drawn_on_the_fly(workers):
    on_the_fly = shapes.ShapesDataset("val", 24, num_images=13, seed=3)
    cached = shapes.ShapesDataset("val", 24, num_images=13, seed=3).draw_all(workers, batch_size=4)
    assert cached.pixels.shape == (13, 24, 24, 3) and cached.pixels.dtype == torch.uint8
    for i in range(13):
        assert np.array_equal(np.asarray(cached[i][0]), np.asarray(on_the_fly[i][0])), i
        assert cached[i][1] == on_the_fly[i][1]


def test_trainer_with_cache_images_trains_as_without(tmp_path, capsys):
    """--cache-images changes where the pixels come from, not what the run sees: the same losses."""
    losses = {}
    for flag in ("", " --cache-images"):
        argv = "--data shapes --img-size 16 --model lkat_micro --threads 1 --epochs 1 --max-steps 3 --batch-size 8"
        argv += f" --train-images 32 --val-images 8 --no-telemetry --name r{len(flag)} --out-dir {tmp_path}{flag}"
        assert lktrain.main(argv.split()) == 0, capsys.readouterr().err
        lines = (tmp_path / f"r{len(flag)}" / "metrics.jsonl").read_text().splitlines()
        losses[flag] = [json.loads(line)["train_loss"] for line in lines]
    assert losses[""] == losses[" --cache-images"]
