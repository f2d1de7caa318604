"""The policy file watcher: reloads on change (including a ConfigMap volume's symlink swap), keeps the last good."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest

from sparkgate import policy_file
from sparkgate.policy_file import PolicySource

GOOD = "apiVersion: sparkgate.io/v1alpha1\nkind: Policy\nallocation: {{batchSize: {n}}}\n"


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def configmap_volume(root: Path, version: str, text: str) -> Path:
    """The layout kubelet writes: ..<ts>/policy.yaml, ..data -> ..<ts>, policy.yaml -> ..data/policy.yaml."""
    data_dir = root / f"..{version}"
    data_dir.mkdir()
    (data_dir / "policy.yaml").write_text(text)
    tmp = root / "..data_tmp"
    tmp.symlink_to(data_dir.name)
    os.replace(tmp, root / "..data")
    link = root / "policy.yaml"
    if not link.is_symlink():
        link.symlink_to("..data/policy.yaml")
    return link


def test_reloads_after_a_symlink_swap_and_keeps_the_last_good_policy(tmp_path: Path) -> None:
    clock = Clock()
    events: list[tuple[str, str | None]] = []
    path = configmap_volume(tmp_path, "v1", GOOD.format(n=7))
    source = PolicySource(
        str(path),
        "sparkgate-system",
        clock=clock,
        check_interval=1.0,
        on_reload=lambda r, e: events.append((r, e)),
    )
    first = source.current()
    assert first is not None and first.allocation.batch_size == 7 and source.generation == 1

    configmap_volume(tmp_path, "v2", GOOD.format(n=9))
    assert source.current() is first, "not re-checked before check_interval"
    clock.now += 1
    second = source.current()
    assert second is not None and second.allocation.batch_size == 9 and source.generation == 2

    configmap_volume(tmp_path, "v3", GOOD.format(n=0))
    clock.now += 1
    assert source.current() is second
    assert source.last_error is not None and "allocation.batchSize" in source.last_error
    assert events == [("success", None), ("success", None), ("failure", source.last_error)]

    clock.now += 1
    assert source.current() is second and len(events) == 3, "the same bad file is reported once"


def test_missing_file_means_no_policy_until_it_appears(tmp_path: Path) -> None:
    clock = Clock()
    path = tmp_path / "policy.yaml"
    source = PolicySource(str(path), "sparkgate-system", clock=clock)
    assert source.current() is None and source.last_error and "cannot read" in source.last_error
    path.write_text(GOOD.format(n=3))
    clock.now += 1
    policy = source.current()
    assert policy is not None and policy.allocation.batch_size == 3 and source.last_error is None


def watched(tmp_path: Path) -> tuple[Clock, list[tuple[str, str | None]], PolicySource]:
    """A good policy in a ConfigMap volume, its source, its clock and what its reload hook was told."""
    clock = Clock()
    events: list[tuple[str, str | None]] = []
    path = configmap_volume(tmp_path, "v1", GOOD.format(n=7))
    source = PolicySource(
        str(path), "sparkgate-system", clock=clock, on_reload=lambda r, e: events.append((r, e))
    )
    return clock, events, source


def test_a_second_bad_edit_with_the_same_error_is_reported_again(tmp_path: Path) -> None:
    """De-duplicated by file and error, not by error alone: each refused edit is logged and counted once."""
    clock, events, source = watched(tmp_path)
    good = source.current()
    for version, text in (("v2", GOOD.format(n=0)), ("v3", "# fixed?\n" + GOOD.format(n=0))):
        configmap_volume(tmp_path, version, text)
        clock.now += 1
        assert source.current() is good
        clock.now += 1
        assert source.current() is good
    assert [r for r, _ in events] == ["success", "failure", "failure"]
    assert events[1] == events[2]


def test_any_exception_while_loading_is_a_refusal_that_keeps_the_last_good_policy(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A defect of the loader must not escape to the webhook (a 500 per admission, a worker that cannot
    boot) or the allocator: the file is refused, logged with the traceback and counted like any other."""
    clock, events, source = watched(tmp_path)
    good = source.current()

    def defect(text: str, install_namespace: str) -> None:
        raise RecursionError("maximum recursion depth exceeded")

    monkeypatch.setattr(policy_file, "load_policy", defect)
    configmap_volume(tmp_path, "v2", GOOD.format(n=9))
    clock.now += 1
    with caplog.at_level(logging.ERROR, logger="sparkgate.policy_file"):
        assert source.current() is good
    assert events[-1] == ("failure", "RecursionError: maximum recursion depth exceeded")
    assert source.last_error == "RecursionError: maximum recursion depth exceeded"
    assert "the last good policy stays in force" in caplog.text and "Traceback" in caplog.text
