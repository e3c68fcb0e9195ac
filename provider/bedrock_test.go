package provider

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"reflect"
	"runtime"
	"slices"
	"strings"
	"testing"
	"testing/iotest"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/aws/protocol/eventstream"
	v4 "github.com/aws/aws-sdk-go-v2/aws/signer/v4"
	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"
)

func TestBedrockModule(t *testing.T) {
	checkModule(t, Bedrock{}, "bedrock")
}

func TestBedrockUnmarshalCaddyfile(t *testing.T) {
	checkCaddyfile(t, func() caddyfile.Unmarshaler { return new(Bedrock) }, []caddyfileCase{
		{in: "bedrock", want: &Bedrock{}},
		{in: "bedrock {\n\tregion us-east-1\n\tapi_key ABSK-1\n}", want: &Bedrock{Region: "us-east-1", APIKey: "ABSK-1"}},
		{in: "bedrock {\n\tregion eu-west-3\n\taccess_key_id AKID\n\tsecret_access_key SECRET\n\tsession_token TOKEN\n}",
			want: &Bedrock{Region: "eu-west-3", AccessKeyID: "AKID", SecretAccessKey: "SECRET", SessionToken: "TOKEN"}},
		{in: "bedrock us-east-1", err: "wrong argument count or unexpected line ending after 'us-east-1'"},
		{in: "bedrock {\n\tregion\n}", err: "wrong argument count or unexpected line ending after 'region'"},
		{in: "bedrock {\n\taccess_key_id AKID SECRET\n}", err: "wrong argument count or unexpected line ending after 'SECRET'"},
		{in: "bedrock {\n\tprofile default\n}", err: "unrecognized provider option 'profile'"},
		{in: "bedrock {\n\tapi_version v1\n}", err: "unrecognized provider option 'api_version'"},
	})
}

func TestBedrockServes(t *testing.T) {
	for api := Unknown; api < NumAPIs; api++ {
		if got := (&Bedrock{}).Serves(api); got != (api == AnthropicMessages) {
			t.Errorf("bedrock serves %v = %v", api, got)
		}
	}
	for region, want := range map[string]string{
		"":             "",
		"us-east-1":    "https://bedrock-runtime.us-east-1.amazonaws.com",
		"eu-central-1": "https://bedrock-runtime.eu-central-1.amazonaws.com",
	} {
		if got := (&Bedrock{Region: region}).DefaultBaseURL(); got != want {
			t.Errorf("region %q: default base URL %q, want %q", region, got, want)
		}
	}
}

func TestBedrockCheckBaseURL(t *testing.T) {
	const host = "https://bedrock-runtime.us-east-1.amazonaws.com"
	for _, tt := range []struct {
		name string
		b    Bedrock
		base string
		err  string // "" when accepted
	}{
		{"default chain", Bedrock{Region: "us-east-1"}, host, ""},
		{"api key", Bedrock{Region: "us-east-1", APIKey: "k"}, host, ""},
		{"static keys", Bedrock{Region: "us-east-1", AccessKeyID: "AKID", SecretAccessKey: "S"}, host, ""},
		{"static keys and session token", Bedrock{Region: "us-east-1", AccessKeyID: "AKID", SecretAccessKey: "S", SessionToken: "T"}, host, ""},
		{"proxy prefix", Bedrock{Region: "us-east-1"}, "https://proxy.example.com/aws", ""},
		{"no region", Bedrock{APIKey: "k"}, host, "needs a region"},
		{"api key and access key", Bedrock{Region: "us-east-1", APIKey: "k", AccessKeyID: "AKID", SecretAccessKey: "S"}, host, "not both"},
		{"api key and secret", Bedrock{Region: "us-east-1", APIKey: "k", SecretAccessKey: "S"}, host, "not both"},
		{"access key alone", Bedrock{Region: "us-east-1", AccessKeyID: "AKID"}, host, "go together"},
		{"secret alone", Bedrock{Region: "us-east-1", SecretAccessKey: "S"}, host, "go together"},
		{"session token alone", Bedrock{Region: "us-east-1", SessionToken: "T"}, host, "session_token needs"},
		{"session token and api key", Bedrock{Region: "us-east-1", APIKey: "k", SessionToken: "T"}, host, "session_token needs"},
		{"base ending in /v1", Bedrock{Region: "us-east-1"}, host + "/v1", "ends in /v1"},
	} {
		err := tt.b.CheckBaseURL(mustURL(t, tt.base))
		if (err == nil) != (tt.err == "") || err != nil && !strings.Contains(err.Error(), tt.err) {
			t.Errorf("%s: %v, want %q", tt.name, err, tt.err)
		}
	}
}

// provisioned provisions b, failing the test on an error.
func provisioned(t *testing.T, b *Bedrock) *Bedrock {
	t.Helper()
	ctx, cancel := caddy.NewContext(caddy.Context{Context: context.Background()})
	t.Cleanup(cancel)
	if err := b.Provision(ctx); err != nil {
		t.Fatal(err)
	}
	return b
}

func TestBedrockNewRequest(t *testing.T) {
	const (
		host     = "https://bedrock-runtime.us-east-1.amazonaws.com"
		profile  = "us.anthropic.claude-sonnet-4-5-20250929-v1:0"
		escaped  = "us.anthropic.claude-sonnet-4-5-20250929-v1%3A0"
		messages = `"max_tokens":10,"messages":[{"role":"user","content":"hi"}]`
		version  = `"anthropic_version":"bedrock-2023-05-31"`
	)
	for _, tt := range []struct {
		name, base, target, body, upstreamModel string
		client, channel                         http.Header
		wantURL, wantBody                       string
	}{
		{"invoke", host, "/v1/messages?beta=true", `{"model":"claude-sonnet-4-5",` + messages + `}`, profile, nil, nil,
			host + "/model/" + escaped + "/invoke", `{` + messages + `,` + version + `}`},
		{"stream", host, "/v1/messages", `{"model":"claude-sonnet-4-5","stream":true,` + messages + `}`, profile, nil, nil,
			host + "/model/" + escaped + "/invoke-with-response-stream", `{` + messages + `,` + version + `}`},
		{"the client's model", host, "/v1/messages", `{"model":"anthropic.claude-3-haiku-20240307-v1:0",` + messages + `}`, "", nil, nil,
			host + "/model/anthropic.claude-3-haiku-20240307-v1%3A0/invoke", `{` + messages + `,` + version + `}`},
		{"an inference profile's ARN", host, "/v1/messages", `{"model":"m",` + messages + `}`,
			"arn:aws:bedrock:us-east-1:123456789012:inference-profile/" + profile, nil, nil,
			host + "/model/arn%3Aaws%3Abedrock%3Aus-east-1%3A123456789012%3Ainference-profile%2F" + escaped + "/invoke", `{` + messages + `,` + version + `}`},
		{"proxy prefix", "https://proxy.example.com/aws", "/v1/messages", `{"model":"m",` + messages + `}`, profile, nil, nil,
			"https://proxy.example.com/aws/model/" + escaped + "/invoke", `{` + messages + `,` + version + `}`},
		{"the client's version and betas in the body", host, "/v1/messages",
			`{"anthropic_version":"2023-06-01","model":"m",` + messages + `,"anthropic_beta":["bogus"]}`, profile, nil, nil,
			host + "/model/" + escaped + "/invoke", `{` + messages + `,` + version + `}`},
		{"betas Bedrock knows", host, "/v1/messages", `{"model":"m",` + messages + `}`, profile,
			http.Header{"Anthropic-Beta": {"prompt-caching-2024-07-31, interleaved-thinking-2025-05-14", "context-1m-2025-08-07,bogus-beta"}}, nil,
			host + "/model/" + escaped + "/invoke",
			`{` + messages + `,` + version + `,"anthropic_beta":["interleaved-thinking-2025-05-14","context-1m-2025-08-07"]}`},
		{"no beta Bedrock knows", host, "/v1/messages", `{"model":"m",` + messages + `}`, profile,
			http.Header{"Anthropic-Beta": {"prompt-caching-2024-07-31,files-api-2025-04-14"}}, nil,
			host + "/model/" + escaped + "/invoke", `{` + messages + `,` + version + `}`},
		{"the channel's betas", host, "/v1/messages", `{"model":"m",` + messages + `}`, profile,
			http.Header{"Anthropic-Beta": {"context-1m-2025-08-07"}}, http.Header{"Anthropic-Beta": {"effort-2025-11-24"}},
			host + "/model/" + escaped + "/invoke", `{` + messages + `,` + version + `,"anthropic_beta":["effort-2025-11-24"]}`},
	} {
		b := provisioned(t, &Bedrock{Region: "us-east-1", APIKey: "bedrock-key"})
		base := mustURL(t, tt.base)
		if err := b.CheckBaseURL(base); err != nil {
			t.Fatalf("%s: %v", tt.name, err)
		}
		hdr := withClientCredentials(tt.client)
		hdr.Set("Anthropic-Version", "2023-06-01")
		hdr.Set("Content-Type", "application/json; charset=utf-8")
		r := clientRequest(t, "http://gw.local"+tt.target, tt.body, hdr)
		out, err := b.NewRequest(context.Background(), Call{
			API: AnthropicMessages, Base: base, Client: r, Body: []byte(tt.body), Request: mustParse(t, []byte(tt.body)),
			UpstreamModel: tt.upstreamModel, Header: tt.channel,
		})
		if err != nil {
			t.Fatalf("%s: %v", tt.name, err)
		}
		if got := out.URL.String(); got != tt.wantURL {
			t.Errorf("%s: URL %s, want %s", tt.name, got, tt.wantURL)
		}
		if out.Method != http.MethodPost || out.Host != base.Host {
			t.Errorf("%s: %s to host %q", tt.name, out.Method, out.Host)
		}
		if got := out.Header.Values("Authorization"); len(got) != 1 || got[0] != "Bearer bedrock-key" {
			t.Errorf("%s: authorization %q, want the API key alone", tt.name, got)
		}
		if got := out.Header.Get("X-Amz-Date"); got != "" {
			t.Errorf("%s: signed (X-Amz-Date %s) though it has an API key", tt.name, got)
		}
		// Bedrock refuses the whole request for a beta it does not know
		// and takes version and betas in the body.
		for _, k := range []string{"Anthropic-Beta", "Anthropic-Version", "X-Api-Key"} {
			if got, ok := out.Header[k]; ok {
				t.Errorf("%s: %s %q sent", tt.name, k, got)
			}
		}
		if got := out.Header.Values("Content-Type"); len(got) != 1 || got[0] != "application/json" {
			t.Errorf("%s: content-type %q", tt.name, got)
		}
		checkNoClientCredentials(t, tt.name, out.Header)
		if got := sentBody(t, out); got != tt.wantBody {
			t.Errorf("%s: body %s, want %s", tt.name, got, tt.wantBody)
		}
	}
}

func TestBedrockAllowedBetas(t *testing.T) {
	for _, tt := range []struct {
		in   []string
		want []string
	}{
		{nil, nil},
		{[]string{""}, nil},
		{[]string{"prompt-caching-2024-07-31"}, nil},
		{[]string{"computer-use-2025-01-24"}, []string{"computer-use-2025-01-24"}},
		{[]string{" token-efficient-tools-2025-02-19 ,output-128k-2025-02-19,"}, []string{"token-efficient-tools-2025-02-19", "output-128k-2025-02-19"}},
		{[]string{"effort-2025-11-24", "bogus, tool-search-tool-2025-10-19"}, []string{"effort-2025-11-24", "tool-search-tool-2025-10-19"}},
		{[]string{"Context-1m-2025-08-07"}, nil}, // flags are case-sensitive
	} {
		if got := allowedBetas(tt.in); !reflect.DeepEqual(got, tt.want) {
			t.Errorf("allowedBetas(%q) = %q, want %q", tt.in, got, tt.want)
		}
	}
}

// checkSigV4 checks an upstream request's SigV4 signature the way AWS
// does: the headers it says it signed and the body it carries, signed
// again with creds at its X-Amz-Date, give the same Authorization.
func checkSigV4(t *testing.T, name string, r recorded, creds aws.Credentials, region string) {
	t.Helper()
	when, err := time.Parse("20060102T150405Z", r.header.Get("X-Amz-Date"))
	if err != nil {
		t.Errorf("%s: X-Amz-Date %q", name, r.header.Get("X-Amz-Date"))
		return
	}
	if d := time.Since(when); d < -time.Minute || d > time.Minute {
		t.Errorf("%s: signed at %v, %v from now", name, when, d)
	}
	auth := r.header.Get("Authorization")
	scope := "AWS4-HMAC-SHA256 Credential=" + creds.AccessKeyID + "/" + when.Format("20060102") + "/" + region + "/bedrock/aws4_request, SignedHeaders="
	if !strings.HasPrefix(auth, scope) {
		t.Errorf("%s: authorization %q, want the scope %q", name, auth, scope)
		return
	}
	signed, _, _ := strings.Cut(strings.TrimPrefix(auth, scope), ",")
	names := strings.Split(signed, ";")
	want := []string{"content-type", "host", "x-amz-date"}
	if creds.SessionToken != "" {
		want = append(want, "x-amz-security-token")
		if got := r.header.Get("X-Amz-Security-Token"); got != creds.SessionToken {
			t.Errorf("%s: X-Amz-Security-Token %q", name, got)
		}
	} else if got, ok := r.header["X-Amz-Security-Token"]; ok {
		t.Errorf("%s: X-Amz-Security-Token %q without a session token", name, got)
	}
	for _, h := range want {
		if !slices.Contains(names, h) {
			t.Errorf("%s: %s not signed (%s)", name, h, signed)
		}
	}
	again, err := http.NewRequest(r.method, "http://"+r.host+r.uri, strings.NewReader(r.body))
	if err != nil {
		t.Fatal(err)
	}
	again.Host = r.host
	for _, h := range names {
		if h != "host" {
			again.Header[http.CanonicalHeaderKey(h)] = r.header.Values(h)
		}
	}
	sum := sha256.Sum256([]byte(r.body))
	if err := v4.NewSigner().SignHTTP(context.Background(), creds, again, hex.EncodeToString(sum[:]), "bedrock", region, when); err != nil {
		t.Fatal(err)
	}
	if got := again.Header.Get("Authorization"); got != auth {
		t.Errorf("%s: signature does not verify:\n sent  %s\n again %s", name, auth, got)
	}
}

// TestBedrockSigV4 signs with static keys, with a session token, and
// with keys from the default credential chain (the environment here).
func TestBedrockSigV4(t *testing.T) {
	dir := t.TempDir()
	for k, v := range map[string]string{
		"AWS_ACCESS_KEY_ID": "AKIDENVIRONMENT", "AWS_SECRET_ACCESS_KEY": "env-secret", "AWS_SESSION_TOKEN": "",
		"AWS_PROFILE": "", "AWS_CONFIG_FILE": filepath.Join(dir, "config"), "AWS_SHARED_CREDENTIALS_FILE": filepath.Join(dir, "credentials"),
		"AWS_EC2_METADATA_DISABLED": "true", "AWS_CONTAINER_CREDENTIALS_FULL_URI": "", "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI": "",
		"AWS_WEB_IDENTITY_TOKEN_FILE": "", "AWS_ROLE_ARN": "", "AWS_BEARER_TOKEN_BEDROCK": "",
	} {
		t.Setenv(k, v)
	}
	body := `{"model":"m","max_tokens":10,"messages":[{"role":"user","content":"hi"}]}`
	for _, tt := range []struct {
		name  string
		b     *Bedrock
		creds aws.Credentials
	}{
		{"static keys", &Bedrock{Region: "us-east-1", AccessKeyID: "AKIDSTATIC", SecretAccessKey: "static-secret"},
			aws.Credentials{AccessKeyID: "AKIDSTATIC", SecretAccessKey: "static-secret"}},
		{"session token", &Bedrock{Region: "eu-west-3", AccessKeyID: "ASIATEMP", SecretAccessKey: "temp-secret", SessionToken: "session-token"},
			aws.Credentials{AccessKeyID: "ASIATEMP", SecretAccessKey: "temp-secret", SessionToken: "session-token"}},
		{"default chain", &Bedrock{Region: "ap-northeast-1"},
			aws.Credentials{AccessKeyID: "AKIDENVIRONMENT", SecretAccessKey: "env-secret"}},
	} {
		b := provisioned(t, tt.b)
		base := mustURL(t, b.DefaultBaseURL())
		r := clientRequest(t, "http://gw.local/v1/messages", body, withClientCredentials(http.Header{"Anthropic-Beta": {"effort-2025-11-24"}}))
		out, err := b.NewRequest(context.Background(), Call{
			API: AnthropicMessages, Base: base, Client: r, Body: []byte(body), Request: mustParse(t, []byte(body)),
			UpstreamModel: "us.anthropic.claude-sonnet-4-5-20250929-v1:0",
		})
		if err != nil {
			t.Fatalf("%s: %v", tt.name, err)
		}
		checkNoClientCredentials(t, tt.name, out.Header)
		got := recorded{uri: out.URL.RequestURI(), host: out.Host, method: out.Method, header: out.Header, body: sentBody(t, out)}
		if want := `{"max_tokens":10,"messages":[{"role":"user","content":"hi"}],"anthropic_version":"bedrock-2023-05-31","anthropic_beta":["effort-2025-11-24"]}`; got.body != want {
			t.Errorf("%s: body %s, want %s", tt.name, got.body, want)
		}
		checkSigV4(t, tt.name, got, tt.creds, tt.b.Region)
	}
}

// TestBedrockSigV4OnTheWire sends a signed stream request to a loopback
// upstream, which checks the signature of what it received.
func TestBedrockSigV4OnTheWire(t *testing.T) {
	up := newRecorder(t)
	b := provisioned(t, &Bedrock{Region: "us-west-2", AccessKeyID: "AKIDWIRE", SecretAccessKey: "wire-secret", SessionToken: "wire-token"})
	body := `{"model":"m","stream":true,"max_tokens":10,"messages":[]}`
	r := clientRequest(t, "http://gw.local/v1/messages?beta=true", body, clientCredentials)
	out, err := b.NewRequest(context.Background(), Call{
		API: AnthropicMessages, Base: mustURL(t, up.URL), Client: r, Body: []byte(body), Request: mustParse(t, []byte(body)),
		UpstreamModel: "us.anthropic.claude-sonnet-4-5-20250929-v1:0",
	})
	if err != nil {
		t.Fatal(err)
	}
	got := up.send(t, out)
	if want := "/model/us.anthropic.claude-sonnet-4-5-20250929-v1%3A0/invoke-with-response-stream"; got.uri != want {
		t.Errorf("upstream asked for %s, want %s", got.uri, want)
	}
	if got.body != `{"max_tokens":10,"messages":[],"anthropic_version":"bedrock-2023-05-31"}` {
		t.Errorf("body %s", got.body)
	}
	checkNoClientCredentials(t, "on the wire", got.header)
	checkSigV4(t, "on the wire", got, aws.Credentials{AccessKeyID: "AKIDWIRE", SecretAccessKey: "wire-secret", SessionToken: "wire-token"}, "us-west-2")
}

func TestBedrockNewRequestRefuses(t *testing.T) {
	body := `{"model":"m","max_tokens":1}`
	base := mustURL(t, "https://bedrock-runtime.us-east-1.amazonaws.com")
	call := func(p string) Call {
		return Call{API: AnthropicMessages, Base: base, Client: clientRequest(t, "http://gw.local"+p, body, nil), Body: []byte(body), Request: mustParse(t, []byte(body))}
	}
	if _, err := (&Bedrock{Region: "us-east-1", APIKey: "k"}).NewRequest(context.Background(), call("/v1/messages")); !errors.Is(err, errNotProvisioned) {
		t.Errorf("before Provision: %v", err)
	}
	b := provisioned(t, &Bedrock{Region: "us-east-1", APIKey: "k"})
	for _, p := range []string{"/v1/%2e%2e/messages", "/v1/../messages", "/v1%2Fmessages"} {
		if out, err := b.NewRequest(context.Background(), call(p)); err == nil {
			t.Errorf("%s: built %s", p, out.URL)
		}
	}
	c := call("/v1/messages")
	c.Base = nil
	if _, err := b.NewRequest(context.Background(), c); err == nil {
		t.Error("a call without a base URL built a request")
	}
	failing := &Bedrock{Region: "us-east-1", logger: zap.NewNop(), signer: v4.NewSigner(),
		creds: aws.CredentialsProviderFunc(func(context.Context) (aws.Credentials, error) {
			return aws.Credentials{}, errors.New("no EC2 IMDS role found")
		})}
	if _, err := failing.NewRequest(context.Background(), call("/v1/messages")); err == nil || !strings.Contains(err.Error(), "bedrock: retrieving AWS credentials: no EC2 IMDS role found") {
		t.Errorf("without credentials: %v", err)
	}
}

func TestBedrockResponseHeaders(t *testing.T) {
	b := &Bedrock{}
	for _, tt := range []struct {
		contentType    string
		stream, isJSON bool
	}{
		{"application/vnd.amazon.eventstream", true, false},
		{" Application/VND.Amazon.EventStream; charset=binary", true, false},
		{"text/event-stream", true, false},
		{"application/json", false, true},
		{"text/plain", false, false},
		{"", false, false},
	} {
		h := http.Header{"Content-Type": {tt.contentType}}
		if got := b.IsStream(h); got != tt.stream {
			t.Errorf("%q: IsStream %v", tt.contentType, got)
		}
		if got := b.IsJSON(h); got != tt.isJSON {
			t.Errorf("%q: IsJSON %v", tt.contentType, got)
		}
	}
	src := http.Header{
		"Content-Type": {"application/vnd.amazon.eventstream"}, "X-Request-Id": {"r1"},
		"Set-Cookie": {"aws=1"}, "X-Amzn-Bedrock-Invocation-Latency": {"12"}, "Content-Length": {"9"},
	}
	dst := http.Header{}
	b.CopyResponseHeader(dst, src)
	if want := (http.Header{"Content-Type": {"text/event-stream"}, "X-Request-Id": {"r1"}}); !reflect.DeepEqual(dst, want) {
		t.Errorf("event stream: copied %v, want %v", dst, want)
	}
	if src.Get("Content-Type") != "application/vnd.amazon.eventstream" {
		t.Error("the upstream's headers were changed")
	}
	dst = http.Header{}
	b.CopyResponseHeader(dst, http.Header{"Content-Type": {"application/json"}, "Retry-After": {"3"}, "Set-Cookie": {"aws=1"}})
	if want := (http.Header{"Content-Type": {"application/json"}, "Retry-After": {"3"}}); !reflect.DeepEqual(dst, want) {
		t.Errorf("JSON: copied %v, want %v", dst, want)
	}
}

// frame encodes one AWS event-stream message.
func frame(t *testing.T, payload string, headers ...string) []byte {
	t.Helper()
	var hs eventstream.Headers
	for i := 0; i+1 < len(headers); i += 2 {
		hs.Set(headers[i], eventstream.StringValue(headers[i+1]))
	}
	var buf bytes.Buffer
	if err := eventstream.NewEncoder().Encode(&buf, eventstream.Message{Headers: hs, Payload: []byte(payload)}); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// chunkFrame is Bedrock's chunk event carrying one Anthropic event, its
// JSON base64-encoded in "bytes" (with the padding Bedrock adds).
func chunkFrame(t *testing.T, event string) []byte {
	t.Helper()
	payload, err := json.Marshal(struct {
		Bytes []byte `json:"bytes"`
		P     string `json:"p"`
	}{[]byte(event), "abcdefghijklmnopqrstuvwxyzABCDEFGHIJ"})
	if err != nil {
		t.Fatal(err)
	}
	return frame(t, string(payload), ":message-type", "event", ":event-type", "chunk", ":content-type", "application/json")
}

func exceptionFrame(t *testing.T, typ, message string) []byte {
	t.Helper()
	payload, _ := json.Marshal(map[string]string{"message": message})
	return frame(t, string(payload), ":message-type", "exception", ":exception-type", typ, ":content-type", "application/json")
}

// eventStreamResponse is a 200 answer of Bedrock's event stream.
func eventStreamResponse(frames ...[]byte) *http.Response {
	return &http.Response{
		StatusCode: http.StatusOK,
		Header:     http.Header{"Content-Type": {"application/vnd.amazon.eventstream"}},
		Body:       io.NopCloser(bytes.NewReader(bytes.Join(frames, nil))),
	}
}

// readSSE reads a converted stream a byte at a time, as a slow client.
func readSSE(b *Bedrock, res *http.Response) (string, error) {
	out, err := io.ReadAll(iotest.OneByteReader(b.ResponseBody(res)))
	return string(out), err
}

func TestBedrockEventStream(t *testing.T) {
	const (
		start = `{"type":"message_start","message":{"id":"msg_1","type":"message","role":"assistant","model":"claude","content":[],"usage":{"input_tokens":5,"output_tokens":1}}}`
		delta = `{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"Hello"}}`
		stop  = `{"type":"message_stop","amazon-bedrock-invocationMetrics":{"inputTokenCount":5,"outputTokenCount":2}}`
	)
	b := &Bedrock{logger: zap.NewNop()}
	res := eventStreamResponse(
		frame(t, `{}`, ":message-type", "event", ":event-type", "initial-response"),
		chunkFrame(t, start), chunkFrame(t, delta), chunkFrame(t, `{"no_type":true}`), chunkFrame(t, stop),
	)
	got, err := readSSE(b, res)
	if err != nil {
		t.Fatal(err)
	}
	want := "event: message_start\ndata: " + start + "\n\n" +
		"event: content_block_delta\ndata: " + delta + "\n\n" +
		"data: {\"no_type\":true}\n\n" +
		"event: message_stop\ndata: " + stop + "\n\n"
	if got != want {
		t.Errorf("SSE:\n%s\nwant:\n%s", got, want)
	}
	// The frames may arrive a byte at a time.
	res = eventStreamResponse(chunkFrame(t, start), chunkFrame(t, stop))
	res.Body = io.NopCloser(iotest.OneByteReader(res.Body))
	if got, err := readSSE(b, res); err != nil || got != "event: message_start\ndata: "+start+"\n\nevent: message_stop\ndata: "+stop+"\n\n" {
		t.Errorf("slow source: %q, %v", got, err)
	}
	if got, err := readSSE(b, eventStreamResponse()); err != nil || got != "" {
		t.Errorf("empty stream: %q, %v", got, err)
	}
}

// TestBedrockEventStreamErrors: an exception frame ends the stream with
// Anthropic's error event of the same meaning; what follows it is not
// read.
func TestBedrockEventStreamErrors(t *testing.T) {
	const ping = `{"type":"ping"}`
	const onDemand = "Invocation of model ID anthropic.claude-sonnet-4-5-20250929-v1:0 with on-demand throughput isn't supported."
	for _, tt := range []struct {
		name       string
		frame      []byte
		typ, msg   string
		errorFrame bool
	}{
		{"throttling", exceptionFrame(t, "throttlingException", "Too many requests, please wait before trying again."),
			"rate_limit_error", "throttlingException: Too many requests, please wait before trying again.", false},
		{"service unavailable", exceptionFrame(t, "serviceUnavailableException", "Bedrock is unable to process your request."),
			"overloaded_error", "serviceUnavailableException: Bedrock is unable to process your request.", false},
		{"internal", exceptionFrame(t, "internalServerException", "oops"), "api_error", "internalServerException: oops", false},
		{"model stream error", exceptionFrame(t, "modelStreamErrorException", "broke"), "api_error", "modelStreamErrorException: broke", false},
		{"model timeout", exceptionFrame(t, "modelTimeoutException", "slow"), "timeout_error", "modelTimeoutException: slow", false},
		{"validation", exceptionFrame(t, "validationException", "messages: field required"),
			"invalid_request_error", "validationException: messages: field required", true},
		{"validation with a hint", exceptionFrame(t, "validationException", onDemand),
			"invalid_request_error", "validationException: " + onDemand + " (use the model's cross-region inference profile id as upstream_model, e.g. us.anthropic.claude-sonnet-4-5-20250929-v1:0)", true},
		{"unknown exception", exceptionFrame(t, "brandNewException", "new"), "api_error", "brandNewException: new", false},
		{"error frame", frame(t, "", ":message-type", "error", ":error-code", "InternalFailure", ":error-message", "An internal error occurred."),
			"api_error", "InternalFailure: An internal error occurred.", false},
	} {
		res := eventStreamResponse(chunkFrame(t, ping), tt.frame, chunkFrame(t, ping))
		got, err := readSSE(&Bedrock{logger: zap.NewNop()}, res)
		if err != nil {
			t.Fatalf("%s: %v", tt.name, err)
		}
		msg, _ := json.Marshal(tt.msg)
		ev := []byte(`{"type":"error","error":{"type":"` + tt.typ + `","message":` + string(msg) + `}}`)
		want := "event: ping\ndata: " + ping + "\n\nevent: error\ndata: " + string(ev) + "\n\n"
		if got != want {
			t.Errorf("%s:\n%q\nwant\n%q", tt.name, got, want)
		}
		// The stream gate tells a refusal of the request from a failure.
		if status := AnthropicMessages.ErrorFrameRefusal(ev); (status == http.StatusBadRequest) != tt.errorFrame {
			t.Errorf("%s: refusal status %d", tt.name, status)
		}
	}
}

// TestBedrockEventStreamBroken: a stream cut inside a frame, a frame
// with a bad checksum or a malformed chunk is an error, after the events
// before it.
func TestBedrockEventStreamBroken(t *testing.T) {
	const ping = `{"type":"ping"}`
	first := chunkFrame(t, ping)
	whole := chunkFrame(t, `{"type":"message_stop"}`)
	corrupt := bytes.Clone(whole)
	corrupt[len(corrupt)-8] ^= 0xff // in the payload: the message checksum fails
	for _, tt := range []struct {
		name, err string
		rest      []byte
	}{
		{"cut in the prelude", "bedrock event stream: ", whole[:5]},
		{"cut in the payload", "bedrock event stream: ", whole[:len(whole)-3]},
		{"bad checksum", "bedrock event stream: ", corrupt},
		{"no bytes", "bedrock event stream: malformed chunk", frame(t, `{"p":"x"}`, ":message-type", "event", ":event-type", "chunk")},
		{"not JSON", "bedrock event stream: malformed chunk", frame(t, `bytes`, ":message-type", "event", ":event-type", "chunk")},
		{"bytes not base64", "bedrock event stream: malformed chunk", frame(t, `{"bytes":"%%%"}`, ":message-type", "event", ":event-type", "chunk")},
		// A length under the empty frame's 16 bytes once panicked (a
		// slice past a buffer of that length).
		{"a length of 0", "bedrock event stream: a frame of 0 bytes", make([]byte, 16)},
		{"a length of 3", "bedrock event stream: a frame of 3 bytes", append([]byte{0, 0, 0, 3}, make([]byte, 12)...)},
		{"a length of 15", "bedrock event stream: a frame of 15 bytes", append([]byte{0, 0, 0, 15}, make([]byte, 12)...)},
	} {
		got, err := readSSE(&Bedrock{logger: zap.NewNop()}, eventStreamResponse(first, tt.rest))
		if err == nil || !strings.HasPrefix(err.Error(), tt.err) || errors.Is(err, io.EOF) {
			t.Errorf("%s: error %v, want one starting %q", tt.name, err, tt.err)
		}
		if want := "event: ping\ndata: " + ping + "\n\n"; got != want {
			t.Errorf("%s: read %q before the error, want %q", tt.name, got, want)
		}
	}
}

// TestBedrockResponseBody: Bedrock's error bodies reach the client as
// Anthropic's, with a hint (and a warning) when a model needs an
// inference profile; other answers pass as they came.
func TestBedrockResponseBody(t *testing.T) {
	const (
		onDemand = "Invocation of model ID anthropic.claude-sonnet-4-5-20250929-v1:0 with on-demand throughput isn't supported. Retry your request with the ID or ARN of an inference profile that contains this model."
		hint     = " (use the model's cross-region inference profile id as upstream_model, e.g. us.anthropic.claude-sonnet-4-5-20250929-v1:0)"
		denied   = "User: arn:aws:iam::123456789012:user/gw is not authorized to perform: bedrock:InvokeModelWithResponseStream"
	)
	for _, tt := range []struct {
		name        string
		status      int
		contentType string
		body, want  string // want "" when the body passes unchanged
		warns       int
	}{
		{"needs an inference profile", 400, "application/json", `{"message":"` + onDemand + `"}`,
			`{"type":"error","error":{"type":"invalid_request_error","message":"` + onDemand + hint + `"}}`, 1},
		{"throttled", 429, "application/json", `{"message":"Too many requests, please wait before trying again."}`,
			`{"type":"error","error":{"type":"rate_limit_error","message":"Too many requests, please wait before trying again."}}`, 0},
		{"denied, AWS's capital Message", 403, "application/json", `{"Message":"` + denied + `"}`,
			`{"type":"error","error":{"type":"permission_error","message":"` + denied + `"}}`, 0},
		// The model failed or timed out: the types its stream form has,
		// never "fix your request".
		{"model error", 424, "application/json", `{"message":"Received server error (500) from model."}`,
			`{"type":"error","error":{"type":"api_error","message":"Received server error (500) from model."}}`, 0},
		{"model timeout", 408, "application/json", `{"message":"Model has timed out in processing the request."}`,
			`{"type":"error","error":{"type":"timeout_error","message":"Model has timed out in processing the request."}}`, 0},
		{"an error without a message", 500, "application/json", `{"__type":"InternalFailure"}`, "", 0},
		{"not JSON", 502, "text/html", "<html>502</html>", "", 0},
		{"2xx JSON", 200, "application/json", `{"type":"message","content":[]}`, "", 0},
		{"an error as an event stream", 400, "application/vnd.amazon.eventstream", "raw", "", 0},
	} {
		core, logs := observer.New(zapcore.WarnLevel)
		b := &Bedrock{logger: zap.New(core)}
		res := &http.Response{
			StatusCode: tt.status, ContentLength: int64(len(tt.body)),
			Header: http.Header{"Content-Type": {tt.contentType}, "Content-Length": {"99"}},
			Body:   io.NopCloser(strings.NewReader(tt.body)),
		}
		got, err := io.ReadAll(b.ResponseBody(res))
		if err != nil {
			t.Fatalf("%s: %v", tt.name, err)
		}
		if logs.Len() != tt.warns {
			t.Errorf("%s: %d warnings, want %d: %v", tt.name, logs.Len(), tt.warns, logs.All())
		}
		if tt.want == "" {
			if string(got) != tt.body || res.Header.Get("Content-Length") != "99" {
				t.Errorf("%s: changed to %s", tt.name, got)
			}
			continue
		}
		if string(got) != tt.want {
			t.Errorf("%s: body %s, want %s", tt.name, got, tt.want)
		}
		if res.Header.Get("Content-Length") != "" || res.ContentLength != -1 || res.Header.Get("Content-Type") != "application/json" {
			t.Errorf("%s: headers %v, length %d after the body changed", tt.name, res.Header, res.ContentLength)
		}
	}
	// Unprovisioned (a configuration check), the hint comes without a
	// warning.
	res := &http.Response{StatusCode: 400, Header: http.Header{"Content-Type": {"application/json"}}, Body: io.NopCloser(strings.NewReader(`{"message":"` + onDemand + `"}`))}
	if got, _ := io.ReadAll((&Bedrock{}).ResponseBody(res)); !strings.Contains(string(got), hint) {
		t.Errorf("without a logger: %s", got)
	}
}

func TestBedrockCredentials(t *testing.T) {
	for _, tt := range []struct {
		b    Bedrock
		want []string
	}{
		{Bedrock{Region: "us-east-1"}, nil},
		{Bedrock{Region: "us-east-1", APIKey: "ABSK-key"}, []string{"ABSK-key"}},
		{Bedrock{Region: "us-east-1", AccessKeyID: "AKID", SecretAccessKey: "secret"}, []string{"AKID", "secret"}},
		{Bedrock{Region: "us-east-1", AccessKeyID: "ASIA", SecretAccessKey: "secret", SessionToken: "token"}, []string{"ASIA", "secret", "token"}},
	} {
		if got := tt.b.Credentials(); !reflect.DeepEqual(got, tt.want) {
			t.Errorf("%+v: credentials %q, want %q", tt.b, got, tt.want)
		}
	}
	if got := ChannelCredentials(nil, nil, &Bedrock{APIKey: "ABSK-key"}); !reflect.DeepEqual(got, []string{"ABSK-key"}) {
		t.Errorf("channel credentials %q", got)
	}
}

// countingHolder is a memory budget of limit bytes that remembers the
// most it was asked to hold at once.
type countingHolder struct {
	limit, held, most int64
}

func (h *countingHolder) Hold(n int64) bool {
	h.held += n
	h.most = max(h.most, h.held)
	return h.held > h.limit
}

func (h *countingHolder) Release(n int64) { h.held -= n }

// hugeFrame is the start of a frame whose prelude claims size bytes and
// whose body is an endless run of zeros.
func hugeFrame(size uint32) io.Reader {
	var prelude [4]byte
	binary.BigEndian.PutUint32(prelude[:], size)
	return io.MultiReader(bytes.NewReader(prelude[:]), zeros{})
}

type zeros struct{}

func (zeros) Read(p []byte) (int, error) {
	clear(p)
	return len(p), nil
}

// TestBedrockEventStreamFrameBound: a frame is read whole, so its length
// prefix is bounded before anything is read (a 256 MiB frame used to be
// buffered whole), and what a frame holds while it is read counts against
// the memory budget: over it, the stream ends with ErrMemoryBudget.
func TestBedrockEventStreamFrameBound(t *testing.T) {
	b := &Bedrock{logger: zap.NewNop()}
	res := eventStreamResponse()
	res.Body = io.NopCloser(io.MultiReader(bytes.NewReader(chunkFrame(t, `{"type":"ping"}`)), hugeFrame(256<<20)))
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	got, err := readSSE(b, res)
	runtime.ReadMemStats(&after)
	if err == nil || !strings.Contains(err.Error(), "over the 1048576 a frame may have") || got != "event: ping\ndata: {\"type\":\"ping\"}\n\n" {
		t.Fatalf("read %q, %v", got, err)
	}
	if grew := after.TotalAlloc - before.TotalAlloc; grew > 8<<20 {
		t.Fatalf("reading a 256 MiB frame's prelude allocated %d bytes", grew)
	}

	frames := bytes.Join([][]byte{chunkFrame(t, `{"type":"ping"}`), chunkFrame(t, `{"type":"message_stop"}`)}, nil)
	h := &countingHolder{limit: 1 << 20}
	res = eventStreamResponse()
	res.Body = io.NopCloser(bytes.NewReader(frames))
	res.Request = httptest.NewRequest(http.MethodPost, "/", nil).WithContext(WithHolder(context.Background(), h))
	if _, err := readSSE(b, res); err != nil {
		t.Fatal(err)
	}
	if one := max(len(chunkFrame(t, `{"type":"ping"}`)), len(chunkFrame(t, `{"type":"message_stop"}`))); h.held != 0 || h.most != int64(one) {
		t.Fatalf("held %d at the end, at most %d; want 0, one frame", h.held, h.most)
	}
	res = eventStreamResponse()
	res.Body = io.NopCloser(bytes.NewReader(frames))
	res.Request = httptest.NewRequest(http.MethodPost, "/", nil).WithContext(WithHolder(context.Background(), &countingHolder{limit: 10}))
	if _, err := readSSE(b, res); !errors.Is(err, ErrMemoryBudget) {
		t.Fatalf("over the budget: %v, want ErrMemoryBudget", err)
	}
}

// TestBedrockChunkWithLineBreaks: an event whose JSON holds line breaks
// is sent on one data line; SSE would end the event at the first one.
func TestBedrockChunkWithLineBreaks(t *testing.T) {
	got, err := readSSE(&Bedrock{logger: zap.NewNop()}, eventStreamResponse(
		chunkFrame(t, "{\"type\":\"content_block_delta\",\r\n \"delta\":{\"type\":\"text_delta\",\"text\":\"a\\nb\"}\n}")))
	if err != nil {
		t.Fatal(err)
	}
	if want := "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"delta\":{\"type\":\"text_delta\",\"text\":\"a\\nb\"}}\n\n"; got != want {
		t.Fatalf("SSE %q, want %q", got, want)
	}
	if _, err := readSSE(&Bedrock{logger: zap.NewNop()}, eventStreamResponse(chunkFrame(t, "{\"type\":\n"))); err == nil {
		t.Fatal("a chunk of broken JSON with a line break was relayed")
	}
}

// TestBedrockLargeFrameIsNotPinned: a frame counts against the memory
// budget only while it is read, so the buffers it took must not stay with
// the stream after it: one large frame early in each of many long streams
// would otherwise pin about 2 MiB a stream that no budget sees.
func TestBedrockLargeFrameIsNotPinned(t *testing.T) {
	const streams = 8
	big := chunkFrame(t, `{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"`+strings.Repeat("x", 700<<10)+`"}}`)
	small := chunkFrame(t, `{"type":"ping"}`)
	b := &Bedrock{logger: zap.NewNop()}
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	readers := make([]io.Reader, streams)
	for i := range readers {
		h := &countingHolder{limit: 4 << 20}
		res := eventStreamResponse()
		// The stream goes on after the small frame: it is still open.
		res.Body = io.NopCloser(io.MultiReader(bytes.NewReader(big), bytes.NewReader(small), blockingReader{}))
		res.Request = httptest.NewRequest(http.MethodPost, "/", nil).WithContext(WithHolder(context.Background(), h))
		r := b.ResponseBody(res)
		const ping = "event: ping\ndata: {\"type\":\"ping\"}\n\n"
		buf := make([]byte, 64<<10)
		for got := 0; ; {
			n, err := r.Read(buf)
			if err != nil {
				t.Fatal(err)
			}
			if got += n; got > 700<<10 && string(buf[:n]) == ping {
				break // the small frame's event: nothing more is read
			}
		}
		if h.held != 0 {
			t.Fatalf("stream %d: %d bytes still counted as held", i, h.held)
		}
		readers[i] = r
	}
	runtime.GC()
	runtime.ReadMemStats(&after)
	runtime.KeepAlive(readers)
	if grew := int64(after.HeapInuse) - int64(before.HeapInuse); grew > streams<<20 {
		t.Fatalf("%d open streams past one large frame each hold %d KiB of heap in all, which the budget does not count", streams, grew>>10)
	}
}

// blockingReader is an upstream that sends nothing more (and must not be
// read in this test).
type blockingReader struct{}

func (blockingReader) Read([]byte) (int, error) { panic("read past the frames the test sent") }
