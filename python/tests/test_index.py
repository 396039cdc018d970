"""build_index, sparse_attention and index_sizes: the CSR contract and foreign indexes."""

import numpy as np
import pytest

import flashprefill as fp
from conftest import (KV_TILE, TILE_ROWS, causal_tiles, cu_of, first_position, num_q_tiles,
                      random_qkv, reference_attention, rel_l2, structured_qkv)


def test_index_sizes():
    lens_q, lens_kv = [300, 20], [1000, 520]
    q, k, v = random_qkv(np.random.default_rng(0), 320, 1520, 6, 2, 32)
    config = fp.SelectConfig(block_size=256)
    sizes = fp.index_sizes(q, k, v, config, cu_seqlens_q=cu_of(lens_q),
                           cu_seqlens_k=cu_of(lens_kv))
    group, batch = 3, 2
    max_q_tiles = -(-group * 300 // TILE_ROWS)
    max_blocks = -(-1000 // 256)
    assert sizes == fp.IndexSizes(
        num_segments=batch * 2 * max_q_tiles, max_q_tiles=max_q_tiles, max_blocks=max_blocks,
        idx_capacity=2 * (-(-group * 320 // TILE_ROWS) + batch) * -(-1000 // KV_TILE),
        mean_elements=batch * 2 * max_blocks * 32)


def test_index_follows_the_contract(rng):
    lens_q, lens_kv = [700, 90], [1000, 600]
    group, num_heads_kv = 2, 2
    q, k, v = structured_qkv(rng, sum(lens_q), sum(lens_kv), group * num_heads_kv,
                             num_heads_kv, 32)
    config = fp.SelectConfig(alpha=0.4, sink_tokens=128, window_tokens=64, block_size=128)
    index = fp.build_index(q, k, v, config, cu_seqlens_q=cu_of(lens_q),
                           cu_seqlens_k=cu_of(lens_kv))
    sizes = fp.index_sizes(q, k, v, config, cu_seqlens_q=cu_of(lens_q),
                           cu_seqlens_k=cu_of(lens_kv))
    assert index.cu.shape == (sizes.num_segments + 1,) and index.idx.shape == (sizes.idx_capacity,)
    assert index.cu[0] == 0 and (np.diff(index.cu) >= 0).all()
    assert index.k_mean.shape == (2, num_heads_kv, sizes.max_blocks, 32)
    bs = config.block_size
    sink_tiles = -(-config.sink_tokens // bs) * bs // KV_TILE
    for b, (len_q, len_kv) in enumerate(zip(lens_q, lens_kv)):
        tiles = num_q_tiles(len_q, group)
        for h in range(num_heads_kv):
            for tile in range(sizes.max_q_tiles):
                ids = index.segment(b, h, tile).tolist()
                if tile >= tiles:
                    assert ids == []
                    continue
                reach = causal_tiles(len_q, len_kv, group, tile)
                assert ids == sorted(set(ids)) and 0 <= ids[0] and ids[-1] < reach
                if tile == tiles - 1:
                    assert ids == list(range(reach))
                window_start = max(first_position(len_q, len_kv, group, tile)
                                   - config.window_tokens, 0)
                forced = set(range(min(sink_tiles, reach)))
                forced |= set(range(window_start // bs * bs // KV_TILE, reach))
                assert forced <= set(ids)
    # the means of request 0, KV head 1, block 2 (Eq. 5)
    np.testing.assert_allclose(index.k_mean[0, 1, 2], k[256:384, 1].mean(axis=0), rtol=1e-5,
                               atol=1e-6)
    np.testing.assert_allclose(index.v_mean[1, 0, 4], v[1000 + 512:1000 + 600, 0].mean(axis=0),
                               rtol=1e-5, atol=1e-6)
    assert 0.0 < index.density() < 1.0


def test_two_stages_equal_prefill(rng):
    q, k, v = random_qkv(rng, 900, 900, 4, 2, 64)
    for mean_correction in (True, False):
        config = fp.SelectConfig(alpha=0.3, sink_tokens=64, window_tokens=128,
                                 mean_correction=mean_correction)
        index = fp.build_index(q, k, v, config)
        assert (index.v_mean is None) == (not mean_correction)
        out = fp.sparse_attention(q, k, v, index)
        fused = fp.prefill(q, k, v, alpha=0.3, sink_tokens=64, window_tokens=128,
                           mean_correction=mean_correction)
        np.testing.assert_allclose(out, fused, rtol=1e-6, atol=1e-6)


def _tiles_mask(index, group, len_q, len_kv):
    """allowed(b, h, L_q, L_kv) for reference_attention: the keys of the listed tiles."""
    def allowed(b, h, _len_q, _len_kv):
        mask = np.zeros((len_q, len_kv), dtype=bool)
        for i in range(len_q):
            tile = (i * group + h % group) // TILE_ROWS
            for t in index.segment(b, h // group, tile):
                mask[i, t * KV_TILE:(t + 1) * KV_TILE] = True
        return mask
    return allowed


def test_foreign_index(rng):
    """A hand-made index (every other causal tile, plus the diagonal) against float64."""
    len_q, len_kv, group, num_heads_kv, head_dim = 300, 700, 2, 1, 32
    q, k, v = random_qkv(rng, len_q, len_kv, group * num_heads_kv, num_heads_kv, head_dim)
    config = fp.SelectConfig(mean_correction=False)
    sizes = fp.index_sizes(q, k, v, config)
    lists = []
    for tile in range(sizes.max_q_tiles):
        reach = causal_tiles(len_q, len_kv, group, tile)
        lists.append(sorted(set(range(0, reach, 2)) | {reach - 1}))
    cu = cu_of([len(ids) for ids in lists])
    idx = np.zeros(sizes.idx_capacity, dtype=np.int32)
    idx[:cu[-1]] = np.concatenate(lists)
    k_mean = np.zeros((1, num_heads_kv, sizes.max_blocks, head_dim), dtype=np.float32)
    index = fp.Index(cu, idx, k_mean, config=config)
    out = fp.sparse_attention(q, k, v, index)
    ref, _ = reference_attention(q, k, v, allowed=_tiles_mask(index, group, len_q, len_kv))
    assert rel_l2(out, ref) <= 1e-5
    with pytest.raises(ValueError, match="build_index"):
        index.density()


def test_all_tiles_index_equals_dense(rng):
    len_q = len_kv = 512
    q, k, v = random_qkv(rng, len_q, len_kv, 2, 2, 16)
    config = fp.SelectConfig(mean_correction=False)
    sizes = fp.index_sizes(q, k, v, config)
    lists = [list(range(causal_tiles(len_q, len_kv, 1, tile))) for tile in range(4)] * 2
    cu = cu_of([len(ids) for ids in lists])
    idx = np.concatenate(lists).astype(np.int32)
    k_mean = np.zeros((1, 2, sizes.max_blocks, 16), dtype=np.float32)
    out = fp.sparse_attention(q, k, v, fp.Index(cu, idx, k_mean, config=config))
    assert rel_l2(out, fp.dense_attention(q, k, v)) <= 1e-5


def _mask_allowed(mask, block_size, group):
    """reference_attention's `allowed` for a block mask [B, Hkv, query blocks, KV blocks]."""
    def allowed(b, h, len_q, len_kv):
        rows = mask[b, h // group][np.arange(len_q) // TILE_ROWS]
        return rows[:, np.arange(len_kv) // block_size]
    return allowed


@pytest.mark.parametrize("block_size", [128, 256])
def test_index_from_block_mask_lists_the_masks_causal_tiles(rng, block_size):
    lens_q, lens_kv = [300, 130], [700, 130]
    group, num_heads_kv, head_dim = 3, 2, 32
    q, k, v = random_qkv(rng, sum(lens_q), sum(lens_kv), group * num_heads_kv, num_heads_kv,
                         head_dim)
    config = fp.SelectConfig(block_size=block_size, mean_correction=False)
    cu_q, cu_k = cu_of(lens_q), cu_of(lens_kv)
    mask = rng.random((2, num_heads_kv, -(-300 // TILE_ROWS), -(-700 // block_size))) < 0.4
    mask[..., 0] = True  # every query sees key 0
    index = fp.Index.from_block_mask(mask, q, k, v, config, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k)
    assert index.cu.dtype == np.int32 and index.idx.dtype == np.int32
    sizes = fp.index_sizes(q, k, v, config, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k)
    assert index.cu.shape == (sizes.num_segments + 1,)
    for b, (len_q, len_kv) in enumerate(zip(lens_q, lens_kv)):
        for h in range(num_heads_kv):
            for tile in range(sizes.max_q_tiles):
                ids = index.segment(b, h, tile).tolist()
                if tile >= num_q_tiles(len_q, group):
                    assert ids == []
                    continue
                query_block = first_position(len_q, len_kv, group, tile) - (len_kv - len_q)
                query_block //= TILE_ROWS
                expected = [t for t in range(causal_tiles(len_q, len_kv, group, tile))
                            if mask[b, h, query_block, t * KV_TILE // block_size]]
                assert ids == expected
    out = fp.sparse_attention(q, k, v, index, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k)
    ref, _ = reference_attention(q, k, v, cu_q, cu_k,
                                 allowed=_mask_allowed(mask, block_size, group))
    assert rel_l2(out, ref) < 1e-5


def test_index_from_a_full_block_mask_is_dense_attention_with_the_librarys_means(rng):
    q, k, v = random_qkv(rng, 200, 450, 4, 1, 32)
    mask = np.ones((1, -(-200 // TILE_ROWS), -(-450 // 128)), dtype=bool)  # one request: no B
    index = fp.Index.from_block_mask(mask, q, k, v)
    assert index.density() == 1.0
    pooled = fp.build_index(q, k, v)
    np.testing.assert_array_equal(index.k_mean, pooled.k_mean)
    np.testing.assert_array_equal(index.v_mean, pooled.v_mean)
    out = fp.sparse_attention(q, k, v, index)
    assert rel_l2(out, fp.dense_attention(q, k, v)) < 1e-6


def test_index_from_block_mask_torch_matches_numpy(rng):
    torch = pytest.importorskip("torch")
    lens_q, lens_kv = [260, 64], [600, 200]
    q, k, v = random_qkv(rng, sum(lens_q), sum(lens_kv), 8, 2, 64)
    mask = rng.random((2, 2, 3, 5)) < 0.5
    config = fp.SelectConfig(block_size=128)
    cu_q, cu_k = cu_of(lens_q), cu_of(lens_kv)
    ref = fp.Index.from_block_mask(mask, q, k, v, config, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k)
    tq, tk, tv = (torch.from_numpy(x) for x in (q, k, v))
    got = fp.Index.from_block_mask(torch.from_numpy(mask), tq, tk, tv, config,
                                   cu_seqlens_q=torch.tensor(cu_q), cu_seqlens_k=cu_k)
    assert isinstance(got.cu, torch.Tensor) and got.cu.dtype == torch.int32
    np.testing.assert_array_equal(got.cu.numpy(), ref.cu)
    np.testing.assert_array_equal(got.idx.numpy(), ref.idx)
    out = fp.sparse_attention(tq, tk, tv, got, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k)
    np.testing.assert_array_equal(
        out.numpy(), fp.sparse_attention(q, k, v, ref, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k))


def test_index_from_block_mask_rejects_a_mask_of_the_wrong_shape(rng):
    q, k, v = random_qkv(rng, 200, 450, 4, 1, 32)
    with pytest.raises(ValueError, match=r"mask: expected shape \[1, 1, 2, 4\]"):
        fp.Index.from_block_mask(np.ones((1, 2, 3), dtype=bool), q, k, v)
