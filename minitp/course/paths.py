"""Where the repository is: exercises/, solutions/ and notebooks/ live beside the package."""

from __future__ import annotations

from pathlib import Path


def repo_root() -> Path:
    """The checkout this package is installed from (an editable install)."""
    return Path(__file__).resolve().parents[2]  # minitp/course/paths.py -> the checkout
