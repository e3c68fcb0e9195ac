package fakeproviders

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/aws/protocol/eventstream"
	v4 "github.com/aws/aws-sdk-go-v2/aws/signer/v4"
)

// Bedrock is a fake Bedrock runtime serving Claude through InvokeModel.
// It accepts requests signed with its known keys, and nothing else.
type Bedrock struct {
	modelSlot
	state
	*httptest.Server
	Region, AccessKeyID, SecretAccessKey string
}

// NewBedrock starts a fake Bedrock for a region that knows one key pair.
func NewBedrock(region, accessKeyID, secretAccessKey string) *Bedrock {
	b := &Bedrock{Region: region, AccessKeyID: accessKeyID, SecretAccessKey: secretAccessKey}
	b.Server = httptest.NewServer(http.HandlerFunc(b.serve))
	return b
}

func (b *Bedrock) serve(w http.ResponseWriter, r *http.Request) {
	b.hits.Add(1)
	body, _ := io.ReadAll(r.Body)
	b.received(body)
	if p := b.checkSignature(r, body); p != "" {
		w.Header().Set("X-Amzn-Errortype", "InvalidSignatureException")
		b.refuse(w, http.StatusForbidden, "%s", p)
		return
	}
	rest, ok := strings.CutPrefix(r.URL.EscapedPath(), "/model/")
	escaped, verb, _ := strings.Cut(rest, "/")
	id, err := url.PathUnescape(escaped)
	if !ok || err != nil || id == "" || (verb != "invoke" && verb != "invoke-with-response-stream") {
		b.refuse(w, http.StatusNotFound, "unexpected path %s", r.URL.EscapedPath())
		return
	}
	var fields map[string]json.RawMessage
	_ = json.Unmarshal(body, &fields)
	if _, ok := fields["stream"]; ok {
		b.refuse(w, http.StatusBadRequest, "stream: Extra inputs are not permitted")
		return
	}
	if _, problem := checkClaudeBody(body, "bedrock-2023-05-31"); problem != "" {
		b.refuse(w, http.StatusBadRequest, "%s", problem)
		return
	}
	if !strings.HasPrefix(id, "us.") && !strings.HasPrefix(id, "arn:") {
		b.refuse(w, http.StatusBadRequest, "Invocation of model ID %s with on-demand throughput isn't supported. Retry your request with the ID or ARN of an inference profile that contains this model.", id)
		return
	}
	model := strings.TrimSuffix(strings.TrimPrefix(id, "us.anthropic."), "-v1:0")
	if verb == "invoke" {
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, anthropicMessage(model, "Hello from bedrock"))
		return
	}
	events, refusal := b.claudeEvents(model, "Hello from bedrock", body)
	if refusal != "" {
		w.Header().Set("X-Amzn-Errortype", "ValidationException")
		writeJSON(w, http.StatusBadRequest, `{"message":"`+refusal+`"}`)
		return
	}
	w.Header().Set("Content-Type", "application/vnd.amazon.eventstream")
	enc := eventstream.NewEncoder()
	switch Mode(b.mode.Load()) {
	case ExceptionBeforeContent:
		_ = exception(enc, w, "throttlingException", "Too many requests, please wait before trying again.")
		return
	case ValidationBeforeContent:
		_ = exception(enc, w, "validationException", "messages: roles must alternate")
		return
	case ExceptionAfterContent:
		for _, ev := range events[:3] {
			_ = chunk(enc, w, ev)
		}
		w.(http.Flusher).Flush()
		_ = exception(enc, w, "internalServerException", "The system encountered an unexpected error during processing.")
		return
	}
	for _, ev := range events {
		_ = chunk(enc, w, ev)
	}
}

func chunk(enc *eventstream.Encoder, w io.Writer, event string) error {
	payload, _ := json.Marshal(map[string]string{"bytes": base64.StdEncoding.EncodeToString([]byte(event))})
	return enc.Encode(w, eventstream.Message{Headers: eventstream.Headers{
		{Name: ":message-type", Value: eventstream.StringValue("event")},
		{Name: ":event-type", Value: eventstream.StringValue("chunk")},
		{Name: ":content-type", Value: eventstream.StringValue("application/json")},
	}, Payload: payload})
}

func exception(enc *eventstream.Encoder, w io.Writer, typ, message string) error {
	payload, _ := json.Marshal(map[string]string{"message": message})
	return enc.Encode(w, eventstream.Message{Headers: eventstream.Headers{
		{Name: ":message-type", Value: eventstream.StringValue("exception")},
		{Name: ":exception-type", Value: eventstream.StringValue(typ)},
		{Name: ":content-type", Value: eventstream.StringValue("application/json")},
	}, Payload: payload})
}

// checkSignature signs again, with the known keys, the headers the
// request says it signed, and compares the signatures.
func (b *Bedrock) checkSignature(r *http.Request, body []byte) string {
	auth := r.Header.Get("Authorization")
	signed := between(auth, "SignedHeaders=", ",")
	if !strings.HasPrefix(auth, "AWS4-HMAC-SHA256 Credential="+b.AccessKeyID+"/") || signed == "" {
		return "missing or foreign SigV4 authorization"
	}
	if !strings.Contains(auth, "/"+b.Region+"/bedrock/aws4_request") {
		return "signed for another region or service"
	}
	when, err := time.Parse("20060102T150405Z", r.Header.Get("X-Amz-Date"))
	if err != nil {
		return "no X-Amz-Date"
	}
	sum := sha256.Sum256(body)
	u := *r.URL
	u.Scheme, u.Host = "http", r.Host
	again, _ := http.NewRequest(r.Method, u.String(), bytes.NewReader(body))
	again.URL.RawPath = r.URL.RawPath
	for _, h := range strings.Split(signed, ";") {
		if h != "host" {
			again.Header[http.CanonicalHeaderKey(h)] = r.Header.Values(h)
		}
	}
	again.Header.Del("Authorization")
	creds := aws.Credentials{AccessKeyID: b.AccessKeyID, SecretAccessKey: b.SecretAccessKey, SessionToken: r.Header.Get("X-Amz-Security-Token")}
	if err := v4.NewSigner().SignHTTP(context.Background(), creds, again, hex.EncodeToString(sum[:]), "bedrock", b.Region, when); err != nil {
		return "re-signing: " + err.Error()
	}
	if between(again.Header.Get("Authorization"), "Signature=", "") != between(auth, "Signature=", "") {
		return "The request signature we calculated does not match the signature you provided."
	}
	return ""
}

func between(s, from, to string) string {
	_, after, ok := strings.Cut(s, from)
	if !ok {
		return ""
	}
	if to == "" {
		return after
	}
	v, _, _ := strings.Cut(after, to)
	return v
}
