"""``verl-ext gateway``: serve OpenAI-compatible sessions on the CPU engine (or a running SGLang server,
``--sglang-url``), to try a harness before training.

Any new session id opens a session; ``POST /sessions/{id}/end`` ends one, and every session still open is ended
on shutdown (Ctrl-C): each branch is checked and, with ``--records``, written as a record ``verl-ext report``
reads.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import signal
import socket
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from verl_ext.gateway.service import Gateway
    from verl_ext.gateway.sglang_engine import SGLangEngine

# verl_ext.core (its errors included) is imported inside the functions: `verl-ext --help` builds this parser and
# must not import the token core (tokenizers, transformers).


def add_gateway_parser(sub: argparse._SubParsersAction) -> None:
    """The ``gateway`` subcommand's arguments."""
    gw = sub.add_parser("gateway", help="serve OpenAI-compatible sessions that keep the engine's tokens (CPU engine)")
    gw.add_argument("--model", required=True, metavar="DIR", help="a local Hugging Face model folder")
    gw.add_argument("--tokenizer", metavar="DIR", help="tokenizer folder (default: the model's)")
    gw.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    gw.add_argument("--port", type=int, default=0, help="port (default: a free one, printed)")
    gw.add_argument("--records", metavar="DIR", help="write a record per branch here when its session ends")
    gw.add_argument(
        "--no-thumbnails",
        action="store_true",
        help="with --records, write no image thumbnails (DIR/thumbnails: one small PNG per distinct image)",
    )
    gw.add_argument("--response-length", type=int, default=1024, help="token budget per branch (default 1024)")
    gw.add_argument("--max-branches", type=int, default=8, help="branches per session before it ends (default 8)")
    gw.add_argument("--tool-parser", default="hermes", help="verl's tool-call format (default hermes)")
    gw.add_argument("--template-kwargs", metavar="JSON", help="a JSON object passed to the chat template")
    gw.add_argument(
        "--chat-template", metavar="FILE", help="a Jinja chat template file to use instead of the tokenizer's"
    )
    gw.add_argument("--seed", type=int, default=0, help="sampling seed for requests that give none (CPU engine)")
    gw.add_argument(
        "--sglang-url",
        metavar="URL",
        help="generate with the SGLang server running at URL (its native /generate, token ids in and out) instead "
        "of the CPU engine; --model names the model it serves (tokenizer, template and context length are read "
        "from it, its weights are not loaded)",
    )


def run_gateway(args: argparse.Namespace) -> int:
    """Serve until interrupted; then end every open session (records written) and print what was recorded."""
    import uvicorn

    from verl_ext.gateway.server import KEEP_ALIVE_S, create_app

    gateway, sock = build_gateway(args)
    # Listening before the address is printed: a client that reads it and connects at once waits in the backlog
    # until the server takes it, instead of being refused while the app starts (seen under load).
    sock.listen(2048)
    host, port = sock.getsockname()[:2]
    on = f" (SGLang at {args.sglang_url})" if args.sglang_url else ""
    print(f"verl-ext gateway: serving {args.model}{on} at http://{host}:{port}/sessions/{{id}}/v1", flush=True)
    print("  any new id opens a session; POST /sessions/{id}/end ends it (Ctrl-C ends them all)", flush=True)
    server = uvicorn.Server(
        uvicorn.Config(
            create_app(gateway, str(args.model)), log_level="warning", lifespan="off", timeout_keep_alive=KEEP_ALIVE_S
        )
    )
    # uvicorn shuts down gracefully on SIGINT/SIGTERM, then raises the signal again under the handler it found:
    # both become KeyboardInterrupt here, so the open sessions are still recorded (SIGTERM's default would kill).
    signal.signal(signal.SIGTERM, _interrupted)
    with contextlib.suppress(KeyboardInterrupt):
        server.run(sockets=[sock])
    gateway.end_all()
    print(shutdown_summary(gateway), flush=True)
    return 0


def build_gateway(args: argparse.Namespace) -> tuple[Gateway, socket.socket]:
    """The gateway ``verl-ext gateway`` serves for ``args`` and its socket (bound, not yet listening). Every option is
    checked before the slow load (the model's weights): the address, the records folder, the template file and its
    kwargs, the tokenizer against the model."""
    from verl_ext.cli.options import renderer_from_args
    from verl_ext.core.errors import OptionsError
    from verl_ext.gateway.local import check_tokenizer_matches, local_gateway
    from verl_ext.gateway.service import GatewayConfig

    for flag, value in (("--response-length", args.response_length), ("--max-branches", args.max_branches)):
        if value < 1:
            raise OptionsError(f"{flag} must be at least 1, got {value}")
    _check_tool_parser(args.tool_parser)
    sock = _listening_socket(args.host, args.port)
    try:
        if args.records:
            from verl_ext.telemetry.records import records_folder_problem

            problem = records_folder_problem(args.records)
            if problem:
                raise OptionsError(
                    f"--records {args.records}: records cannot be written there ({problem}); pass a folder this user "
                    "can create and write, or leave --records out"
                )
        renderer = renderer_from_args(args.tokenizer or args.model, args)
        check_tokenizer_matches(args.model, renderer, args.tokenizer)
        if not args.sglang_url:  # the CPU engine loads the weights from the folder
            _refuse_a_folder_without_weights(args.model)
        config = GatewayConfig(response_length=args.response_length, max_branches=args.max_branches)
        engine = _sglang_engine(args.sglang_url, args.model) if args.sglang_url else None
        gateway = local_gateway(
            args.model,
            records_dir=args.records,
            thumbnails=not args.no_thumbnails,
            config=config,
            tool_parser=args.tool_parser,
            seed=args.seed,
            engine=engine,
            renderer=renderer,
            processor=getattr(engine, "processor", None),
        )
    except BaseException:  # a refused option: the port is free again at once (the CLI's tests run in one process)
        sock.close()
        raise
    return gateway, sock


def shutdown_summary(gateway: Gateway) -> str:
    """The line printed on shutdown, once every session has ended: sessions, branches recorded, forks, requests
    refused for the model's context (``context_length_exceeded``), and the engine-view failures among every branch
    checked, the sessions the harness ended itself included."""
    c = gateway.counters
    where = f" to {gateway.writer.path}" if gateway.writer else " (no --records: nothing written)"
    unserved = c["sessions"] - c["sessions_served"]
    return (
        f"verl-ext gateway: {c['sessions_served']} sessions served"
        + (f" ({unserved} more opened without an engine call)" if unserved else "")
        + f", {c['branches_recorded']} branches recorded{where}; "
        f"forks {c['forks']}, context refusals {c['context_length_exceeded']}, "
        f"expired idle {c['sessions_expired']}, engine-view failures {c['engine_view_failures']}"
    )


def _check_tool_parser(name: str) -> None:
    """``--tool-parser``: one of verl's tool-call formats, checked before the model loads."""
    from verl.experimental.agent_loop.tool_parser import ToolParser

    from verl_ext.core.errors import OptionsError

    known = sorted(ToolParser._registry)
    if name not in known:
        raise OptionsError(
            f"--tool-parser {name!r} is not one of verl's tool-call formats; pass one of {', '.join(known)} (hermes: "
            "Qwen's <tool_call> blocks, the default)"
        )


# What transformers' save_pretrained writes: one weights file, or an index of shards.
WEIGHT_FILES = (
    "model.safetensors",
    "model.safetensors.index.json",
    "pytorch_model.bin",
    "pytorch_model.bin.index.json",
)


def _refuse_a_folder_without_weights(model_dir: str) -> None:
    """A model folder the CPU engine cannot load, refused before the load, naming what is missing and the fix."""
    from pathlib import Path

    from verl_ext.core.errors import OptionsError

    folder = Path(model_dir)
    if folder.is_dir() and not any((folder / name).is_file() for name in WEIGHT_FILES):
        raise OptionsError(
            f"--model {model_dir}: the folder holds no model weights (none of {', '.join(WEIGHT_FILES)}); give a "
            "folder saved with save_pretrained (a tokenizer-only folder goes to --tokenizer), or serve the model "
            "with SGLang and pass --sglang-url"
        )


def _sglang_engine(url: str, model_dir: str) -> SGLangEngine:
    """The SGLang engine at ``url``, checked to answer before the gateway starts."""
    from pathlib import Path

    from verl_ext.core.errors import EngineRequestError, OptionsError
    from verl_ext.gateway.sglang_engine import SGLangEngine, model_context
    from verl_ext.runtime.images import load_processor

    processor = None
    if (Path(model_dir) / "preprocessor_config.json").is_file():  # a VL model: its images are proven with it
        try:
            processor = load_processor(model_dir).processor
        except OptionsError:
            processor = None  # the gateway's own load names the cause on every image request
    try:
        engine = SGLangEngine(url, max_context=model_context(model_dir), processor=processor)
        engine.check_reachable()
    except EngineRequestError as exc:
        raise OptionsError(f"--sglang-url: {exc}") from exc
    return engine


def _interrupted(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def _listening_socket(host: str, port: int) -> socket.socket:
    """A socket bound to ``host:port``, or an ``OptionsError`` blaming the option at fault."""
    from verl_ext.core.errors import OptionsError

    if not 0 <= port <= 65535:
        raise OptionsError(f"--port {port} is not a port: pass 1-65535, or 0 (the default) for a free one")
    try:
        socket.getaddrinfo(host, port, socket.AF_INET, socket.SOCK_STREAM)
    except socket.gaierror as exc:
        raise OptionsError(
            f"--host {host!r} is not an IPv4 address or a name this machine resolves ({exc.strerror}); pass e.g. "
            "127.0.0.1 (this machine only) or 0.0.0.0 (every interface)"
        ) from None
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        if exc.errno == errno.EADDRNOTAVAIL:
            raise OptionsError(
                f"--host {host!r} is not an address of this machine ({exc.strerror}); pass one of its addresses, "
                "127.0.0.1 or 0.0.0.0"
            ) from None
        raise OptionsError(f"cannot listen on {host}:{port}: {exc.strerror or exc}; pick another --port") from None
    return sock
