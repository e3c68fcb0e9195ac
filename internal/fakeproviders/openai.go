package fakeproviders

import (
	"encoding/json"
	"fmt"
	"net/http"
)

// chatRequest is the part of an OpenAI chat request the fakes read.
type chatRequest struct {
	Model  string `json:"model"`
	Stream bool   `json:"stream"`
}

// chatCompletion is a short OpenAI chat answer as one JSON body.
func chatCompletion(model, text, finish string) string {
	return fmt.Sprintf(`{"id":"chatcmpl-fake","object":"chat.completion","created":1,"model":%q,"choices":[{"index":0,"message":{"role":"assistant","content":%q},"finish_reason":%q}],"usage":{"prompt_tokens":9,"completion_tokens":4,"total_tokens":13}}`, model, text, finish)
}

// writeChatStream writes the same answer as chat completion chunks: role,
// text, finish reason, usage, [DONE].
func writeChatStream(w http.ResponseWriter, model, text, finish string) {
	w.Header().Set("Content-Type", "text/event-stream")
	chunk := func(delta, finish string) {
		fr := "null"
		if finish != "" {
			fr = fmt.Sprintf("%q", finish)
		}
		fmt.Fprintf(w, "data: {\"id\":\"chatcmpl-fake\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":%q,\"choices\":[{\"index\":0,\"delta\":%s,\"finish_reason\":%s}]}\n\n", model, delta, fr)
	}
	chunk(`{"role":"assistant","content":""}`, "")
	content, _ := json.Marshal(map[string]string{"content": text})
	chunk(string(content), "")
	chunk(`{}`, finish)
	fmt.Fprintf(w, "data: {\"id\":\"chatcmpl-fake\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":%q,\"choices\":[],\"usage\":{\"prompt_tokens\":9,\"completion_tokens\":4,\"total_tokens\":13}}\n\n", model)
	fmt.Fprint(w, "data: [DONE]\n\n")
}

// writeJSON answers status with a JSON body.
func writeJSON(w http.ResponseWriter, status int, body string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, _ = w.Write([]byte(body))
}
