# round-lib.sh: what the device round scripts (tests/gpu/rounds/run-round-*.sh) share; sourced by them
# from their own folder (.gpu-round/ on the device, where tests/gpu/prepare-round.sh copies both).
# Unpacks the bundle (.gpu-round/bundle.tar.xz) and the fixture archives carried (tiny-llama /
# tiny-moe, tiny-glm / tiny-dsv3), sets the
# bundle's environment, and defines:
#   st NAME TIMEOUT CMD...  runs CMD under the smaller of TIMEOUT and the time left before
#                           $DEADLINE (default $ROUND_DEADLINE) into $L/NAME.log, prints its rc
#                           and seconds; a failure or a skipped step sets rc=1
#   cases NAME              the harness's summary and FAIL lines of that log
#   tab NAME                its markdown table rows (and stepprof's headings)
#   round_end               packs the logs into $OUT/r.tgz and exits with rc
#   gates_start [T] / gates_end   the greedy-ids and perplexity gates (check_reference.py on
#                           tiny-llama / tiny-moe, under T seconds each, default 140) in the
#                           background, then their wait, status and tables (a failure sets rc=1)
F=$PWD/.gpu-round
tar -C $F -xJf $F/bundle.tar.xz || exit 9
# the fixture archives the call carried (llama-moe.tar.xz, glm-dsv3.tar.xz: one or both)
nfx=0
for a in .gpu-models/llama-moe.tar.xz .gpu-models/glm-dsv3.tar.xz; do
  [ -f $a ] || continue; tar -xJf $a || exit 9; nfx=$((nfx + 1)); done
[ $nfx -gt 0 ] || { echo "round-lib: no fixture archive carried (.gpu-models/*.tar.xz)"; exit 9; }
G=$F/b
export LD_LIBRARY_PATH=$G/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-} PATH=/usr/local/cuda/bin:$PATH PYTHONUNBUFFERED=1
export UCX_MODULE_DIR=$G/ucx PD_MODELS_DIR=$PWD/deploy/models
L=$OUT/logs; mkdir -p $L
DL=${DEADLINE:-${ROUND_DEADLINE:-400}}
rc=0
st() {
  local name=$1 t=$2; shift 2; local left=$((DL - SECONDS))
  [ $left -gt 6 ] || { echo "=== $name skipped (deadline)"; rc=1; return; }
  [ $t -lt $left ] || t=$left; echo "=== $name: $*"; local t0=$SECONDS
  timeout $t "$@" > $L/$name.log 2>&1; local r=$?
  echo "=== $name: rc $r, $((SECONDS - t0)) s"; [ $r = 0 ] || rc=1; }
cases() { grep -E "cases,|ERROR SUMMARY|FAIL" $L/$1.log | head -16; }
tab() { grep -E "^\| |^#### |steps; per step" $L/$1.log; }
round_end() { tar -C $OUT -czf $OUT/r.tgz logs && rm -rf $L; exit $rc; }
gates_start() {
  local t=${1:-140} fx="tiny-llama tiny-moe"
  st greedy $t python3 $G/check_reference.py greedy --pdctl $G/bin/pdctl --models deploy/models --kv f32 bf16 --only $fx --jobs 6 > $L/greedy.st &
  st ppl $t python3 $G/check_reference.py ppl --pdctl $G/bin/pdctl --models deploy/models --text tests/data/tinyshakespeare-val.txt --only $fx --jobs 4 > $L/ppl.st & }
gates_end() {
  wait
  for s in greedy ppl; do cat $L/$s.st; grep -qE "^=== $s: rc 0," $L/$s.st || rc=1; done
  tail -8 $L/greedy.log; tail -8 $L/ppl.log; }
