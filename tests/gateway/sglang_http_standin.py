"""SGLang's own HTTP server on CPU, for the gateway's SGLang engine: the FastAPI app of
``sglang.srt.entrypoints.http_server`` (its ``/generate`` route parsing the body into SGLang's ``GenerateReqInput``,
its ``/health``, its JSON response and its error answer), with a stand-in tokenizer manager from
tests/engines/sglang_standin.py in place of the one that talks to the GPU scheduler: scripted ids through SGLang's
own finish and output code (``ScriptedTokenizerManager``), or outputs recorded on a GPU
(``RecordedTokenizerManager``). SGLang's app is a module global: one stand-in server at a time."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

ENGINES_TESTS = Path(__file__).resolve().parents[1] / "engines"
if str(ENGINES_TESTS) not in sys.path:
    sys.path.insert(0, str(ENGINES_TESTS))

from sglang_shim import load_sglang, sglang_installed  # noqa: E402
from sglang_standin import RecordedTokenizerManager, Script, ScriptedTokenizerManager, load_recordings  # noqa: E402

from verl_ext.gateway.server import ServerThread  # noqa: E402

__all__ = [
    "RecordedTokenizerManager",
    "Script",
    "ScriptedTokenizerManager",
    "load_recordings",
    "load_sglang",
    "sglang_installed",
    "sglang_server",
]


@contextmanager
def sglang_server(tokenizer_manager: Any) -> Iterator[ServerThread]:
    """SGLang's HTTP app serving ``tokenizer_manager``, on a free port (``.url``) while the context lasts."""
    load_sglang()
    from sglang.srt.entrypoints import http_server
    from sglang.srt.environ import envs
    from sglang.srt.managers.tokenizer_manager import ServerStatus

    # what SGLang's /health reads of a running tokenizer manager
    tokenizer_manager.gracefully_exit = False
    tokenizer_manager.server_status = ServerStatus.Up
    state = http_server._GlobalState(tokenizer_manager=tokenizer_manager, template_manager=None, scheduler_info={})
    http_server.set_global_state(state)
    # SGLang's switch for a /health that answers without generating a probe token (no GPU here to generate it on)
    with envs.SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION.override(False):
        server = ServerThread(http_server.app).start()
        try:
            yield server
        finally:
            server.stop()
