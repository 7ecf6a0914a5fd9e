# Step helpers of .ci/run (sourced; tested by hack/ci/steps_test.go):
# step runs a command in the foreground, bg in the background, join waits
# for background steps, and table (the EXIT trap) prints each step's
# seconds, the CPU seconds its processes used and how busy the machine's
# cores were meanwhile. Needs $start
# (the run's start, date +%s) and a bin/ folder in the working directory.
steps=()
# cpu: the machine's busy and total jiffies so far (/proc/stat), so that a
# step's row says how much of the 2 cores were busy meanwhile: where a
# step leaves them idle, work can move beside it.
cpu() { awk '/^cpu / {t=0; for (i=2; i<=NF; i++) t+=$i; print t-$5-$6, t}' /proc/stat; }
# busy B0 T0 B1 T1: percent of the machine busy between two cpu readings.
busy() { echo $(( ($3 - $1) * 100 / ($4 - $2 > 0 ? $4 - $2 : 1) )); }
# cpusecs VAR: sets VAR to the CPU seconds (user + system) of this shell's
# waited-for children so far: what a step's own processes used. The times
# builtin must run in this shell, not in a $(...) subshell, whose
# counters start at zero.
cpusecs() {
  local f=bin/.ci-times.$BASHPID
  times >"$f"
  printf -v "$1" '%s' "$(awk 'NR == 2 {split($1, u, /[ms]/); split($2, s, /[ms]/); printf "%d", u[1] * 60 + u[2] + s[1] * 60 + s[2]}' "$f")"
  rm -f "$f"
}
# failures LOG: the failed tests of a go test log, package by package,
# each with the last ten messages it wrote itself (file.go:line: ..., not
# the continuation lines of the process logs the e2e suite dumps), and on
# a timeout the tests still running with theirs: why a run failed, at the
# end of its output. With -v, === RUN/CONT/NAME/PAUSE say whose messages
# follow (parallel tests and subtests interleave); without it, a test's
# messages follow its result line, a subtest's four spaces deeper.
failures() {
  awk '
    function owner(d,   parts, k, out) {
      if (verbose) return name
      split(name, parts, "/")
      out = parts[1]
      for (k = 2; k <= d + 1 && (k in parts); k++) out = out "/" parts[k]
      return out
    }
    function show(f, indent,   i) {
      for (i = (n[f] > 10 ? n[f] - 9 : 1); i <= n[f]; i++) print indent "    " msg[f, i]
    }
    function flush(last,   k, f) {
      for (k = 1; k <= nf; k++) {
        f = failed[k]
        print line[f]
        match(line[f], /^ */)
        show(f, substr(line[f], 1, RLENGTH))
      }
      for (k = 1; k <= nt; k++) {
        print tail[k]
        if (k in stopped) show(stopped[k], "\t\t")
      }
      if (last != "") print last
      split("", failed); split("", line); split("", msg); split("", n); split("", tail); split("", stopped)
      nf = nt = verbose = running = 0
      name = ""
    }
    /^=== (RUN|CONT|PAUSE|NAME) / { verbose = 1; name = $3; next }
    /^ +[A-Za-z0-9_.-]+\.go:[0-9]+: / {
      match($0, /^ +/)
      f = owner(int(RLENGTH / 4) - 1)
      msg[f, ++n[f]] = substr($0, RLENGTH + 1)
      next
    }
    /^ *--- FAIL: / { if (!($3 in line)) failed[++nf] = $3; line[$3] = $0 }
    /^ *--- (PASS|FAIL|SKIP): / { name = $3; next }
    /^(panic: |.*test timed out)/ { tail[++nt] = $0; next }
    /^\t*running tests:/ { running = 1; tail[++nt] = $0; next }
    running && /^\t\t[^ \t]+ / { tail[++nt] = $0; stopped[nt] = $1; next }
    { running = 0 }
    /^ok  \t/ { flush(""); next }
    /^FAIL\t/ { flush($0); next }
    END { flush("") }
  ' "$1"
}
read -r cpu_b0 cpu_t0 < <(cpu)
table() {
  local rc=$? b t secs used pct
  echo
  # The tests that failed, just before the table: the end of the output
  # is what a reader of a failed run sees first, and the e2e suite dumps
  # many logs before it.
  if [ "$rc" -ne 0 ] && [ -f bin/ci-test.log ]; then
    echo "ci: failed tests (from bin/ci-test.log):"
    failures bin/ci-test.log | tail -80 || true
  fi
  read -r b t < <(cpu)
  # cpu s: the step's own processes (daemons they leave behind not
  # counted); busy: the whole machine meanwhile, every step beside it too.
  echo "ci: step                          seconds    cpu s    busy"
  for s in "${steps[@]}"; do
    read -r secs used pct <<<"${s#*=}"
    printf 'ci: %-30s %7s  %7s  %5s%%\n' "${s%%=*}" "$secs" "$used" "$pct"
  done
  cpusecs used
  printf 'ci: %-30s %7s  %7s  %5s%%\n' "total" "$(( $(date +%s) - start ))" "$used" "$(busy "$cpu_b0" "$cpu_t0" "$b" "$t")"
  [ "$rc" -eq 0 ] && echo "ci: done" || echo "ci: failed (exit $rc)"
}
trap table EXIT

# step NAME COMMAND...: runs COMMAND and records how long it took, the CPU
# seconds it used and how busy the machine was meanwhile.
step() {
  local name=$1 t c0 c1 b0 t0 b1 t1
  shift
  t=$(date +%s)
  cpusecs c0
  read -r b0 t0 < <(cpu)
  echo "ci: == $name"
  "$@"
  read -r b1 t1 < <(cpu)
  cpusecs c1
  steps+=("$name=$(( $(date +%s) - t )) $((c1 - c0)) $(busy "$b0" "$t0" "$b1" "$t1")")
}

# bg NAME COMMAND...: runs COMMAND in the background, its output in
# bin/ci-NAME.log; when it ends, bin/ci-NAME.status holds one line: its
# exit code, seconds, CPU seconds and the machine's busy percent meanwhile
# (e2e's awaitRelease reads the first two fields of the release's).
bg() {
  local name=$1
  shift
  echo "ci: started $name in the background (log bin/ci-$name.log)"
  (
    t=$(date +%s); rc=0
    read -r b0 t0 < <(cpu)
    "$@" >"bin/ci-$name.log" 2>&1 || rc=$?
    read -r b1 t1 < <(cpu)
    cpusecs used
    echo "$rc $(( $(date +%s) - t )) $used $(busy "$b0" "$t0" "$b1" "$t1")" >"bin/ci-$name.status"
  ) &
}
# join NAME...: waits for background steps and records them, saying every
# minute which still run; fails with the log of the first that failed.
join() {
  local name rc secs used pct waited=0 running
  while :; do
    running=() rc=0
    for name in "$@"; do
      if [ -f "bin/ci-$name.status" ]; then read -r rc _ <"bin/ci-$name.status"; [ "$rc" -eq 0 ] || break; else running+=("$name"); fi
    done
    # Done, or one failed: no need to wait for the others.
    [ ${#running[@]} -gt 0 ] && [ "$rc" -eq 0 ] || break
    sleep 1
    waited=$((waited + 1))
    [ $((waited % 60)) -ne 0 ] || echo "ci: waiting ${waited}s for ${running[*]}"
  done
  local failed=
  for name in "$@"; do
    [ -f "bin/ci-$name.status" ] || continue
    read -r rc secs used pct <"bin/ci-$name.status"
    steps+=("$name (background)=$secs $used $pct")
    [ "$rc" -eq 0 ] || [ -n "$failed" ] || failed=$name
  done
  if [ -n "$failed" ]; then
    read -r rc _ <"bin/ci-$failed.status"
    echo "ci: $failed failed (exit $rc):"; tail -40 "bin/ci-$failed.log"; exit "$rc"
  fi
}
