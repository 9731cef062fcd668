"""Where the shipped assets live inside the installed package (no imports beyond pathlib)."""

from pathlib import Path

ASSETS_DIR = Path(__file__).resolve().parent / "assets"
DEFAULT_MODEL_DIR = ASSETS_DIR / "flash"
DEFAULT_LINE_BOOK_DIR = ASSETS_DIR / "linebook"
