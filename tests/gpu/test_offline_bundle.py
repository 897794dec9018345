"""CPU, in CI, no network: the offline GPU bundle (scripts/gpu/build_bundle.py, install_bundle.sh) on small wheels
built here: trims, the import and version checks, parts + manifest, and the install script run for real with pip."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import re
import subprocess
import sys
import zipfile
from pathlib import Path
from types import ModuleType

import pytest

REPO = Path(__file__).resolve().parents[2]
GPU_SCRIPTS = REPO / "scripts" / "gpu"
INSTALL = GPU_SCRIPTS / "install_bundle.sh"
TORCH = "2.13.0"
HERE = "{}.{}".format(
    *sys.version_info[:2]
)  # this Python, as the bundle's target  # this venv's torch: the "preinstalled" package the install script checks


@pytest.fixture(scope="module")
def bb() -> ModuleType:
    spec = importlib.util.spec_from_file_location("build_bundle", GPU_SCRIPTS / "build_bundle.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def noise(n: int, seed: int) -> bytes:
    """Incompressible bytes, so wheel and part sizes are what the test says."""
    out, block = bytearray(), hashlib.sha256(str(seed).encode()).digest()
    while len(out) < n:
        block = hashlib.sha256(block).digest()
        out += block
    return bytes(out[:n])


@pytest.fixture()
def wheels(bb: ModuleType, tmp_path: Path) -> Path:
    """A small bundle's wheels: shaped like the real packages the trims and checks are about."""
    d = tmp_path / "wheels"
    bb.write_wheel(d, "sglang-kernel", "0.4.2.post2", {
        "sgl_kernel/__init__.py": "from . import load_utils\n",
        "sgl_kernel/load_utils.py": "",
        "sgl_kernel/flash_ops.abi3.so": noise(200_000, 1),
        "sgl_kernel/flashmla_ops.abi3.so": noise(10_000, 2),
        "sgl_kernel/sm100/common_ops.abi3.so": noise(20_000, 3),
        "sgl_kernel/sm90/common_ops.abi3.so": noise(150_000, 4),
        "lib/mscclpp.so": noise(5_000, 5),
    })  # fmt: skip
    bb.write_wheel(d, "ray", "2.60.0", {
        "ray/__init__.py": "",
        "ray/_private/worker.py": "",
        "ray/rllib/__init__.py": "",
        "ray/dashboard/__init__.py": "",
        "ray/dashboard/client/build/index.html": "<html></html>",
    })  # fmt: skip
    bb.write_wheel(d, "tensordict", "0.10.0", {"tensordict/__init__.py": ""}, requires=["pyvers<0.2"])
    bb.write_wheel(d, "pyvers", "0.1.0", {"pyvers/__init__.py": ""})
    bb.write_wheel(d, "transformers", "5.9.0", {"transformers/__init__.py": ""}, requires=["tokenizers<=0.23"])
    sglang_requires = ["transformers==5.6.0", "xgrammar==0.2.0", 'decord2; platform_machine == "aarch64"']
    bb.write_wheel(d, "sglang", "0.5.12", {"sglang/__init__.py": "", "sglang/multimodal_gen/x.py": ""}, sglang_requires)
    for name, (files, _why) in bb.STUBS.items():
        bb.write_wheel(d, name, "0.0.0", files)
    return d


REQUIRED = ("sgl_kernel", "sgl_kernel.sm90.common_ops", "ray", "tensordict", "pyvers", "transformers", "sglang",
            "IPython.display")  # fmt: skip
PURE = ("sgl_kernel", "ray", "tensordict", "pyvers", "transformers", "sglang", "IPython.display")


def assemble(bb: ModuleType, wheels: Path, out: Path, **kw):
    args = {"python": "3.11", "platform": "manylinux_2_28_x86_64", "pins": {"torch": TORCH}, "required": REQUIRED,
            "preinstalled": {"torch": TORCH}, "part_bytes": 64 * 1024, **kw}  # fmt: skip
    return bb.assemble(wheels, out, **args)


def test_trims_remove_what_they_list_and_keep_record_in_step(bb: ModuleType, wheels: Path) -> None:
    kernel = wheels / "sglang_kernel-0.4.2.post2-py3-none-any.whl"
    results = bb.trim_wheel(kernel, bb.TRIMS)
    removed = sorted(f for r in results for f in r.files)
    assert removed == ["lib/mscclpp.so", "sgl_kernel/flash_ops.abi3.so", "sgl_kernel/flashmla_ops.abi3.so",
                       "sgl_kernel/sm100/common_ops.abi3.so"]  # fmt: skip
    assert all(r.why for r in results) and results[0].wheel_bytes_after < results[0].wheel_bytes_before
    with zipfile.ZipFile(kernel) as zf:
        names = set(zf.namelist())
        record = zf.read("sglang_kernel-0.4.2.post2.dist-info/RECORD").decode()
    assert "sgl_kernel/sm90/common_ops.abi3.so" in names and not names & set(removed)
    assert {line.split(",")[0] for line in record.splitlines()} == names
    ray = bb.trim_wheel(wheels / "ray-2.60.0-py3-none-any.whl", bb.TRIMS)
    assert sorted(f for r in ray for f in r.files) == ["ray/dashboard/client/build/index.html", "ray/rllib/__init__.py"]
    assert bb.trim_wheel(wheels / "pyvers-0.1.0-py3-none-any.whl", bb.TRIMS) == []


def test_the_real_trims_cover_what_the_gpu_path_never_imports(bb: ModuleType) -> None:
    patterns = {p for t in bb.TRIMS for p in t.patterns}
    assert {"sgl_kernel/flash_ops*.so", "sgl_kernel/sm100/*", "sgl_kernel/flashmla_ops*.so"} <= patterns
    assert "flashinfer/data/cutlass/*" in patterns and "ray/dashboard/client/build/*" in patterns
    assert {f"ray/{p}/*" for p in ("rllib", "serve", "tune", "train", "data")} <= patterns
    packages = {bb.canonicalize_name(p) for p in bb.PACKAGES}
    assert {bb.canonicalize_name(t.package) for t in bb.TRIMS} <= packages and all(t.why for t in bb.TRIMS)
    assert {bb.canonicalize_name(p) for p in bb.SDIST_ONLY} <= packages
    assert not {m for m in bb.REQUIRED_IMPORTS if m.startswith("sgl_kernel.sm100")}  # what is trimmed is not needed


def test_a_trim_that_removes_a_needed_module_fails_the_import_check(bb: ModuleType, wheels: Path, tmp_path) -> None:
    with pytest.raises(
        bb.BundleError, match=r"lacks modules the GPU run imports: sgl_kernel\.flash_ops, verl \(add the package"
    ):
        assemble(bb, wheels, tmp_path / "out", required=(*REQUIRED, "sgl_kernel.flash_ops", "verl"))


def test_version_conflicts_between_bundled_wheels_fail(bb: ModuleType, wheels: Path, tmp_path: Path) -> None:
    (wheels / "pyvers-0.1.0-py3-none-any.whl").unlink()
    bb.write_wheel(wheels, "pyvers", "0.2.3", {"pyvers/__init__.py": ""})
    with pytest.raises(
        bb.BundleError, match=r"tensordict 0\.10\.0 requires pyvers<0\.2, the bundle has pyvers 0\.2\.3"
    ):
        assemble(bb, wheels, tmp_path / "out")


def test_parts_and_manifest(bb: ModuleType, wheels: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    manifest = assemble(bb, wheels, out)
    parts = manifest["parts"]
    assert len(parts) >= 2 and all(p["bytes"] <= 64 * 1024 for p in parts)
    whole = hashlib.sha256()
    for p in parts:
        data = (out / p["file"]).read_bytes()
        assert hashlib.sha256(data).hexdigest() == p["sha256"] and len(data) == p["bytes"]
        whole.update(data)
    assert whole.hexdigest() == manifest["tar_sha256"]
    assert json.loads((out / "manifest.json").read_text()) == manifest
    assert {w["name"] for w in manifest["wheels"]} >= {"sglang-kernel", "ray", "verl-ext-ipython-stub"}
    assert {t["package"] for t in manifest["trims"]} == {"sglang-kernel", "ray", "sglang"}
    unmet = "\n".join(manifest["requirements_not_bundled"])
    assert "xgrammar==0.2.0 (not bundled)" in unmet and "allowed: sglang 0.5.12 declares" in unmet
    assert "decord2" not in unmet  # its marker is false on x86_64
    assert manifest["pins"] == {"torch": TORCH} and manifest["imports"] == list(REQUIRED)


def test_a_bundle_too_big_for_one_part_still_splits_under_the_limit(bb: ModuleType, tmp_path: Path) -> None:
    d = tmp_path / "w"
    bb.write_wheel(d, "big", "1.0", {"big/__init__.py": "", "big/blob.bin": noise(300_000, 9)})
    manifest = bb.assemble(d, tmp_path / "out", python="3.11", platform="x", pins={}, required=("big",),
                           preinstalled={}, part_bytes=100_000)  # fmt: skip
    assert [p["bytes"] <= 100_000 for p in manifest["parts"]] == [True] * 4


def install(bundle: Path, target: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHON": sys.executable}
    return subprocess.run(["bash", str(INSTALL), str(bundle), str(target), *extra], env=env, text=True,
                          capture_output=True, timeout=300)  # fmt: skip


def test_install_script_checks_and_installs_into_a_target(bb: ModuleType, wheels: Path, tmp_path: Path) -> None:
    out = tmp_path / "bundle"
    assemble(bb, wheels, out, python=HERE, required=PURE)
    target = tmp_path / "target"
    run = install(out, target)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "every module the run imports imports" in run.stdout
    assert (target / "sgl_kernel" / "sm90" / "common_ops.abi3.so").is_file()
    assert not (target / "sgl_kernel" / "flash_ops.abi3.so").exists() and not (target / "ray" / "rllib").exists()
    assert (target / "IPython" / "display.py").is_file()
    (target / "pyvers" / "__init__.py").write_text("raise ImportError('stale')\n")  # a second install replaces it
    again = install(out, target)
    assert again.returncode == 0, again.stdout + again.stderr
    assert (target / "pyvers" / "__init__.py").read_text() == ""


def test_download_asks_for_every_package_at_its_pin(bb: ModuleType) -> None:
    wanted = bb.specs({"verl": "0.9.1", "antlr4-python3-runtime": "4.9.3"})
    assert "verl==0.9.1" in wanted and "ray" in wanted  # unpinned: the newest wheel for the target
    assert not [s for s in wanted if s.startswith("antlr4")]  # built from its sdist instead
    assert len(wanted) == len(bb.PACKAGES) - len(bb.SDIST_ONLY)


def test_install_script_refuses_a_damaged_or_foreign_bundle(bb: ModuleType, wheels: Path, tmp_path: Path) -> None:
    here = HERE
    out = tmp_path / "bundle"
    assemble(bb, wheels, out, python=here, required=PURE)
    part = out / "bundle.tar.001"
    data = bytearray(part.read_bytes())
    data[10] ^= 0xFF
    part.write_bytes(bytes(data))
    run = install(out, tmp_path / "t1")
    assert run.returncode == 1 and "part bundle.tar.001 is damaged" in run.stderr and "Traceback" not in run.stderr
    assemble(bb, wheels, out, python="3.9", required=PURE)
    run = install(out, tmp_path / "t2")
    assert run.returncode == 1 and f"the bundle is for Python 3.9, this is {here}" in run.stderr
    assemble(bb, wheels, out, python=here, required=PURE, preinstalled={"torch": "2.11.0"})
    run = install(out, tmp_path / "t3")
    assert run.returncode == 1 and "bundle is built for torch 2.11.0" in run.stderr
    assert not (tmp_path / "t3").exists()  # nothing installed


def test_the_cli_reports_a_missing_module_without_a_traceback(wheels: Path, tmp_path: Path) -> None:
    cmd = [sys.executable, str(GPU_SCRIPTS / "build_bundle.py"), "--out", str(tmp_path / "o"), "--from-wheels",
           str(wheels)]  # fmt: skip
    run = subprocess.run(cmd, text=True, capture_output=True, timeout=120)
    assert run.returncode == 1 and "Traceback" not in run.stderr
    assert "build_bundle: the bundle lacks modules the GPU run imports: verl, verl.trainer.main_ppo, " in run.stderr
    assert "flashinfer" in run.stderr and " sgl_kernel," not in run.stderr  # the synthetic kernel wheel has it


def test_versions_file_pins_the_install_gaps(bb: ModuleType, tmp_path: Path) -> None:
    pins = bb.read_pins()
    assert pins["verl"] == "0.9.1" and pins["sglang"] == "0.5.12" and pins["transformers"] == "5.9.0"
    assert pins["tokenizers"].startswith("0.22.") and pins["omegaconf"].startswith("2.3.")
    assert pins["torch-memory-saver"] == "0.0.10" and pins["torch"] == bb.PREINSTALLED["torch"]
    assert bb.Version(pins["pyvers"]) < bb.Version("0.2")
    assert {"pydantic", "jsonschema", "importlib-metadata"} <= set(pins)
    bad = tmp_path / "v.txt"
    bad.write_text("verl>=0.9\n")
    with pytest.raises(bb.BundleError, match=r"v\.txt:1: 'verl>=0\.9' is not `name==version`"):
        bb.read_pins(bad)


def test_the_recipes_install_script_pins_the_same_versions(bb: ModuleType) -> None:
    """recipes/sglang/install.sh (the online install) must not pin another version than versions.txt (the right
    way: install with ``-c scripts/gpu/versions.txt``; literal pins left in it must agree)."""
    pins = bb.read_pins()
    lines = (REPO / "recipes" / "sglang" / "install.sh").read_text().splitlines()
    text = "\n".join(line.split("#", 1)[0] for line in lines)  # comments may quote other projects' pins
    pinned = {
        bb.canonicalize_name(n): v for n, v in re.findall(r"([A-Za-z0-9][A-Za-z0-9._-]*)==([0-9][^\s\"']*)", text)
    }
    reads_the_file = "scripts/gpu/versions.txt" in text
    assert pinned or reads_the_file, "install.sh pins nothing: it should install with -c scripts/gpu/versions.txt"
    assert {n: v for n, v in pinned.items() if pins.get(n) != v} == {}


def test_pip_is_given_every_manylinux_tag_the_node_accepts(bb: ModuleType) -> None:
    tags = bb.platform_tags("manylinux_2_28_x86_64")
    assert tags[0] == "manylinux_2_28_x86_64" and "manylinux_2_17_x86_64" in tags and "manylinux2014_x86_64" in tags
    assert "manylinux_2_29_x86_64" not in tags and bb.platform_tags("manylinux_2_12_aarch64")[-2:] == [
        "manylinux2010_aarch64", "manylinux1_aarch64"]  # fmt: skip
    args = bb.pip_target("3.12", "manylinux_2_28_x86_64")
    assert args.count("--platform") == len(tags) and args[args.index("--abi") + 1] == "cp312"
    with pytest.raises(bb.BundleError, match="give the node's Python as MAJOR.MINOR"):
        bb.pip_target("cp312", "manylinux_2_28_x86_64")


def test_the_pins_meet_what_the_pinned_packages_declare(bb: ModuleType) -> None:
    """verl 0.9.1's and sglang 0.5.12's own declared requirements (and those of every other pinned package this
    venv has at the pinned version) against versions.txt: e.g. tensordict's pyvers < 0.2, sglang's exact pins."""
    from importlib.metadata import PackageNotFoundError, requires, version

    pins = bb.read_pins()
    declared = {}
    for name, pin in pins.items():
        try:
            same = version(name) == pin
        except PackageNotFoundError:
            same = False
        if same:
            declared[name] = [r for r in requires(name) or [] if "extra ==" not in r]
    assert {"verl", "sglang"} <= set(declared)  # installed by `make venv sglang-cpu` at the pinned versions
    environment = bb.target_environment("3.12", "manylinux_2_34_x86_64")
    assert bb.pin_conflicts(pins, declared, environment) == []
    declared["tensordict"] = ["pyvers<0.2,>=0.1.0"]  # what tensordict 0.10.0 declares, should this venv lack it
    broken = {**pins, "pyvers": "0.2.3", "openai": "3.0.0"}
    assert sorted(bb.pin_conflicts(broken, declared, environment)) == [
        "sglang requires openai==2.6.1, versions.txt pins openai==3.0.0",
        "tensordict requires pyvers<0.2,>=0.1.0, versions.txt pins pyvers==0.2.3",
    ]
