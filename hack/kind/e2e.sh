#!/usr/bin/env bash
# make e2e-kind: the e2e rollout scenario (tests/e2e/test_rollout.py) and the node scenario
# (tests/node: managed versions as pods under load through rollbacks, rolling updates, pod
# deletions, scaling and an operator restart) on a kind cluster: the same code that `make
# test-node` runs on the local node.
#
#   1. create a kind cluster (or reuse one of the same name)
#   2. build the operator, gateway, sidecar and demo images and `kind load` them
#   3. install kube-prometheus-stack (Prometheus Operator + Prometheus) and the modelroll chart
#      with monitoring on (PodMonitor, ServiceMonitor, PrometheusRule)
#   4. port-forward the gateway, its admin port and Prometheus, and run the scenario against
#      them (it pins versions through the port-forward, which arrives from loopback): the versions
#      are the managed examples (examples/managed/) renamed stable-v1 and canary-v2
#   5. stop the port-forwards and delete the cluster (KEEP_CLUSTER=1 keeps it)
#
# Needs Docker, kind, network access to the kube-prometheus-stack chart repository, and what
# `make e2e-kind` builds first (.venv, .bin/helm, .bin/kubectl).
set -euo pipefail
cd "$(dirname "$0")/../.."

CLUSTER=${KIND_CLUSTER:-modelroll-e2e}
NAMESPACE=${MODELROLL_E2E_NAMESPACE:-modelroll}
RELEASE=modelroll
MONITORING_NAMESPACE=monitoring
PROMETHEUS_RELEASE=kube-prometheus-stack   # examples/values-monitoring.yaml selects on it
GATEWAY_PORT=${GATEWAY_PORT:-18080}
GATEWAY_ADMIN_PORT=${GATEWAY_ADMIN_PORT:-18090}
PROMETHEUS_PORT=${PROMETHEUS_PORT:-19090}
HELM=${HELM:-.bin/helm}
KUBECTL=${KUBECTL:-.bin/kubectl}
TAG=$(awk '$1 == "appVersion:" {gsub(/"/, "", $2); print $2}' charts/modelroll/Chart.yaml)
KUBECONFIG_FILE=$PWD/.cache/kind-$CLUSTER.kubeconfig
export KUBECONFIG=$KUBECONFIG_FILE

step() { printf '\n==> %s\n' "$*"; }
for tool in docker kind "$HELM" "$KUBECTL"; do
  command -v "$tool" >/dev/null || { echo "e2e-kind needs $tool" >&2; exit 1; }
done
docker info >/dev/null 2>&1 || { echo "e2e-kind needs a running Docker engine" >&2; exit 1; }

forwards=()
cleanup() {
  for pid in "${forwards[@]}"; do kill "$pid" 2>/dev/null || true; done
  if [ "${KEEP_CLUSTER:-0}" != 1 ]; then
    step "Deleting kind cluster $CLUSTER (KEEP_CLUSTER=1 keeps it)"
    kind delete cluster --name "$CLUSTER" || true
  fi
}
trap cleanup EXIT

mkdir -p .cache
if kind get clusters | grep -qx "$CLUSTER"; then
  step "Reusing kind cluster $CLUSTER"
  kind export kubeconfig --name "$CLUSTER" --kubeconfig "$KUBECONFIG_FILE"
else
  step "Creating kind cluster $CLUSTER"
  kind create cluster --name "$CLUSTER" --kubeconfig "$KUBECONFIG_FILE" --wait 180s
fi

for spec in operator:operator gateway:gateway sidecar:sidecar standins:demo; do  # folder:image
  component=${spec%%:*} image=ghcr.io/modelroll/modelroll-${spec#*:}:$TAG
  step "Building $image and loading it into the cluster"
  docker build --build-arg "COMPONENT=$component" -t "$image" .
  kind load docker-image --name "$CLUSTER" "$image"
done

step "Installing kube-prometheus-stack (Prometheus Operator and Prometheus; no Grafana)"
"$HELM" repo add prometheus-community https://prometheus-community.github.io/helm-charts >/dev/null
"$HELM" repo update prometheus-community >/dev/null
"$HELM" upgrade --install "$PROMETHEUS_RELEASE" prometheus-community/kube-prometheus-stack \
  --namespace "$MONITORING_NAMESPACE" --create-namespace --wait --timeout 10m \
  --set grafana.enabled=false --set alertmanager.enabled=false \
  --set nodeExporter.enabled=false --set kubeStateMetrics.enabled=false

step "Installing the modelroll chart with monitoring on"
"$HELM" upgrade --install "$RELEASE" charts/modelroll \
  --namespace "$NAMESPACE" --create-namespace --wait --timeout 5m \
  -f examples/values-monitoring.yaml \
  --set monitoring.podMonitor.interval=5s --set monitoring.serviceMonitor.interval=5s \
  --set 'gateway.trustedNetworks={127.0.0.1/32}'

step "Port-forwarding the gateway (:$GATEWAY_PORT, admin :$GATEWAY_ADMIN_PORT) and Prometheus (:$PROMETHEUS_PORT)"
"$KUBECTL" --namespace "$NAMESPACE" port-forward "service/$RELEASE-gateway" \
  "$GATEWAY_PORT:8080" >/dev/null &
forwards+=($!)
"$KUBECTL" --namespace "$NAMESPACE" port-forward "service/$RELEASE-gateway-admin" \
  "$GATEWAY_ADMIN_PORT:9090" >/dev/null &
forwards+=($!)
"$KUBECTL" --namespace "$MONITORING_NAMESPACE" port-forward \
  "service/$PROMETHEUS_RELEASE-prometheus" "$PROMETHEUS_PORT:9090" >/dev/null &
forwards+=($!)
for url in "http://127.0.0.1:$GATEWAY_PORT/readyz" "http://127.0.0.1:$GATEWAY_ADMIN_PORT/metrics" \
  "http://127.0.0.1:$PROMETHEUS_PORT/-/ready"; do
  for _ in $(seq 60); do curl -fsS "$url" >/dev/null 2>&1 && break; sleep 1; done
  curl -fsS "$url" >/dev/null || { echo "$url does not answer" >&2; exit 1; }
done

step "Running the e2e and node scenarios against the cluster"
# shellcheck disable=SC2086 # PYTEST_ARGS holds several arguments on purpose
MODELROLL_KUBECONFIG=$KUBECONFIG_FILE \
MODELROLL_KUBECTL=$KUBECTL \
MODELROLL_E2E_NAMESPACE=$NAMESPACE \
MODELROLL_E2E_RELEASE=$RELEASE \
MODELROLL_E2E_GATEWAY_URL=http://127.0.0.1:$GATEWAY_PORT \
MODELROLL_E2E_GATEWAY_ADMIN_URL=http://127.0.0.1:$GATEWAY_ADMIN_PORT \
MODELROLL_E2E_PROMETHEUS_URL=http://127.0.0.1:$PROMETHEUS_PORT \
  .venv/bin/python -m pytest tests/e2e/test_rollout.py tests/node ${PYTEST_ARGS:-}
