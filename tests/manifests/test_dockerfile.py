"""The Dockerfile cannot be built here (no Docker engine): check what can be checked without one, i.e.
its shape (multi-stage, slim, non-root matching the Deployment, no compilers in the final stage), that
everything it copies exists and is not excluded by .dockerignore, and that its entry point runs."""

from __future__ import annotations

import json
import subprocess
import sys
import tomllib
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]


def stages() -> list[list[str]]:
    lines = (REPO / "Dockerfile").read_text().replace("\\\n", " ").splitlines()
    instructions = [line.strip() for line in lines if line.strip() and not line.lstrip().startswith("#")]
    result: list[list[str]] = []
    for instruction in instructions:
        if instruction.startswith("FROM "):
            result.append([])
        if result:
            result[-1].append(instruction)
    return result


def test_multi_stage_slim_non_root() -> None:
    _, final = stages()
    assert "python:3.11-slim" in (REPO / "Dockerfile").read_text()
    text = "\n".join(final)
    for tool in ("gcc", "build-essential", "apt-get install", "pip install"):
        assert tool not in text, tool
    assert any(i.startswith("COPY --from=build ") for i in final)
    user = next(i for i in final if i.startswith("USER ")).split()[1]
    deployment = yaml.safe_load((REPO / "manifests" / "base" / "deployment.yaml").read_text())
    pod = deployment["spec"]["template"]["spec"]["securityContext"]
    assert user == f"{pod['runAsUser']}:{pod['runAsGroup']}"


def test_entry_point_is_the_console_script() -> None:
    _, final = stages()
    entry = json.loads(next(i for i in final if i.startswith("ENTRYPOINT ")).removeprefix("ENTRYPOINT "))
    scripts = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]
    assert entry == ["sparkgate"] and "sparkgate" in scripts
    for args in (["--help"], ["certs", "sync", "--help"], ["webhook", "--help"], ["allocator", "--help"]):
        done = subprocess.run(
            [str(Path(sys.executable).with_name("sparkgate")), *args],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 0, (args, done.stderr)


def test_copied_paths_exist_and_are_not_ignored() -> None:
    build, _ = stages()
    ignore = (REPO / ".dockerignore").read_text().splitlines()
    allowed = {line[1:].rstrip("/") for line in ignore if line.startswith("!")}
    packages = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]["find"]
    for instruction in build:
        if instruction.startswith("COPY ") and "--from" not in instruction:
            for source in instruction.split()[1:-1]:
                assert (REPO / source).exists() and source in allowed, source
    copied = {i.split()[1] for i in build if i.startswith("COPY ")}
    # The image holds the production packages and never the simulator or the sandbox wing (issue 13).
    wing = {"kubesim", "sandbox"}
    assert {p.rstrip("*") for p in packages["include"]} - wing <= copied
    assert not copied & wing and not allowed & wing
