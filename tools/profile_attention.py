"""A driver for ncu: three calls of one attention mode on the benchmark's inputs, nothing else.

    python3 tools/profile_attention.py LIB RHO [L [fp8]]

RHO >= 1 runs dense mode; below 1, sparse mode without mean correction on a random 128x128
block mask of that density (fixed seed, so every build profiles the same mask). `fp8`: the same
calls on the inputs quantized to e4m3 per tensor (bench_fp8.Fp8Batch). Profile it with,
for example (the second call is the one measured):

    ncu --clock-control none --kernel-name regex:attention_kernel --launch-skip 1 \\
        --launch-count 1 --section SpeedOfLight --section WarpStateStats \\
        --section SourceCounters --import-source yes -o prof \\
        python3 tools/profile_attention.py build/libflashprefill.so 0.05 32768
"""

import pathlib
import sys

import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "bench"))
import bench_attention as ba  # noqa: E402
import bench_fp8  # noqa: E402
import common  # noqa: E402

SEED = 7


def main():
    common.load_package(sys.argv[1])
    lib = ba.Lib(sys.argv[1])
    rho = float(sys.argv[2])
    L = int(sys.argv[3]) if len(sys.argv) > 3 else 32768
    b = ba.Batch([L], [L])
    if len(sys.argv) > 4 and sys.argv[4] == "fp8":
        fp8 = bench_fp8.Fp8Batch(b.q, b.k, b.v)  # holds the e4m3 tensors its batch reads
        b = fp8.batch
    ours = ba.Ours(lib, b)
    if rho >= 1:
        run = ours.dense
    else:
        gen = torch.Generator(device="cuda")
        gen.manual_seed(SEED)
        ours.use_block_mask(ba.random_block_mask(L, rho, gen), 0)
        run = ours.sparse
    for _ in range(3):
        run()
    torch.cuda.synchronize()


if __name__ == "__main__":
    main()
