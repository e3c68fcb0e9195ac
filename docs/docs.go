// Package docs holds the documentation the gateway serves itself: the
// runbooks, built into the binary because the operator paged at 4 a.m.
// may reach nothing but the gateway.
package docs

import "embed"

// Runbooks are runbooks/*.md, one per failure reason and breaker state.
//
//go:embed runbooks/*.md
var Runbooks embed.FS
