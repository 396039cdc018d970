# Sourced by the scripts that make virtual environments (setup.sh, test_sglang.sh, test_vllm.sh),
# from the repository root. They install with uv, pinned in requirements/uv.txt, which links each
# wheel from one cache (UV_CACHE_DIR, default ~/.cache/uv) into every environment.
#   uv_ready               installs the pinned uv into .venv-uv (FP_UV_VENV) when it is missing
#                          or another version, one caller at a time; FP_UV is its path
#   uv_install VENV ARG... `uv pip install ARG...` into VENV, made with python3 -m venv (pip
#                          included) when missing
FP_UV_VENV=$(realpath -m "${FP_UV_VENV:-.venv-uv}")
FP_UV="$FP_UV_VENV/bin/uv"

uv_ready() {
  local want
  want=$(sed -n 's/^uv==\([0-9.]*\).*/\1/p' requirements/uv.txt)
  mkdir -p "$FP_UV_VENV"
  (
    flock 9
    if [ "$("$FP_UV" --version 2>/dev/null | cut -d' ' -f2)" != "$want" ]; then
      [ -x "$FP_UV_VENV/bin/python" ] || python3 -m venv "$FP_UV_VENV"
      "$FP_UV_VENV/bin/python" -m pip install -q --disable-pip-version-check -r requirements/uv.txt
    fi
  ) 9>"$FP_UV_VENV/.lock"
}

uv_install() {
  local venv=$1
  shift
  [ -x "$venv/bin/python" ] || python3 -m venv "$venv"
  "$FP_UV" pip install -q --python "$venv/bin/python" "$@"
}
