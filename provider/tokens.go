package provider

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
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
	// stopFetches aborts a fetch under way (tokenFetchContext); nil for
	// a source that fetches nothing over HTTP.
	stopFetches context.CancelFunc

	mu      sync.Mutex
	tok     *oauth2.Token
	prev    string // the access token tok replaced
	fetched time.Time
	lastErr error
	// fetching is closed when the fetch requests asked for ends; nil
	// when none is under way.
	fetching chan struct{}
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
	if k.stopFetches != nil {
		k.stopFetches()
	}
	<-k.done
}

// tokenFetchTimeout bounds one token fetch: the oauth2 library's own
// client (http.DefaultClient) waits on a silent token endpoint for ever.
const tokenFetchTimeout = 30 * time.Second

// tokenFetchContext is the context a token source is built with: its
// fetches go through a client bounded by tokenFetchTimeout, and stop
// aborts the one under way.
func tokenFetchContext() (ctx context.Context, stop context.CancelFunc) {
	life, stop := context.WithCancel(context.Background())
	client := &http.Client{Timeout: tokenFetchTimeout, Transport: boundTransport{life: life}}
	return context.WithValue(life, oauth2.HTTPClient, client), stop
}

// boundTransport ends its requests, bodies included, when life ends.
type boundTransport struct{ life context.Context }

func (b boundTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	ctx, cancel := context.WithCancel(r.Context())
	unbind := context.AfterFunc(b.life, cancel)
	end := func() { unbind(); cancel() }
	res, err := http.DefaultTransport.RoundTrip(r.WithContext(ctx))
	if err != nil {
		end()
		return nil, err
	}
	res.Body = boundBody{ReadCloser: res.Body, end: end}
	return res, nil
}

type boundBody struct {
	io.ReadCloser
	end func()
}

func (b boundBody) Close() error {
	err := b.ReadCloser.Close()
	b.end()
	return err
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

// token returns a token valid for a request sent now. Without one, it
// has one fetched, waiting at most as long as ctx: the requests that
// find none share one fetch (bounded by tokenFetchTimeout), so that a
// token endpoint gone silent costs one goroutine, not one per request.
func (k *tokenKeeper) token(ctx context.Context) (string, error) {
	k.mu.Lock()
	if usable(k.tok, k.fetched, time.Now()) {
		tok := k.tok
		k.mu.Unlock()
		return tok.AccessToken, nil
	}
	wait := k.fetching
	if wait == nil {
		wait = make(chan struct{})
		k.fetching = wait
		go func() {
			_, _ = k.fetch()
			k.mu.Lock()
			k.fetching = nil
			k.mu.Unlock()
			close(wait)
		}()
	}
	k.mu.Unlock()
	select {
	case <-wait:
	case <-ctx.Done():
		return "", fmt.Errorf("fetching an access token: %w", context.Cause(ctx))
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	if usable(k.tok, k.fetched, time.Now()) {
		return k.tok.AccessToken, nil
	}
	err := k.lastErr
	if err == nil {
		err = errNoToken
	}
	return "", fmt.Errorf("fetching an access token: %w", err)
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
