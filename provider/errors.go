package provider

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"unicode/utf8"

	"github.com/llmfailover/caddy-llm-failover/internal/jsonscan"
)

// Error is an error the gateway itself answers, rendered in the format of
// the API the client called so that official SDKs raise their usual typed
// errors (BadRequestError, NotFoundError, RateLimitError...).
type Error struct {
	Status  int
	Message string
	// Code is the OpenAI "code" (model_not_found, insufficient_quota...);
	// empty means the default for the status.
	Code string
}

// ErrorBody renders e as the HTTP error body of the API.
func (a API) ErrorBody(e Error) []byte {
	if a.Anthropic() {
		return anthropicErrorBody(e)
	}
	return openAIErrorBody(e)
}

// marshal encodes one of this package's error shapes: plain structs of
// strings, which cannot fail to marshal.
func marshal(v any) []byte {
	b, err := json.Marshal(v)
	if err != nil {
		panic(fmt.Sprintf("provider: marshal %T: %v", v, err))
	}
	return b
}

// sseEvent frames v as one server-sent event, named unless name is "".
func sseEvent(name string, v any) []byte {
	body := marshal(v)
	out := make([]byte, 0, len("event: \ndata: ")+len(name)+len(body)+2)
	if name != "" {
		out = append(append(append(out, "event: "...), name...), '\n')
	}
	out = append(append(out, "data: "...), body...)
	return append(out, '\n', '\n')
}

// nullable renders "" as JSON null.
func nullable(s string) *string {
	if s == "" {
		return nil
	}
	return &s
}

// Errors returned by CheckBody.
var (
	ErrErrorBody     = errors.New("provider: 2xx body is an error object")
	ErrMalformedBody = errors.New("provider: 2xx body is not valid JSON")
)

// CheckBody inspects a complete, non-streaming 2xx JSON body of the API.
// It returns an error wrapping ErrErrorBody for an error object in disguise
// (a non-null top-level "error", or "type":"error" as Anthropic sends), one
// wrapping ErrMalformedBody for invalid or truncated JSON, and nil
// otherwise. Only the top level is walked, so large bodies cost one
// validation pass and one skim.
func (API) CheckBody(body []byte) error {
	if !jsonscan.Valid(body) {
		return fmt.Errorf("%w (%d bytes)", ErrMalformedBody, len(body))
	}
	t := scanTop(body)
	if !t.ok {
		if first, ok := googleWrapped(body); ok && scanTop(first).err {
			return fmt.Errorf("%w: an array of error objects", ErrErrorBody)
		}
		return nil // valid JSON but not an object: nothing to unmask
	}
	switch {
	case t.err:
		return fmt.Errorf("%w: top-level \"error\" member", ErrErrorBody)
	case string(t.typ) == "error":
		return fmt.Errorf("%w: \"type\":\"error\"", ErrErrorBody)
	}
	return nil
}

// maxUpstreamMessage caps a quoted upstream message, so that an upstream
// answering with a huge error cannot flood logs or clients.
const maxUpstreamMessage = 512

// UpstreamMessage extracts the human-readable message from an upstream's
// error body or error event data, so the gateway's own error can quote it.
// Both families' shapes are understood whatever the API: an
// OpenAI-compatible host may answer an Anthropic path in OpenAI's format.
// It returns "" when the body is not a recognisable error.
//
// The message is cut loosely, maxSecretSpan past the bound: the caller
// masks secrets in it first, then cuts it to the bound (CutMessage). Cut
// at the bound before masking, a secret across it would no longer be the
// configured value, and its first part would pass the mask.
func (API) UpstreamMessage(body []byte) string {
	return cutAt(upstreamMessage(body), maxUpstreamMessage+maxSecretSpan, "")
}

// maxSecretSpan is the longest secret UpstreamMessage keeps whole across
// the bound: longer than any key, token or signature a channel sends.
const maxSecretSpan = 4096

// CutMessage bounds a message quoted from an upstream to
// maxUpstreamMessage bytes, on a character boundary.
func CutMessage(msg string) string { return cutAt(msg, maxUpstreamMessage, "…") }

// cutAt cuts msg to at most n bytes on a character boundary, marking a
// cut with mark.
func cutAt(msg string, n int, mark string) string {
	if len(msg) <= n {
		return msg
	}
	cut := n
	for cut > 0 && !utf8.RuneStart(msg[cut]) {
		cut--
	}
	return msg[:cut] + mark
}

func upstreamMessage(body []byte) string {
	b := trimWS(body)
	if len(b) > 0 && b[0] == '[' {
		first, ok := googleWrapped(b)
		if !ok {
			return ""
		}
		errVal, _, ok := messageMembers(first)
		if !ok || len(errVal) == 0 {
			return ""
		}
		msg, _ := errorMessage(errVal)
		return msg
	}
	errVal, msgVal, ok := messageMembers(b)
	if !ok {
		return ""
	}
	if msg, ok := errorMessage(errVal); ok && msg != "" {
		return msg
	}
	msg, _ := jsonString(msgVal)
	return msg
}

// googleWrapped is the first element of the array in b when it is an
// object: Google wraps its error objects in an array,
// [{"error":{"code":429,"message":"...","status":"RESOURCE_EXHAUSTED"}}],
// and may do so with a 200.
func googleWrapped(b []byte) ([]byte, bool) {
	arr, ok := jsonscan.Array(trimWS(b))
	if !ok {
		return nil, false
	}
	if _, ok = arr.Next(); !ok || arr.Peek() != '{' {
		return nil, false
	}
	return arr.Value(), true
}

// messageMembers finds the "error" and "message" members of the object in
// b (keys matched without regard to case, the last one winning, as
// encoding/json reads them into a struct). ok is false when b is not a
// well-formed object, or when its "message" is neither a string nor null.
func messageMembers(b []byte) (errVal, msgVal []byte, ok bool) {
	it, ok := jsonscan.Object(b)
	if !ok {
		return nil, nil, false
	}
	for key, more := it.Next(); more; key, more = it.Next() {
		switch {
		case bytes.EqualFold(key, []byte("error")):
			errVal = it.Value()
		case bytes.EqualFold(key, []byte("message")):
			msgVal = it.Value()
		}
	}
	if !it.Finished() {
		return nil, nil, false
	}
	if _, isString := jsonString(msgVal); !isString && len(msgVal) > 0 && !jsonscan.IsNull(msgVal) {
		return nil, nil, false
	}
	return errVal, msgVal, true
}

// errorMessage is the message an "error" member carries: its "message"
// when it is an object, itself when it is a string.
func errorMessage(v []byte) (string, bool) {
	if len(v) > 0 && v[0] == '{' {
		_, msg, ok := messageMembers(v)
		if !ok {
			return "", false
		}
		return jsonString(msg)
	}
	return jsonString(v)
}

// jsonString decodes a JSON string value; false when v is not one.
func jsonString(v []byte) (string, bool) {
	raw := jsonscan.StringValue(v)
	if raw == nil {
		return "", false
	}
	if bytes.IndexByte(raw, '\\') < 0 && utf8.Valid(raw) {
		return string(raw), true
	}
	var s string
	if json.Unmarshal(v, &s) != nil {
		return "", false
	}
	return s, true
}

// errorFrameStatuses are the HTTP statuses that in-stream error types
// and codes stand for: Anthropic's error types, and the codes OpenAI's
// chat and Responses streams use for rate limits and server errors.
var errorFrameStatuses = map[string]int{
	"invalid_request_error": http.StatusBadRequest, "authentication_error": http.StatusUnauthorized,
	"billing_error": http.StatusPaymentRequired, "permission_error": http.StatusForbidden,
	"not_found_error": http.StatusNotFound, "request_too_large": http.StatusRequestEntityTooLarge,
	"rate_limit_error": http.StatusTooManyRequests, "api_error": http.StatusInternalServerError,
	"overloaded_error": 529, "timeout_error": http.StatusGatewayTimeout,
	"rate_limit_exceeded": http.StatusTooManyRequests, "server_error": http.StatusInternalServerError,
}

// ErrorFrameStatus is the HTTP status an in-stream error event stands
// for, read from its type or code in any of the shapes the APIs send
// (Anthropic's "error" event, an OpenAI chat chunk's "error", the
// Responses API's "error" and "response.failed" events); 0 when it names
// none this package knows.
func (API) ErrorFrameStatus(data []byte) int {
	var v struct {
		Type     string          `json:"type"`
		Code     json.RawMessage `json:"code"`
		Error    json.RawMessage `json:"error"`
		Response struct {
			Error json.RawMessage `json:"error"`
		} `json:"response"`
	}
	if json.Unmarshal(data, &v) != nil {
		return 0
	}
	for _, raw := range []json.RawMessage{v.Error, v.Response.Error} {
		var e struct {
			Type string          `json:"type"`
			Code json.RawMessage `json:"code"`
		}
		if len(raw) == 0 || json.Unmarshal(raw, &e) != nil {
			continue
		}
		if st := errorFrameStatuses[codeString(e.Code)]; st != 0 {
			return st
		}
		if st := errorFrameStatuses[e.Type]; st != 0 {
			return st
		}
	}
	return errorFrameStatuses[codeString(v.Code)]
}

// codeString is an error code given as a string (OpenAI's are; some hosts
// send numbers, which name no status here).
func codeString(raw json.RawMessage) string {
	var s string
	if json.Unmarshal(raw, &s) != nil {
		return ""
	}
	return s
}

// ErrorFrameRefusal reports the client error an in-stream error event of
// an Anthropic API stands for (a Bedrock validationException, an
// invalid_request_error): such a refusal is about the request, every
// channel would answer it alike, so before any content it is the client's
// answer rather than a reason to fail over. It returns 0 for the other
// errors (rate limits, overload, server errors), which fail over.
func (a API) ErrorFrameRefusal(data []byte) int {
	if !a.Anthropic() {
		return 0
	}
	st := a.ErrorFrameStatus(data)
	if st < 400 || st >= 500 || st == http.StatusRequestTimeout || st == http.StatusTooManyRequests {
		return 0
	}
	return st
}

// StoredContextMissing reports whether an upstream's error answer (status
// and body) says that the stored context a request refers to
// (previous_response_id, conversation, a stored prompt) does not exist
// there: OpenAI answers 400 previous_response_not_found, a conversation or
// prompt unknown to the account 404 or 400 naming the field. Another
// provider account's channel may hold it. A missing model is not one.
func StoredContextMissing(status int, body []byte) bool {
	if status != http.StatusBadRequest && status != http.StatusNotFound {
		return false
	}
	var e struct {
		Error *struct {
			Message string `json:"message"`
			Param   any    `json:"param"`
			Code    any    `json:"code"`
		} `json:"error"`
	}
	if json.Unmarshal(body, &e) != nil || e.Error == nil {
		return false
	}
	code, _ := e.Error.Code.(string)
	param, _ := e.Error.Param.(string)
	switch {
	case code == "model_not_found":
		return false
	case code == "previous_response_not_found", code == "conversation_not_found", code == "prompt_not_found":
		return true
	}
	notFound := strings.Contains(strings.ToLower(e.Error.Message), "not found")
	switch param {
	case "previous_response_id", "conversation", "conversation.id", "prompt", "prompt.id":
		return notFound
	}
	// The endpoint exists (the request reached it): a 404 of a request
	// referring to stored context is that context's.
	return status == http.StatusNotFound && notFound
}

// ChannelRefusal reports whether an upstream's error answer that no
// retry_status names (a 400, a 402) is about the channel's own account or
// credentials rather than the request: another channel, with its own
// account, may serve the same request, so it is the channel's failure and
// not the client's answer. h and body are the answer's headers and body
// as the adapter hands them on (a Google or Bedrock body already in the
// client API's format).
//   - 402, whoever sends it (Anthropic's billing_error, an aggregator out
//     of credit): the client pays the gateway, never the upstream.
//   - Bedrock's ServiceQuotaExceededException, a 400 named by
//     x-amzn-ErrorType: the account's quota ("resubmit your request
//     later").
//   - Anthropic's 400 "Your credit balance is too low": the organisation's
//     prepaid balance.
//   - Google's 400 INVALID_ARGUMENT API_KEY_INVALID ("API key not valid.
//     Please pass a valid API key."): the channel's key.
func ChannelRefusal(status int, h http.Header, body []byte) bool {
	switch status {
	case http.StatusPaymentRequired:
		return true
	case http.StatusBadRequest:
	default:
		return false
	}
	if strings.HasPrefix(strings.TrimSpace(h.Get("X-Amzn-Errortype")), "ServiceQuotaExceededException") {
		return true
	}
	msg := upstreamMessage(body)
	return strings.Contains(msg, "credit balance is too low") || strings.Contains(msg, "Please pass a valid API key") ||
		bytes.Contains(body, []byte(`"API_KEY_INVALID"`))
}

// ClientErrorBody returns an upstream's error body (status >= 400) in the
// shape the client's API reads: an Anthropic client whose channel refused
// in OpenAI's shape (an OpenAI-compatible host serving /v1/messages) gets
// Anthropic's {"type":"error","error":{...}}, the upstream's message and
// status kept. A body already in the API's shape, or with no message to
// quote, is returned as it is (false).
func (a API) ClientErrorBody(status int, body []byte) ([]byte, bool) {
	if !a.Anthropic() {
		return body, false
	}
	if t := scanTop(body); t.ok && string(t.typ) == "error" {
		return body, false
	}
	msg := upstreamMessage(body)
	if msg == "" {
		return body, false
	}
	return anthropicErrorBody(Error{Status: status, Message: msg}), true
}
