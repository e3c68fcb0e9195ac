package failover

import (
	"net/http"
	"strconv"

	"github.com/llmfailover/caddy-llm-failover/provider"
)

// listModels answers GET /v1/models from the configured models, in the
// client's API's list format.
func (e *Engine) listModels(w http.ResponseWriter, r *http.Request) error {
	// Each list names the models a client of its API can use: a model
	// only OpenAI-style channels serve is not in Anthropic's list, and
	// one only Bedrock serves (Messages) not in OpenAI's.
	anthropic := r.Header.Get("Anthropic-Version") != ""
	var names []string
	for _, name := range e.modelList {
		m := e.models[name]
		for api := range provider.NumAPIs {
			if m.ByAPI[api] != nil && api != provider.OpenAIModels && api.Anthropic() == anthropic {
				names = append(names, name)
				break
			}
		}
	}
	body, err := provider.ModelList(r.Header, names)
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
