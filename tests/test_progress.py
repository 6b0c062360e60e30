"""Progress bars of the Study's streaming passes: they name the pass and count the images; off when asked or when
the output is not a terminal."""

import io

import pytest

from lkat_lens.study import Study


def study_writing_to(checkpoint, progress):
    out = io.StringIO()
    study = Study.open(checkpoint, num_images=6, batch_size=4, device="cpu", progress=progress, progress_file=out)
    return study, out


def test_a_forced_bar_names_the_pass_and_counts_the_images(digits_checkpoint):
    study, out = study_writing_to(digits_checkpoint, True)
    study.token_norms()
    study.span_shares()
    text = out.getvalue().replace("\r", "\n")
    done = [line for line in text.splitlines() if "100%" in line]  # tqdm may draw a finished bar twice
    for name in ("token norms", "grid span of the KAN inputs"):  # images done, time, rate
        assert any(line.startswith(f"{name}: 100%") and "6/6 [" in line for line in done), text
    assert done[0].startswith("token norms") and done[-1].startswith("grid span"), text  # the passes in order
    assert all("image/s" in line or "s/image" in line for line in done), text
    assert "<" in text.split("token norms:")[1]  # the elapsed<remaining (ETA) field


@pytest.mark.parametrize("progress", [False, None])  # None: only at a terminal, and a StringIO is none
def test_no_bar_when_off_or_not_a_terminal(digits_checkpoint, progress):
    study, out = study_writing_to(digits_checkpoint, progress)
    study.token_norms()
    assert out.getvalue() == ""
