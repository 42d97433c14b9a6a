#!/usr/bin/env bash
# Copies the project's files (tracked, and new ones git does not ignore) into
# a fresh tree at $1, for builds that must leave the main build alone.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
tree=$1
rm -rf "$tree/torch_convgrad" "$tree/tests" "$tree/csrc" "$tree/examples"
mkdir -p "$tree"
(cd "$root" && git ls-files -z --cached --others --exclude-standard | xargs -0 tar cf -) | (cd "$tree" && tar xf -)
