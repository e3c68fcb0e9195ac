package provider

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"go.uber.org/zap"
	"golang.org/x/oauth2"
)

// tokenKeeper keeps a current OAuth access token for an adapter: it
// fetches one in the background and refreshes it well before it expires,
// so that requests never wait on the token endpoint, and fetches one on
// the spot only when none is valid. A request never gets an empty token:
// without a valid one, it gets the fetch's error.
type tokenKeeper struct {
	src    oauth2.TokenSource
	logger *zap.Logger
	cancel context.CancelFunc
	done   chan struct{}

	mu      sync.Mutex
	tok     *oauth2.Token
	prev    string // the access token tok replaced
	fetched time.Time
	lastErr error
}

// Refresh timing: a token is refreshed once half its lifetime (at most
// maxRefreshMargin before expiry) remains, retried every retryFetch after
// a failure, and no longer used once less than a tenth of its lifetime
// (at most maxUseMargin) remains.
const (
	maxRefreshMargin = 5 * time.Minute
	maxUseMargin     = 30 * time.Second
	retryFetch       = time.Second
)

var errNoToken = errors.New("no access token")

func newTokenKeeper(src oauth2.TokenSource, logger *zap.Logger) *tokenKeeper {
	ctx, cancel := context.WithCancel(context.Background())
	k := &tokenKeeper{src: src, logger: logger, cancel: cancel, done: make(chan struct{})}
	go k.run(ctx)
	return k
}

// stop ends the background refresh and waits for it.
func (k *tokenKeeper) stop() {
	k.cancel()
	<-k.done
}

func (k *tokenKeeper) run(ctx context.Context) {
	defer close(k.done)
	for {
		wait := retryFetch
		if tok, err := k.fetch(); err == nil {
			wait = k.refreshIn(tok, time.Now())
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
	}
}

// refreshIn is how long to wait before refreshing tok. The token source
// may hand back the same cached token while it is still valid, so the
// wait never drops to zero.
func (k *tokenKeeper) refreshIn(tok *oauth2.Token, now time.Time) time.Duration {
	k.mu.Lock()
	life := tok.Expiry.Sub(k.fetched)
	k.mu.Unlock()
	if tok.Expiry.IsZero() {
		return maxRefreshMargin
	}
	left := tok.Expiry.Sub(now)
	floor := max(min(retryFetch, left/2), 10*time.Millisecond)
	return max(left-min(life/2, maxRefreshMargin), floor)
}

// fetch asks the source for a token and keeps it.
func (k *tokenKeeper) fetch() (*oauth2.Token, error) {
	start := time.Now()
	tok, err := k.src.Token()
	if err == nil && tok.AccessToken == "" {
		err = errNoToken
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	if err != nil {
		k.lastErr = err
		k.logger.Warn("fetching an access token failed", zap.Error(err))
		return nil, err
	}
	if k.tok == nil || tok.AccessToken != k.tok.AccessToken {
		k.fetched = start
		if k.tok != nil {
			k.prev = k.tok.AccessToken
		}
	}
	k.tok, k.lastErr = tok, nil
	return tok, nil
}

// recent returns the access tokens requests may have been sent with
// lately, for masking: the current one and the one before it.
func (k *tokenKeeper) recent() []string {
	k.mu.Lock()
	defer k.mu.Unlock()
	var out []string
	if k.tok != nil {
		out = append(out, k.tok.AccessToken)
	}
	if k.prev != "" {
		out = append(out, k.prev)
	}
	return out
}

// token returns a token valid for a request sent now.
func (k *tokenKeeper) token() (string, error) {
	now := time.Now()
	k.mu.Lock()
	tok, fetched := k.tok, k.fetched
	k.mu.Unlock()
	if usable(tok, fetched, now) {
		return tok.AccessToken, nil
	}
	tok, err := k.fetch()
	if err != nil {
		return "", fmt.Errorf("fetching an access token: %w", err)
	}
	return tok.AccessToken, nil
}

func usable(tok *oauth2.Token, fetched, now time.Time) bool {
	if tok == nil {
		return false
	}
	if tok.Expiry.IsZero() {
		return true
	}
	margin := min(tok.Expiry.Sub(fetched)/10, maxUseMargin)
	return now.Add(margin).Before(tok.Expiry)
}
