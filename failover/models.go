package failover

import (
	"encoding/json"
	"net/http"
	"strconv"
)

// listModels answers GET /v1/models from the configured models, in
// Anthropic's list format when the client is an Anthropic SDK (it always
// sends anthropic-version) and OpenAI's otherwise.
func (e *Engine) listModels(w http.ResponseWriter, r *http.Request) error {
	var v any
	if r.Header.Get("Anthropic-Version") != "" {
		type model struct {
			Type        string `json:"type"`
			ID          string `json:"id"`
			DisplayName string `json:"display_name"`
			CreatedAt   string `json:"created_at"`
		}
		list := struct {
			Data    []model `json:"data"`
			HasMore bool    `json:"has_more"`
			FirstID *string `json:"first_id"`
			LastID  *string `json:"last_id"`
		}{Data: []model{}}
		for _, name := range e.modelList {
			list.Data = append(list.Data, model{Type: "model", ID: name, DisplayName: name, CreatedAt: "1970-01-01T00:00:00Z"})
		}
		if n := len(e.modelList); n > 0 {
			list.FirstID, list.LastID = &e.modelList[0], &e.modelList[n-1]
		}
		v = list
	} else {
		type model struct {
			ID      string `json:"id"`
			Object  string `json:"object"`
			Created int64  `json:"created"`
			OwnedBy string `json:"owned_by"`
		}
		list := struct {
			Object string  `json:"object"`
			Data   []model `json:"data"`
		}{Object: "list", Data: []model{}}
		for _, name := range e.modelList {
			list.Data = append(list.Data, model{ID: name, Object: "model", OwnedBy: "llm_failover"})
		}
		v = list
	}
	body, err := json.Marshal(v)
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
