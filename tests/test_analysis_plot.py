"""`otel-mindformers plot`: the images decode, have their size, and every panel has its curves."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from otel_mindformers.analysis.plot import ALERT_COLOR, NONFINITE_COLOR, ema, plot
from otel_mindformers.outputs.jsonl_reader import read_logs
from tests.support.cli import cli
from tests.support.paths import LOG_FIXTURES as FIXTURES
from tests.support.plot_pixels import count, load, panels, spread

pytestmark = pytest.mark.analysis


@pytest.mark.slow
def test_multirank_png_size_and_curves_in_every_panel(tmp_path):
    done = cli("plot", str(FIXTURES / "multirank"), "-o", "run.png", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "wrote run.png (4 series, 44 records)"
    pixels = load(tmp_path / "run.png")
    assert pixels.shape == (1000, 1600, 3)
    for metric, region in panels(pixels).items():
        assert (region < 250).any(axis=2).sum() > 1000, metric  # not a blank panel
        assert count(region, "C0") > 100, f"rank 0's curve missing from the {metric} panel"
        assert count(region, NONFINITE_COLOR) > 100, f"non-finite step not marked in the {metric} panel"
    step_time = panels(pixels)["train_per_step_time"]
    for color in ("C1", "C2", "C3"):  # ranks 1-3 only log step time
        assert count(step_time, color) > 200, color


@pytest.mark.slow
def test_panel_without_data_has_no_curve(tmp_path):
    # truncated.json logs loss and step time only: a check that can fail on empty panels.
    output = plot(read_logs([FIXTURES / "truncated.json"]), tmp_path / "partial.png", size=(800, 600))
    regions = panels(load(output))
    assert load(output).shape == (600, 800, 3)
    assert count(regions["loss"], "C0") > 50 and count(regions["train_per_step_time"], "C0") > 50
    assert count(regions["learning_rate"], "C0") == 0
    assert count(regions["grad_norm"], "C0") == 0


@pytest.mark.slow
def test_alert_lines_are_marked(tmp_path):
    output = plot(read_logs([FIXTURES / "mixed_writers.json"]), tmp_path / "alerts.png")
    for metric, region in panels(load(output)).items():
        assert count(region, ALERT_COLOR) > 100, metric


@pytest.mark.slow
def test_smoothing_draws_a_faded_raw_curve_under_the_average(tmp_path):
    log = tmp_path / "noisy.json"
    log.write_text(
        "".join(
            json.dumps({"time_stamp": float(step), "step": step, "epoch": 1, "rank": 0, "loss": 1.0 + 2 * (step % 2)})
            + "\n"
            for step in range(1, 61)
        )
    )
    series = read_logs([log])
    plain = panels(load(plot(series, tmp_path / "plain.png")))["loss"]
    smooth = panels(load(plot(series, tmp_path / "smooth.png", smoothing=0.9)))["loss"]
    # Raw, the zigzag spans the panel in full colour; smoothed, the full-colour curve is a
    # nearly flat average and the zigzag is still there, faded (C0 at alpha 0.3 on white).
    assert spread(smooth, "C0") < 0.2 * spread(plain, "C0")
    assert spread(smooth, "#bcdaed", tolerance=12) > 0.8 * spread(plain, "C0")


def test_ema_is_debiased_and_keeps_holes():
    values = [4.0, 2.0, math.nan, 1.0]
    smoothed = ema(values, 0.5)
    assert smoothed[0] == 4.0  # debiased: the first point is itself, not 2.0
    assert smoothed[1] == pytest.approx((0.25 * 4 + 0.5 * 2) / 0.75)
    assert math.isnan(smoothed[2])
    assert smoothed[3] == pytest.approx((0.125 * 4 + 0.25 * 2 + 0.5 * 1) / 0.875)


@pytest.mark.slow
def test_svg_output_and_argument_errors(tmp_path):
    assert cli("plot", str(FIXTURES / "rotated"), "-o", "run.svg", cwd=tmp_path).returncode == 0
    assert "<svg" in (tmp_path / "run.svg").read_text()[:1000]
    bad = cli("plot", str(FIXTURES / "rotated"), "--smooth", "1.5", cwd=tmp_path)
    assert bad.returncode == 2 and "expected a weight in [0, 1)" in bad.stderr
    missing = cli("plot", str(tmp_path / "nothing.json"), cwd=tmp_path)
    assert missing.returncode == 1 and missing.stderr.startswith("error: ") and "Traceback" not in missing.stderr


@pytest.mark.slow  # the CLI, as users run it
@pytest.mark.parametrize(
    ("output", "said"),
    [
        ("run", "'run': the suffix picks the image format; expected one of .png, .svg"),
        ("run.jpgg", "'run.jpgg': the suffix picks the image format"),
        (".", "'.' is a folder; name the image file (e.g. plot.png)"),
    ],
)
def test_an_output_that_is_no_image_file_is_refused_before_drawing(tmp_path, output, said):
    """matplotlib wrote `run` as run.png (and a folder `out/` as out.png beside it) while the
    command said it wrote `run`; an unknown suffix was a traceback after the drawing."""
    done = cli("plot", str(FIXTURES / "rotated"), "-o", output, cwd=tmp_path)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert f"argument -o/--output: {said}" in done.stderr
    assert list(tmp_path.iterdir()) == [] and not (tmp_path.parent / f"{tmp_path.name}.png").exists()


def test_the_image_suffix_is_read_in_any_case_and_a_home_folder_is_a_folder(tmp_path, monkeypatch):
    """matplotlib reads `RUN.PNG` as a PNG; `--output=~` (no shell expands that `~`) names
    the home folder, refused as a folder, not as a name without a suffix."""
    import argparse

    from otel_mindformers.core.image_file import image_file

    assert image_file("RUN.PNG") == Path("RUN.PNG")
    monkeypatch.setenv("HOME", str(tmp_path))
    assert image_file("~/run.svg") == tmp_path / "run.svg"
    with pytest.raises(argparse.ArgumentTypeError, match="'~' is a folder; name the image file"):
        image_file("~")


@pytest.mark.slow  # the CLI, as users run it
@pytest.mark.parametrize("command", [["plot", "-o", "taken/run.png"], ["replay", "--tensorboard", "taken/tb"]])
def test_an_output_the_system_refuses_is_one_line_naming_it(tmp_path, command):
    (tmp_path / "taken").write_text("a file where a folder would go\n")
    done = cli(command[0], str(FIXTURES / "rotated"), *command[1:], cwd=tmp_path)
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
    assert done.stderr.startswith("error: taken") and done.stderr.count("\n") == 1, done.stderr
