"""The recipes on a real two-node Ray cluster on this machine (recipes/cpu_demo/cluster.sh: a head and a worker node,
ports apart from Ray's defaults), stopped at the end, pass or fail:

- the CPU demo submitted with recipes/cpu_demo/submit.sh: the job's terminal status is SUCCEEDED (the last line the
  script prints, from Ray's job SDK, not a word in the streamed log), with tito/ metrics and zero engine-view
  failures;
- a job stopped while it runs: the submit helper exits non-zero with STOPPED (``ray job submit`` exits 0 for it),
  and waits for the terminal status when the log stream ends before the job does;
- recipes/gsm8k_qwen3_sglang/submit.sh from another folder: its code and configs travel as Ray's working_dir, and the
  job's first step checks the shared paths on both nodes, one line each (a missing model fails the job);
- recipes/agent_harness/submit.sh with a harness that cannot be imported: the job's driver stops it before training.

Slow (a few minutes on 2 cores): one cluster for the module."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

pytestmark = pytest.mark.xdist_group("ray")  # the Ray group: tests/conftest.py

REPO = Path(__file__).resolve().parents[2]
RECIPE = REPO / "recipes" / "cpu_demo"
RAY_PORT, DASHBOARD_PORT = "26479", "28365"
ADDRESS = f"http://127.0.0.1:{DASHBOARD_PORT}"
STATUS_LINE = re.compile(r"^ray job (\S+): (SUCCEEDED|FAILED|STOPPED|UNKNOWN)\b.*$")


def last_status(out: str) -> tuple[str, str]:
    """(job id, status) from the submit helper's last line; ("", "") when it is not a status line."""
    lines = out.strip().splitlines()
    match = STATUS_LINE.match(lines[-1]) if lines else None
    return (match.group(1), match.group(2)) if match else ("", "")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    ray_tmp = Path(tempfile.mkdtemp(prefix="vxray", dir="/tmp"))  # Ray's socket paths must stay under 107 bytes
    bin_dir = str(Path(sys.executable).parent)
    env = {
        **os.environ,
        "PATH": bin_dir + os.pathsep + os.environ.get("PATH", ""),
        "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""),
        "PYTHON": sys.executable,
        "RAY_PORT": RAY_PORT,
        "DASHBOARD_PORT": DASHBOARD_PORT,
        "BASE_PORT": "29000",
        "RAY_TMP": str(ray_tmp),
        "OUT": str(tmp_path_factory.mktemp("demo")),
        "RAY_AUTH_MODE": "disabled",  # a local test cluster, as cluster.sh starts it
    }
    try:
        started = subprocess.run([str(RECIPE / "cluster.sh"), "start"], env=env, capture_output=True, text=True)
        assert started.returncode == 0, started.stdout[-3000:] + started.stderr[-3000:]
        for _ in range(60):  # the worker node registers with the head a few seconds after `ray start` returns
            nodes = subprocess.run(
                ["ray", "status", "--address", f"127.0.0.1:{RAY_PORT}"], env=env, capture_output=True, text=True
            )
            if len(re.findall(r"^\s*1 node_", nodes.stdout, flags=re.M)) == 2:
                break
            time.sleep(2)
        assert len(re.findall(r"^\s*1 node_", nodes.stdout, flags=re.M)) == 2, nodes.stdout
        yield env
    finally:
        subprocess.run([str(RECIPE / "cluster.sh"), "stop"], env=env, capture_output=True, text=True)
        left = subprocess.run(["pgrep", "-af", f"{ray_tmp}|:{RAY_PORT}"], capture_output=True, text=True)
        shutil.rmtree(ray_tmp, ignore_errors=True)
        assert left.stdout.strip() == "", f"Ray processes left running: {left.stdout}"


@pytest.mark.timeout(900)
def test_cpu_demo_recipe_on_a_two_node_ray_cluster(cluster: dict[str, str]) -> None:
    # One GRPO step proves the job runs on the cluster; the demo's own tests cover the steps after it.
    env = {**cluster, "STEPS": "1"}
    job = subprocess.run([str(RECIPE / "submit.sh")], env=env, capture_output=True, text=True, timeout=780)
    out = job.stdout + job.stderr
    assert job.returncode == 0, out[-6000:]
    assert last_status(job.stdout)[1] == "SUCCEEDED", job.stdout[-3000:]
    steps = re.findall(r"step (\d+)/1 .*?\n((?:    .*\n)+)", out)
    assert {s for s, _ in steps} == {"1"}, out[-4000:]  # ray job logs may echo lines twice
    for _, metrics in steps:
        assert re.search(r"\bengine_view_failures 0\b", metrics) and "rollouts_checked" in metrics
    assert re.search(r"engine-view failures 0\b", out)


@pytest.mark.timeout(300)
def test_a_stopped_job_exits_non_zero_with_its_status(cluster: dict[str, str]) -> None:
    submit = [sys.executable, str(REPO / "recipes" / "ray_submit.py"), f"--address={ADDRESS}", "--poll-s=1"]
    proc = subprocess.Popen([*submit, "--", "sleep", "120"], env=cluster, stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    first = proc.stdout.readline()  # "ray job <id> submitted to ... (stop it with: ...)"
    job_id = re.match(r"ray job (\S+) submitted", first).group(1)
    time.sleep(3)
    stopped = subprocess.run(
        ["ray", "job", "stop", f"--address={ADDRESS}", job_id], env=cluster, capture_output=True, text=True
    )
    assert stopped.returncode == 0, stopped.stderr
    rest = proc.stdout.read()
    assert proc.wait(timeout=120) == 1  # `ray job submit` exits 0 here
    assert last_status(rest) == (job_id, "STOPPED"), rest[-2000:]


@pytest.mark.timeout(300)
def test_the_status_is_awaited_when_the_log_stream_ends_before_the_job(
    cluster: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from ray.job_submission import JobSubmissionClient

    sys.path.insert(0, str(REPO / "recipes"))
    try:
        from ray_submit import wait_for_terminal
    finally:
        sys.path.remove(str(REPO / "recipes"))
    monkeypatch.setenv("RAY_AUTH_MODE", cluster["RAY_AUTH_MODE"])
    client = JobSubmissionClient(ADDRESS)
    job_id = client.submit_job(entrypoint="sleep 6")
    assert str(client.get_job_status(job_id).value) in ("PENDING", "RUNNING")  # as when the stream drops early
    assert wait_for_terminal(client, job_id, poll_s=1, unreachable_s=60)[0] == "SUCCEEDED"


@pytest.mark.timeout(600)
def test_the_gsm8k_job_ships_its_code_and_checks_the_shared_paths_on_every_node(
    cluster: dict[str, str], tmp_path: Path
) -> None:
    model, data, records = tmp_path / "model", tmp_path / "data", tmp_path / "shared" / "records"
    model.mkdir()
    (model / "config.json").write_text("{}")
    data.mkdir()
    for name in ("train.parquet", "test.parquet"):
        (data / name).write_text("")
    elsewhere = tmp_path / "laptop"  # submitted from a folder that is not the checkout
    elsewhere.mkdir()
    submit = [sys.executable, str(REPO / "recipes" / "ray_submit.py"), f"--address={ADDRESS}", f"--working-dir={REPO}"]
    for excluded in ("tests", "docs", "bench"):
        submit.append(f"--exclude={excluded}")
    check = ["python", "recipes/check_shared_paths.py", f"--model={model}", f"--data={data}", f"--records={records}"]
    ok = subprocess.run([*submit, "--", *check], cwd=elsewhere, env=cluster, capture_output=True, text=True)
    assert ok.returncode == 0 and last_status(ok.stdout)[1] == "SUCCEEDED", ok.stdout[-3000:] + ok.stderr[-2000:]
    for label, path in (("model", model), ("data", data), ("records", records)):
        assert f"shared storage: {label} {path}: ok on all 2 nodes" in ok.stdout, ok.stdout[-3000:]

    env = {**cluster, "RAY_ADDRESS": ADDRESS, "MODEL": str(tmp_path / "missing"), "DATA": str(data)}
    job = subprocess.run(
        [str(REPO / "recipes" / "gsm8k_qwen3_sglang" / "submit.sh")], cwd=elsewhere, env=env, capture_output=True,
        text=True, timeout=300,
    )  # fmt: skip
    assert job.returncode == 1 and last_status(job.stdout)[1] == "FAILED", job.stdout[-3000:] + job.stderr[-2000:]
    missing = re.escape(str(tmp_path / "missing"))
    line = rf"shared storage: ERROR: model {missing}: not usable on 2 of 2 nodes \(node .*: no folder"
    assert re.search(line, job.stdout), job.stdout[-3000:]
    assert f"shared storage: data {data}: ok on all 2 nodes" in job.stdout


@pytest.mark.timeout(300)
def test_the_agent_harness_recipe_stops_a_harness_that_cannot_run_before_training(cluster: dict[str, str]) -> None:
    # recipes/agent_harness/submit.sh on this cluster, with a harness no node can import: the job's driver refuses it
    # in one line before training starts, and the script exits non-zero with FAILED (the harness run itself is
    # tests/demo/test_gateway_demo.py's, and what the recipe submits is tests/recipes/test_agent_harness_recipe.py's)
    env = {**cluster, "HARNESS": "no_such_agents.calc:run"}
    job = subprocess.run(
        [str(REPO / "recipes" / "agent_harness" / "submit.sh")], env=env, capture_output=True, text=True, timeout=280
    )
    assert job.returncode == 1 and last_status(job.stdout)[1] == "FAILED", job.stdout[-3000:] + job.stderr[-2000:]
    refused = "verl_ext.harness.function=no_such_agents.calc:run: cannot import no_such_agents.calc (ModuleNotFound"
    assert refused in job.stdout, job.stdout[-3000:]
    assert "weights synced" not in job.stdout and "step 1/" not in job.stdout  # stopped before the trainer's workers
