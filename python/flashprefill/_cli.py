"""The `flashprefill` console command: runs the CLI program installed inside the package
(flashprefill/bin/flashprefill, linked against the package's own library) with the same arguments.

    flashprefill demo [--device cpu|cuda] [--seqlen N] ...     (flashprefill demo --help)
"""

import os
import pathlib
import sys


def program():
    """The path of the installed CLI program, or of the repository build's when run from a
    checkout."""
    here = pathlib.Path(__file__).resolve().parent
    for candidate in (here / "bin" / "flashprefill", here.parents[1] / "build" / "flashprefill"):
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return candidate
    raise SystemExit("flashprefill: the CLI program is not installed with this package (no "
                     f"{here / 'bin' / 'flashprefill'}); reinstall with `pip install .`")


def main(argv=None):
    exe = str(program())
    args = sys.argv[1:] if argv is None else list(argv)
    sys.stdout.flush()
    os.execv(exe, [exe, *args])


if __name__ == "__main__":
    main()
