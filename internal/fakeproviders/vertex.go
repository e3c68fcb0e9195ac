package fakeproviders

import (
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"
)

// Vertex is a fake Vertex AI serving Claude, with its OAuth token
// endpoint at /token.
type Vertex struct {
	state
	modelSlot
	*httptest.Server
	Project, Region string
	// TokenTTL is the lifetime of the tokens it issues.
	TokenTTL time.Duration

	mu     sync.Mutex
	tokens map[string]time.Time
	n      int
	issued int
}

// NewVertex starts a fake Vertex for a project and region whose tokens
// live ttl.
func NewVertex(project, region string, ttl time.Duration) *Vertex {
	v := &Vertex{Project: project, Region: region, TokenTTL: ttl, tokens: map[string]time.Time{}}
	v.Server = httptest.NewServer(http.HandlerFunc(v.serve))
	return v
}

// TokensIssued counts the access tokens the token endpoint handed out.
func (v *Vertex) TokensIssued() int {
	v.mu.Lock()
	defer v.mu.Unlock()
	return v.issued
}

// WriteServiceAccount writes a service-account JSON key whose token_uri
// is the fake's token endpoint, and returns its path.
func (v *Vertex) WriteServiceAccount(dir string) (string, error) {
	key, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		return "", err
	}
	der, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return "", err
	}
	sa, _ := json.Marshal(map[string]string{
		"type": "service_account", "project_id": v.Project, "private_key_id": "fake",
		"private_key":  string(pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der})),
		"client_email": "gateway@" + v.Project + ".iam.gserviceaccount.com", "client_id": "1",
		"token_uri": v.URL + "/token",
	})
	p := filepath.Join(dir, "vertex-sa.json")
	return p, os.WriteFile(p, sa, 0o600)
}

func (v *Vertex) serve(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path == "/token" {
		v.token(w, r)
		return
	}
	v.hits.Add(1)
	if p := v.checkBearer(r); p != "" {
		v.refuse(w, http.StatusUnauthorized, "%s", p)
		return
	}
	if r.URL.Path == fmt.Sprintf("/v1/projects/%s/locations/%s/endpoints/openapi/chat/completions", v.Project, v.Region) {
		v.serveOpenAI(w, r)
		return
	}
	prefix := fmt.Sprintf("/v1/projects/%s/locations/%s/publishers/anthropic/models/", v.Project, v.Region)
	rest, ok := strings.CutPrefix(r.URL.Path, prefix)
	model, verb, _ := strings.Cut(rest, ":")
	if !ok || model == "" || (verb != "rawPredict" && verb != "streamRawPredict") {
		v.refuse(w, http.StatusNotFound, "unexpected path %s", r.URL.Path)
		return
	}
	for _, h := range []string{"Anthropic-Beta", "Anthropic-Version", "X-Api-Key"} {
		if r.Header.Get(h) != "" {
			v.refuse(w, http.StatusBadRequest, "Unexpected value(s) for the %s header", h)
			return
		}
	}
	body, _ := io.ReadAll(r.Body)
	v.received(body)
	stream, problem := checkClaudeBody(body, "vertex-2023-10-16")
	if problem != "" {
		v.refuse(w, http.StatusBadRequest, "%s", problem)
		return
	}
	if stream != (verb == "streamRawPredict") {
		v.refuse(w, http.StatusBadRequest, "stream %v sent to :%s", stream, verb)
		return
	}
	switch Mode(v.mode.Load()) {
	case RateLimited:
		writeJSON(w, http.StatusTooManyRequests, `[{"error":{"code":429,"message":"Resource exhausted, please try again later.","status":"RESOURCE_EXHAUSTED"}}]`)
		return
	case QuotaZero:
		writeJSON(w, http.StatusTooManyRequests, `{"error":{"code":429,"message":"Quota exceeded for aiplatform.googleapis.com/online_prediction_requests_per_base_model with base model: anthropic-claude-sonnet-4-5. Please submit a quota increase request. https://cloud.google.com/vertex-ai/docs/generative-ai/quotas-genai.","status":"RESOURCE_EXHAUSTED"}}`)
		return
	case ModelNotEnabled:
		writeJSON(w, http.StatusBadRequest, `{"error":{"code":400,"message":"Project `+"`"+v.Project+"`"+` is not allowed to use Publisher Model `+"`"+`projects/`+v.Project+`/locations/`+v.Region+`/publishers/anthropic/models/`+model+"`"+`","status":"FAILED_PRECONDITION"}}`)
		return
	}
	if !stream {
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, anthropicMessage(model, "Hello from vertex"))
		return
	}
	events, refusal := v.claudeEvents(model, "Hello from vertex", body)
	if refusal != "" {
		// rawPredict passes Anthropic's own error through.
		writeJSON(w, http.StatusBadRequest, anthropicError("invalid_request_error", refusal))
		return
	}
	writeSSE(w, events)
}

// serveOpenAI is Vertex's OpenAI-compatible endpoint for Gemini: the
// model is named with its publisher (google/gemini-2.5-flash), errors are
// Google's, wrapped in an array.
func (v *Vertex) serveOpenAI(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	var req chatRequest
	if err := json.Unmarshal(body, &req); err != nil || !strings.HasPrefix(req.Model, "google/") {
		v.refuse(w, http.StatusBadRequest, "model %q is not publisher/model", req.Model)
		return
	}
	if Mode(v.mode.Load()) == RateLimited {
		writeJSON(w, http.StatusTooManyRequests, `[{"error":{"code":429,"message":"Resource exhausted, please try again later.","status":"RESOURCE_EXHAUSTED"}}]`)
		return
	}
	if req.Stream {
		writeChatStream(w, req.Model, "Hello from vertex gemini", "stop")
		return
	}
	writeJSON(w, http.StatusOK, chatCompletion(req.Model, "Hello from vertex gemini", "stop"))
}

// token answers the JWT-bearer grant a service account makes.
func (v *Vertex) token(w http.ResponseWriter, r *http.Request) {
	if Mode(v.mode.Load()) == TokenRefused {
		writeJSON(w, http.StatusBadRequest, `{"error":"invalid_grant","error_description":"Invalid JWT Signature."}`)
		return
	}
	if err := r.ParseForm(); err != nil || r.PostForm.Get("grant_type") != "urn:ietf:params:oauth:grant-type:jwt-bearer" || r.PostForm.Get("assertion") == "" {
		http.Error(w, `{"error":"invalid_grant"}`, http.StatusBadRequest)
		return
	}
	v.mu.Lock()
	v.n++
	v.issued++
	tok := fmt.Sprintf("ya29.fake-%d", v.n)
	v.tokens[tok] = time.Now().Add(v.TokenTTL)
	v.mu.Unlock()
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(map[string]any{"access_token": tok, "token_type": "Bearer", "expires_in": int(v.TokenTTL / time.Second)})
}

func (v *Vertex) checkBearer(r *http.Request) string {
	tok, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	if !ok || tok == "" {
		return "no bearer token"
	}
	v.mu.Lock()
	exp, known := v.tokens[tok]
	v.mu.Unlock()
	switch {
	case !known:
		return "unknown token"
	case time.Now().After(exp):
		return "token expired"
	}
	return ""
}
