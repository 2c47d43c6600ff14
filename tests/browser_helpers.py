"""A headless chromium over `jaxswe inspect`'s HTML report: its DOM after the scripts ran, its screenshot."""

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest


def browser():
    path = shutil.which("chromium") or shutil.which("chromium-browser")
    if path is None:
        if os.environ.get("CI") == "true":
            pytest.fail("chromium not installed; .ci/run installs it")
        pytest.skip("chromium not installed (apt-get install chromium)")
    return path


def dump_dom(html_path: Path, fragment: str) -> str:
    out = subprocess.run(
        [
            browser(),
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--dump-dom",
            f"file://{html_path}#{fragment}",
        ],
        capture_output=True,
        text=True,
        timeout=90,
    )
    assert out.returncode == 0 and "</html>" in out.stdout, out.stderr[-2000:]
    return out.stdout


def rendered_episodes(dom: str) -> list[str]:
    """Each episode's markup as rendered, from its opening tag."""
    return ["<details" + part for part in re.split(r"<details(?= class=\"ep\")", dom)[1:]]


def assert_screenshot_not_blank(html_path: Path, shot: Path) -> None:
    """What a person sees: chromium's screenshot of a report holds text and charts, not one colour."""
    from matplotlib.image import imread

    argv = [browser(), "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars"]
    argv += ["--window-size=1200,900", f"--screenshot={shot}", f"file://{html_path}"]
    out = subprocess.run(argv, capture_output=True, text=True, timeout=90)
    assert out.returncode == 0 and shot.is_file(), out.stderr[-2000:]
    pixels = imread(shot)[..., :3]
    assert pixels.shape[:2] == (900, 1200)
    colours = len({tuple(p) for p in (pixels.reshape(-1, 3)[::7] * 255).astype(int)})
    dark = (pixels.mean(axis=-1) < 0.5).mean()  # text and lines on the page's light background
    assert colours > 20 and 0.005 < dark < 0.6, (colours, dark)
