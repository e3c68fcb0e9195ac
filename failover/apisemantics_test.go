package failover

import (
	"bytes"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	fu "github.com/llmfailover/caddy-llm-failover/internal/faultupstream"
)

// sseAnswer is an upstream that answers every request with a 200 event
// stream of events, each "name\ndata" pair written as one SSE event.
func sseAnswer(events ...[2]string) fu.BehaviorFunc {
	return func(w http.ResponseWriter, _ *http.Request, _ int64) {
		w.Header().Set("Content-Type", "text/event-stream")
		w.WriteHeader(http.StatusOK)
		for _, ev := range events {
			_, _ = w.Write([]byte("event: " + ev[0] + "\ndata: " + ev[1] + "\n\n"))
			http.NewResponseController(w).Flush()
		}
	}
}

// A Responses stream's output_item.added and content_part.added announce
// an item (a message whose content is still [], a reasoning item whose
// summary is still [], a function call whose arguments are "") as
// Anthropic's content_block_start announces a block: no content yet. A
// response.failed right after them, before any delta, is the channel's
// failure like one after response.in_progress, and fails over: the client
// gets the backup's answer, never the primary's failure.
func TestResponsesFailedAfterItemAddedFailsOver(t *testing.T) {
	for name, events := range map[string][][2]string{
		"reasoning item": {
			{"response.created", `{"type":"response.created","sequence_number":0,"response":{"id":"resp_a","object":"response","status":"in_progress","error":null,"output":[],"usage":null}}`},
			{"response.in_progress", `{"type":"response.in_progress","sequence_number":1,"response":{"id":"resp_a","object":"response","status":"in_progress","error":null,"output":[]}}`},
			{"response.output_item.added", `{"type":"response.output_item.added","sequence_number":2,"output_index":0,"item":{"id":"rs_a","type":"reasoning","summary":[]}}`},
			{"response.failed", `{"type":"response.failed","sequence_number":3,"response":{"id":"resp_a","object":"response","status":"failed","error":{"code":"server_error","message":"The model failed to generate a response."},"output":[]}}`},
		},
		"message item and empty part": {
			{"response.created", `{"type":"response.created","sequence_number":0,"response":{"id":"resp_a","object":"response","status":"in_progress","error":null,"output":[],"usage":null}}`},
			{"response.output_item.added", `{"type":"response.output_item.added","sequence_number":1,"output_index":0,"item":{"id":"msg_a","type":"message","status":"in_progress","role":"assistant","content":[]}}`},
			{"response.content_part.added", `{"type":"response.content_part.added","sequence_number":2,"item_id":"msg_a","output_index":0,"content_index":0,"part":{"type":"output_text","text":"","annotations":[]}}`},
			{"response.failed", `{"type":"response.failed","sequence_number":3,"response":{"id":"resp_a","object":"response","status":"failed","error":{"code":"server_error","message":"The model failed to generate a response."},"output":[]}}`},
		},
	} {
		t.Run(name, func(t *testing.T) {
			a := upstream(t, sseAnswer(events...))
			b := upstream(t, fu.OKNamed("backup"))
			e := testEngine(t, testPlan(t, Options{}, nil,
				testChannel{name: uniqueName("ra"), url: a.URL}, testChannel{name: uniqueName("rb"), url: b.URL}))
			w := httptest.NewRecorder()
			r := httptest.NewRequest(http.MethodPost, "/v1/responses", bytes.NewReader(fu.ResponsesRequest("m", true)))
			r.Header.Set("Content-Type", "application/json")
			serveDirect(e, w, r)
			body := w.Body.String()
			if w.Code != http.StatusOK || strings.Contains(body, "response.failed") || !strings.Contains(body, "backup") {
				t.Fatalf("status %d: the primary's failure reached the client instead of the backup's answer:\n%s", w.Code, body)
			}
			hits(t, b, 1)
		})
	}
}

// notFound is OpenAI's answer for a stored response another account holds.
const notFound = `{"error":{"message":"Previous response with id 'resp_abc' not found.","type":"invalid_request_error","param":"previous_response_id","code":"previous_response_not_found"}}`

// serveStoredContext serves body, a Responses request, on channels a then b.
func serveStoredContext(t *testing.T, a, b *fu.Server, body string) *httptest.ResponseRecorder {
	t.Helper()
	e := testEngine(t, testPlan(t, Options{}, nil,
		testChannel{name: uniqueName("sa"), url: a.URL}, testChannel{name: uniqueName("sb"), url: b.URL}))
	w := httptest.NewRecorder()
	r := httptest.NewRequest(http.MethodPost, "/v1/responses", strings.NewReader(body))
	r.Header.Set("Content-Type", "application/json")
	serveDirect(e, w, r)
	return w
}

// A Responses request continuing a stored response (previous_response_id)
// whose channel fails over to a channel of another provider account: that
// account never stored the response and answers 400
// previous_response_not_found. That answer is not the answer to the client's
// request: its stored response exists, on the channel that failed. The
// client must not be told, with a status no retry helps, that its
// conversation is gone; it gets the first channel's failure, which a
// retry may get past.
func TestStoredContextMissingOnBackupIsNotTheAnswer(t *testing.T) {
	a := upstream(t, fu.Status(http.StatusServiceUnavailable, `{"error":{"message":"The server is overloaded","type":"server_error","param":null,"code":null}}`))
	b := upstream(t, fu.Status(http.StatusBadRequest, notFound))
	w := serveStoredContext(t, a, b, `{"model":"m","previous_response_id":"resp_abc","input":"And then?"}`)
	hits(t, a, 1)
	hits(t, b, 1)
	if w.Code != http.StatusServiceUnavailable || strings.Contains(w.Body.String(), "not found") {
		t.Fatalf("status %d: the backup's missing stored response was the client's answer:\n%s", w.Code, w.Body)
	}
}

// The other order: the chain's first channel is of another account than
// the one that stored the response (the turn before was served by the
// backup while the first was down). Its 400 previous_response_not_found
// must not end the request before the channel holding the response is
// asked.
func TestStoredContextMissingOnFirstTriesTheNext(t *testing.T) {
	a := upstream(t, fu.Status(http.StatusBadRequest, notFound))
	b := upstream(t, fu.OKNamed("backup"))
	w := serveStoredContext(t, a, b, `{"model":"m","previous_response_id":"resp_abc","input":"And then?"}`)
	if w.Code != http.StatusOK || !strings.Contains(w.Body.String(), "backup") {
		t.Fatalf("status %d: the channel holding the stored response was never asked:\n%s", w.Code, w.Body)
	}
}

// When no channel has the stored response, the client gets that error,
// with OpenAI's code for it.
func TestStoredContextMissingEverywhere(t *testing.T) {
	a := upstream(t, fu.Status(http.StatusBadRequest, notFound))
	b := upstream(t, fu.Status(http.StatusBadRequest, notFound))
	w := serveStoredContext(t, a, b, `{"model":"m","previous_response_id":"resp_abc","input":"And then?"}`)
	hits(t, a, 1)
	hits(t, b, 1)
	if w.Code != http.StatusBadRequest || !strings.Contains(w.Body.String(), `"code":"previous_response_not_found"`) || !strings.Contains(w.Body.String(), "resp_abc") {
		t.Fatalf("status %d:\n%s", w.Code, w.Body)
	}
}

// A billed legacy completions request (/v1/completions) carries its
// prompt in the body, as "prompt": it is served and charged, not refused
// as referring to input stored upstream.
func TestBilledCompletionsPromptIsServed(t *testing.T) {
	up := upstream(t, fu.BehaviorFunc(func(w http.ResponseWriter, _ *http.Request, _ int64) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{"id":"cmpl-1","object":"text_completion","model":"m","choices":[{"text":"Hello","index":0,"logprobs":null,"finish_reason":"stop"}],"usage":{"prompt_tokens":3,"completion_tokens":1,"total_tokens":4}}`))
	}))
	e := testEngine(t, testPlan(t, Options{}, nil, testChannel{name: uniqueName("lc"), url: up.URL}))
	_, _, secret := withTestWallet(t, e)
	r := httptest.NewRequest(http.MethodPost, "/v1/completions", strings.NewReader(`{"model":"m","prompt":"Say hello","max_tokens":16}`))
	r.Header.Set("Content-Type", "application/json")
	r.Header.Set("Authorization", "Bearer "+secret)
	w := httptest.NewRecorder()
	serveDirect(e, w, r)
	if w.Code != http.StatusOK {
		t.Fatalf("status %d: %s", w.Code, w.Body)
	}
	hits(t, up, 1)
}

// A Responses request with "background": true and no stream is answered
// upstream at once with the response queued ("status":"queued",
// "usage":null, no output): its answer is fetched later with GET
// /v1/responses/{id}, which this gateway does not serve (404 unknown_url),
// and its usage never passes the meter, so the wallet would charge an
// estimate of its input for an answer the upstream then generates in
// full. It is refused before any upstream is sent it, with a 400 saying
// why; a streamed background request delivers its answer and is served.
func TestResponsesBackgroundWithoutStreamIsRefused(t *testing.T) {
	up := upstream(t, fu.BehaviorFunc(func(w http.ResponseWriter, _ *http.Request, _ int64) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{"id":"resp_bg","object":"response","created_at":1741290958,"status":"queued","background":true,"error":null,"incomplete_details":null,"model":"m","output":[],"usage":null}`))
	}))
	e := testEngine(t, testPlan(t, Options{}, nil, testChannel{name: uniqueName("bg"), url: up.URL}))
	w := httptest.NewRecorder()
	r := httptest.NewRequest(http.MethodPost, "/v1/responses", strings.NewReader(`{"model":"m","input":"Write a long essay.","background":true}`))
	r.Header.Set("Content-Type", "application/json")
	serveDirect(e, w, r)
	if w.Code != http.StatusBadRequest || !strings.Contains(w.Body.String(), "background") {
		t.Fatalf("status %d: a background response the client cannot retrieve through the gateway was accepted:\n%s", w.Code, w.Body)
	}
	hits(t, up, 0)
	// Retrieval is indeed not served.
	w = httptest.NewRecorder()
	serveDirect(e, w, httptest.NewRequest(http.MethodGet, "/v1/responses/resp_bg", nil))
	if w.Code != http.StatusNotFound {
		t.Fatalf("GET /v1/responses/{id}: status %d", w.Code)
	}
}

// Any other error answer to a request with stored context is the
// client's, passed back at once as before.
func TestStoredContextOtherErrorIsPassedBack(t *testing.T) {
	const invalid = `{"error":{"message":"Invalid value for 'temperature': must be at most 2.","type":"invalid_request_error","param":"temperature","code":"invalid_value"}}`
	a := upstream(t, fu.Status(http.StatusBadRequest, invalid))
	b := upstream(t, fu.OKNamed("backup"))
	w := serveStoredContext(t, a, b, `{"model":"m","previous_response_id":"resp_abc","input":"And then?","temperature":9}`)
	if w.Code != http.StatusBadRequest || w.Body.String() != invalid {
		t.Fatalf("status %d:\n%s", w.Code, w.Body)
	}
	hits(t, b, 0)
}
