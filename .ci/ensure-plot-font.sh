#!/usr/bin/env bash
# The font `cxlfs run` / `cxlfs plot` draw PNG text with (plotters' ab_glyph
# renderer reads a TrueType file; no fontconfig or freetype library is used):
# DejaVu Sans from Debian's fonts-dejavu-core. Installs it with apt-get when
# missing. CXLFS_PLOT_FONT may name another .ttf instead.
set -euo pipefail
font=/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf
if [[ -n "${CXLFS_PLOT_FONT:-}" && -f "${CXLFS_PLOT_FONT}" ]] || [[ -f "$font" ]]; then
    exit 0
fi
echo "ensure-plot-font: installing fonts-dejavu-core (for plot text)" >&2
sudo=()
((EUID == 0)) || sudo=(sudo)
export DEBIAN_FRONTEND=noninteractive
"${sudo[@]}" apt-get install -y --no-install-recommends fonts-dejavu-core >&2 \
    || { "${sudo[@]}" apt-get update >&2 && "${sudo[@]}" apt-get install -y --no-install-recommends fonts-dejavu-core >&2; }
[[ -f "$font" ]] || { echo "ensure-plot-font: $font still missing" >&2; exit 1; }
