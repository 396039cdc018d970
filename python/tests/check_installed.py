"""The installed package, as a user gets it from `pip install .` (CTest `installed_package`):
imported from site-packages, its library is the one inside the package, its version is the
library's and pyproject's, and the `flashprefill` console command runs the CLI.

Usage: PYTHON check_installed.py PYPROJECT   (run from outside the repository's python/)
"""

import pathlib
import re
import subprocess
import sys
import tomllib

pyproject = pathlib.Path(sys.argv[1])
sys.path = [p for p in sys.path if not p.endswith("/python")]
import flashprefill  # noqa: E402

package = pathlib.Path(flashprefill.__file__).resolve().parent
assert "site-packages" in package.parts, f"flashprefill imported from {package}, not site-packages"
lib = pathlib.Path(flashprefill._lib.path).resolve()
assert lib.parent == package, f"the library {lib} is not the installed package's own"
version = tomllib.loads(pyproject.read_text())["project"]["version"]
assert flashprefill.__version__ == version, f"{flashprefill.__version__} != pyproject's {version}"
command = pathlib.Path(sys.executable).parent / "flashprefill"
run = subprocess.run([str(command), "demo", "--help"], capture_output=True, text=True, timeout=60)
assert run.returncode == 0 and re.search(r"usage: flashprefill demo", run.stdout), run
run = subprocess.run([sys.executable, "-m", "flashprefill", "demo", "--help"],
                     capture_output=True, text=True, timeout=60)
assert run.returncode == 0 and "usage: flashprefill demo" in run.stdout, run
print(f"installed_package: flashprefill {version} from {package}, library {lib.name}, "
      f"console command {command}")
