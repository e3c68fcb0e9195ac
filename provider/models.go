package provider

import (
	"encoding/json"
	"net/http"
)

// ModelList renders names as GET /v1/models answers them: in Anthropic's
// list format when the client is an Anthropic SDK (it always sends
// anthropic-version), in OpenAI's otherwise.
func ModelList(client http.Header, names []string) ([]byte, error) {
	if client.Get("Anthropic-Version") != "" {
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
		for _, name := range names {
			list.Data = append(list.Data, model{Type: "model", ID: name, DisplayName: name, CreatedAt: "1970-01-01T00:00:00Z"})
		}
		if n := len(names); n > 0 {
			list.FirstID, list.LastID = &names[0], &names[n-1]
		}
		return json.Marshal(list)
	}
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
	for _, name := range names {
		list.Data = append(list.Data, model{ID: name, Object: "model", OwnedBy: "llm_failover"})
	}
	return json.Marshal(list)
}
