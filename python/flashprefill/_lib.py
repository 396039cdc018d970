"""The C ABI of include/flashprefill/flashprefill.h through ctypes.

Loads libflashprefill.so, mirrors its enums and structs field for field, declares every entry
point's prototype, and turns a failing fp_status into FlashPrefillError carrying the library's
message. Nothing else in the package touches ctypes prototypes or raw statuses.
"""

import ctypes
import ctypes.util
import enum
import os
import pathlib

# Mirrors of the header's macros.
VERSION = (0, 1, 0)
TILE_ROWS = 128   # FP_TILE_ROWS: packed rows of a PackGQA query tile
KV_TILE = 64      # FP_KV_TILE: tokens of a physical KV tile
FLAG_VALIDATE_DEVICE_METADATA = 1
FLAG_MEANS_POOLED = 2

_SETUP_HINT = ("build it with `bash scripts/setup.sh` (it writes build/libflashprefill.so), or "
               "set FLASHPREFILL_LIB to the path of libflashprefill.so")


class Status(enum.IntEnum):
    """fp_status."""
    OK = 0
    INVALID_ARGUMENT = 1
    UNSUPPORTED = 2
    WORKSPACE_TOO_SMALL = 3
    CUDA = 4
    INTERNAL = 5


class DType(enum.IntEnum):
    """fp_dtype."""
    FLOAT32 = 0
    BFLOAT16 = 1
    FLOAT16 = 2


class Device(enum.IntEnum):
    """fp_device."""
    CPU = 0
    CUDA = 1


class KvLayout(enum.IntEnum):
    """fp_kv_layout."""
    CONTIGUOUS = 0
    PAGED = 1


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


_c_enum = ctypes.c_int


class Problem(ctypes.Structure):
    """fp_problem."""
    _fields_ = [
        ("device", _c_enum),
        ("stream", ctypes.c_void_p),
        ("flags", ctypes.c_uint32),
        ("dtype", _c_enum),
        ("batch_size", ctypes.c_int32),
        ("num_heads_q", ctypes.c_int32),
        ("num_heads_kv", ctypes.c_int32),
        ("head_dim", ctypes.c_int32),
        ("softmax_scale", ctypes.c_float),
        ("q", ctypes.c_void_p),
        ("q_stride_token", ctypes.c_int64),
        ("q_stride_head", ctypes.c_int64),
        ("total_q", ctypes.c_int64),
        ("cu_seqlens_q", ctypes.c_void_p),
        ("max_seqlen_q", ctypes.c_int32),
        ("kv_layout", _c_enum),
        ("k", ctypes.c_void_p),
        ("v", ctypes.c_void_p),
        ("k_stride_page", ctypes.c_int64),
        ("k_stride_token", ctypes.c_int64),
        ("k_stride_head", ctypes.c_int64),
        ("v_stride_page", ctypes.c_int64),
        ("v_stride_token", ctypes.c_int64),
        ("v_stride_head", ctypes.c_int64),
        ("max_seqlen_k", ctypes.c_int32),
        ("total_k", ctypes.c_int64),
        ("cu_seqlens_k", ctypes.c_void_p),
        ("num_pages", ctypes.c_int32),
        ("page_size", ctypes.c_int32),
        ("page_table", ctypes.c_void_p),
        ("max_pages_per_seq", ctypes.c_int32),
        ("seqlens_k", ctypes.c_void_p),
    ]


class SelectConfig(ctypes.Structure):
    """fp_select_config."""
    _fields_ = [
        ("block_size", ctypes.c_int32),
        ("alpha", ctypes.c_float),
        ("sink_tokens", ctypes.c_int32),
        ("window_tokens", ctypes.c_int32),
        ("dense_recent_tiles", ctypes.c_int32),
        ("mean_correction", ctypes.c_int32),
    ]


class Index(ctypes.Structure):
    """fp_index."""
    _fields_ = [
        ("cu", ctypes.c_void_p),
        ("idx", ctypes.c_void_p),
        ("k_mean", ctypes.c_void_p),
        ("v_mean", ctypes.c_void_p),
        ("idx_capacity", ctypes.c_int64),
    ]


class IndexSizes(ctypes.Structure):
    """fp_index_sizes."""
    _fields_ = [
        ("num_segments", ctypes.c_int64),
        ("max_q_tiles", ctypes.c_int32),
        ("max_blocks", ctypes.c_int32),
        ("idx_capacity", ctypes.c_int64),
        ("mean_elements", ctypes.c_int64),
    ]


class Output(ctypes.Structure):
    """fp_output."""
    _fields_ = [
        ("out", ctypes.c_void_p),
        ("out_stride_token", ctypes.c_int64),
        ("out_stride_head", ctypes.c_int64),
        ("lse", ctypes.c_void_p),
    ]


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
    """(where, path) pairs in search order: FLASHPREFILL_LIB, the repo's build/, the system."""
    env = os.environ.get("FLASHPREFILL_LIB")
    if env:
        return [("FLASHPREFILL_LIB", env)]
    found = []
    local = pathlib.Path(__file__).resolve().parents[2] / "build" / "libflashprefill.so"
    if local.is_file():
        found.append(("the repository build", str(local)))
    system = ctypes.util.find_library("flashprefill")
    if system:
        found.append(("the system library path", system))
    return found


def _load():
    candidates = _candidates()
    if not candidates:
        raise ImportError("flashprefill: libflashprefill.so not found (FLASHPREFILL_LIB is unset, "
                          "there is no build/libflashprefill.so beside the package, and the "
                          f"system library path has none); {_SETUP_HINT}")
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
