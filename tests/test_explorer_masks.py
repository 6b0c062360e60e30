"""The explorer's Attributions tab on a dataset with object masks: the mask outline and the map's scores."""

import shutil

import pytest
from local_server import dash_browser
from test_explorer import graph_data, open_page

from lkat_lens.apps.explorer import create_app
from lkat_lens.apps.views import attributions

needs_browser = pytest.mark.skipif(
    not (shutil.which("chromium") and shutil.which("chromedriver")),
    reason="needs Debian's chromium and chromium-driver",
)


@pytest.fixture(scope="module")
def app(shapes_checkpoint):
    """The explorer of a shapes checkpoint (4 sample images with masks)."""
    return create_app([shapes_checkpoint], num_images=4, edges=2, probe_images=24, device="cpu")


def test_overlay_outlines_the_mask_and_the_scores_are_the_studys(app):
    ckpt = app.explorer_state[0]
    overlay, _ = attributions.dataset_figures(ckpt, 1, "saliency", None)
    outlines = [t for t in overlay.data if t.type == "contour"]
    assert len(outlines) == 2  # on the image and on the attribution
    assert [list(row) for row in outlines[0].z] == ckpt.sample.masks[1].double().tolist()
    table = str(attributions.score_table(ckpt, 1, "saliency", None))
    scores = ckpt.map_scores(1, "saliency")
    assert f"{scores['relevance_mass']:.3f}" in table and "relevance mass" in table


@needs_browser
def test_attributions_tab_shows_mask_and_scores(app):
    with dash_browser(app) as duo:
        open_page(duo, "?block=0&image=2&head=0&tab=attributions")
        duo.wait_for_contains_text("#attribution-scores", "relevance mass", timeout=60)
        assert "image 2 against its object mask" in duo.find_element("#attribution-scores").text
        assert "contour" in graph_data(duo, "attribution-figure")
        assert duo.get_logs() == []
