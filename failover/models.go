package failover

import (
	"net/http"
	"strconv"

	"github.com/llmfailover/caddy-llm-failover/provider"
)

// listModels answers GET /v1/models from the configured models, in the
// client's API's list format.
func (e *Engine) listModels(w http.ResponseWriter, r *http.Request) error {
	body, err := provider.ModelList(r.Header, e.modelList)
	if err != nil {
		return err
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Content-Length", strconv.Itoa(len(body)))
	w.WriteHeader(http.StatusOK)
	if r.Method != http.MethodHead {
		_, _ = w.Write(body)
	}
	return nil
}
