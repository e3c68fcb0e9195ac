package provider

import (
	"fmt"

	"github.com/llmfailover/caddy-llm-failover/internal/caddykit"
)

// secret is one of an adapter's options that may hold an {env.*} (or
// {file.*}) placeholder, like a channel's header values.
type secret struct {
	option string
	value  *string
}

// resolveSecrets replaces the placeholders of an adapter's secret options
// when the config loads (Provision): an unset variable is a load error
// naming it, never a literal "{env.X}" sent upstream as a key.
func resolveSecrets(provider string, secrets ...secret) error {
	for _, s := range secrets {
		if *s.value == "" {
			continue
		}
		v, err := caddykit.Resolve(*s.value)
		if err != nil {
			return fmt.Errorf("%s %s: %w", provider, s.option, err)
		}
		*s.value = v
	}
	return nil
}
