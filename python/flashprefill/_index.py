"""The selection config and the CSR index: SelectConfig, IndexSizes, Index, and the fp_index
struct of an Index checked against the buffer sizes the library will assume."""

import ctypes
import dataclasses

import numpy as np

from . import _arrays, _lib


@dataclasses.dataclass(frozen=True)
class SelectConfig:
    """Block selection (Eq. 19-20) and mean correction (Eq. 6); mirrors fp_select_config.

    Attributes:
        block_size: logical KV block in tokens, a multiple of 64.
        alpha: keep a block whose energy E_J >= alpha * max_J E_J; in [0, 1]; 0 keeps every
            causal block (dense).
        sink_tokens: keys [0, sink_tokens) are always kept.
        window_tokens: keys within this distance before a query tile's first position are
            kept (blocks that meet the diagonal are kept regardless).
        dense_recent_tiles: the last n query tiles of every (request, KV head) run dense.
        mean_correction: add one Eq. 6 surrogate key per unselected block that is fully
            visible to the whole query tile.
    """

    block_size: int = 128
    alpha: float = 0.1
    sink_tokens: int = 256
    window_tokens: int = 512
    dense_recent_tiles: int = 1
    mean_correction: bool = True

    def to_c(self):
        i32 = _arrays.int32
        return _lib.SelectConfig(i32(self.block_size, "block_size"), float(self.alpha),
                                 i32(self.sink_tokens, "sink_tokens"),
                                 i32(self.window_tokens, "window_tokens"),
                                 i32(self.dense_recent_tiles, "dense_recent_tiles"),
                                 int(bool(self.mean_correction)))

    @classmethod
    def from_c(cls, c):
        # alpha as the shortest decimal that names the same float32 (0.1, not 0.10000000149).
        alpha = float(str(np.float32(c.alpha)))
        return cls(c.block_size, alpha, c.sink_tokens, c.window_tokens, c.dense_recent_tiles,
                   bool(c.mean_correction))


@dataclasses.dataclass(frozen=True)
class IndexSizes:
    """fp_index_sizes: the buffers an index for one problem and config needs.

    Attributes:
        num_segments: B * Hkv * max_q_tiles; cu has num_segments + 1 entries.
        max_q_tiles: ceil(g * min(max_seqlen_q, total_q) / 128), g = Hq / Hkv.
        max_blocks: ceil(max_seqlen_k / block_size).
        idx_capacity: upper bound on the selected tiles over all segments.
        mean_elements: B * Hkv * max_blocks * D, the size of k_mean and of v_mean.
    """

    num_segments: int
    max_q_tiles: int
    max_blocks: int
    idx_capacity: int
    mean_elements: int


def query_sizes(problem, config):
    """IndexSizes of a BuiltProblem under a SelectConfig (fp_index_sizes_query)."""
    c = _lib.IndexSizes()
    c_config = config.to_c()
    _lib.call("fp_index_sizes_query", ctypes.byref(problem.c), ctypes.byref(c_config),
              ctypes.byref(c))
    return IndexSizes(c.num_segments, c.max_q_tiles, c.max_blocks, c.idx_capacity,
                      c.mean_elements)


class Index:
    """The CSR index of selected 64-token KV tiles plus the pooled block means.

    Segment s = (b * Hkv + h) * max_q_tiles + I lists the tile ids idx[cu[s]:cu[s+1]]
    (strictly ascending, local to request b) that query tile I of request b and KV head h
    attends to (docs/ALGORITHM.md). Every array is contiguous and lives in the problem's place
    (numpy, torch CPU, or the CUDA device of q).

    Attributes:
        cu: [num_segments + 1] int32, cu[0] = 0, non-decreasing.
        idx: [idx_capacity] int32; entries past cu[-1] are unused.
        k_mean: [B, Hkv, max_blocks, D] float32, the Eq. 5 block means of k.
        v_mean: [B, Hkv, max_blocks, D] float32, or None when config.mean_correction is off.
        config: the SelectConfig of the index; sparse_attention uses its block_size (the
            layout of the means) and mean_correction.

    An index may come from elsewhere (a block mask): build the arrays with the sizes that
    index_sizes() reports; the library validates it on the CPU and skips non-causal ids on
    CUDA.
    """

    def __init__(self, cu, idx, k_mean, v_mean=None, config=SelectConfig()):
        self.cu = cu
        self.idx = idx
        self.k_mean = k_mean
        self.v_mean = v_mean
        self.config = config
        self._problem = None

    @classmethod
    def from_block_mask(cls, mask, q, k, v=None, config=None, cu_seqlens_q=None,
                        cu_seqlens_k=None, *, max_seqlen_q=None, max_seqlen_k=None,
                        means=None):
        """An Index that lists the 64-token tiles of the blocks a block mask selects.

        Args:
            mask: bool [B, Hkv, ceil(max_seqlen_q / 128), ceil(max_seqlen_k / block_size)]
                (or [Hkv, ...] for one request), numpy or torch; mask[b, h, i, J] means that
                queries 128 i .. 128 i + 127 of request b (counted from its first query) read
                KV block J (keys J * block_size ..) through KV head h. Causality is applied
                here: a query tile lists only the tiles it causally reaches (docs/ALGORITHM.md
                "the CSR index"), so entries above the diagonal and past a request's length
                are ignored. Every PackGQA query tile lies inside one 128-query block, so each
                query reads exactly its block's row of the mask.
            q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k: the problem the
                index is for, as for build_index (k may be a PagedKV).
            config: a SelectConfig; its block_size sets the KV block of the mask and the
                layout of the means, its mean_correction whether sparse_attention adds the
                surrogate keys of the skipped blocks. None means SelectConfig().
            means: (k_mean, v_mean) already pooled for this problem (pool_kv); None pools
                them here with the library (v_mean only with mean correction).

        Returns:
            An Index in q's place; its density() is the selected share of the causal tiles.
            Builds the CSR with the mask's array library; a torch mask is moved to q's device.
        """
        from . import api
        from ._problem import build_problem
        config = SelectConfig() if config is None else config
        problem = build_problem(q, k, v, None, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                                max_seqlen_k, validate_metadata=False)
        c = problem.c
        sizes = query_sizes(problem, config)
        lengths_q, lengths_k = _request_lengths(q, k, cu_seqlens_q, cu_seqlens_k)
        group = c.num_heads_q // c.num_heads_kv
        num_q_blocks = -(-c.max_seqlen_q // _lib.TILE_ROWS)
        expected = (c.batch_size, c.num_heads_kv, num_q_blocks, sizes.max_blocks)
        xp, mask = _mask_in_place(mask, problem.q)
        if len(mask.shape) == 3 and c.batch_size == 1:
            mask = mask[None]
        if tuple(mask.shape) != expected:
            raise ValueError(f"mask: expected shape {list(expected)} = [B, Hkv, "
                             f"ceil(max_seqlen_q / {_lib.TILE_ROWS}), ceil(max_seqlen_k / "
                             f"block_size)] (or without B for one request), got "
                             f"{list(mask.shape)}")
        # Tile I of request b (PackGQA rows 128 I ..) reads query block I // g and reaches the
        # tiles t < T_c(I) = pmax(I) / 64 + 1; tile t belongs to KV block t / (block_size / 64).
        tiles = np.arange(sizes.max_q_tiles)
        rows_end = np.minimum((tiles[None, :] + 1) * _lib.TILE_ROWS, group * lengths_q[:, None])
        pmax = (lengths_k - lengths_q)[:, None] + (rows_end - 1) // group
        in_request = tiles[None, :] < -(-group * lengths_q[:, None] // _lib.TILE_ROWS)
        reach = np.where(in_request, pmax // _lib.KV_TILE + 1, 0)
        kv_tiles = np.arange(-(-c.max_seqlen_k // _lib.KV_TILE))
        place = _placer(xp, mask)
        selected = mask[:, :, place(tiles // group)][:, :, :, place(
            kv_tiles // (config.block_size // _lib.KV_TILE))]
        selected = selected & (place(kv_tiles)[None, None, None, :] < place(reach)[:, None, :, None])
        selected = selected.reshape(sizes.num_segments, len(kv_tiles))
        cu = _arrays.empty(problem.q, (sizes.num_segments + 1,), "int32")
        cu[0] = 0
        cu[1:] = xp.cumsum(selected.sum(-1), 0)
        ids = xp.where(selected)[1]
        idx = _arrays.empty(problem.q, (max(len(ids), 1),), "int32")
        idx[:len(ids)] = ids
        if len(ids) == 0:
            idx[0] = 0
        if means is None:
            means = api.pool_kv(q, k, v, config, cu_seqlens_q=cu_seqlens_q,
                                cu_seqlens_k=cu_seqlens_k, max_seqlen_q=max_seqlen_q,
                                max_seqlen_k=max_seqlen_k, validate_metadata=False)
        index = cls(cu, idx, means[0], means[1] if config.mean_correction else None, config)
        index._problem = problem
        return index

    def segment(self, b, h, tile):
        """The tile ids of query tile `tile` of request b and KV head h (a view of idx)."""
        batch, num_heads_kv = self.k_mean.shape[0], self.k_mean.shape[1]
        max_q_tiles = (len(self.cu) - 1) // (batch * num_heads_kv)
        s = (b * num_heads_kv + h) * max_q_tiles + tile
        return self.idx[int(self.cu[s]):int(self.cu[s + 1])]

    def density(self):
        """Selected tiles / causal tiles over all segments (fp_index_density), a float.

        Only for an index that build_index() returned: it remembers its problem (and so keeps
        that problem's arrays alive). Reads the index back: synchronizes the host on CUDA.
        """
        if self._problem is None:
            raise ValueError("density() needs the problem the index was built for; only an "
                             "index returned by build_index() has it")
        density = ctypes.c_double()
        c_config = self.config.to_c()
        c_index = index_struct(self, self._problem)
        with self._problem.guard():
            _lib.call("fp_index_density", ctypes.byref(self._problem.c), ctypes.byref(c_config),
                      ctypes.byref(c_index), ctypes.byref(density))
        return density.value


def _request_lengths(q, k, cu_seqlens_q, cu_seqlens_k):
    """(L_q, L_kv) of every request as int64 numpy arrays, from the call's metadata (read back
    to the host: a synchronization when it is on CUDA)."""
    from ._problem import PagedKV

    def host(value, default):
        value = default if value is None else value
        if _arrays.is_torch(value):
            value = value.cpu().numpy()
        return np.asarray(value).astype(np.int64)

    lengths_q = np.diff(host(cu_seqlens_q, [0, q.shape[0]]))
    if isinstance(k, PagedKV):
        lengths_k = host(k.seqlens_k, None)
    else:
        lengths_k = np.diff(host(cu_seqlens_k, [0, k.shape[0]]))
    return lengths_q, lengths_k


def _mask_in_place(mask, q):
    """(array module, mask as bool) with the mask in q's place: a numpy array for numpy q, a
    torch tensor on q's device otherwise."""
    if q.device is None:
        if _arrays.is_torch(mask):
            mask = mask.cpu().numpy()
        return np, np.asarray(mask).astype(bool, copy=False)
    torch = _arrays._torch()
    return torch, torch.as_tensor(mask, device=q.device).to(torch.bool)


def _placer(xp, like):
    """Turns a numpy integer array into an index array of like's array module and device."""
    if xp is np:
        return lambda a: a
    return lambda a: xp.as_tensor(a, device=like.device)


def pool_buffers(means, pooled_keys, like, shape, batch_size):
    """The buffers of an incremental pooling (fp_pool_kv), checked: (k_mean, v_mean) float32
    of `shape` in like's place (v_mean may be None) and pooled_keys None or [batch_size]
    integers (converted to int32 in like's place). Returns (k_mean pointer, v_mean pointer or
    None, pooled_keys Array or None)."""
    ptrs = []
    for name, m in zip(("k_mean", "v_mean"), means):
        if m is None:
            ptrs.append(None)
            continue
        a = _arrays.Array(m, name)
        _arrays.require_same_place(like, a)
        _arrays.require(a, "float32", shape)
        ptrs.append(a.ptr)
    done = None
    if pooled_keys is not None:
        done, _ = _arrays.int32_metadata(pooled_keys, like, "pooled_keys")
        if done.shape != (batch_size,):
            raise ValueError(f"pooled_keys: expected shape [B = {batch_size}], got "
                             f"{done.shape}")
    return ptrs[0], ptrs[1], done


def index_struct(index, problem):
    """The fp_index of `index` (whose arrays it points into) for a BuiltProblem.

    Checks what the library cannot: the buffers' dtypes, contiguity, place and sizes.
    """
    sizes = query_sizes(problem, index.config)
    c = problem.c
    means_shape = (c.batch_size, c.num_heads_kv, sizes.max_blocks, c.head_dim)
    cu = _arrays.Array(index.cu, "index.cu")
    _arrays.require(cu, "int32", (sizes.num_segments + 1,))
    idx = _arrays.Array(index.idx, "index.idx")
    if len(idx.shape) != 1:
        raise ValueError(f"index.idx: expected shape [idx_capacity], got {idx.shape}")
    _arrays.require(idx, "int32")
    k_mean = _arrays.Array(index.k_mean, "index.k_mean")
    _arrays.require(k_mean, "float32", means_shape)
    arrays = [cu, idx, k_mean]
    v_mean = None
    if index.v_mean is not None:
        v_mean = _arrays.Array(index.v_mean, "index.v_mean")
        _arrays.require(v_mean, "float32", means_shape)
        arrays.append(v_mean)
    for a in arrays:
        _arrays.require_same_place(problem.q, a)
    return _lib.Index(cu.ptr, idx.ptr, k_mean.ptr, None if v_mean is None else v_mean.ptr,
                      idx.shape[0])
