package integration_test

import (
	"bufio"
	"bytes"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	fu "github.com/llmfailover/caddy-llm-failover/internal/faultupstream"
)

// BenchmarkStreamTTFB compares the time to the first content event of a
// streaming chat completion read straight from a faultupstream with the
// same stream read through the gateway (stream gate included). Besides
// ns/op (whole stream), it reports ttfb-µs, the mean time from sending the
// request to reading the first content line.
//
//	LLMF_TEST_PORT_OFFSET=300 go test -run '^$' -bench StreamTTFB .
func BenchmarkStreamTTFB(b *testing.B) {
	up := fu.New(fu.OKNamed("bench"))
	b.Cleanup(up.Close)
	gateway(b, `
		channel a %s
		model m {
			route a cost 1 1
		}
	`, up.URL)

	body := fu.ChatRequest("m", true)
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 4}, Timeout: 30 * time.Second}
	b.Cleanup(client.CloseIdleConnections)

	for _, c := range []struct{ name, url string }{
		{"direct", up.URL + "/v1/chat/completions"},
		{"gateway", gatewayURL + "/v1/chat/completions"},
	} {
		b.Run(c.name, func(b *testing.B) {
			// One untimed request warms the connection pool.
			streamTTFB(b, client, c.url, body)
			var total time.Duration
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				total += streamTTFB(b, client, c.url, body)
			}
			b.ReportMetric(float64(total.Microseconds())/float64(b.N), "ttfb-µs")
		})
	}
}

// streamTTFB posts one streaming request, returns the time to its first
// content line and reads the rest so the connection can be reused.
func streamTTFB(b *testing.B, client *http.Client, url string, body []byte) time.Duration {
	b.Helper()
	start := time.Now()
	res, err := client.Post(url, "application/json", bytes.NewReader(body))
	if err != nil {
		b.Fatal(err)
	}
	defer res.Body.Close()
	if res.StatusCode != 200 {
		b.Fatalf("status %d", res.StatusCode)
	}
	br := bufio.NewReader(res.Body)
	var ttfb time.Duration
	for ttfb == 0 {
		line, err := br.ReadString('\n')
		if strings.Contains(line, `"content":"Hello"`) {
			ttfb = time.Since(start)
		}
		if err != nil {
			b.Fatalf("no content before the end of the stream: %v", err)
		}
	}
	if _, err := io.Copy(io.Discard, br); err != nil {
		b.Fatal(err)
	}
	return ttfb
}
