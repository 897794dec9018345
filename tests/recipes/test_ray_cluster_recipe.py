"""recipes/cpu_demo on a real two-node Ray cluster on this machine: `ray start` a head and a worker node (ports apart
from Ray's defaults), `ray job submit` the CPU demo, check the job succeeded with tito/ metrics and zero engine-view
failures, and stop the cluster, pass or fail. Slow (a few minutes on 2 cores): one test."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
RECIPE = REPO / "recipes" / "cpu_demo"


@pytest.mark.timeout(900)
def test_cpu_demo_recipe_on_a_two_node_ray_cluster(tmp_path: Path) -> None:
    ray_tmp = Path(tempfile.mkdtemp(prefix="vxray", dir="/tmp"))  # Ray's socket paths must stay under 107 bytes
    bin_dir = str(Path(sys.executable).parent)
    env = {
        **os.environ,
        "PATH": bin_dir + os.pathsep + os.environ.get("PATH", ""),
        "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""),
        "RAY_PORT": "26479",
        "DASHBOARD_PORT": "28365",
        "BASE_PORT": "29000",
        "RAY_TMP": str(ray_tmp),
        "OUT": str(tmp_path / "demo"),
        "RAY_AUTH_MODE": "disabled",  # a local test cluster, as cluster.sh starts it
    }
    try:
        started = subprocess.run([str(RECIPE / "cluster.sh"), "start"], env=env, capture_output=True, text=True)
        assert started.returncode == 0, started.stdout[-3000:] + started.stderr[-3000:]
        for _ in range(60):  # the worker node registers with the head a few seconds after `ray start` returns
            nodes = subprocess.run(
                ["ray", "status", "--address", "127.0.0.1:26479"], env=env, capture_output=True, text=True
            )
            if len(re.findall(r"^\s*1 node_", nodes.stdout, flags=re.M)) == 2:
                break
            time.sleep(2)
        assert len(re.findall(r"^\s*1 node_", nodes.stdout, flags=re.M)) == 2, nodes.stdout
        job = subprocess.run([str(RECIPE / "submit.sh")], env=env, capture_output=True, text=True, timeout=780)
        out = job.stdout + job.stderr
        assert job.returncode == 0, out[-6000:]
        assert "succeeded" in out, out[-3000:]
        steps = re.findall(r"step (\d+)/2 .*?\n((?:    .*\n)+)", out)
        assert sorted({s for s, _ in steps}) == ["1", "2"], out[-4000:]  # ray job logs may echo lines twice
        for _, metrics in steps:
            assert re.search(r"\bengine_view_failures 0\b", metrics) and "rollouts_checked" in metrics
        assert re.search(r"engine-view failures 0\b", out)
    finally:
        subprocess.run([str(RECIPE / "cluster.sh"), "stop"], env=env, capture_output=True, text=True)
        left = subprocess.run(["pgrep", "-af", f"{ray_tmp}|:26479"], capture_output=True, text=True)
        shutil.rmtree(ray_tmp, ignore_errors=True)
        assert left.stdout.strip() == "", f"Ray processes left running: {left.stdout}"
