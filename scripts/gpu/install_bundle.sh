#!/usr/bin/env bash
# Install an offline bundle (scripts/gpu/build_bundle.py) on a GPU node without internet, into a target folder.
#
#   scripts/gpu/install_bundle.sh BUNDLE_DIR TARGET [--no-import-check]
#
# BUNDLE_DIR holds manifest.json and the parts bundle.tar.NNN. Every part is checked against the manifest (size and
# sha256), then the reassembled tar and each wheel; the node's preinstalled packages (torch) must have the pinned
# versions. The wheels are installed with `pip install --no-index --no-deps --target TARGET` (the bundle is the
# complete set; nothing is fetched or resolved), then every module the run imports is imported from TARGET.
# Use it with: export PYTHONPATH=TARGET${PYTHONPATH:+:$PYTHONPATH}
# PYTHON (default python3) is the node's Python, the one the bundle was built for.
set -euo pipefail

usage() { echo "usage: $0 BUNDLE_DIR TARGET [--no-import-check]" >&2; exit 2; }
[ $# -ge 2 ] || usage
BUNDLE=$1
TARGET=$2
IMPORT_CHECK=1
[ "${3:-}" = "--no-import-check" ] && IMPORT_CHECK=0
[ $# -le 3 ] || usage
PYTHON=${PYTHON:-python3}
[ -f "$BUNDLE/manifest.json" ] || { echo "install_bundle: no manifest.json in $BUNDLE (copy the whole bundle folder)" >&2; exit 1; }

WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT

# Checks and reassembly in Python (the node has it; no jq needed): parts, tar, wheels, Python version, torch.
"$PYTHON" - "$BUNDLE" "$WORK" <<'PY'
import hashlib, json, sys, tarfile
from pathlib import Path

bundle, work = Path(sys.argv[1]), Path(sys.argv[2])
manifest = json.loads((bundle / "manifest.json").read_text())

def fail(message):
    sys.exit(f"install_bundle: {message}")

if manifest.get("format") != 1:
    fail(f"manifest format {manifest.get('format')!r}, this script reads format 1 (rebuild the bundle)")
want = manifest["python"]
have = "%d.%d" % sys.version_info[:2]
if have != want:
    fail(f"the bundle is for Python {want}, this is {have} (set PYTHON, or rebuild with --python {have})")
whole = hashlib.sha256()
with (work / "bundle.tar").open("wb") as out:
    for part in manifest["parts"]:
        path = bundle / part["file"]
        if not path.is_file():
            fail(f"part {part['file']} is missing from {bundle} ({len(manifest['parts'])} parts in all)")
        data = path.read_bytes()
        if len(data) != part["bytes"] or hashlib.sha256(data).hexdigest() != part["sha256"]:
            fail(f"part {part['file']} is damaged: size or sha256 differs from the manifest (copy it again)")
        whole.update(data)
        out.write(data)
if whole.hexdigest() != manifest["tar_sha256"]:
    fail("the reassembled tar's sha256 differs from the manifest (parts from two different bundles?)")
with tarfile.open(work / "bundle.tar") as tar:
    tar.extractall(work, filter="data") if hasattr(tarfile, "data_filter") else tar.extractall(work)
for wheel in manifest["wheels"]:
    path = work / "wheels" / wheel["file"]
    if not path.is_file() or hashlib.sha256(path.read_bytes()).hexdigest() != wheel["sha256"]:
        fail(f"wheel {wheel['file']} is missing or differs from the manifest")
for name, version in manifest.get("preinstalled", {}).items():
    from importlib.metadata import PackageNotFoundError, version as installed
    try:
        found = installed(name)
    except PackageNotFoundError:
        fail(f"{name} {version} must be installed on the node first (the bundle does not carry it)")
    if found.split("+")[0] != version:
        fail(f"the node has {name} {found}; the bundle is built for {name} {version}")
print(f"install_bundle: {len(manifest['parts'])} parts and {len(manifest['wheels'])} wheels checked")
PY

mkdir -p "$TARGET"
# --upgrade: a second install into the same TARGET replaces what is there (pip leaves it otherwise)
"$PYTHON" -m pip install --no-index --no-deps --upgrade --disable-pip-version-check --quiet --target "$TARGET" "$WORK"/wheels/*.whl

if [ "$IMPORT_CHECK" = 1 ]; then
  PYTHONPATH="$TARGET${PYTHONPATH:+:$PYTHONPATH}" "$PYTHON" - "$BUNDLE/manifest.json" <<'PY'
import importlib, json, sys
failed = []
for name in json.load(open(sys.argv[1]))["imports"]:
    try:
        importlib.import_module(name)
    except Exception as exc:  # any failure to import is the node's problem to report, not to hide
        failed.append(f"{name}: {type(exc).__name__}: {exc}")
if failed:
    sys.exit("install_bundle: installed, but these imports fail:\n  " + "\n  ".join(failed))
print("install_bundle: every module the run imports imports")
PY
fi
echo "install_bundle: installed into $TARGET; use it with: export PYTHONPATH=$TARGET\${PYTHONPATH:+:\$PYTHONPATH}"
