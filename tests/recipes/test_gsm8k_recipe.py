"""recipes/gsm8k_qwen3_sglang and recipes/sglang: data preparation from a local file, the shared-path check the job
starts with, submit.sh's refusal of paths that are not on shared storage, and the SGLang install's pins. (The job
config is tested in test_job_configs.py; submitting to a real cluster in test_ray_cluster_recipe.py.)"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.xdist_group("ray")  # the Ray group: tests/conftest.py

REPO = Path(__file__).resolve().parents[2]
RECIPE = REPO / "recipes" / "gsm8k_qwen3_sglang"
SGLANG = REPO / "recipes" / "sglang"


def prepare(tmp_path: Path, train: Path, test: Path | None = None) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, str(RECIPE / "prepare_data.py"), "--train", str(train), "--test", str(test or train)]
    return subprocess.run([*cmd, "--out", str(tmp_path / "out")], capture_output=True, text=True)


def test_prepare_data_from_a_local_jsonl(tmp_path: Path) -> None:
    import pandas as pd

    rows = [{"question": "Tom has 3 boxes of 12 eggs. How many eggs?", "answer": "3*12=<<3*12=36>>36\n#### 36"}]
    for split in ("train", "test"):
        (tmp_path / f"{split}.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    run = subprocess.run(
        [
            sys.executable,
            str(RECIPE / "prepare_data.py"),
            "--train",
            str(tmp_path / "train.jsonl"),
            "--test",
            str(tmp_path / "test.jsonl"),
            "--out",
            str(tmp_path / "out"),
        ],
        capture_output=True,
        text=True,
    )
    assert run.returncode == 0, run.stderr
    df = pd.read_parquet(tmp_path / "out" / "train.parquet")
    row = df.iloc[0]
    assert row["data_source"] == "openai/gsm8k" and row["reward_model"]["ground_truth"] == "36"
    assert [m["role"] for m in row["prompt"]] == ["system", "user"]


def test_prepare_data_names_a_row_without_a_final_answer(tmp_path: Path) -> None:
    (tmp_path / "bad.jsonl").write_text(json.dumps({"question": "q"}) + "\n")
    run = subprocess.run(
        [
            sys.executable,
            str(RECIPE / "prepare_data.py"),
            "--train",
            str(tmp_path / "bad.jsonl"),
            "--test",
            str(tmp_path / "bad.jsonl"),
            "--out",
            str(tmp_path / "out"),
        ],
        capture_output=True,
        text=True,
    )
    assert run.returncode != 0 and "lacks ['answer']" in run.stderr


@pytest.mark.parametrize(
    ("lines", "where", "why"),
    [
        ([{"question": "q", "answer": "36"}], ":1: ", "no '#### <number>' final answer in '36'"),  # was a traceback
        ([{"question": "q", "answer": "x\n#### 1"}, {"question": "q", "answer": "x ####"}], ":2: ", "nothing after"),
        ([["q", "a"]], ":1: ", "a list, not an object"),
        ([{"question": None, "answer": "#### 1"}], ":1: ", "'question' must be non-empty text"),
        (["{not json"], ":1: ", "not a JSON line"),
    ],
)
def test_a_bad_row_names_the_file_and_line_without_a_traceback_and_writes_nothing(tmp_path, lines, where, why):
    bad = tmp_path / "bad.jsonl"
    good = {"question": "q", "answer": "#### 1"}
    bad.write_text("\n" + "\n".join(x if isinstance(x, str) else json.dumps(x) for x in lines) + "\n")
    ok = tmp_path / "ok.jsonl"
    ok.write_text(json.dumps(good) + "\n")
    run = prepare(tmp_path, ok, bad)  # the test split is bad: the train split read fine, still nothing is written
    line = int(where.strip(": ")) + 1  # the file starts with a blank line: line numbers, not row numbers
    assert run.returncode == 2 and run.stderr.startswith(f"error: {bad}:{line}: "), run.stderr
    assert why in run.stderr and "Traceback" not in run.stderr and len(run.stderr.splitlines()) == 1
    assert not (tmp_path / "out").exists()


def test_an_unreadable_parquet_file_is_one_line(tmp_path):
    bad = tmp_path / "bad.parquet"
    bad.write_text("not parquet")
    run = prepare(tmp_path, bad)
    assert run.returncode == 2 and run.stderr.startswith(f"error: {bad}: not a readable parquet file (")
    assert "Traceback" not in run.stderr and not (tmp_path / "out").exists()


def test_a_parquet_row_is_named_by_its_row_number(tmp_path):
    import pandas as pd

    path = tmp_path / "rows.parquet"
    pd.DataFrame([{"question": "q", "answer": "#### 1"}, {"question": "q", "answer": "none"}]).to_parquet(path)
    run = prepare(tmp_path, path)
    assert run.returncode == 2 and run.stderr.startswith(f"error: {path} row 1: no '#### <number>'"), run.stderr


# -- the shared-path check every node runs at the start of the job -----------------------------------------------
def test_shared_path_problems_on_one_node(tmp_path):
    sys.path.insert(0, str(REPO / "recipes"))
    try:
        from check_shared_paths import path_problems, report_lines
    finally:
        sys.path.remove(str(REPO / "recipes"))
    model, data = tmp_path / "model", tmp_path / "data"
    model.mkdir()
    (model / "config.json").write_text("{}")
    data.mkdir()
    for name in ("train.parquet", "test.parquet"):
        (data / name).write_text("")
    (tmp_path / "file").write_text("")
    assert path_problems(str(model), str(data), str(tmp_path / "records")) == {
        "model": None, "data": None, "records": None}  # fmt: skip
    bad = path_problems(str(tmp_path / "nomodel"), str(model), str(tmp_path / "file" / "r"))
    assert bad["model"] == "no folder with a config.json"
    assert bad["data"] == "cannot read train.parquet, test.parquet" and "NotADirectoryError" in bad["records"]
    lines = report_lines(
        {"model": str(model), "data": str(data), "records": None},
        {"10.0.0.1": {"model": None, "data": None}, "10.0.0.2": {"model": "no config.json in it", "data": None}},
    )
    assert lines[0].startswith(f"shared storage: ERROR: model {model}: not usable on 1 of 2 nodes (node 10.0.0.2: ")
    assert lines[1:] == [f"shared storage: data {data}: ok on all 2 nodes", "shared storage: records: off"]


def test_submit_refuses_a_path_that_is_not_absolute_before_contacting_the_cluster(tmp_path):
    env = {**os.environ, "RAY_ADDRESS": "http://127.0.0.1:1", "MODEL": "models/Qwen3-4B", "DATA": "/data/gsm8k"}
    run = subprocess.run([str(RECIPE / "submit.sh")], cwd=tmp_path, env=env, capture_output=True, text=True)
    assert run.returncode == 2 and "models/Qwen3-4B is not an absolute path" in run.stderr, run.stderr


def test_the_submit_helper_says_in_one_line_when_no_cluster_answers(tmp_path):
    cmd = [sys.executable, str(REPO / "recipes" / "ray_submit.py"), "--address=http://127.0.0.1:9", "--", "true"]
    run = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert run.returncode == 2 and "Traceback" not in run.stderr, run.stderr[-2000:]
    assert run.stderr.strip().splitlines()[-1].startswith("error: could not submit the job to http://127.0.0.1:9 (")


# -- recipes/sglang: the install's pins ----------------------------------------------------------------------------
def pins() -> dict[str, str]:
    """scripts/gpu/versions.txt (pip constraints: ``name==version`` lines), the GPU stack's one list of versions."""
    found = {}
    for line in (REPO / "scripts" / "gpu" / "versions.txt").read_text().splitlines():
        name, sep, version = line.split("#", 1)[0].strip().partition("==")
        if sep:
            found[name] = version
    return found


def test_sglang_requirements_keep_its_torch_pin_and_leave_transformers_to_verls():
    from importlib.metadata import PackageNotFoundError, version

    try:  # the script reads sglang's metadata only; importing sglang needs its GPU kernels or the test shims
        version("sglang")
    except PackageNotFoundError:
        pytest.skip("sglang is not installed (make sglang-cpu)")
    torch = pins()["torch"]
    cmd = [sys.executable, str(SGLANG / "sglang_requirements.py"), "--torch", torch]
    run = subprocess.run(cmd, capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    reqs = [line for line in run.stdout.splitlines() if not line.startswith("#")]
    assert f"torch=={torch}" in reqs  # the torch SGLang's kernels are built for
    assert not [r for r in reqs if re.match(r"transformers\b", r)] and not [r for r in reqs if "extra ==" in r]
    other = subprocess.run([*cmd[:-1], "2.13.0"], capture_output=True, text=True)
    assert other.returncode == 2 and "pin SGLang's torch in scripts/gpu/versions.txt" in other.stderr


def test_install_runs_every_step_with_one_interpreter_and_the_shared_pins(tmp_path):
    script = (SGLANG / "install.sh").read_text()
    assert "DRY_RUN" in script  # never run the real install here
    env = {**os.environ, "DRY_RUN": "1", "PYTHON": "/opt/py/bin/python3.12", "TMPDIR": str(tmp_path)}
    run = subprocess.run([str(SGLANG / "install.sh")], env=env, capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    commands = run.stdout.splitlines()
    assert commands and all(c.startswith("/opt/py/bin/python3.12 ") for c in commands), commands
    installs = [c for c in commands if " -m pip install " in c]
    constraint = f"-c {REPO / 'scripts' / 'gpu' / 'versions.txt'} "
    assert len(installs) == 5 and all(constraint in c for c in installs), installs  # every version from one file
    assert installs[0].endswith(" torch ")  # torch first, at SGLang's pin
    assert f"--torch {pins()['torch']}" in run.stdout  # SGLang's declared torch pin is checked against it
    assert "/tmp/sglang_reqs.txt" not in run.stdout and str(tmp_path) in run.stdout
    assert list(tmp_path.iterdir()) == []  # the requirements file is removed on exit
