#!/usr/bin/env bash
# Stages what the device calls of docs/ACCURACY.md ("On the GPU") need, in folders of the repo that
# the device tool sends (name them in .git/info/exclude and in the call's carry). The model (94 MiB)
# is over one call's 64 MiB, and an ignored folder that a call does not carry is removed on the
# device before the call runs, so part 0 travels first and is parked outside the repo there:
#
#   phase 1: <root>/.devacc0/model/part0.npz
#            call 1, carry [".devacc0"]: mkdir -p /tmp/fpm && cp .devacc0/model/part0.npz /tmp/fpm/
#   phase 2: <root>/.devacc/{accuracy,python,lib}, model/part1.npz, model/tokens.npz
#            call 2 (machine still warm: it is given back 30 s after a call), carry [".devacc"]:
#            bash .devacc/accuracy/device_run.sh
#
#   bash accuracy/device_stage.sh 1 <root> [lib] ; bash accuracy/device_stage.sh 2 <root> [lib]
# Pack first: python3 accuracy/device_pack.py (writes accuracy/.device/).
set -euo pipefail
src=$(cd "$(dirname "$0")/.." && pwd)
phase=${1:?1 or 2}
root=${2:?repo root the device tool sends}
lib=${3:-$src/build/libflashprefill.so}
pack=${PACK:-$src/accuracy/.device}
rm -rf "$root/.devacc"
mkdir -p "$root/.devacc/accuracy" "$root/.devacc/python" "$root/.devacc/lib" "$root/.devacc/model"
cp "$src"/accuracy/*.py "$root/.devacc/accuracy/"
cp -r "$src/python/flashprefill" "$root/.devacc/python/"
rm -rf "$root/.devacc/python/flashprefill/__pycache__"
cp "$lib" "$root/.devacc/lib/"
if [ "$phase" = 1 ]; then
  rm -rf "$root/.devacc0" && mkdir -p "$root/.devacc0/model"
  cp "$pack/part0.npz" "$root/.devacc0/model/"
else
  cp "$pack/part1.npz" "$pack/tokens.npz" "$root/.devacc/model/"
fi
du -sh "$root/.devacc" "$root/.devacc0" 2>/dev/null || true
