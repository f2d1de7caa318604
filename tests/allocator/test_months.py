"""Two simulated days of a busy cluster through the real allocator, as `python -m bench.months --smoke` runs
them (bench/months.py; the 30-day run is `make soak`): what the allocator keeps stays bounded and returns to
its floor once the cluster is idle."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_two_busy_days_keep_every_store_bounded_and_return_to_the_floor_when_idle() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "bench.months", "--smoke"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
    )
    result = json.loads(done.stdout)
    print({k: v for k, v in result.items() if k not in ("floor", "peak", "final")})
    print("peak", result["peak"])
    print("final", result["final"])
    assert result["problems"] == [] and done.returncode == 0, done.stderr[-2000:]
    # The run exercised what it is about: both modes, killed drivers, fail-overs, bypassed pods, Events.
    assert result["apps"] >= 1300 and result["failovers"] == 2
    assert result["modes"]["client-killed"] > 100 and result["modes"]["cluster"] > 500
    assert result["ended"]["client"] > 100 and result["bypassed_pods"] > 0 and result["events_posted"] > 0
    assert result["peak"]["copies"] > 0 and result["peak"]["histories"] > 0 and result["releases"] > 10_000
