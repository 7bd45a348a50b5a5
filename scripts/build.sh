#!/usr/bin/env bash
# Configures and builds one build folder. Usage: scripts/build.sh DIR [cmake options...]
set -euo pipefail
dir=$1
shift
cmake -S "$(dirname "$0")/.." -B "$dir" -DCMAKE_BUILD_TYPE=Release "$@" >/dev/null
cmake --build "$dir" -j "$(nproc)"
# The Python package goes where /usr/bin/python3 finds it (/usr/local/lib/python3.*/dist-packages),
# so `import deltacast` works with no extra step; sanitizer and fuzz builds have none.
if [ -f "$dir/python/deltacast/__init__.py" ]; then
  cmake --install "$dir" --component python >/dev/null ||
    echo "note: could not install the Python package (not root?); use PYTHONPATH=$dir/python" >&2
fi
