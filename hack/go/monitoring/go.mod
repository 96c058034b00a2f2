// Pins the prometheus-operator release whose CRDs (PodMonitor, ServiceMonitor, PrometheusRule)
// the chart tests install into the local control plane. Nothing is built from it: `make
// monitoring-crds` (hack/chart.mk) downloads the module and copies the three CRD files from
// example/prometheus-operator-crd/ in the module cache into .cache/, never into git.
module modelroll.io/hack/monitoring

go 1.26.0

require github.com/prometheus-operator/prometheus-operator v0.85.0
