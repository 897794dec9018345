"""``verl-ext gateway`` as a user runs it: a subprocess serving a local model, driven by the OpenAI SDK."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import openai

from verl_ext.telemetry.records import read_records

REPO = Path(__file__).resolve().parents[2]


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}


def test_gateway_command_serves_sessions_and_records_them_on_shutdown(tiny_qwen3_dir: Path, tmp_path: Path) -> None:
    records = tmp_path / "records"
    command = [sys.executable, "-m", "verl_ext.cli.main", "gateway", "--model", str(tiny_qwen3_dir)]
    command += ["--records", str(records), "--response-length", "64"]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=_env())
    try:
        lines = []
        for line in process.stdout:
            lines.append(line)
            if "/sessions/{id}/v1" in line:
                break
        match = re.search(r"(http://[\d.]+:\d+)/sessions/\{id\}/v1", "".join(lines))
        assert match, "".join(lines)
        base = match.group(1)
        for session in ("first", "second"):
            sdk = openai.OpenAI(base_url=f"{base}/sessions/{session}/v1", api_key="k", max_retries=0, timeout=120)
            response = sdk.chat.completions.create(
                model="m", messages=[{"role": "user", "content": "Hello"}], max_tokens=6, seed=1
            )
            assert len(response.choices[0].model_extra["token_ids"]) == response.usage.completion_tokens
        ended = httpx.post(f"{base}/sessions/first/end", timeout=60).json()
        assert ended["branches"][0]["engine_ok"]
        process.send_signal(signal.SIGTERM)  # "second" is still open: shutdown ends and records it
        rest, _ = process.communicate(timeout=120)
    finally:
        if process.poll() is None:
            process.kill()
    assert process.returncode == 0, rest
    assert "2 sessions, 2 branches recorded" in rest and "engine-view failures 0" in rest, rest
    _, rollouts = read_records(sorted(records.glob("*.jsonl")))
    assert sorted(r.extra["gateway"]["session"] for r in rollouts) == ["first", "second"]
    assert [r.extra["gateway"]["ended"] for r in rollouts] == ["ended by the client", "the gateway shut down"]


def test_gateway_command_refuses_bad_options(tiny_qwen3_dir: Path) -> None:
    command = [sys.executable, "-m", "verl_ext.cli.main", "gateway", "--model", str(tiny_qwen3_dir)]
    out = subprocess.run([*command, "--template-kwargs", "[1]"], capture_output=True, text=True, env=_env())
    assert out.returncode == 2
    assert "--template-kwargs must be a JSON object" in out.stderr and "Traceback" not in out.stderr


def test_gateway_command_checks_its_options_before_loading_the_model(
    tiny_qwen3_dir: Path, tokenizer_dirs: dict[str, Path], tmp_path: Path
) -> None:
    """Each bad option is refused (exit 2) in one line naming the option, before the weights load."""
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    cases = [
        (["--port", "99999"], "--port 99999 is not a port"),
        (["--host", "256.0.0.1"], "--host '256.0.0.1' is not"),
        (["--records", str(blocker / "records")], f"--records {blocker / 'records'}: records cannot be written"),
        (["--template-kwargs", '{"enable_thinkin": false}'], "did you mean 'enable_thinking'?"),
        (["--tokenizer", str(tokenizer_dirs["mistral-7b-v0.3"])], "is not the tokenizer of the model"),
        (["--chat-template", str(tmp_path / "missing.jinja")], "missing.jinja"),
    ]
    command = [sys.executable, "-m", "verl_ext.cli.main", "gateway", "--model", str(tiny_qwen3_dir)]
    for extra, words in cases:
        out = subprocess.run([*command, *extra], capture_output=True, text=True, env=_env(), timeout=300)
        assert out.returncode == 2, (extra, out.stdout, out.stderr)
        assert words in out.stderr and "Traceback" not in out.stderr, (extra, out.stderr)
        assert "Loading weights" not in out.stderr, (extra, out.stderr)  # refused before the model loads

