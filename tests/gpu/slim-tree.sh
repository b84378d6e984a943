#!/usr/bin/env bash
# slim-tree.sh drop|restore : the device tool sends the checkout's tracked and untracked files and
# refuses more than 64 MiB. The four model fixtures in deploy/models are 90 MB, so before a GPU
# call `drop` takes deploy/models/tiny-glm and tiny-dsv3 out of the index (and ignores them); the
# files stay on disk. `restore` puts them back. Do not commit in between.
set -euo pipefail
cd "$(dirname "$0")/../.."
ex=.git/info/exclude
[ -f .git ] && ex=$(git rev-parse --git-path info/exclude)
case ${1:-} in
drop)
    git rm -r -q --cached deploy/models/tiny-glm deploy/models/tiny-dsv3
    printf '/deploy/models/tiny-glm/\n/deploy/models/tiny-dsv3/\n' >>"$ex"
    git ls-files -z | xargs -0 du -cb 2>/dev/null | tail -1 ;;
restore)
    git reset -q -- deploy/models
    sed -i '\#^/deploy/models/tiny-glm/$#d; \#^/deploy/models/tiny-dsv3/$#d' "$ex"
    git status --short -- deploy/models ;;
*) echo "usage: $0 drop|restore" >&2; exit 2 ;;
esac
