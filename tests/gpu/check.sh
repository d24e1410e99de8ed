#!/usr/bin/env bash
# ./dev gpu-check: install trainmaster over this machine's own torch, then run tests/gpu/check.py.
#
# For a machine with a CUDA device and no network (the device tool's H200: torch 2.11 + CUDA 13, Python 3.12):
# what trainmaster needs beyond the machine's packages comes as wheels in .gpu-wheels/ (./dev gpu-wheels, run
# where PyPI is reachable), installed with --no-deps into a folder of their own, so torch is never replaced;
# trainmaster itself is built from this working tree. Everything is written under $OUT (default ./gpu-check-out):
# gpu-check.json (every stage's results and the figures), gpu-check.log (this output), calibrations.tar.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-$PWD/gpu-check-out}
PY=${GPU_CHECK_PYTHON:-python3}
WHEELS=${GPU_CHECK_WHEELS:-.gpu-wheels}
mkdir -p "$OUT"
exec > >(tee -a "$OUT/gpu-check.log") 2>&1

if ! "$PY" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 3)' 2>/dev/null; then
    echo "gpu-check: $PY sees no CUDA device (or has no torch); this check runs on a machine with a GPU" \
         "(the device tool: ./dev gpu-check with carry [.gpu-wheels]); nothing was run" >&2
    exit 2
fi
if ! compgen -G "$WHEELS/*.whl" >/dev/null; then
    echo "gpu-check: no wheels in $WHEELS; run ./dev gpu-wheels where PyPI is reachable, and carry the folder" >&2
    exit 2
fi
site=/tmp/trainmaster-gpu-site build=/tmp/trainmaster-gpu-build
rm -rf "$site" "$build" && mkdir -p "$site" "$build"
deps=() tools=()
for w in "$WHEELS"/*.whl; do
    case "$(basename "$w")" in
        trainmaster-*) ;;
        setuptools-*|wheel-*) tools+=("$w") ;;
        *) deps+=("$w") ;;
    esac
done
"$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$site" "${deps[@]}" || exit 2
# trainmaster from this tree (the carried wheel only when it cannot be built here)
"$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$build/tools" "${tools[@]}" 2>/dev/null
if PYTHONPATH="$build/tools" "$PY" -m pip wheel -q --no-index --no-deps --no-build-isolation -w "$build" . >/dev/null 2>&1; then
    tm_wheel=$(ls "$build"/trainmaster-*.whl)
else
    tm_wheel=$(ls "$WHEELS"/trainmaster-*.whl 2>/dev/null | head -1)
    echo "gpu-check: could not build trainmaster from this tree here; using the carried $tm_wheel"
fi
[[ -n "$tm_wheel" ]] || { echo "gpu-check: no trainmaster wheel" >&2; exit 2; }
"$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$site" "$tm_wheel" || exit 2
export PYTHONPATH="$site" PYTHONUNBUFFERED=1
"$PY" -c 'import torch, trainmaster.jobs, pydantic; print("gpu-check: torch", torch.__version__, "cuda", torch.version.cuda,
      "gpu", torch.cuda.get_device_name(0), "| trainmaster from", trainmaster.jobs.__file__.rsplit("/", 2)[0])'
exec "$PY" tests/gpu/check.py --out "$OUT" "$@"
