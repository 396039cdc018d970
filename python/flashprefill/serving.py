"""The selection settings of the engine backends (flashprefill.vllm, flashprefill.sglang), read
from one place: FLASHPREFILL_* environment variables, once, when a backend is built.

    FLASHPREFILL_ALPHA               0.1   keep a KV block whose energy is at least alpha times
                                           the largest; 0 makes every request exact
    FLASHPREFILL_BLOCK_SIZE          128   the selection's KV block, a multiple of 64
    FLASHPREFILL_SINK_TOKENS         256   leading keys always kept
    FLASHPREFILL_WINDOW_TOKENS       512   keys this close before a query tile always kept
    FLASHPREFILL_DENSE_RECENT_TILES  1     the last query tiles of each request and KV head that
                                           run dense
    FLASHPREFILL_MEAN_CORRECTION     1     the Eq. 6 surrogate keys (1/0, true/false, yes/no,
                                           on/off)
    FLASHPREFILL_MIN_SPARSE_LEN      1024  prefill / extend requests with fewer keys (cached
                                           prefix included) run exact attention

Each backend adds its own settings as fields of a subclass (docs/VLLM.md, docs/SGLANG.md). An
unset or empty variable keeps the default; a malformed or out-of-range one raises ValueError
naming the variable.
"""

import dataclasses
import os

from ._index import SelectConfig

ENV_PREFIX = "FLASHPREFILL_"


def _parse(kind, text):
    """text as a value of `kind` (bool, int or float), or ValueError."""
    if kind is bool:
        value = text.strip().lower()
        if value in ("1", "true", "yes", "on"):
            return True
        if value in ("0", "false", "no", "off"):
            return False
        raise ValueError("expected 1/0, true/false, yes/no or on/off")
    try:
        return kind(text.strip())
    except ValueError:
        raise ValueError("expected an integer" if kind is int else "expected a number") from None


@dataclasses.dataclass(frozen=True)
class Settings:
    """The selection settings every backend reads; see the module docstring for each."""

    alpha: float = 0.1
    block_size: int = 128
    sink_tokens: int = 256
    window_tokens: int = 512
    dense_recent_tiles: int = 1
    mean_correction: bool = True
    min_sparse_len: int = 1024

    # Fields whose variable is not FLASHPREFILL_<FIELD NAME> (subclasses extend it).
    ENV_NAMES = {}

    def __post_init__(self):
        if not 0.0 <= self.alpha <= 1.0:
            raise ValueError(f"alpha must lie in [0, 1], got {self.alpha}")
        if self.block_size <= 0 or self.block_size % 64:
            raise ValueError(f"block_size must be a positive multiple of 64, got "
                             f"{self.block_size}")
        for field in dataclasses.fields(self):
            if field.type in (int, "int") and getattr(self, field.name) < 0:
                raise ValueError(f"{field.name} must be >= 0, got {getattr(self, field.name)}")

    @classmethod
    def env_name(cls, field):
        return ENV_PREFIX + cls.ENV_NAMES.get(field, field.upper())

    @classmethod
    def from_env(cls, environ=None):
        """The settings from the environment (os.environ, or the mapping given)."""
        environ = os.environ if environ is None else environ
        values = {}
        for field in dataclasses.fields(cls):
            key = cls.env_name(field.name)
            text = environ.get(key)
            if text is None or text.strip() == "":
                continue
            try:
                values[field.name] = _parse(type(field.default), text)
                cls(**{field.name: values[field.name]})
            except ValueError as err:
                raise ValueError(f"{key}={text!r}: {err}") from None
        return cls(**values)

    def select_config(self):
        return SelectConfig(self.block_size, self.alpha, self.sink_tokens, self.window_tokens,
                            self.dense_recent_tiles, self.mean_correction)
