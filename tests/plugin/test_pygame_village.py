"""examples/pygame_village.py runs headless and its screenshot shows a speech bubble."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pygame = pytest.importorskip("pygame")

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "pygame_village.py"
BUBBLE = (255, 255, 240)


def bubble_pixels(path: Path) -> int:
    image = pygame.image.load(str(path))
    w, h = image.get_size()
    return sum(1 for x in range(0, w, 2) for y in range(0, h, 2) if tuple(image.get_at((x, y)))[:3] == BUBBLE)


def run_example(model_dir: Path, shot: Path, frames: int) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "SDL_VIDEODRIVER": "dummy", "SDL_AUDIODRIVER": "dummy"}
    return subprocess.run(
        [sys.executable, str(EXAMPLE), "--model", str(model_dir), "--frames", str(frames),
         "--screenshot", str(shot), "--npcs", "3", "--day", "30"],
        env=env, capture_output=True, text=True, timeout=120, check=False)


def test_headless_run_screenshot_shows_a_speech_bubble(plugin_model_dir: Path, tmp_path: Path) -> None:
    shot = tmp_path / "village.png"
    proc = run_example(plugin_model_dir, shot, 300)  # 5 s: the traveller reaches the guard
    assert proc.returncode == 0, proc.stderr
    assert "Bram (" in proc.stdout  # the guard spoke
    assert bubble_pixels(shot) > 200


def test_no_bubble_before_anyone_speaks(plugin_model_dir: Path, tmp_path: Path) -> None:
    shot = tmp_path / "start.png"
    proc = run_example(plugin_model_dir, shot, 2)  # the traveller is still at the gate
    assert proc.returncode == 0, proc.stderr
    assert bubble_pixels(shot) == 0
