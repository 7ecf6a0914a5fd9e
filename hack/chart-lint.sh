#!/usr/bin/env bash
# helm lint --strict and helm template of deploy/charts/knotless with every
# value set in its ci/ folder, and a check that the chart refuses to render
# without the Secrets it needs. helm is bin/helm (make chart-lint builds it
# from hack/tools/helm).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
helm=${HELM:-$root/bin/helm}
chart=$root/deploy/charts/knotless
out=$root/bin/chart
mkdir -p "$out"
for values in "$chart"/ci/*.yaml; do
  name=$(basename "$values" .yaml)
  "$helm" lint --strict --quiet -f "$values" "$chart"
  "$helm" template knotless "$chart" --namespace knotless-system -f "$values" >"$out/$name.yaml"
  echo "chart: $name: lint ok, $(grep -c '^kind:' "$out/$name.yaml") objects rendered into bin/chart/$name.yaml"
done
if msg=$("$helm" template knotless "$chart" 2>&1); then
  echo "chart: rendered without any Secret named; it must refuse" >&2
  exit 1
fi
case $msg in
  *"a Secret with"*) echo "chart: refuses to render without its Secrets: ok" ;;
  *) echo "chart: unexpected error without values: $msg" >&2; exit 1 ;;
esac
# values.schema.json: helm lint refuses a value of the wrong type.
if "$helm" lint --strict --quiet -f "$chart/ci/default-values.yaml" --set provider.replicas=two "$chart" >/dev/null 2>&1; then
  echo "chart: helm lint accepted provider.replicas=two; values.schema.json must refuse it" >&2
  exit 1
fi
echo "chart: values.schema.json refuses a wrong type: ok"
