"""The records' derived values (allocator/model.py): an app's counts agree with the pod's own properties
for every combination of the fields they read, and its profile is the lowest executor id's."""

from __future__ import annotations

import itertools

from allocator import pacing
from allocator.model import AppView, Counts, Now, PodRecord
from sparkgate.contract import NO_PROFILE, AppKey

KEY = AppKey("spark", "a")


def pod(
    i: int,
    *,
    gated: bool = False,
    deleting: bool = False,
    phase: str = "Pending",
    profile: str | None = "etl",
    node: str | None = None,
    unschedulable: bool = False,
) -> PodRecord:
    return PodRecord(
        "spark", f"a-{i}", str(i), "a", i, "0", gated, profile, node, phase, deleting, 0.0,
        unschedulable=unschedulable,
    )  # fmt: skip


def test_counts_put_each_pod_in_one_state_as_its_properties_say() -> None:
    phases = ("Pending", "Running", "Succeeded", "Failed", "Unknown")
    for gated, deleting, phase, profile, node, unschedulable in itertools.product(
        (False, True), (False, True), phases, ("etl", None), (None, "n"), (False, True)
    ):
        p = pod(
            1,
            gated=gated,
            deleting=deleting,
            phase=phase,
            profile=profile,
            node=node,
            unschedulable=unschedulable,
        )
        state = (
            "other" if deleting else "gated" if gated else "in_flight" if p.in_flight
            else "running" if phase == "Running" else "other"
        )  # fmt: skip
        counts = Counts.of((p,))
        assert counts.by_state() == {
            s: int(s == state) for s in ("gated", "in_flight", "running", "other")
        }, p
        assert (counts.bypassed, counts.failed) == (int(p.bypassed), int(phase == "Failed")), p
        assert counts.refused == int(pacing.refused(p)), p


def test_an_api_timestamp_on_the_monotonic_clock_is_now_less_its_age_never_ahead_of_now() -> None:
    now = Now(monotonic=500.0, wall=1_800_000_000.0)
    assert now.since(1_800_000_000.0 - 120) == 380.0
    assert now.since(1_800_000_000.0 + 30) == 500.0  # ahead of this host's clock: now
    assert now.wall_of(380.0) == 1_800_000_000.0 - 120


def test_an_apps_profile_is_the_one_its_lowest_named_executor_carries() -> None:
    def profile(*pods: PodRecord) -> str | None:
        return AppView(KEY, pods, None, False, frozenset()).profile

    assert profile(pod(3), pod(1), pod(2)) == "etl"
    assert profile(pod(3, profile="new"), pod(2, profile="old"), pod(4, profile="new")) == "old"
    assert profile(pod(1, profile=NO_PROFILE), pod(2, profile=None), pod(5, profile="etl")) == "etl"
    assert profile(pod(1, profile=None), pod(2, profile=NO_PROFILE)) is None
    assert profile() is None
