#!/usr/bin/env bash
# slim-tree.sh drop|restore|pack : the device tool sends the checkout's tracked and untracked files
# and refuses more than 64 MiB. The four model fixtures in deploy/models are 90 MB, so:
#   drop     takes every deploy/models/tiny-* out of the index (and ignores them; the files stay
#            on disk): the sent tree is ~3 MB. Commit nothing in between, or commit named paths
#            only (`git commit -m ... -- PATHS`), which leaves the drop staged and uncommitted.
#   restore  puts them back.
#   pack     writes .gpu-models/llama-moe.tar.xz (tiny-llama, tiny-moe, ~33 MB) and
#            glm-dsv3.tar.xz (tiny-glm, tiny-dsv3, ~21 MB), ignored; a GPU call carries one of them
#            (e.g. carry [".gpu", ".gpu-models/llama-moe.tar.xz"]) and starts with
#            `tar -xJf .gpu-models/llama-moe.tar.xz`.
set -euo pipefail
cd "$(dirname "$0")/../.."
ex=.git/info/exclude
[ -f .git ] && ex=$(git rev-parse --git-path info/exclude)
mkdir -p "$(dirname "$ex")"
case ${1:-} in
drop)
    # only what is still in the index: a second drop (prepare-round.sh run again) is a no-op
    git ls-files -z -- 'deploy/models/tiny-*' | xargs -0 -r git rm -q --cached --
    grep -qx '/deploy/models/tiny-\*/' "$ex" 2>/dev/null || echo '/deploy/models/tiny-*/' >>"$ex"
    grep -qx '/.gpu-models/' "$ex" 2>/dev/null || echo '/.gpu-models/' >>"$ex"
    git ls-files -z | xargs -0 du -cb 2>/dev/null | tail -1 ;;
restore)
    git reset -q -- deploy/models
    sed -i '\#^/deploy/models/tiny-\*/$#d' "$ex"
    git status --short -- deploy/models ;;
pack)
    mkdir -p .gpu-models
    tar -cf - deploy/models/tiny-llama deploy/models/tiny-moe | xz -T0 -6 >.gpu-models/llama-moe.tar.xz
    tar -cf - deploy/models/tiny-glm deploy/models/tiny-dsv3 | xz -T0 -6 >.gpu-models/glm-dsv3.tar.xz
    ls -la .gpu-models ;;
*) echo "usage: $0 drop|restore|pack" >&2; exit 2 ;;
esac
