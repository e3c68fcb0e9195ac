package llmapi

import (
	"encoding/json"
	"net/http"
	"unicode/utf8"
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

// Body renders the error for api.
func (e Error) Body(api API) []byte {
	if api.Anthropic() {
		b, _ := json.Marshal(anthropicError{Type: "error", Error: anthropicDetail{Type: anthropicType(e.Status), Message: e.Message}})
		return b
	}
	typ, code := openAIType(e.Status)
	if e.Code != "" {
		code = e.Code
	}
	var c *string
	if code != "" {
		c = &code
	}
	b, _ := json.Marshal(openAIError{Error: openAIDetail{Message: e.Message, Type: typ, Param: nil, Code: c}})
	return b
}

type openAIError struct {
	Error openAIDetail `json:"error"`
}

type openAIDetail struct {
	Message string  `json:"message"`
	Type    string  `json:"type"`
	Param   *string `json:"param"`
	Code    *string `json:"code"`
}

type anthropicError struct {
	Type  string          `json:"type"`
	Error anthropicDetail `json:"error"`
}

type anthropicDetail struct {
	Type    string `json:"type"`
	Message string `json:"message"`
}

// anthropicType follows Anthropic's documented error types per status.
func anthropicType(status int) string {
	switch status {
	case http.StatusBadRequest, http.StatusUnprocessableEntity:
		return "invalid_request_error"
	case http.StatusUnauthorized:
		return "authentication_error"
	case http.StatusPaymentRequired:
		return "billing_error"
	case http.StatusForbidden:
		return "permission_error"
	case http.StatusNotFound:
		return "not_found_error"
	case http.StatusRequestEntityTooLarge:
		return "request_too_large"
	case http.StatusTooManyRequests:
		return "rate_limit_error"
	case http.StatusGatewayTimeout:
		return "timeout_error"
	case http.StatusServiceUnavailable, 529:
		return "overloaded_error"
	}
	if status >= 400 && status < 500 {
		return "invalid_request_error"
	}
	return "api_error"
}

// openAIType follows the types and codes OpenAI's API answers with.
func openAIType(status int) (typ, code string) {
	switch status {
	case http.StatusUnauthorized:
		return "invalid_request_error", "invalid_api_key"
	case http.StatusPaymentRequired:
		return "insufficient_quota", "insufficient_quota"
	case http.StatusNotFound:
		return "invalid_request_error", "model_not_found"
	case http.StatusRequestEntityTooLarge:
		return "invalid_request_error", "request_too_large"
	case http.StatusTooManyRequests:
		return "rate_limit_exceeded", "rate_limit_exceeded"
	case http.StatusGatewayTimeout:
		return "server_error", "timeout"
	}
	if status >= 400 && status < 500 {
		return "invalid_request_error", ""
	}
	return "server_error", ""
}

// maxUpstreamMessage caps a quoted upstream message, so that an upstream
// answering with a huge error cannot flood logs or clients.
const maxUpstreamMessage = 512

// UpstreamMessage extracts the human-readable message from an upstream's
// error body in either format, so the gateway's own error can quote it.
// It returns "" when the body is not a recognisable error.
func UpstreamMessage(body []byte) string {
	msg := upstreamMessage(body)
	if len(msg) <= maxUpstreamMessage {
		return msg
	}
	cut := maxUpstreamMessage
	for cut > 0 && !utf8.RuneStart(msg[cut]) {
		cut--
	}
	return msg[:cut] + "…"
}

func upstreamMessage(body []byte) string {
	var v struct {
		Error   json.RawMessage `json:"error"`
		Message string          `json:"message"`
	}
	if json.Unmarshal(body, &v) != nil {
		return ""
	}
	if len(v.Error) > 0 {
		var d struct {
			Message string `json:"message"`
		}
		if json.Unmarshal(v.Error, &d) == nil && d.Message != "" {
			return d.Message
		}
		var s string
		if json.Unmarshal(v.Error, &s) == nil && s != "" {
			return s
		}
	}
	return v.Message
}
