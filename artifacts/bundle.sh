#!/bin/sh
# bundle.sh DIR TEMPLATE -- writes DIR/manifest.json from TEMPLATE, with
# @FILES@ replaced by the sha256 of every file in DIR (docs/ARTIFACTS.md).
# The bundle is then exactly what kern_artifacts_scan verifies.
set -eu
dir=$1; tmpl=$2
files=""
for f in $(ls "$dir" | LC_ALL=C sort); do
    [ "$f" = manifest.json ] && continue
    [ -f "$dir/$f" ] || { echo "bundle.sh: $dir/$f is not a regular file" >&2; exit 1; }
    h=$(sha256sum "$dir/$f" | cut -d' ' -f1)
    files="$files${files:+, }\"$f\": \"$h\""
done
[ -n "$files" ] || { echo "bundle.sh: $dir holds no file" >&2; exit 1; }
sed "s|@FILES@|{ $files }|" "$tmpl" > "$dir/manifest.json.tmp"
mv "$dir/manifest.json.tmp" "$dir/manifest.json"
