"""Real long text for the study, as token ids.

- `kjv`: the King James Bible from Debian's `bible-kjv-text` (read through its `bible` program),
  verse references stripped, starting at Genesis 1:1.
- `code`: Python source of the standard library that runs this harness (real code, several
  modules concatenated in a fixed order).

`encoded(encode)` returns each text's token ids (`encode(str) -> ids`); tasks.build_pack makes the
prompts from them once, so a machine without the Debian package or these sources reads the pack.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sysconfig

import numpy as np

KJV_RANGE = "gen1:1-ex40:38"          # Genesis and Exodus: about 90K tokens
CODE_MODULES = ["argparse.py", "dataclasses.py", "functools.py", "json/decoder.py", "json/encoder.py",
                "textwrap.py", "shutil.py", "tarfile.py", "zipfile.py", "pathlib.py"]
MAX_CHARS = 360_000          # over 80K tokens of either text (about 4 and 3 chars a token)


def kjv_text(max_chars: int = MAX_CHARS) -> str:
    if shutil.which("bible") is None:
        raise FileNotFoundError("`bible` not found: apt-get install bible-kjv-text (accuracy/setup.sh)")
    env = dict(os.environ, COLUMNS="100000")
    raw = subprocess.run(["bible", "-f", KJV_RANGE], capture_output=True, text=True, env=env,
                         check=True).stdout[: max_chars * 2]
    verses = [re.sub(r"^\S+\s+", "", line) for line in raw.splitlines() if line.strip()]
    return " ".join(verses)[:max_chars]


def code_text(max_chars: int = MAX_CHARS) -> str:
    lib = sysconfig.get_paths()["stdlib"]
    parts = []
    for rel in CODE_MODULES:
        with open(os.path.join(lib, rel), encoding="utf-8") as f:
            parts.append(f"# file: {rel}\n" + f.read())
    return "\n\n".join(parts)[:max_chars]


TEXTS = {"kjv": kjv_text, "code": code_text}


def encoded(encode) -> dict:
    """{name: int32 token ids} of every text."""
    return {name: np.asarray(encode(text()), dtype=np.int32) for name, text in TEXTS.items()}
