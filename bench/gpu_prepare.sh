#!/usr/bin/env bash
# Here (a machine with PyPI and the cached SmolLM2 copy), once per checkout: put in .gpu/ (in
# .gitignore, carried to the GPU machine, ~30 MiB) what bench/gpu_table.sh needs there, where nothing can be
# downloaded: this machine's versions of the packages the GPU image lacks or has in another version
# (as Python 3.12 x86-64 wheels), TRL 1.12 for the PPO contender, SmolLM2's tokenizer files and the
# built-in tiny model.
#
#     bash bench/gpu_prepare.sh            # then: device run, carry [".gpu"], command "bash bench/gpu_table.sh"
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python}
PKGS=(transformers==5.24.0 tokenizers==0.23.3 regex==2026.11.19 peft==0.21.2 trl==1.16.0 datasets==5.2.0
      dill==0.4.1 multiprocess==0.70.19 fsspec==2026.9.0)
rm -rf .gpu/whl .gpu/trl112
download() {  # download DIR SPEC...: binary wheels for CPython 3.12 on manylinux x86-64, no dependencies
  local dir=$1; shift
  "$PY" -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    --platform manylinux1_x86_64 -d "$dir" "$@"
}
download .gpu/whl "${PKGS[@]}"
download .gpu/trl112 trl==1.12.0
"$PY" bench/gpu_model.py tokenizer --out .gpu/tokenizer
# the built-in tiny model (gpu_check.sh trains it): built once here instead of warm-started there
rm -rf .gpu/cache && mkdir -p .gpu/cache
PYTHONPATH="$PWD" "$PY" -c "import shutil, sys; from llmrl.models.tiny import ensure_tiny; \
p = ensure_tiny(show_progress=False); shutil.copytree(p, sys.argv[1] + '/' + p.name)" .gpu/cache
du -sh .gpu/whl .gpu/trl112 .gpu/tokenizer .gpu/cache
