"""The first step of a multi-node job: the model, the data and the records folder must be on storage every node
mounts at the same path. Each is checked on every alive node of the Ray cluster (one task pinned to each node) and
reported in one line; any problem exits with status 2 before verl starts.

    python recipes/check_shared_paths.py --model /models/Qwen3-4B --data /data/gsm8k --records /shared/records

Run inside a Ray job (the job's driver is connected to its cluster); outside one it starts a local Ray.
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path

DATA_FILES = ("train.parquet", "test.parquet")  # what prepare_data.py writes


def path_problems(model: str, data: str, records: str | None) -> dict[str, str | None]:
    """On this node: for each of model, data, records, None when usable here, else what is wrong."""
    problems: dict[str, str | None] = {"model": None, "data": None}
    if not Path(model, "config.json").is_file():
        problems["model"] = "no folder with a config.json" if not Path(model).is_dir() else "no config.json in it"
    missing = [name for name in DATA_FILES if not os.access(Path(data, name), os.R_OK)]
    if missing:
        problems["data"] = f"cannot read {', '.join(missing)}"
    if records:
        try:
            Path(records).mkdir(parents=True, exist_ok=True)
            with tempfile.NamedTemporaryFile(dir=records, prefix=".verl_ext-write-check-"):
                pass
            problems["records"] = None
        except OSError as exc:
            problems["records"] = f"cannot create or write it ({type(exc).__name__}: {exc.strerror or exc})"
    return problems


def report_lines(paths: Mapping[str, str | None], by_node: Mapping[str, Mapping[str, str | None]]) -> list[str]:
    """One line per path: found on every node, or on which nodes it is not and why."""
    lines = []
    for label, path in paths.items():
        if not path:
            lines.append(f"shared storage: {label}: off")
            continue
        bad = {node: problems[label] for node, problems in by_node.items() if problems.get(label)}
        if not bad:
            lines.append(f"shared storage: {label} {path}: ok on all {len(by_node)} nodes")
            continue
        where = "; ".join(f"node {node}: {why}" for node, why in sorted(bad.items()))
        lines.append(
            f"shared storage: ERROR: {label} {path}: not usable on {len(bad)} of {len(by_node)} nodes ({where}). "
            "Fix: put it on storage every node mounts at the same path (NFS, Lustre, ...)."
        )
    return lines


def check_on_every_node(model: str, data: str, records: str | None) -> dict[str, dict[str, str | None]]:
    """``path_problems`` run once on each alive Ray node (0 CPUs: it runs even on a node whose CPUs are taken)."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    if not ray.is_initialized():
        ray.init(log_to_driver=False)

    @ray.remote(num_cpus=0)
    def probe() -> tuple[str, dict[str, str | None]]:
        return socket.gethostname(), path_problems(model, data, records)

    nodes = [n for n in ray.nodes() if n.get("Alive")]
    refs = {
        n["NodeManagerAddress"] + f" ({n['NodeID'][:8]})": probe.options(
            scheduling_strategy=NodeAffinitySchedulingStrategy(n["NodeID"], soft=False)
        ).remote()
        for n in nodes
    }
    return {node: ray.get(ref, timeout=120)[1] for node, ref in refs.items()}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True, help="the model folder (config.json, tokenizer, weights)")
    parser.add_argument("--data", required=True, help=f"the folder of {' and '.join(DATA_FILES)}")
    parser.add_argument("--records", default=None, help="verl_ext's records folder (omit: no records)")
    args = parser.parse_args(argv)
    paths = {"model": args.model, "data": args.data, "records": args.records or None}
    relative = [f"{label} {path}" for label, path in paths.items() if path and not os.path.isabs(path)]
    if relative:
        print(
            f"shared storage: ERROR: {', '.join(relative)}: a relative path means another folder on every node; "
            "give absolute paths on shared storage",
            file=sys.stderr,
        )
        return 2
    lines = report_lines(paths, check_on_every_node(args.model, args.data, args.records))
    for line in lines:
        print(line, flush=True)
    return 2 if any("ERROR" in line for line in lines) else 0


if __name__ == "__main__":
    sys.exit(main())
