"""Build an offline install bundle of verl 0.9.1 + SGLang 0.5.12 + verl_ext for GPU nodes without internet.

On a machine with internet (any OS; nothing is installed there)::

    python scripts/gpu/build_bundle.py --out build/bundle [--python 3.12] [--platform manylinux_2_34_x86_64]
    python scripts/gpu/build_bundle.py --out build/bundle --resolve-only   # versions and sizes, no download

Then copy ``build/bundle`` (``manifest.json`` and the ``bundle.tar.NNN`` parts) to the node and run
``scripts/gpu/install_bundle.sh build/bundle TARGET``. Steps, each a function below:

1. **download**: every package of ``PACKAGES`` as a wheel for the target Python and platform
   (``pip download --no-deps --only-binary=:all: --python-version --platform``), at the version pinned in
   scripts/gpu/versions.txt; packages with no wheel (``SDIST_ONLY``) are downloaded as sdists and built into wheels;
   verl_ext is built from this repository. ``--no-deps`` because SGLang's declared requirements are far wider than
   what the GPU path imports (FA4, tilelang, xgrammar, torchao, ...); the set here is the one that ran.
2. **trim**: ``TRIMS`` removes from a wheel what the GPU path never imports (each with why), RECORD kept in step.
3. **check**: every module of ``REQUIRED_IMPORTS`` is in a wheel (read from the wheels' file names, nothing is
   installed); every requirement one bundled wheel declares on another bundled one is met by its version
   (``ALLOWED_CONFLICTS`` excepted, each with why). Requirements on packages not bundled are listed in the manifest.
4. **split**: the wheels in one tar, cut into parts of at most ``--part-mib`` (60) MiB, with ``manifest.json``:
   sha256 per part, per wheel and of the whole, the pinned versions, the trims and the checks.
"""

from __future__ import annotations

import argparse
import fnmatch
import hashlib
import io
import json
import re
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from email.parser import Parser
from pathlib import Path
from typing import Any

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name, parse_wheel_filename
from packaging.version import Version

REPO = Path(__file__).resolve().parents[2]
VERSIONS = Path(__file__).with_name("versions.txt")
MIB = 1 << 20
FORMAT = 1  # manifest format, checked by install_bundle.sh

# What goes in the bundle: the set that ran verl_ext's GRPO run on a GPU node with torch preinstalled, by name;
# versions from versions.txt where pinned, else the newest wheel for the target. IPython is a stub (STUBS).
PACKAGES: tuple[str, ...] = (
    "verl", "sglang", "sglang-kernel", "flashinfer-python", "transformers", "tokenizers", "ray", "transferqueue",
    "torch-memory-saver", "tensordict", "pyvers", "torchdata", "hydra-core", "omegaconf", "antlr4-python3-runtime",
    "codetiming", "datasets", "dill", "multiprocess", "pylatexenc", "pydantic", "pydantic-core", "jsonschema",
    "referencing", "rpds-py", "jsonschema-specifications", "importlib-metadata", "zipp", "fastapi", "starlette",
    "uvicorn", "python-multipart", "openai", "jiter", "distro", "sniffio", "msgspec", "orjson", "pybase64", "pyzmq",
    "setproctitle", "partial-json-parser", "interegular", "gguf", "compressed-tensors", "loguru", "soundfile", "cffi",
    "pycparser", "apache-tvm-ffi", "cuda-tile", "rapidfuzz", "cachetools", "annotated-types", "typing-inspection",
)  # fmt: skip
# On the node already, with the version the node must have (checked by install_bundle.sh); never bundled.
PREINSTALLED: dict[str, str] = {"torch": "2.11.0"}
# No wheel on PyPI: the sdist is built into a wheel (pure Python, so one wheel serves every platform).
SDIST_ONLY: dict[str, str] = {"antlr4-python3-runtime": "4.9.3 (omegaconf 2.3's parser runtime) is published as sdist"}


# Wheels written here instead of downloaded: distribution name -> (files, why). sglang.utils imports
# IPython.display (HTML, display) for notebooks only; real IPython would bring a dozen packages the run never uses.
STUBS: dict[str, tuple[dict[str, str], str]] = {
    "verl-ext-ipython-stub": (
        {
            "IPython/__init__.py": '"""Stand-in for IPython on GPU nodes (offline bundle): only IPython.display."""\n',
            "IPython/display.py": (
                '"""The two names sglang.utils imports (for notebooks); nothing on a GPU node calls them."""\n\n\n'
                "def HTML(data=None, **kwargs):\n    return data\n\n\n"
                "def display(*objs, **kwargs):\n    for obj in objs:\n        print(obj)\n"
            ),
        },
        "sglang.utils imports IPython.display for notebooks only",
    )
}


@dataclass(frozen=True)
class Trim:
    """Files removed from one package's wheel (fnmatch patterns on the paths inside the wheel), and why."""

    package: str
    patterns: tuple[str, ...]
    why: str


TRIMS: tuple[Trim, ...] = (
    Trim(
        "sglang-kernel",
        ("sgl_kernel/flash_ops*.so", "sgl_kernel/sm100/*", "sgl_kernel/flashmla_ops*.so"),
        "FA3 (~1 GB unpacked), Blackwell (sm100) and FlashMLA kernels: the run uses attention_backend=triton on "
        "Hopper (sm90 kernels kept)",
    ),
    Trim(
        "sglang-kernel",
        ("lib/*mscclpp*", "_mscclpp*.so", "include/mscclpp/*", "lib/libmscclpp*"),
        "mscclpp: custom all-reduce for tensor parallelism across GPUs; one GPU here",
    ),
    Trim("flashinfer-python", ("flashinfer/data/cutlass/*",), "CUTLASS sources for JIT builds the run never does"),
    Trim(
        "ray",
        tuple(f"ray/{p}/*" for p in ("rllib", "data", "serve", "tune", "train", "llm", "workflow", "jars")),
        "Ray libraries verl never imports (RLlib, Data, Serve, Tune, Train, LLM, Workflow; jars for Java workers)",
    ),
    Trim("ray", ("ray/dashboard/client/build/*",), "the dashboard's web build: the run sets include_dashboard=false"),
    Trim("sglang", ("sglang/multimodal_gen/*",), "diffusion serving: text generation only"),
    Trim(
        "torch-memory-saver",
        (
            "torch_memory_saver_hook_mode_*_cu12.abi3.so",
            "torch_memory_saver_hook_mode_torch.abi3.so",
            "torch_memory_saver_hook_mode_preload.abi3.so",
        ),
        "the node's torch is built for CUDA 13: only the cu13 hooks are loaded",
    ),  # fmt: skip
)

# Modules the GPU run imports that must come from the bundle (torch and the node image's own packages aside).
REQUIRED_IMPORTS: tuple[str, ...] = (
    "verl", "verl.trainer.main_ppo", "verl.workers.rollout.sglang_rollout.async_sglang_server",
    "verl.experimental.agent_loop.tool_agent_loop", "sglang", "sglang.srt.entrypoints.engine",
    "sglang.srt.managers.tokenizer_manager", "sgl_kernel", "sgl_kernel.sm90.common_ops", "flashinfer", "transformers",
    "tokenizers", "ray", "ray._raylet", "transfer_queue", "torch_memory_saver", "tensordict", "pyvers", "torchdata",
    "hydra", "omegaconf", "antlr4", "codetiming", "datasets", "dill", "multiprocess", "pylatexenc", "pydantic",
    "pydantic_core", "jsonschema", "importlib_metadata", "fastapi", "uvicorn", "multipart", "openai", "msgspec",
    "orjson", "pybase64", "zmq", "setproctitle", "partial_json_parser", "interegular", "gguf", "compressed_tensors",
    "soundfile", "tvm_ffi", "rapidfuzz", "cachetools", "IPython", "verl_ext", "verl_ext.engines.sglang_server",
    "verl_ext.plugin.agent_loop",
)  # fmt: skip

# Declared requirements between bundled packages that are knowingly not met, and why that is fine.
ALLOWED_CONFLICTS: dict[tuple[str, str], str] = {
    ("sglang", "transformers"): "sglang 0.5.12 declares transformers==5.6.0, which verl 0.9.1 refuses; it runs "
    "with verl's 5.9.0",
}


class BundleError(Exception):
    """A bundle that cannot be built or would not work; the message names the problem and the fix."""


@dataclass
class Wheel:
    """One wheel in the bundle: its file, distribution name and version."""

    path: Path
    name: str
    version: str

    @classmethod
    def of(cls, path: Path) -> Wheel:
        name, version, _build, _tags = parse_wheel_filename(path.name)
        return cls(path, str(name), str(version))


@dataclass
class TrimResult:
    """What one trim removed from one wheel."""

    package: str
    patterns: list[str]
    why: str
    removed_files: int = 0
    removed_bytes: int = 0  # uncompressed
    wheel_bytes_before: int = 0
    wheel_bytes_after: int = 0
    files: list[str] = field(default_factory=list)


def read_pins(path: Path = VERSIONS) -> dict[str, str]:
    """``name==version`` lines of a constraints file (comments and blanks skipped), by canonical name."""
    pins: dict[str, str] = {}
    for n, raw in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        match = re.fullmatch(r"([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s;]+)", line)
        if not match:
            raise BundleError(f"{path}:{n}: {raw!r} is not `name==version` (only exact pins belong in that file)")
        pins[canonicalize_name(match.group(1))] = match.group(2)
    return pins


def write_wheel(
    dest: Path, name: str, version: str, files: Mapping[str, bytes | str], requires: Sequence[str] = ()
) -> Path:
    """Write a pure-Python wheel (``py3-none-any``) with ``files`` (path -> content), its METADATA, WHEEL and
    RECORD (sha256 per file, as pip expects); return its path."""
    import base64

    dist = re.sub(r"[-_.]+", "_", name)
    info = f"{dist}-{version}.dist-info"
    meta = [
        "Metadata-Version: 2.1",
        f"Name: {name}",
        f"Version: {version}",
        *(f"Requires-Dist: {r}" for r in requires),
    ]
    contents = {k: v.encode("utf-8") if isinstance(v, str) else v for k, v in files.items()}
    contents[f"{info}/METADATA"] = ("\n".join(meta) + "\n").encode("utf-8")
    contents[f"{info}/WHEEL"] = (
        b"Wheel-Version: 1.0\nGenerator: verl_ext build_bundle\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
    )
    record = []
    for path, data in contents.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode("ascii")
        record.append(f"{path},sha256={digest},{len(data)}")
    record.append(f"{info}/RECORD,,")
    contents[f"{info}/RECORD"] = ("\n".join(record) + "\n").encode("utf-8")
    dest.mkdir(parents=True, exist_ok=True)
    path = dest / f"{dist}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as zf:
        for member, data in contents.items():
            zf.writestr(member, data)
    return path


def trim_wheel(path: Path, trims: Sequence[Trim]) -> list[TrimResult]:
    """Remove from the wheel at ``path`` (rewritten in place, same name) every file a trim of its package matches,
    and those files' RECORD lines. One result per trim that applies, with what it removed."""
    wheel = Wheel.of(path)
    mine = [t for t in trims if canonicalize_name(t.package) == canonicalize_name(wheel.name)]
    if not mine:
        return []
    results = [TrimResult(t.package, list(t.patterns), t.why, wheel_bytes_before=path.stat().st_size) for t in mine]
    buffer = io.BytesIO()
    removed: set[str] = set()
    with zipfile.ZipFile(path) as src, zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as dst:
        record_name = next((n for n in src.namelist() if n.endswith(".dist-info/RECORD")), None)
        for info in src.infolist():
            hit = next(
                (
                    r
                    for t, r in zip(mine, results, strict=True)
                    if any(fnmatch.fnmatch(info.filename, p) for p in t.patterns)
                ),
                None,
            )
            if hit is not None:
                hit.removed_files += 1
                hit.removed_bytes += info.file_size
                hit.files.append(info.filename)
                removed.add(info.filename)
            elif info.filename != record_name:
                dst.writestr(info, src.read(info), compress_type=zipfile.ZIP_DEFLATED)
        if record_name is not None:
            lines = src.read(record_name).decode("utf-8").splitlines()
            kept = [ln for ln in lines if ln.split(",", 1)[0] not in removed]
            dst.writestr(src.getinfo(record_name), ("\n".join(kept) + "\n").encode("utf-8"))
    path.write_bytes(buffer.getvalue())
    for r in results:
        r.wheel_bytes_after = path.stat().st_size
    return results


def wheel_modules(path: Path) -> set[str]:
    """Every importable module and package a wheel installs, from its file names (``a/b.py`` gives ``a`` and
    ``a.b``; extension modules count with their ABI suffix stripped); ``.dist-info`` and ``.data`` are skipped."""
    modules: set[str] = set()
    with zipfile.ZipFile(path) as zf:
        names = zf.namelist()
    for name in names:
        parts = name.split("/")
        if parts[0].endswith((".dist-info", ".data")):
            continue
        leaf = parts[-1]
        if leaf.endswith(".py"):
            stem = leaf[:-3]
        elif leaf.endswith((".so", ".pyd")):
            stem = leaf.split(".", 1)[0]
        else:
            continue
        dotted = [*parts[:-1], stem] if stem != "__init__" else parts[:-1]
        for i in range(1, len(dotted) + 1):
            modules.add(".".join(dotted[:i]))
    return modules


def missing_imports(wheels: Iterable[Path], required: Iterable[str]) -> list[str]:
    """The required modules no wheel provides (after trimming: a trim that removes a needed module shows here)."""
    provided: set[str] = set()
    for path in wheels:
        provided |= wheel_modules(path)
    return [m for m in required if m not in provided]


def wheel_requirements(path: Path) -> list[Requirement]:
    """The wheel's ``Requires-Dist`` entries (from its METADATA)."""
    with zipfile.ZipFile(path) as zf:
        meta_name = next(n for n in zf.namelist() if n.endswith(".dist-info/METADATA"))
        meta = Parser().parsestr(zf.read(meta_name).decode("utf-8"))
    out = []
    for raw in meta.get_all("Requires-Dist") or []:
        try:
            out.append(Requirement(raw))
        except InvalidRequirement as exc:
            raise BundleError(f"{path.name}: unreadable Requires-Dist {raw!r}: {exc}") from exc
    return out


def target_environment(python: str, platform: str) -> dict[str, str]:
    """PEP 508 marker values of the target node (Linux, CPython ``python``, the platform's machine)."""
    machine = "aarch64" if "aarch64" in platform else "x86_64"
    return {
        "python_version": python,
        "python_full_version": f"{python}.0",
        "sys_platform": "linux",
        "platform_system": "Linux",
        "platform_machine": machine,
        "implementation_name": "cpython",
        "platform_python_implementation": "CPython",
        "os_name": "posix",
        "extra": "",
    }


def requirement_report(
    wheels: Sequence[Wheel], environment: Mapping[str, str], preinstalled: Mapping[str, str]
) -> tuple[list[str], list[str]]:
    """(conflicts, not bundled): a requirement of one bundled wheel that a bundled (or preinstalled) version does
    not meet, unless ``ALLOWED_CONFLICTS`` lists it; and requirements on packages that are not in the bundle."""
    versions = {canonicalize_name(w.name): w.version for w in wheels}
    versions.update({canonicalize_name(k): v for k, v in preinstalled.items()})
    conflicts, absent = [], []
    for wheel in wheels:
        for req in wheel_requirements(wheel.path):
            if req.marker is not None and not req.marker.evaluate(dict(environment)):
                continue
            dep = canonicalize_name(req.name)
            if dep not in versions:
                absent.append(f"{wheel.name} {wheel.version} requires {req} (not bundled)")
            elif not req.specifier.contains(Version(versions[dep]), prereleases=True):
                why = ALLOWED_CONFLICTS.get((canonicalize_name(wheel.name), dep))
                line = f"{wheel.name} {wheel.version} requires {req}, the bundle has {dep} {versions[dep]}"
                if why is None:
                    conflicts.append(line)
                else:
                    absent.append(f"{line} (allowed: {why})")
    return conflicts, absent


def pin_conflicts(
    pins: Mapping[str, str], requires: Mapping[str, Sequence[str]], environment: Mapping[str, str]
) -> list[str]:
    """Declared requirements (package -> its ``Requires-Dist`` strings) that another package's pin does not meet,
    ``ALLOWED_CONFLICTS`` excepted: a versions.txt that cannot work together, found without downloading anything."""
    pinned = {canonicalize_name(k): v for k, v in pins.items()}
    out = []
    for package, raws in requires.items():
        for raw in raws:
            req = Requirement(raw)
            if req.marker is not None and not req.marker.evaluate(dict(environment)):
                continue
            dep = canonicalize_name(req.name)
            if dep not in pinned or req.specifier.contains(Version(pinned[dep]), prereleases=True):
                continue
            if (canonicalize_name(package), dep) not in ALLOWED_CONFLICTS:
                out.append(f"{package} requires {req}, versions.txt pins {dep}=={pinned[dep]}")
    return out


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        for block in iter(lambda: fh.read(MIB), b""):
            digest.update(block)
    return digest.hexdigest()


def split_parts(wheels: Sequence[Path], out: Path, max_bytes: int) -> tuple[list[dict[str, Any]], str]:
    """The wheels in one uncompressed tar (they are compressed already) under ``wheels/``, cut into
    ``bundle.tar.000``, ``.001``, ... of at most ``max_bytes`` each; (parts with sha256 and size, the tar's sha256)."""
    if max_bytes < 1:
        raise BundleError(f"part size {max_bytes} bytes: must be positive")
    out.mkdir(parents=True, exist_ok=True)
    for old in out.glob("bundle.tar.*"):
        old.unlink()
    with tempfile.TemporaryDirectory() as tmp:
        tar_path = Path(tmp) / "bundle.tar"
        with tarfile.open(tar_path, "w", format=tarfile.PAX_FORMAT) as tar:
            for path in sorted(wheels, key=lambda p: p.name):
                tar.add(path, arcname=f"wheels/{path.name}", recursive=False)
        whole = sha256(tar_path)
        parts = []
        with tar_path.open("rb") as fh:
            for index, chunk in enumerate(iter(lambda: fh.read(max_bytes), b"")):
                part = out / f"bundle.tar.{index:03d}"
                part.write_bytes(chunk)
                parts.append({"file": part.name, "bytes": len(chunk), "sha256": hashlib.sha256(chunk).hexdigest()})
    return parts, whole


def assemble(
    wheel_dir: Path,
    out: Path,
    *,
    python: str,
    platform: str,
    pins: Mapping[str, str],
    part_bytes: int = 60 * MIB,
    trims: Sequence[Trim] = TRIMS,
    required: Sequence[str] = REQUIRED_IMPORTS,
    preinstalled: Mapping[str, str] = PREINSTALLED,
) -> dict[str, Any]:
    """Steps 2-4 on the wheels in ``wheel_dir`` (trimmed in place): trim, check, split, write ``manifest.json``.
    Raises BundleError when a required module is missing or two bundled packages conflict."""
    paths = sorted(wheel_dir.glob("*.whl"))
    if not paths:
        raise BundleError(f"no wheels in {wheel_dir}")
    trimmed = [asdict(r) for p in paths for r in trim_wheel(p, trims)]
    wheels = [Wheel.of(p) for p in paths]
    names = [canonicalize_name(w.name) for w in wheels]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise BundleError(f"two wheels of the same package in {wheel_dir}: {', '.join(twice)}; keep one version")
    missing = missing_imports(paths, required)
    if missing:
        raise BundleError(f"the bundle lacks modules the GPU run imports: {', '.join(missing)} (add the package to "
                          "PACKAGES, or loosen the trim that removed it)")  # fmt: skip
    conflicts, absent = requirement_report(wheels, target_environment(python, platform), preinstalled)
    if conflicts:
        raise BundleError("bundled versions conflict (pin one in scripts/gpu/versions.txt, or list the pair in "
                          "ALLOWED_CONFLICTS with why):\n  " + "\n  ".join(conflicts))  # fmt: skip
    parts, whole = split_parts(paths, out, part_bytes)
    manifest = {
        "format": FORMAT,
        "python": python,
        "platform": platform,
        "pins": dict(pins),
        "preinstalled": dict(preinstalled),
        "wheels": [
            {
                "file": w.path.name,
                "name": w.name,
                "version": w.version,
                "bytes": w.path.stat().st_size,
                "sha256": sha256(w.path),
            }
            for w in wheels
        ],  # fmt: skip
        "trims": trimmed,
        "imports": list(required),
        "requirements_not_bundled": absent,
        "max_part_bytes": part_bytes,
        "tar_sha256": whole,
        "parts": parts,
    }
    (out / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n", encoding="utf-8")
    return manifest


def platform_tags(platform: str) -> list[str]:
    """Every wheel platform tag a node with ``platform`` accepts, newest first. pip's ``--platform`` matches only the
    tags it is given: ``manylinux_2_34_x86_64`` alone would refuse the many ``manylinux2014`` wheels (glibc 2.17)."""
    match = re.fullmatch(r"manylinux_2_(\d+)_(\w+)", platform)
    if not match:
        return [platform]
    minor, arch = int(match.group(1)), match.group(2)
    tags = [f"manylinux_2_{m}_{arch}" for m in range(minor, 4, -1)]
    legacy = {17: "manylinux2014", 12: "manylinux2010", 5: "manylinux1"}
    tags += [f"{name}_{arch}" for glibc, name in legacy.items() if glibc <= minor]
    return tags


def pip_target(python: str, platform: str) -> list[str]:
    """pip options that select wheels for the target node instead of this machine."""
    if not re.fullmatch(r"3\.\d+", python):
        raise BundleError(f"--python {python!r}: give the node's Python as MAJOR.MINOR, e.g. 3.12")
    abi = "cp" + python.replace(".", "")
    platforms = [arg for tag in platform_tags(platform) for arg in ("--platform", tag)]
    return ["--only-binary=:all:", "--python-version", python, *platforms, "--implementation", "cp", "--abi", abi]


def specs(pins: Mapping[str, str]) -> list[str]:
    """``name==pin`` (or the bare name) for every bundled package that has a wheel on the index."""
    sdist = {canonicalize_name(n) for n in SDIST_ONLY}
    out = []
    for name in PACKAGES:
        key = canonicalize_name(name)
        if key not in sdist:
            out.append(f"{name}=={pins[key]}" if key in pins else name)
    return out


def run(cmd: Sequence[str]) -> None:
    print("+", " ".join(cmd), flush=True)
    done = subprocess.run(list(cmd), check=False)
    if done.returncode != 0:
        raise BundleError(f"failed (exit {done.returncode}): {' '.join(cmd)}")


def download(pins: Mapping[str, str], python: str, platform: str, work: Path) -> Path:
    """Step 1: every wheel into ``work/wheels`` (sdist-only packages built, verl_ext built from this repository)."""
    wheels, sdists = work / "wheels", work / "sdists"
    wheels.mkdir(parents=True, exist_ok=True)
    pip = [sys.executable, "-m", "pip"]
    run([*pip, "download", "--no-deps", "-d", str(wheels), *pip_target(python, platform), *specs(pins)])
    for name in SDIST_ONLY:
        pin = pins.get(canonicalize_name(name))
        spec = f"{name}=={pin}" if pin else name
        run([*pip, "download", "--no-deps", "--no-binary=:all:", "-d", str(sdists), spec])
    for sdist in sorted(sdists.glob("*.tar.gz")) if sdists.is_dir() else []:
        run([*pip, "wheel", "--no-deps", "-w", str(wheels), str(sdist)])
    run([*pip, "wheel", "--no-deps", "-w", str(wheels), str(REPO)])
    for name, (files, _why) in STUBS.items():
        write_wheel(wheels, name, "0.0.0", files)
    return wheels


def resolve_only(pins: Mapping[str, str], python: str, platform: str, work: Path) -> list[dict[str, str]]:
    """Which wheel each package would be, without writing a bundle (pip's ``install --dry-run --report``). pip still
    fetches every wheel whose metadata the index does not publish separately (sglang-kernel: 322 MB)."""
    report = work / "resolve-report.json"
    run([sys.executable, "-m", "pip", "install", "--dry-run", "--no-deps", "--ignore-installed", "--quiet",
         "--target", str(work / "unused-target"), "--report", str(report), *pip_target(python, platform),
         *specs(pins)])  # fmt: skip
    items = json.loads(report.read_text(encoding="utf-8"))["install"]
    return [{"name": i["metadata"]["name"], "version": i["metadata"]["version"],
             "url": i["download_info"]["url"]} for i in items]  # fmt: skip


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="where manifest.json and the parts go")
    parser.add_argument("--python", default="3.12", help="the node's Python, MAJOR.MINOR (default 3.12)")
    parser.add_argument("--platform", default="manylinux_2_34_x86_64", help="the node's wheel platform tag")
    parser.add_argument("--part-mib", type=int, default=60, help="largest part, MiB (default 60)")
    parser.add_argument("--versions", type=Path, default=VERSIONS, help="pins (default scripts/gpu/versions.txt)")
    parser.add_argument("--work", type=Path, default=None, help="download folder (default OUT/work); reused")
    parser.add_argument("--from-wheels", type=Path, default=None, help="skip the download: use these wheels")
    parser.add_argument(
        "--resolve-only",
        action="store_true",
        help="print which wheels (pip's dry run: it still fetches wheels without index metadata)",
    )
    args = parser.parse_args(argv)
    try:
        pins = read_pins(args.versions)
        work = args.work or args.out / "work"
        if args.resolve_only:
            for item in resolve_only(pins, args.python, args.platform, work):
                print(f"{item['name']}=={item['version']}  {item['url'].rsplit('/', 1)[-1]}")
            return 0
        wheels = args.from_wheels or download(pins, args.python, args.platform, work)
        manifest = assemble(wheels, args.out, python=args.python, platform=args.platform, pins=pins,
                            part_bytes=args.part_mib * MIB)  # fmt: skip
    except BundleError as exc:
        print(f"build_bundle: {exc}", file=sys.stderr)
        return 1
    total = sum(p["bytes"] for p in manifest["parts"])
    print(f"{len(manifest['wheels'])} wheels, {len(manifest['parts'])} parts, {total / MIB:.1f} MiB in {args.out}")
    for trim in manifest["trims"]:
        print(f"  trimmed {trim['package']}: {trim['removed_files']} files, {trim['removed_bytes'] / MIB:.1f} MiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
