#!/usr/bin/env bash
# Lay out a colcon workspace from this clone: DIR/src/ links each of its packages (timely_llm, the repository
# root; timely_llm_interfaces; timely_llm_robot; timely_llm_bench), so that `cd DIR && colcon build` builds them
# all. PACKAGES picks some (e.g. PACKAGES="timely_llm_interfaces timely_llm_robot": a robot's workspace).
# Usage: scripts/workspace.sh DIR   (idempotent; fails if DIR/src holds another package of the same name)
set -euo pipefail
if [[ $# -ne 1 ]]; then
  echo "usage: $0 DIR" >&2
  exit 2
fi
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
src="$(realpath -m "$1")/src"
declare -A path=([timely_llm]="$repo" [timely_llm_interfaces]="$repo/timely_llm_interfaces"
                 [timely_llm_robot]="$repo/timely_llm_robot" [timely_llm_bench]="$repo/timely_llm_bench")
read -r -a packages <<< "${PACKAGES:-timely_llm timely_llm_interfaces timely_llm_robot timely_llm_bench}"
mkdir -p "$src"
for name in "${packages[@]}"; do
  target="${path[$name]:-}"
  if [[ -z "$target" ]]; then
    echo "$0: unknown package $name (known: ${!path[*]})" >&2
    exit 2
  fi
  link="$src/$name"
  if [[ -L "$link" && "$(realpath "$link")" == "$(realpath "$target")" ]]; then
    continue
  fi
  if [[ -e "$link" || -L "$link" ]]; then
    echo "$0: $link exists and is not a link to $target" >&2
    exit 1
  fi
  ln -s "$target" "$link"
done
# colcon stops at a package.xml, so the packages inside the root are found only through their own links.
echo "workspace $src: ${packages[*]}; next: cd $(dirname "$src") && colcon build"
