package integration_test

import (
	"context"
	"io"
	"net/http"
	"path/filepath"
	"testing"
	"time"

	fu "github.com/llmfailover/caddy-llm-failover/internal/faultupstream"
	"github.com/llmfailover/caddy-llm-failover/internal/sqlitefile"
	"github.com/llmfailover/caddy-llm-failover/wallet"
)

// A billed non-streaming answer reaches the client before its settlement
// commits, and the handler does not wait for it either: with the
// wallet's SQLite file locked by another connection, a client still gets
// two answers at once on one connection (the second is only read once
// the first's handler returned), and both charge rows land once the lock
// goes.
func TestBilledAnswerReachesClientBeforeSettlement(t *testing.T) {
	path := filepath.Join(t.TempDir(), "w.db")
	a := upstream(t, fu.OKNamed("a").WithUsage(10, 5))
	b := upstream(t, fu.OKNamed("b"))
	gatewayWith(t, walletOptions("sqlite "+path), walletChannels, a.URL, b.URL)
	secret, _ := newWalletAccount(t, "acct", "100")
	db, err := sqlitefile.Open(path, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	body := fu.ChatRequest("m", false)
	charges := func() int {
		n := 0
		for _, e := range requestRows(t, "acct") {
			if e.Kind == wallet.KindCharge {
				n++
			}
		}
		return n
	}
	// The locked request must be served from the lease the previous one
	// grew (a grow would wait for the lock too); a lease idle for a second
	// goes back, so on a slow machine the try is repeated.
	served := 0 // answers given, each of which must end up charged once
	for try := 1; ; try++ {
		if res, got := post(t, "/v1/chat/completions", body, bearer(secret)...); res.StatusCode != http.StatusOK {
			t.Fatalf("status %d: %s", res.StatusCode, got)
		}
		served++
		eventually(t, 10*time.Second, "the earlier answers charged", func() bool { return charges() == served })
		before := served
		hitsBefore := a.Hits()
		tx, err := db.BeginTx(context.Background(), nil) // BEGIN IMMEDIATE: the write lock
		if err != nil {
			t.Fatal(err)
		}
		if _, err := tx.Exec(`UPDATE accounts SET created_at = created_at WHERE id = 'acct'`); err != nil {
			t.Fatal(err)
		}
		answered := make(chan int, 2)
		go func() {
			// One connection: the second request waits for the first's
			// handler to return.
			client := &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{MaxConnsPerHost: 1}}
			defer client.CloseIdleConnections()
			for range 2 {
				status := 0
				if res, err := client.Do(newPost(t, context.Background(), "/v1/chat/completions", body, bearer(secret)...)); err == nil {
					_, _ = io.Copy(io.Discard, res.Body)
					res.Body.Close()
					status = res.StatusCode
				}
				answered <- status
			}
		}()
		select {
		case status := <-answered:
			if status != http.StatusOK {
				t.Fatalf("status %d", status)
			}
			select {
			case status := <-answered:
				if status != http.StatusOK {
					t.Fatalf("second answer: status %d", status)
				}
			case <-time.After(3 * time.Second):
				_ = tx.Rollback()
				t.Fatal("the second request on the connection waited for the first's settlement")
			}
			if n := charges(); n != before {
				t.Fatalf("the charge committed under the lock (%d rows, were %d)", n, before)
			}
			if err := tx.Rollback(); err != nil {
				t.Fatal(err)
			}
			eventually(t, 10*time.Second, "the charge rows after the lock", func() bool { return charges() == before+2 })
			waitUnreserved(t, "acct")
			auditClean(t)
			return
		case <-time.After(3 * time.Second):
			upstreamGotIt := a.Hits() > hitsBefore
			_ = tx.Rollback()
			for range 2 {
				if status := <-answered; status == http.StatusOK {
					served++
				}
			}
			if upstreamGotIt {
				t.Fatal("the upstream answered, but the client waited for the settlement")
			}
			if try == 3 {
				t.Fatal("three tries found the lease returned before the locked request")
			}
			t.Logf("try %d: the lease went back before the locked request; again", try)
		}
	}
}
