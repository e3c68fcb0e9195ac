package integration_test

import (
	"bufio"
	"bytes"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/llmfailover/caddy-llm-failover/internal/fakeproviders"
	fu "github.com/llmfailover/caddy-llm-failover/internal/faultupstream"
)

// BenchmarkResume measures what a resume costs the client in time: a
// Messages stream cut by channel a after 40 of 60 deltas is continued by
// channel b (loopback fake upstreams, in-process Caddy). It reports
// resume-ns, the mean time from the last delivered delta to the first
// continued one (prefilled, and instructed on a model that takes no
// prefill and repeats the delivered tail), and ttft-ns, the mean time to the first delta of an
// unbroken stream through the same gateway, for comparison.
//
//	LLMF_TEST_PORT_OFFSET=300 go test -run '^$' -bench Resume -benchtime 200x .
func BenchmarkResume(b *testing.B) {
	pieces := resumePieces()
	cut := fu.New(fu.OKNamed("primary").WithPieces(pieces...).WithCutAfter(40))
	b.Cleanup(cut.Close)
	cont := fu.New(fu.OKNamed("backup").WithPieces(pieces[40:]...))
	b.Cleanup(cont.Close)
	whole := fu.New(fu.OKNamed("whole").WithPieces(pieces...))
	b.Cleanup(whole.Close)
	// A model with no prefill, asked in words, that repeats the
	// delivered tail: the Joiner holds its first text until it knows.
	noPrefill := fakeproviders.NewAnthropic("sk-ant-bench")
	b.Cleanup(noPrefill.Close)
	noPrefill.SetModel(&fakeproviders.Model{Answer: strings.Join(pieces, ""), NoPrefill: true, Repeat: 7})
	// The breaker must not open a, whose every stream is cut.
	gateway(b, `
		channel a %s
		channel b %s
		channel c %s
		channel d %s {
			provider anthropic
			header X-Api-Key sk-ant-bench
		}
		model claude {
			route a cost 1 1
			route b cost 2 2
		}
		model claude-46 {
			route a cost 1 1
			route d cost 2 2
		}
		model whole {
			route c
		}
		breaker {
			window 10ms
			failures 64
		}
		stream_resume continue
	`, cut.URL, cont.URL, whole.URL, noPrefill.URL)
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 4}, Timeout: 30 * time.Second}
	b.Cleanup(client.CloseIdleConnections)
	last, first := `"text":" t39"`, `"text":" t40"`

	b.Run("resumed", func(b *testing.B) {
		body := resumeRequest("claude")
		timeLines(b, client, body, last, first)
		var total time.Duration
		b.ResetTimer()
		for i := 0; i < b.N; i++ {
			at := timeLines(b, client, body, last, first)
			total += at[1] - at[0]
		}
		b.ReportMetric(float64(total.Nanoseconds())/float64(b.N), "resume-ns")
	})
	b.Run("instructed", func(b *testing.B) {
		body := resumeRequest("claude-46")
		timeLines(b, client, body, last, `"text":" t40`) // learns that d takes no prefill
		var total time.Duration
		b.ResetTimer()
		for i := 0; i < b.N; i++ {
			at := timeLines(b, client, body, last, `"text":" t40`)
			total += at[1] - at[0]
		}
		b.ReportMetric(float64(total.Nanoseconds())/float64(b.N), "resume-ns")
	})
	b.Run("unbroken", func(b *testing.B) {
		body := fu.MessagesRequest("whole", true)
		timeLines(b, client, body, `"text":" t00"`)
		var total time.Duration
		b.ResetTimer()
		for i := 0; i < b.N; i++ {
			total += timeLines(b, client, body, `"text":" t00"`)[0]
		}
		b.ReportMetric(float64(total.Nanoseconds())/float64(b.N), "ttft-ns")
	})
}

// timeLines posts one streaming Messages request and returns, for each
// marker in turn, when (since the request was sent) the first line
// holding it arrived; it reads the rest so the connection can be reused.
func timeLines(b *testing.B, client *http.Client, body []byte, markers ...string) []time.Duration {
	b.Helper()
	req, err := http.NewRequest(http.MethodPost, gatewayURL+"/v1/messages", bytes.NewReader(body))
	if err != nil {
		b.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Anthropic-Version", "2023-06-01")
	start := time.Now()
	res, err := client.Do(req)
	if err != nil {
		b.Fatal(err)
	}
	defer res.Body.Close()
	if res.StatusCode != 200 {
		b.Fatalf("status %d", res.StatusCode)
	}
	br := bufio.NewReader(res.Body)
	at := make([]time.Duration, 0, len(markers))
	for len(at) < len(markers) {
		line, err := br.ReadString('\n')
		if strings.Contains(line, markers[len(at)]) {
			at = append(at, time.Since(start))
		}
		if err != nil {
			b.Fatalf("stream ended before %s: %v", markers[len(at)], err)
		}
	}
	if _, err := io.Copy(io.Discard, br); err != nil {
		b.Fatal(err)
	}
	return at
}
