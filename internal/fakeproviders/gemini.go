package fakeproviders

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
)

// Gemini is a fake Google AI Studio OpenAI-compatible endpoint:
// /v1beta/openai/chat/completions and /v1beta/openai/models, the key as a
// bearer token, errors wrapped in an array as Google sends them.
type Gemini struct {
	state
	modelSlot
	*httptest.Server
	APIKey string
}

// NewGemini starts a fake AI Studio that knows one key.
func NewGemini(apiKey string) *Gemini {
	g := &Gemini{APIKey: apiKey}
	g.Server = httptest.NewServer(http.HandlerFunc(g.serve))
	return g
}

// GeminiQuotaMessage is the message of the fake's 429.
const GeminiQuotaMessage = "You exceeded your current quota, please check your plan and billing details."

func (g *Gemini) serve(w http.ResponseWriter, r *http.Request) {
	g.hits.Add(1)
	if r.Header.Get("Authorization") != "Bearer "+g.APIKey {
		writeJSON(w, http.StatusBadRequest, `[{"error":{"code":400,"message":"API key not valid. Please pass a valid API key.","status":"INVALID_ARGUMENT","details":[{"@type":"type.googleapis.com/google.rpc.ErrorInfo","reason":"API_KEY_INVALID","domain":"googleapis.com"}]}}]`)
		return
	}
	switch r.URL.Path {
	case "/v1beta/openai/models":
		writeJSON(w, http.StatusOK, `{"object":"list","data":[{"id":"models/gemini-2.5-flash","object":"model","owned_by":"google"}]}`)
		return
	case "/v1beta/openai/chat/completions":
	default:
		writeJSON(w, http.StatusNotFound, `[{"error":{"code":404,"message":"Requested entity was not found.","status":"NOT_FOUND"}}]`)
		return
	}
	body, _ := io.ReadAll(r.Body)
	g.received(body)
	var req chatRequest
	if err := json.Unmarshal(body, &req); err != nil || req.Model == "" {
		g.refuse(w, http.StatusBadRequest, "body is not a chat request")
		return
	}
	if Mode(g.mode.Load()) == RateLimited {
		writeJSON(w, http.StatusTooManyRequests, `[{"error":{"code":429,"message":"`+GeminiQuotaMessage+`","status":"RESOURCE_EXHAUSTED"}}]`)
		return
	}
	if req.Stream {
		if !g.streamModel(w, req.Model, body) {
			writeChatStream(w, req.Model, "Hello from gemini", "stop")
		}
		return
	}
	writeJSON(w, http.StatusOK, chatCompletion(req.Model, "Hello from gemini", "stop"))
}
