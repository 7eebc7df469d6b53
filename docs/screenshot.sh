#!/usr/bin/env bash
# Build the site and take screenshots of the home page, a notebook page and the CLI reference
# with headless Chromium, opening the built files straight from disk (file://): what a reader
# sees offline. For people: CI checks the built HTML instead (tests/docs/test_docs.py).
#
#   docs/screenshot.sh [OUT_DIR]        # default: $TMPDIR/smearcli-screenshots
#
# Needs chromium (Debian: apt-get install chromium). Also shows the search working from
# file:// (index.html?q=noise).
set -euo pipefail
cd "$(dirname "$0")/.."
out="${1:-${TMPDIR:-/tmp}/smearcli-screenshots}"
mkdir -p "$out"
site="$(mktemp -d)"
trap 'rm -rf "$site"' EXIT

browser=""
for b in chromium chromium-browser google-chrome; do
  if command -v "$b" >/dev/null 2>&1; then browser="$b"; break; fi
done
if [ -z "$browser" ]; then
  echo "screenshot.sh: no chromium found (Debian: apt-get install chromium)" >&2
  exit 2
fi

NO_MKDOCS_2_WARNING=1 python -m mkdocs build --strict --quiet --site-dir "$site"

notebook="$(cd "$site" && ls notebooks/*.html 2>/dev/null | grep -v '/index.html$' | head -n 1 || true)"
pages=("index.html" "${notebook:-notebooks/index.html}" "reference/cli.html" "index.html?q=noise")
names=("home" "notebook" "cli-reference" "search")

for i in "${!pages[@]}"; do
  png="$out/${names[$i]}.png"
  "$browser" --headless --no-sandbox --disable-gpu --disable-background-networking \
    --disable-component-update --disable-sync --no-first-run --hide-scrollbars \
    --window-size=1280,1800 --virtual-time-budget=4000 \
    --screenshot="$png" "file://$site/${pages[$i]}" >/dev/null 2>&1
  echo "$png  <-  ${pages[$i]}"
done
