#!/usr/bin/env bash
# Rewrite this wrapper module for another Kubernetes release: hack/go/kubernetes/gen-gomod.sh v1.36.3
# k8s.io/kubernetes requires each staging module (k8s.io/api, k8s.io/client-go, ...) at v0.0.0 and
# replaces it with a directory of its own repository; here each one is replaced with the published
# tag that belongs to the release instead (Kubernetes v1.X.Y ships its staging modules as v0.X.Y).
set -euo pipefail
version=${1:?usage: $0 v1.X.Y}
staging=v0.${version#v1.}
cd "$(dirname "$0")"
gomod=$(go mod download -json "k8s.io/kubernetes@${version}" | sed -n 's/^\t"GoMod": "\(.*\)",$/\1/p')
{
  sed -n '1,/^module /{/^module /!p}' go.mod
  echo 'module modelroll.io/hack/kubernetes'
  echo
  echo "go $(awk '$1 == "go" {print $2; exit}' "$gomod")"
  echo
  echo "require k8s.io/kubernetes ${version}"
  echo
  echo 'tool ('
  echo '	k8s.io/kubernetes/cmd/kube-apiserver'
  echo '	k8s.io/kubernetes/cmd/kube-controller-manager'
  echo '	k8s.io/kubernetes/cmd/kube-proxy'
  echo '	k8s.io/kubernetes/cmd/kube-scheduler'
  echo '	k8s.io/kubernetes/cmd/kubectl'
  echo '	k8s.io/kubernetes/cmd/kubelet'
  echo ')'
  echo
  echo 'replace ('
  grep -E '^\s+k8s\.io/[a-z-]+ v0\.0\.0$' "$gomod" | awk -v v="$staging" '{printf "\t%s => %s %s\n", $1, $1, v}'
  echo ')'
} > go.mod.new
mv go.mod.new go.mod
rm -f go.sum
go mod tidy
echo "hack/go/kubernetes now builds Kubernetes ${version}; run make cluster-bins"
