"""Submit a Ray job, stream its log, and exit with its terminal status: 0 only when it SUCCEEDED.

``ray job submit`` exits 0 when its log stream ends, even when that is early (the dashboard's WebSocket closed, the
cluster went down) and the job is still RUNNING. This waits for the job's terminal status through Ray's job SDK,
whatever happened to the stream, prints it as the last line, and exits 1 unless it is SUCCEEDED (2 when nothing was
submitted: a usage error, a dashboard that cannot be reached; 130 when interrupted: the job then goes on, and the
line says how to stop it).

    python recipes/ray_submit.py --address http://head:8265 [--working-dir DIR] [--env KEY=VALUE ...] -- CMD ARGS...

``--working-dir`` ships that folder to every node (Ray's ``working_dir``: the job's processes start in their node's
copy and import from it), so the job finds its configs and code wherever it was submitted from.
"""

from __future__ import annotations

import argparse
import asyncio
import shlex
import sys
import time
from collections.abc import Sequence
from typing import Any

# never shipped: version control, environments, build outputs, caches
WORKING_DIR_EXCLUDES = [".git", ".venv", "venv", "build", "*.egg-info", "__pycache__", ".pytest_cache", ".ruff_cache"]


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--address", required=True, help="the Ray dashboard address, e.g. http://head:8265")
    parser.add_argument("--working-dir", default=None, help="a folder shipped to every node (Ray's working_dir)")
    parser.add_argument("--exclude", action="append", default=[], help="a path to leave out of --working-dir")
    parser.add_argument("--env", action="append", default=[], help="KEY=VALUE for every process of the job")
    parser.add_argument("--poll-s", type=float, default=5.0, help="status poll interval after the log stream ends")
    parser.add_argument("--unreachable-s", type=float, default=120.0, help="give up when the cluster is away this long")
    parser.add_argument("entrypoint", nargs=argparse.REMAINDER, help="-- then the command the job runs")
    args = parser.parse_args(argv)
    if args.entrypoint[:1] == ["--"]:
        args.entrypoint = args.entrypoint[1:]
    if not args.entrypoint:
        parser.error("no command: put it after --")
    bad = [kv for kv in args.env if "=" not in kv]
    if bad:
        parser.error(f"--env takes KEY=VALUE, got {bad}")
    return args


def runtime_env(args: argparse.Namespace) -> dict[str, Any]:
    env: dict[str, Any] = {"env_vars": dict(kv.split("=", 1) for kv in args.env)}
    if args.working_dir:
        env["working_dir"] = args.working_dir
        env["excludes"] = WORKING_DIR_EXCLUDES + list(args.exclude)
    return env


async def follow_logs(client: Any, job_id: str) -> None:
    """Print the job's log as it comes, until the stream ends (at the job's end, or earlier)."""
    async for chunk in client.tail_job_logs(job_id):
        print(chunk, end="", flush=True)


def wait_for_terminal(client: Any, job_id: str, poll_s: float, unreachable_s: float) -> tuple[str, str]:
    """(status, message) once the job is SUCCEEDED, FAILED or STOPPED; ("UNKNOWN", why) when the cluster cannot be
    reached for ``unreachable_s`` seconds (the job may still be running)."""
    last_seen = time.monotonic()
    status = "UNKNOWN"
    while True:
        try:
            info = client.get_job_info(job_id)
            last_seen = time.monotonic()
            status = str(info.status.value if hasattr(info.status, "value") else info.status)
            if info.status.is_terminal():
                return status, info.message or ""
        except Exception as exc:  # the dashboard is down or restarting: keep trying for a while
            if time.monotonic() - last_seen > unreachable_s:
                return "UNKNOWN", f"the cluster has not answered for {unreachable_s:.0f}s ({exc}); last status {status}"
        time.sleep(poll_s)


def main(argv: Sequence[str] | None = None) -> int:
    from ray.job_submission import JobSubmissionClient

    args = parse_args(sys.argv[1:] if argv is None else argv)
    try:
        client = JobSubmissionClient(args.address)
        job_id = client.submit_job(entrypoint=shlex.join(args.entrypoint), runtime_env=runtime_env(args))
    except Exception as exc:  # no dashboard there, refused, a working_dir Ray cannot package: nothing was started
        reason = " ".join(str(exc).split())[:500]
        print(f"error: could not submit the job to {args.address} ({type(exc).__name__}: {reason})", file=sys.stderr)
        return 2
    stop = f"ray job stop --address {args.address} {job_id}"
    print(f"ray job {job_id} submitted to {args.address} (stop it with: {stop})", flush=True)
    try:
        try:
            asyncio.run(follow_logs(client, job_id))
        except Exception as exc:  # a dropped stream is not the job's end: its status says
            print(f"\nthe log stream of ray job {job_id} ended early ({type(exc).__name__}: {exc})", flush=True)
        status, message = wait_for_terminal(client, job_id, args.poll_s, args.unreachable_s)
    except KeyboardInterrupt:
        print(f"\ninterrupted; ray job {job_id} goes on (stop it with: {stop})", flush=True)
        return 130
    # Ray's message of a failed job repeats the log's tail after the reason: the reason alone, so this stays one line
    reason = message.strip().splitlines()[0].split(", last available logs")[0] if message.strip() else ""
    print(f"ray job {job_id}: {status}" + (f": {reason}" if reason and status != "SUCCEEDED" else ""), flush=True)
    return 0 if status == "SUCCEEDED" else 1


if __name__ == "__main__":
    sys.exit(main())
