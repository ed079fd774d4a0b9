"""The pretrained models shipped under ``models/pretrained``, listed without importing torch.

``iclprobe models`` reads only their ``config.json`` files, so it answers at once.
"""

from __future__ import annotations

import json
from pathlib import Path

PRETRAINED_DIR = Path(__file__).resolve().parent / "models" / "pretrained"
CONFIG_FILE = "config.json"


def shipped_models() -> list[tuple[str, str]]:
    """``(name, one-line summary)`` of each model shipped under ``models/pretrained``."""
    rows = []
    for path in sorted(PRETRAINED_DIR.iterdir()):
        if (path / CONFIG_FILE).is_file():
            meta = json.loads((path / CONFIG_FILE).read_text())
            rows.append((path.name, str(meta.get("summary", meta.get("family", "")))))
    return rows
