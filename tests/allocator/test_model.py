"""The records' derived values (allocator/model.py): an app's counts agree with the pod's own properties
for every combination of the fields they read, and its profile is the lowest executor id's."""

from __future__ import annotations

import itertools

from allocator.model import AppView, Counts, PodRecord
from sparkgate.contract import NO_PROFILE, AppKey

KEY = AppKey("spark", "a")


def pod(
    i: int,
    *,
    gated: bool = False,
    deleting: bool = False,
    phase: str = "Pending",
    profile: str | None = "etl",
):
    return PodRecord("spark", f"a-{i}", str(i), "a", i, "0", gated, profile, None, phase, deleting, 0.0)


def test_counts_put_each_pod_in_one_state_as_its_properties_say() -> None:
    phases = ("Pending", "Running", "Succeeded", "Failed", "Unknown")
    for gated, deleting, phase, profile in itertools.product(
        (False, True), (False, True), phases, ("etl", None)
    ):
        p = pod(1, gated=gated, deleting=deleting, phase=phase, profile=profile)
        state = (
            "other" if deleting else "gated" if gated else "in_flight" if p.in_flight
            else "running" if phase == "Running" else "other"
        )  # fmt: skip
        counts = Counts.of((p,))
        assert counts.by_state() == {
            s: int(s == state) for s in ("gated", "in_flight", "running", "other")
        }, p
        assert (counts.bypassed, counts.failed) == (int(p.bypassed), int(phase == "Failed")), p


def test_an_apps_profile_is_the_one_its_lowest_named_executor_carries() -> None:
    def profile(*pods: PodRecord) -> str | None:
        return AppView(KEY, pods, None, False, frozenset()).profile

    assert profile(pod(3), pod(1), pod(2)) == "etl"
    assert profile(pod(3, profile="new"), pod(2, profile="old"), pod(4, profile="new")) == "old"
    assert profile(pod(1, profile=NO_PROFILE), pod(2, profile=None), pod(5, profile="etl")) == "etl"
    assert profile(pod(1, profile=None), pod(2, profile=NO_PROFILE)) is None
    assert profile() is None
