package faultupstream_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"

	"github.com/llmfailover/caddy-llm-failover/internal/faultupstream"
)

// A primary that fails once and then recovers, as a gateway test would set
// up to check that the retry lands on the healthy answer.
func Example() {
	up := faultupstream.New(faultupstream.FailFirst(1,
		faultupstream.Status(503, "").WithHeader("Retry-After", "1"),
		faultupstream.OKNamed("primary"),
	))
	defer up.Close()

	for i := 0; i < 2; i++ {
		resp, err := http.Post(up.URL+"/v1/chat/completions", "application/json",
			bytes.NewReader(faultupstream.ChatRequest("gpt-4o", false)))
		if err != nil {
			panic(err)
		}
		var out struct {
			Choices []struct {
				Message struct{ Content string }
			}
		}
		_ = json.NewDecoder(resp.Body).Decode(&out)
		resp.Body.Close()
		text := ""
		if len(out.Choices) > 0 {
			text = out.Choices[0].Message.Content
		}
		fmt.Printf("%d retry-after=%q text=%q\n", resp.StatusCode, resp.Header.Get("Retry-After"), text)
	}
	fmt.Println("hits:", up.Hits(), "last model in body:", bytes.Contains(up.LastRequest().Body, []byte(`"gpt-4o"`)))
	// Output:
	// 503 retry-after="1" text=""
	// 200 retry-after="" text="Hello from primary"
	// hits: 2 last model in body: true
}
