// Wrapper module: KServe's request batcher (github.com/kserve/kserve/pkg/batcher, the one its
// agent puts in front of a model server) behind the sidecar's POST /v1/infer, so the same load and
// the same demo model can be pointed at it. Built by `make kserve-batcher` into .bin/.
module modelroll.io/bench/kserve

go 1.25.4

require (
	github.com/kserve/kserve v0.17.0
	go.uber.org/zap v1.27.1
)

require (
	github.com/gofrs/uuid/v5 v5.3.0 // indirect
	go.uber.org/multierr v1.11.0 // indirect
)
