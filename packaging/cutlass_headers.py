"""Prints the include folder of the CUTLASS/CuTe headers shipped in the installed nvidia-cutlass
wheel, after checking every header against the pinned digest of nvidia-cutlass==4.2.0.0.

CMakeLists.txt runs it with the build's Python (scikit-build-core's build environment under
`pip install .`, the repository's .venv under scripts/setup.sh). The digest is SHA-256 over the
sorted lines "relative path NUL sha256(file)" of cutlass_library/source/include/, computed from
the wheel whose own SHA-256 is f9599ada45c7bcb6bf53f7d3f0a7d154183e53451c01bfa59eecd37dd4a693f6.
Exit status 1 with a message on stderr when the package is missing or differs.
"""

import hashlib
import importlib.util
import pathlib
import sys

VERSION = "4.2.0.0"
HEADER_FILES = 802
HEADERS_DIGEST = "ebf1bbe2479970fc162e281c77761ea163909bc1a1225ec386da9ef0967990ed"


def fail(message):
    print(f"cutlass_headers: {message}; install it with `pip install --no-deps "
          f"nvidia-cutlass=={VERSION}` (scripts/setup.sh does, hash-checked) or set "
          f"FP_CUTLASS_INCLUDE", file=sys.stderr)
    sys.exit(1)


def main():
    spec = importlib.util.find_spec("cutlass_library")  # locates the package without importing it
    if spec is None or not spec.submodule_search_locations:
        fail(f"the Python package cutlass_library (nvidia-cutlass=={VERSION}) is not installed "
             f"for {sys.executable}")
    include = pathlib.Path(list(spec.submodule_search_locations)[0]) / "source" / "include"
    files = sorted((p.relative_to(include).as_posix(), p) for p in include.rglob("*")
                   if p.is_file()) if include.is_dir() else []
    digest = hashlib.sha256()
    for rel, path in files:  # in the order of the relative paths as strings
        digest.update(rel.encode() + b"\0" + hashlib.sha256(path.read_bytes()).hexdigest().encode()
                      + b"\n")
    if len(files) != HEADER_FILES or digest.hexdigest() != HEADERS_DIGEST:
        fail(f"{include} holds {len(files)} files with digest {digest.hexdigest()}, not the "
             f"{HEADER_FILES} headers of nvidia-cutlass=={VERSION} ({HEADERS_DIGEST})")
    print(include)


if __name__ == "__main__":
    main()
