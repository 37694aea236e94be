"""Data-plane tests: the helpers of the Program-scheduling actor tests and the real-socket fake worker."""

from __future__ import annotations

import sys
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]
for helper_dir in (TESTS / "actors", TESTS / "faults"):
    if str(helper_dir) not in sys.path:
        sys.path.append(str(helper_dir))
