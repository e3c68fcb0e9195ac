package main

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"sync"
	"sync/atomic"
	"time"
)

// hold (-hold N) opens N requests at once, each on a connection of its
// own, and keeps them open for -d without reading past what arrives: N
// streams waiting for their first token, for measuring what a proxy holds
// per open stream (bench/scale.sh). It counts how many were answered 200
// (headers received), how many of those ended whole ("data: [DONE]" and
// the end of the body before -d: completed), how many were answered with
// another status (refused), and how many failed without an answer before
// the end.
//
// With h2c the requests are HTTP/2 streams without TLS (prior knowledge),
// as many on a connection as the server allows (Go's default is 250): the
// proxy then holds about one socket per stream (its upstream's) instead
// of two, so 10,000 streams fit in a process's 20,000 open files.
func hold(url string, body []byte, n int, d time.Duration, h2c bool) holdResult {
	tr := &http.Transport{MaxConnsPerHost: n, MaxIdleConnsPerHost: n, DisableCompression: true}
	if h2c {
		var p http.Protocols
		p.SetUnencryptedHTTP2(true)
		tr.Protocols = &p
	}
	client := &http.Client{Transport: tr}
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	var answered, refused, failed, completed atomic.Int64
	var wg sync.WaitGroup
	for range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
			if err != nil {
				failed.Add(1)
				return
			}
			req.Header.Set("Content-Type", "application/json")
			res, err := client.Do(req)
			if err != nil {
				if ctx.Err() == nil {
					failed.Add(1)
				}
				return
			}
			if res.StatusCode != http.StatusOK {
				refused.Add(1)
			} else {
				answered.Add(1)
			}
			defer res.Body.Close()
			buf := make([]byte, 4096)
			var tail []byte
			for {
				m, err := res.Body.Read(buf)
				tail = appendTail(tail, buf[:m], 32)
				if err != nil {
					if err == io.EOF && res.StatusCode == http.StatusOK && bytes.Contains(tail, doneMarker) {
						completed.Add(1)
					}
					return
				}
			}
		}()
	}
	wg.Wait()
	return holdResult{Held: n, Answered: answered.Load(), Completed: completed.Load(), Refused: refused.Load(), Failed: failed.Load()}
}

// holdResult is what -hold prints, as one JSON object.
type holdResult struct {
	Held      int   `json:"held"`
	Answered  int64 `json:"answered"`
	Completed int64 `json:"completed"`
	Refused   int64 `json:"refused"`
	Failed    int64 `json:"failed"`
}
