// kserve-batcher serves the sidecar's API with KServe's batcher inside it:
//
//	POST /v1/infer {"payload": p}  ->  batcher  {"instances": [p]}  at /v1/models/bench:predict
//	batcher  {"instances": [p0, p1, ...]}  ->  model  POST /v1/batch {"inputs": [...]}
//	model  {"outputs": [...]}  ->  batcher  {"predictions": [...]}  ->  {"output": o}
//
// The batcher is used as KServe's agent uses it (batcher.New around the model's handler); the
// translation on either side is what lets the same demo model and load generator serve every
// system in `make bench`. Its per-request Info logging is sent to a no-op logger.
package main

import (
	"bytes"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"strings"
	"time"

	"github.com/kserve/kserve/pkg/batcher"
	"go.uber.org/zap"
)

const predictPath = "/v1/models/bench:predict"

// model forwards a batch to the demo model, translating KServe's instances/predictions shape to
// the model protocol's inputs/outputs.
type model struct {
	url    string
	client *http.Client
}

func (m *model) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	var req struct {
		Instances []json.RawMessage `json:"instances"`
	}
	if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	body, _ := json.Marshal(map[string]any{"inputs": req.Instances})
	resp, err := m.client.Post(m.url+"/v1/batch", "application/json", bytes.NewReader(body))
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadGateway)
		return
	}
	defer resp.Body.Close()
	var out struct {
		Outputs []json.RawMessage `json:"outputs"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil || resp.StatusCode != http.StatusOK {
		http.Error(w, fmt.Sprintf("model answered %d", resp.StatusCode), http.StatusBadGateway)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(map[string]any{"predictions": out.Outputs})
}

// infer turns one sidecar-style request into a one-instance KServe predict call on the batcher.
func infer(b http.Handler) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		var req struct {
			Payload json.RawMessage `json:"payload"`
		}
		raw, err := io.ReadAll(r.Body)
		if err == nil {
			err = json.Unmarshal(raw, &req)
		}
		if err != nil || req.Payload == nil {
			w.WriteHeader(http.StatusBadRequest)
			_, _ = w.Write([]byte(`{"error": "body must be {\"payload\": ...}"}`))
			return
		}
		inner, _ := json.Marshal(map[string]any{"instances": []json.RawMessage{req.Payload}})
		rec := httptest.NewRecorder()
		b.ServeHTTP(rec, httptest.NewRequest(http.MethodPost, predictPath, bytes.NewReader(inner)))
		var res batcher.Response
		if err := json.Unmarshal(rec.Body.Bytes(), &res); err != nil || len(res.Predictions) != 1 {
			msg, _ := json.Marshal(map[string]string{"error": strings.TrimSpace(res.Message)})
			w.WriteHeader(http.StatusBadGateway)
			_, _ = w.Write(msg)
			return
		}
		out, _ := json.Marshal(map[string]any{"output": res.Predictions[0]})
		_, _ = w.Write(out)
	}
}

func main() {
	port := flag.Int("port", 8000, "port to listen on (127.0.0.1)")
	upstream := flag.String("upstream", "http://127.0.0.1:8080", "the model server")
	maxBatch := flag.Int("max-batch-size", 32, "KServe batcher maxBatchSize")
	maxLatency := flag.Int("max-latency-ms", 10, "KServe batcher maxLatency (milliseconds)")
	flag.Parse()

	m := &model{url: strings.TrimRight(*upstream, "/"), client: &http.Client{
		Timeout:   60 * time.Second,
		Transport: &http.Transport{MaxIdleConnsPerHost: 16},
	}}
	b := batcher.New(*maxBatch, *maxLatency, m, zap.NewNop().Sugar())
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/infer", infer(b))
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, _ *http.Request) {
		_, _ = w.Write([]byte("ok"))
	})
	addr := fmt.Sprintf("127.0.0.1:%d", *port)
	log.Printf("kserve-batcher on %s, model %s, maxBatchSize %d, maxLatency %d ms",
		addr, m.url, *maxBatch, *maxLatency)
	log.Fatal(http.ListenAndServe(addr, mux))
}
