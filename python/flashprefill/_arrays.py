"""Arrays as the C ABI sees them.

A numpy array (CPU) or a torch tensor (CPU or CUDA) is reduced to a data pointer, a shape,
strides in elements, an fp_dtype and a place (numpy, torch CPU, or one CUDA device); outputs,
metadata and workspace are allocated in the same place as a given array. torch is never
imported here: a tensor can only arrive from a caller that imported it already.
"""

import contextlib
import sys

import numpy as np

from ._lib import DType, Device

try:
    import ml_dtypes
    _NUMPY_BFLOAT16 = np.dtype(ml_dtypes.bfloat16)
    _NUMPY_E4M3 = np.dtype(ml_dtypes.float8_e4m3fn)
except ImportError:
    _NUMPY_BFLOAT16 = _NUMPY_E4M3 = None

_NUMPY_DTYPES = {np.dtype(np.float32): DType.FLOAT32, np.dtype(np.float16): DType.FLOAT16}
if _NUMPY_BFLOAT16 is not None:
    _NUMPY_DTYPES[_NUMPY_BFLOAT16] = DType.BFLOAT16
    _NUMPY_DTYPES[_NUMPY_E4M3] = DType.FLOAT8_E4M3

# Host workspace alignment: enough for any vector type the library may carve out of it.
_WORKSPACE_ALIGNMENT = 256


def _torch():
    return sys.modules.get("torch")


def is_torch(x):
    torch = _torch()
    return torch is not None and isinstance(x, torch.Tensor)


class Array:
    """One array reduced to what the library needs; `obj` keeps it alive."""

    __slots__ = ("obj", "name", "ptr", "shape", "strides", "device")

    def __init__(self, obj, name):
        self.obj = obj
        self.name = name
        if isinstance(obj, np.ndarray):
            itemsize = obj.dtype.itemsize
            if any(s % itemsize for s in obj.strides):
                raise ValueError(f"{name}: strides {obj.strides} (bytes) are not multiples of the "
                                 f"element size {itemsize}")
            self.ptr = obj.ctypes.data
            self.strides = tuple(s // itemsize for s in obj.strides)
            self.device = None
        elif is_torch(obj):
            self.ptr = obj.data_ptr()
            self.strides = tuple(obj.stride())
            self.device = obj.device
        else:
            raise TypeError(f"{name}: expected a numpy.ndarray or a torch.Tensor, got "
                            f"{type(obj).__name__}")
        self.shape = tuple(obj.shape)

    @property
    def dtype(self):
        return self.obj.dtype

    @property
    def on_cuda(self):
        return self.device is not None and self.device.type == "cuda"

    @property
    def fp_device(self):
        return Device.CUDA if self.on_cuda else Device.CPU

    def place(self):
        """'numpy', 'torch:cpu' or 'torch:cuda:N'."""
        if self.device is None:
            return "numpy"
        return f"torch:{self.device}"

    def is_contiguous(self):
        expected = 1
        for extent, stride in zip(reversed(self.shape), reversed(self.strides)):
            if extent > 1 and stride != expected:
                return False
            expected *= extent
        return True


def wrap(obj, name, ndim):
    """An Array of `ndim` dimensions whose last dimension is contiguous (any other strides)."""
    a = Array(obj, name)
    if len(a.shape) != ndim:
        raise ValueError(f"{name}: expected {ndim} dimensions, got shape {a.shape}")
    if a.shape[-1] > 1 and a.strides[-1] != 1:
        raise ValueError(f"{name}: the last (head) dimension must be contiguous (stride 1 "
                         f"element), got strides {a.strides} in elements; make it contiguous")
    return a


def fp_dtype(a):
    """The fp_dtype of a data array, or TypeError naming the supported dtypes."""
    if a.device is None:
        code = _NUMPY_DTYPES.get(np.dtype(a.dtype))
        supported = "float32, float16" + (", ml_dtypes.bfloat16, ml_dtypes.float8_e4m3fn"
                                          if _NUMPY_BFLOAT16 else
                                          " (bfloat16 and float8_e4m3fn need the ml_dtypes "
                                          "package)")
    else:
        torch = _torch()
        code = {torch.float32: DType.FLOAT32, torch.bfloat16: DType.BFLOAT16,
                torch.float16: DType.FLOAT16,
                getattr(torch, "float8_e4m3fn", None): DType.FLOAT8_E4M3}.get(a.dtype)
        supported = "torch.float32, torch.bfloat16, torch.float16, torch.float8_e4m3fn"
    if code is None:
        raise TypeError(f"{a.name}: dtype {a.dtype} is not supported; use {supported}")
    return code


def require_same_place(a, b):
    if a.place() != b.place():
        raise ValueError(f"{b.name} is on {b.place()} but {a.name} is on {a.place()}; every "
                         f"array of one call must live in the same place")


def require(a, dtype, shape=None):
    """Checks that a buffer the caller passed has the dtype (numpy name), shape and contiguity
    the library will assume."""
    if str(a.dtype).replace("torch.", "") != dtype:
        raise ValueError(f"{a.name}: expected dtype {dtype}, got {a.dtype}")
    if shape is not None and a.shape != tuple(shape):
        raise ValueError(f"{a.name}: expected shape {tuple(shape)}, got {a.shape}")
    if not a.is_contiguous():
        raise ValueError(f"{a.name}: must be contiguous, got strides {a.strides} in elements")


def empty(like, shape, dtype=None):
    """An uninitialized contiguous array in like's place; dtype None means like's dtype, else a
    numpy dtype name ('float32', 'int32', 'uint8')."""
    if like.device is None:
        return np.empty(shape, dtype=like.dtype if dtype is None else dtype)
    torch = _torch()
    return torch.empty(shape, dtype=like.dtype if dtype is None else getattr(torch, dtype),
                       device=like.device)


def int32_metadata(value, like, name):
    """Integer metadata (lengths, a page table) as a contiguous int32 Array in like's place,
    plus a host numpy copy when one is at hand without a device synchronization (else None)."""
    if is_torch(value):
        if value.is_floating_point() or value.is_complex():
            raise TypeError(f"{name}: expected integers, got {value.dtype}")
        if like.device is not None:
            host = (None if value.device.type == "cuda"
                    else np.ascontiguousarray(value.numpy(), dtype=np.int32))
            converted = value.to(device=like.device, dtype=_torch().int32).contiguous()
            return Array(converted, name), host
        value = value.cpu().numpy()
    host = np.asarray(value)
    if host.dtype.kind not in "iu":
        raise TypeError(f"{name}: expected integers, got dtype {host.dtype}")
    host = np.ascontiguousarray(host, dtype=np.int32)
    converted = host if like.device is None else _torch().from_numpy(host).to(like.device)
    return Array(converted, name), host


def to_host(a):
    """A numpy copy of an Array (synchronizes when it is on CUDA)."""
    if a.device is None:
        return a.obj
    return a.obj.detach().cpu().numpy()


class Workspace:
    """`nbytes` of scratch memory in like's place; `ptr` is None when nbytes is 0."""

    def __init__(self, like, nbytes):
        self.nbytes = nbytes
        self.ptr = None
        self.obj = None
        if nbytes == 0:
            return
        if like.device is None:
            self.obj = np.empty(nbytes + _WORKSPACE_ALIGNMENT, dtype=np.uint8)
            base = self.obj.ctypes.data
            self.ptr = base + (-base) % _WORKSPACE_ALIGNMENT
        else:
            self.obj = _torch().empty(nbytes, dtype=_torch().uint8, device=like.device)
            self.ptr = self.obj.data_ptr()


def stream_of(a):
    """The cudaStream_t (as an int) of the current torch stream on a's device, or None."""
    if not a.on_cuda:
        return None
    return _torch().cuda.current_stream(a.device).cuda_stream


def raw_stream(index):
    """The cudaStream_t (as an int) of torch's current stream on CUDA device `index`."""
    torch = _torch()
    raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
    return raw(index) if raw is not None else torch.cuda.current_stream(index).cuda_stream


def device_guard_index(index):
    """Makes CUDA device `index` current for a call, unless it is already."""
    torch = _torch()
    if torch.cuda.current_device() == index:
        return contextlib.nullcontext()
    return torch.cuda.device(index)


def device_guard(a):
    """Makes a's CUDA device current for the duration of a call."""
    if not a.on_cuda:
        return contextlib.nullcontext()
    return _torch().cuda.device(a.device)
