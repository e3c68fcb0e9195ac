package failoverapp

import (
	"encoding/json"
	"slices"
	"testing"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	_ "github.com/caddyserver/caddy/v2/modules/logging"
)

// The check reads two fields Caddy keeps unexported; a Caddy upgrade
// that renames either would silently end the warning, so this pins them.
func TestLoggingConfigIsVisible(t *testing.T) {
	var cfg caddy.Config
	if err := json.Unmarshal([]byte(`{"logging":{"logs":{
		"log0":{"encoder":{"format":"filter","fields":{"request>headers>X-Api-Key":{"filter":"delete"},"request>headers>Api-Key":{"filter":"hash"}}},"include":["http.log.access.log0"]},
		"log1":{"encoder":{"format":"filter","fields":{"request>headers>x-api-key":{"filter":"delete"}}},"include":["http.log.access.log1"]},
		"default":{"exclude":["http.log.access.log0","http.log.access.log1"]}}}}`), &cfg); err != nil {
		t.Fatal(err)
	}
	ctx, err := caddy.ProvisionContext(&cfg)
	if err != nil {
		t.Fatal(err)
	}
	logging := loggingConfig(ctx)
	if logging == nil || logging.Logs["log0"] == nil {
		t.Fatal("the context's logging config is not visible")
	}
	if logEncoder(logging.Logs["log0"]) == nil {
		t.Fatal("a log's encoder is not visible")
	}
	for _, tt := range []struct {
		name string
		logs caddyhttp.ServerLogConfig
		want []string
	}{
		{"filtered", caddyhttp.ServerLogConfig{LoggerNames: map[string]caddyhttp.StringArray{"a.example": {"log0"}}}, nil},
		{"default logger filtered", caddyhttp.ServerLogConfig{DefaultLoggerName: "log0"}, nil},
		{"lower-case filter", caddyhttp.ServerLogConfig{DefaultLoggerName: "log1"}, []string{"Api-Key", "X-Api-Key"}},
		{"bare access logger", caddyhttp.ServerLogConfig{}, []string{"Api-Key", "X-Api-Key"}},
		{"credentials logged", caddyhttp.ServerLogConfig{DefaultLoggerName: "log0", ShouldLogCredentials: true}, []string{"Authorization"}},
		{"one host unfiltered", caddyhttp.ServerLogConfig{LoggerNames: map[string]caddyhttp.StringArray{"a.example": {"log0"}, "b.example": {"log1"}}}, []string{"Api-Key", "X-Api-Key"}},
	} {
		if got := headersLoggedInClear(logging, &tt.logs); !slices.Equal(got, tt.want) {
			t.Errorf("%s: %v, want %v", tt.name, got, tt.want)
		}
	}
}

// logAccepts agrees with Caddy's include/exclude rule.
func TestLogAccepts(t *testing.T) {
	for _, tt := range []struct {
		include, exclude []string
		name             string
		want             bool
	}{
		{nil, nil, "http.log.access.log0", true},
		{[]string{"http.log.access.log0"}, nil, "http.log.access.log0", true},
		{[]string{"http.log.access.log0"}, nil, "http.log.access.log01", false},
		{[]string{"http.log.access"}, nil, "http.log.access.log0", true},
		{nil, []string{"http.log.access.log0"}, "http.log.access.log0", false},
		{nil, []string{"http.log.access.log0"}, "http.log.access", true},
		{nil, []string{"http.log"}, "http.log.access.log0", false},
		{[]string{"http.log.access.log0"}, []string{"http.log"}, "http.log.access.log0", true},
		{[]string{"http.log"}, []string{"http.log.access.log0"}, "http.log.access.log0", false},
		{[]string{"http.log.access.log0"}, []string{"*"}, "http.log.access.log0", false},
	} {
		cl := &caddy.CustomLog{Include: tt.include, Exclude: tt.exclude}
		if got := logAccepts(cl, tt.name); got != tt.want {
			t.Errorf("include %v exclude %v, %s: %v, want %v", tt.include, tt.exclude, tt.name, got, tt.want)
		}
	}
}
