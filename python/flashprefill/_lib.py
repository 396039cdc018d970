"""The C ABI of include/flashprefill/flashprefill.h through ctypes.

Loads libflashprefill.so, re-exports the struct and enum mirrors of _abi.py, declares every entry
point's prototype, and turns a failing fp_status into FlashPrefillError carrying the library's
message. Nothing else in the package touches ctypes prototypes or raw statuses.
"""

import ctypes
import ctypes.util
import os
import pathlib

from ._abi import (  # noqa: F401 - re-exported for the package
    VERSION, TILE_ROWS, KV_TILE, MAX_SPLITS, FLAG_VALIDATE_DEVICE_METADATA, FLAG_MEANS_POOLED,
    Status, DType, Device, KvLayout, _c_enum, AttentionTuning, Problem, SelectConfig, Index,
    IndexSizes, Output)

_SETUP_HINT = ("install the package with `pip install .` from the repository (or `bash "
               "scripts/setup.sh`), or set FLASHPREFILL_LIB to the path of libflashprefill.so")


class FlashPrefillError(RuntimeError):
    """A call into libflashprefill failed.

    Attributes:
        status: the library's fp_status as a Status (a plain int if the library returned a
            value this package does not know).
        message: fp_last_error_message() of the failing call.
    """

    def __init__(self, status, message):
        try:
            status = Status(status)
            name = status.name
        except ValueError:
            name = f"status {int(status)}"
        super().__init__(f"{name}: {message}")
        self.status = status
        self.message = message


_P = ctypes.POINTER
_size_p = _P(ctypes.c_size_t)
_PROTOTYPES = {
    "fp_version": (ctypes.c_char_p, []),
    "fp_status_string": (ctypes.c_char_p, [_c_enum]),
    "fp_last_error_message": (ctypes.c_char_p, []),
    "fp_cuda_available": (ctypes.c_int, []),
    "fp_select_config_default": (None, [_P(SelectConfig)]),
    "fp_index_sizes_query": (_c_enum, [_P(Problem), _P(SelectConfig), _P(IndexSizes)]),
    "fp_build_index_workspace_size": (_c_enum, [_P(Problem), _P(SelectConfig), _size_p]),
    "fp_build_index": (_c_enum, [_P(Problem), _P(SelectConfig), _P(Index), ctypes.c_void_p,
                                 ctypes.c_size_t]),
    "fp_sparse_attention_workspace_size": (_c_enum, [_P(Problem), _P(SelectConfig), _size_p]),
    "fp_sparse_attention": (_c_enum, [_P(Problem), _P(SelectConfig), _P(Index), _P(Output),
                                      ctypes.c_void_p, ctypes.c_size_t]),
    "fp_prefill_workspace_size": (_c_enum, [_P(Problem), _P(SelectConfig), _size_p]),
    "fp_prefill": (_c_enum, [_P(Problem), _P(SelectConfig), _P(Output), ctypes.c_void_p,
                             ctypes.c_size_t]),
    "fp_dense_attention_workspace_size": (_c_enum, [_P(Problem), _size_p]),
    "fp_dense_attention": (_c_enum, [_P(Problem), _P(Output), ctypes.c_void_p, ctypes.c_size_t]),
    "fp_index_density": (_c_enum, [_P(Problem), _P(SelectConfig), _P(Index),
                                   _P(ctypes.c_double)]),
    "fp_pool_kv": (_c_enum, [_P(Problem), _P(SelectConfig), ctypes.c_void_p, ctypes.c_void_p,
                             ctypes.c_void_p]),
}


def _candidates():
    """(where, path) pairs in search order: FLASHPREFILL_LIB, the installed package's own library,
    the build/ of the repository this package sits in, the system library path."""
    env = os.environ.get("FLASHPREFILL_LIB")
    if env:
        return [("FLASHPREFILL_LIB", env)]
    found = []
    here = pathlib.Path(__file__).resolve().parent
    for where, local in (("the installed package", here / "libflashprefill.so"),
                         ("the repository build", here.parents[1] / "build" /
                          "libflashprefill.so")):
        if local.is_file():
            found.append((where, str(local)))
    system = ctypes.util.find_library("flashprefill")
    if system:
        found.append(("the system library path", system))
    return found


def _load():
    candidates = _candidates()
    if not candidates:
        raise ImportError("flashprefill: libflashprefill.so not found (FLASHPREFILL_LIB is unset, "
                          "the package holds none, there is no build/libflashprefill.so beside "
                          f"it, and the system library path has none); {_SETUP_HINT}")
    where, path = candidates[0]
    try:
        lib = ctypes.CDLL(path)
    except OSError as e:
        raise ImportError(f"flashprefill: cannot load {path} (from {where}): {e}; "
                          f"{_SETUP_HINT}") from e
    for name, (restype, argtypes) in _PROTOTYPES.items():
        try:
            fn = getattr(lib, name)
        except AttributeError as e:
            raise ImportError(f"flashprefill: {path} lacks {name}; it is not a libflashprefill "
                              f"matching this package; {_SETUP_HINT}") from e
        fn.restype = restype
        fn.argtypes = argtypes
    return lib


lib = _load()
path = lib._name


def call(name, *args):
    """Calls entry point `name`; raises FlashPrefillError with the library's message on failure."""
    status = getattr(lib, name)(*args)
    if status != Status.OK:
        raise FlashPrefillError(status, lib.fp_last_error_message().decode(errors="replace"))


def version():
    return lib.fp_version().decode()


def status_string(status):
    return lib.fp_status_string(int(status)).decode()


def cuda_available():
    return bool(lib.fp_cuda_available())


def default_select_config():
    config = SelectConfig()
    lib.fp_select_config_default(ctypes.byref(config))
    return config
