package fakeproviders

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
)

// Azure is a fake Azure OpenAI resource: it checks the api-key header and
// serves chat completions on both path styles, /openai/v1/chat/completions
// (the deployment is "model") and
// /openai/deployments/<deployment>/chat/completions?api-version=<date>.
type Azure struct {
	state
	modelSlot
	*httptest.Server
	APIKey string
	// APIVersions are the dated api-versions the resource accepts.
	APIVersions []string
	// Deployments are the deployment names; each serves Model.
	Deployments []string
	// Model is what the answers name (Azure names the underlying model,
	// not the deployment).
	Model string
}

// NewAzure starts a fake Azure OpenAI resource with one key and the given
// deployments, accepting api-version 2024-10-21.
func NewAzure(apiKey string, deployments ...string) *Azure {
	a := &Azure{APIKey: apiKey, APIVersions: []string{"2024-10-21"}, Deployments: deployments, Model: "gpt-4o-2024-08-06"}
	a.Server = httptest.NewServer(http.HandlerFunc(a.serve))
	return a
}

// The fake's answers in its modes, as Azure words them.
const (
	azureRetryAfterMs = "1500"
	azureFilterBody   = `{"error":{"message":"The response was filtered due to the prompt triggering Azure OpenAI's content management policy. Please modify your prompt and retry.","type":null,"param":"prompt","code":"content_filter","status":400,"innererror":{"code":"ResponsibleAIPolicyViolation","content_filter_result":{"hate":{"filtered":true,"severity":"high"}}}}}`
)

func (a *Azure) serve(w http.ResponseWriter, r *http.Request) {
	a.hits.Add(1)
	if r.Header.Get("Api-Key") != a.APIKey {
		writeJSON(w, http.StatusUnauthorized, `{"error":{"code":"401","message":"Access denied due to invalid subscription key or wrong API endpoint. Make sure to provide a valid key for an active subscription and use a correct regional API endpoint for your resource."}}`)
		return
	}
	if r.Header.Get("Authorization") != "" {
		a.refuse(w, http.StatusBadRequest, "an Authorization header reached Azure")
		return
	}
	body, _ := io.ReadAll(r.Body)
	a.received(body)
	var req chatRequest
	if err := json.Unmarshal(body, &req); err != nil {
		a.refuse(w, http.StatusBadRequest, "body is not JSON: %v", err)
		return
	}
	deployment := req.Model
	switch rest, dated := strings.CutPrefix(r.URL.Path, "/openai/deployments/"); {
	case r.URL.Path == "/openai/v1/chat/completions":
		if v := r.URL.Query().Get("api-version"); v != "" && v != "preview" && v != "latest" {
			writeJSON(w, http.StatusBadRequest, `{"error":{"code":"BadRequest","message":"API version not supported"}}`)
			return
		}
	case dated && strings.HasSuffix(rest, "/chat/completions"):
		deployment = strings.TrimSuffix(rest, "/chat/completions")
		if v := r.URL.Query().Get("api-version"); !slices.Contains(a.APIVersions, v) {
			writeJSON(w, http.StatusNotFound, `{"error":{"code":"404","message":"Resource not found"}}`)
			return
		}
	default:
		writeJSON(w, http.StatusNotFound, `{"error":{"code":"404","message":"Resource not found"}}`)
		return
	}
	if !slices.Contains(a.Deployments, deployment) {
		writeJSON(w, http.StatusNotFound, `{"error":{"code":"DeploymentNotFound","message":"The API deployment for this resource does not exist. If you created the deployment within the last 5 minutes, please wait a moment and try again."}}`)
		return
	}
	switch Mode(a.mode.Load()) {
	case RateLimited:
		// Azure says when to come back in milliseconds.
		w.Header().Set("Retry-After-Ms", azureRetryAfterMs)
		writeJSON(w, http.StatusTooManyRequests, `{"error":{"code":"429","message":"Requests to the ChatCompletions_Create Operation under Azure OpenAI API version 2024-10-21 have exceeded token rate limit of your current tier. Please retry after 1 second."}}`)
		return
	case ContentFiltered:
		writeJSON(w, http.StatusBadRequest, azureFilterBody)
		return
	case ContentFilteredStream:
		if req.Stream {
			writeChatStream(w, a.Model, "Hello from", "content_filter")
			return
		}
	}
	if req.Stream {
		if !a.streamModel(w, a.Model, body) {
			writeChatStream(w, a.Model, "Hello from azure", "stop")
		}
		return
	}
	writeJSON(w, http.StatusOK, chatCompletion(a.Model, "Hello from azure", "stop"))
}
