"""Print the installed SGLang's declared requirements as a pip requirements file, without its transformers pin
(install.sh pins verl's), and check that SGLang pins torch to ``--torch``.

Run by recipes/sglang/install.sh with the interpreter it installs into (so the metadata read is the installed one):
    python recipes/sglang/sglang_requirements.py --torch 2.11.0 > requirements.txt
Exit status 2, with the reason, when SGLang is not installed or pins another torch.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from importlib.metadata import PackageNotFoundError, requires, version


def requirement_name(requirement: str) -> str:
    """The distribution name a requirement line starts with, normalised (``Foo_Bar>=1`` -> ``foo-bar``)."""
    head = requirement.split(";")[0].strip()
    for i, ch in enumerate(head):
        if not (ch.isalnum() or ch in "-_."):
            head = head[:i]
            break
    return head.lower().replace("_", "-").replace(".", "-")


def sglang_requirements(declared: Sequence[str], torch: str) -> list[str]:
    """SGLang's requirements without extras and without transformers. Raises ValueError when SGLang pins torch to
    anything but ``torch==<torch>``."""
    lines = []
    for requirement in declared:
        if "extra ==" in requirement:
            continue
        name = requirement_name(requirement)
        if name == "transformers":
            continue
        if name == "torch" and requirement.split(";")[0].replace(" ", "") != f"torch=={torch}":
            raise ValueError(
                f"SGLang requires {requirement!r}, not torch=={torch}: pin SGLang's torch in scripts/gpu/versions.txt"
            )
        lines.append(requirement)
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--torch", required=True, help="the torch version SGLang must pin")
    args = parser.parse_args(argv)
    try:
        print(f"# sglang {version('sglang')}'s requirements, without transformers")
        print("\n".join(sglang_requirements(requires("sglang") or [], args.torch)))
    except PackageNotFoundError:
        print(f"error: sglang is not installed for {sys.executable}", file=sys.stderr)
        return 2
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
