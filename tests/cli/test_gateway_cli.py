"""``verl-ext gateway`` as a user runs it: a subprocess serving a local model, driven by the OpenAI SDK."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

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
    assert "2 sessions served, 2 branches recorded" in rest and "engine-view failures 0" in rest, rest
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


KIMI_K2 = REPO / "tests" / "fixtures" / "templates" / "moonshotai-Kimi-K2.jinja"


def test_the_chat_template_file_given_is_the_one_served(tiny_qwen3_dir: Path, tmp_path: Path) -> None:
    """``--chat-template``: Kimi K2's real template over the model's Qwen3 tokenizer. The gateway the command builds
    serves prompts rendered by that file (transformers' own render of it, token for token), not by the tokenizer's
    template, and records them."""
    from verl_ext.cli.gateway import build_gateway
    from verl_ext.cli.main import build_parser
    from verl_ext.gateway.server import ServerThread, create_app

    argv = ["gateway", "--model", str(tiny_qwen3_dir), "--chat-template", str(KIMI_K2)]
    argv += ["--records", str(tmp_path / "records"), "--response-length", "8"]
    gateway, sock = build_gateway(build_parser().parse_args(argv))
    sock.close()  # served here on a thread, as the command serves it on the socket
    messages = [{"role": "user", "content": "Hi"}]
    server = ServerThread(create_app(gateway, "m")).start()
    try:
        sdk = openai.OpenAI(base_url=f"{server.url}/sessions/k/v1", api_key="k", max_retries=0, timeout=120)
        reply = sdk.chat.completions.create(model="m", messages=messages, max_tokens=4, seed=1)
    finally:
        server.stop()
    gateway.end("k")
    tokenizer = gateway.renderer.tokenizer
    text = tokenizer.apply_chat_template(
        messages, chat_template=KIMI_K2.read_text(), add_generation_prompt=True, tokenize=False
    )
    assert text.endswith("<|im_user|>user<|im_middle|>Hi<|im_end|><|im_assistant|>assistant<|im_middle|>"), text
    expected = tokenizer.encode(text, add_special_tokens=False)
    assert reply.usage.prompt_tokens == len(expected)
    _, (record,) = read_records(sorted((tmp_path / "records").glob("*.jsonl")))
    assert list(record.input_ids[: record.prompt_length]) == expected
    assert "<|im_start|>" not in tokenizer.decode(record.input_ids)  # nothing of the tokenizer's own template
    # with --records, image thumbnails are written beside them unless --no-thumbnails
    assert gateway.runtime.thumbnails is not None
    assert gateway.runtime.thumbnails.folder == tmp_path / "records" / "thumbnails"
    import verl_ext.gateway.local

    asked: dict[str, Any] = {}

    class Asked(Exception):
        pass

    def record_kwargs(*args: Any, **kwargs: Any) -> Any:  # the build's arguments, without a second model load
        asked.update(kwargs)
        raise Asked

    with pytest.MonkeyPatch.context() as mp, pytest.raises(Asked):
        mp.setattr(verl_ext.gateway.local, "local_gateway", record_kwargs)
        build_gateway(build_parser().parse_args([*argv, "--no-thumbnails"]))
    assert asked["thumbnails"] is False and asked["records_dir"] == str(tmp_path / "records")


def test_a_chat_template_file_that_is_no_chat_template_is_refused_naming_it(
    tiny_qwen3_dir: Path, tokenizer_dirs: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A file that is not a Jinja chat template (notes, a tokenizer_config.json, broken Jinja), or one verl_ext cannot
    serve over this tokenizer: one line naming the file and the fix, before the weights load."""
    from verl_ext.cli.main import main

    notes, broken = tmp_path / "notes.txt", tmp_path / "broken.jinja"
    notes.write_text("Use the Kimi template for the agent runs.\n")
    broken.write_text("{% for message in messages %}{{ message.content }}\n")
    phi = KIMI_K2.parent / "microsoft-Phi-3.5-mini-instruct.jinja"
    cases = [
        (notes, "not a chat template: it never reads 'messages'"),
        (tokenizer_dirs["qwen3"] / "tokenizer_config.json", "a JSON file, not a Jinja chat template; save its "),
        (broken, "the chat template does not parse, line 1"),
        (phi, f"the chat template '{phi}' (over the tokenizer"),
    ]
    for file, words in cases:
        assert main(["gateway", "--model", str(tiny_qwen3_dir), "--chat-template", str(file)]) == 2, file
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and words in err and str(file) in err, err
    assert f"verl-ext check-template {tiny_qwen3_dir} --chat-template {phi}`" in err  # the audit of that file


@pytest.mark.parametrize("flag", ["--response-length", "--max-branches"])
def test_a_budget_below_one_names_its_own_flag(flag: str, tiny_qwen3_dir: Path) -> None:
    """Refused in-process before the socket or the model (the subprocess path is the test above's)."""
    from verl_ext.cli.gateway import build_gateway
    from verl_ext.cli.main import build_parser
    from verl_ext.core.errors import OptionsError

    args = build_parser().parse_args(["gateway", "--model", str(tiny_qwen3_dir), flag, "0"])
    with pytest.raises(OptionsError) as refused:
        build_gateway(args)
    assert str(refused.value) == f"{flag} must be at least 1, got 0"


def test_a_model_folder_without_weights_is_refused_naming_what_is_missing(
    tokenizer_dirs: dict[str, Path], tmp_path: Path
) -> None:
    """A tokenizer folder given as --model: one line naming the missing weight files and the fix (in-process;
    the subprocess path of each refusal is the test above's)."""
    import shutil

    from verl_ext.cli.gateway import build_gateway
    from verl_ext.cli.main import build_parser
    from verl_ext.core.errors import OptionsError

    folder = shutil.copytree(tokenizer_dirs["qwen3"], tmp_path / "no-weights")
    (folder / "config.json").write_text('{"model_type": "qwen3"}')
    args = build_parser().parse_args(["gateway", "--model", str(folder)])
    with pytest.raises(OptionsError) as refused:
        build_gateway(args)
    assert "the folder holds no model weights (none of model.safetensors" in str(refused.value), refused.value
    assert "--sglang-url" in str(refused.value)
