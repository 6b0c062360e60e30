"""The RBF grid is validated in one place: bad grids at construction and non-uniform stored grids on load."""

import pytest
import torch

import lkat_lens
from lkat_lens.checkpoint import CheckpointError, save_checkpoint
from lkat_lens.kernels.kan_triton import _grid_constants
from lkat_lens.kernels.rbf import check_grid, rbf_basis
from lkat_lens.models import create_model
from lkat_lens.models.kan import RadialBasis


@pytest.mark.parametrize("make", [lambda: RadialBasis(1.0, 1.0, 4), lambda: rbf_basis(torch.zeros(2), 2.0, -2.0, 4)])
def test_bad_grid_has_one_message(make):
    with pytest.raises(ValueError, match=r"need num_grids >= 2 and grid_max > grid_min"):
        make()


def test_kernels_use_the_same_check():
    with pytest.raises(ValueError, match=r"need num_grids >= 2 and grid_max > grid_min, got 1"):
        check_grid(-2.0, 2.0, 1)
    with pytest.raises(ValueError, match=r"need num_grids >= 2 and grid_max > grid_min, got 1"):
        _grid_constants(-2.0, 2.0, 1)


def test_uniform_stored_grid_loads_and_a_moved_centre_is_refused_by_name(tmp_path):
    torch.manual_seed(0)
    model = create_model("lkat_micro", num_classes=10)
    sd = model.state_dict()
    key = next(k for k in sd if k.endswith("rbf.grid"))
    good = tmp_path / "good.pt"
    save_checkpoint(good, model_name="lkat_micro", model_kwargs={"num_classes": 10}, state_dict=sd)
    loaded, _ = lkat_lens.load(good)
    assert torch.equal(loaded.state_dict()[key], sd[key])

    bad_sd = dict(sd)
    bad_sd[key] = sd[key].clone()
    bad_sd[key][1] += 0.25
    bad = tmp_path / "bad.pt"
    save_checkpoint(bad, model_name="lkat_micro", model_kwargs={"num_classes": 10}, state_dict=bad_sd)
    with pytest.raises(CheckpointError) as err:
        lkat_lens.load(bad)
    message = str(err.value)
    assert key in message and "not the uniform grid" in message
    assert str(round(bad_sd[key][1].item(), 6)) in message
