package e2e

import (
	"bufio"
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	_ "github.com/jackc/pgx/v5/stdlib"

	fu "github.com/llmfailover/caddy-llm-failover/internal/faultupstream"
	"github.com/llmfailover/caddy-llm-failover/wallet"
)

// account is the admin API's view of a wallet account.
type account struct {
	ID        string `json:"id"`
	Balance   string `json:"balance"`
	Reserved  string `json:"reserved"`
	Available string `json:"available"`
}

type ledgerEntry struct {
	ID        int64  `json:"id"`
	Kind      string `json:"kind"`
	KeyID     string `json:"key_id"`
	Model     string `json:"model"`
	Channel   string `json:"channel"`
	RequestID string `json:"request_id"`
	TokensIn  int64  `json:"tokens_in"`
	TokensOut int64  `json:"tokens_out"`
	Cost      string `json:"cost"`
	Note      string `json:"note"`
}

func (in *instance) account(id string) account {
	in.t.Helper()
	var a account
	in.admin(http.MethodGet, "/llm_wallet/accounts/"+url.PathEscape(id), nil, 200, &a)
	return a
}

func (in *instance) ledger(id string) []ledgerEntry {
	in.t.Helper()
	var page struct {
		Entries []ledgerEntry `json:"entries"`
		Next    int64         `json:"next_before"`
	}
	in.admin(http.MethodGet, "/llm_wallet/accounts/"+url.PathEscape(id)+"/usage?limit=1000", nil, 200, &page)
	if page.Next != 0 {
		in.t.Fatalf("ledger of %s has more than 1000 rows", id)
	}
	return page.Entries
}

// newAccount creates a funded account and one key through the admin API
// and returns the key's secret.
func (in *instance) newAccount(id, credit string) string {
	in.t.Helper()
	in.admin(http.MethodPost, "/llm_wallet/accounts", map[string]string{"id": id}, 201, nil)
	in.admin(http.MethodPost, "/llm_wallet/accounts/"+id+"/credit", map[string]string{"amount": credit, "note": "e2e"}, 200, nil)
	var k struct {
		Key string `json:"key"`
		ID  string `json:"id"`
	}
	in.admin(http.MethodPost, "/llm_wallet/accounts/"+id+"/keys", map[string]string{"label": "e2e"}, 201, &k)
	if k.Key == "" {
		in.t.Fatalf("created key has no secret: %+v", k)
	}
	return k.Key
}

func micros(t *testing.T, s string) wallet.Micros {
	t.Helper()
	neg := strings.HasPrefix(s, "-")
	m, err := wallet.ParseMicros(strings.TrimPrefix(s, "-"))
	if err != nil {
		t.Fatalf("amount %q: %v", s, err)
	}
	if neg {
		m = -m
	}
	return m
}

// cliFields runs `caddy llm-wallet` and returns its output as a map of the
// first word of each line to the rest (the "key  value" lines it prints).
func cliFields(out string) map[string]string {
	m := map[string]string{}
	sc := bufio.NewScanner(strings.NewReader(out))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) >= 2 {
			m[f[0]] = strings.Join(f[1:], " ")
		}
	}
	return m
}

// TestBinaryWalletCLI administers the wallet with `caddy llm-wallet` only,
// as an operator would, and checks that the gateway enforces what the CLI
// did: the key works while funded, its use is in the ledger, and revoking
// it locks it out.
func TestBinaryWalletCLI(t *testing.T) {
	up := fu.New(fu.OKNamed("paid"))
	defer up.Close()
	p := portsWalletCLI
	in := newInstance(t, "walletcli", p, globalOptions(p)+site(p, fmt.Sprintf(`
		channel paid %s
		model gpt-paid {
			route paid cost 1 2
			max_output_tokens 1000
		}
		wallet
`, up.URL)))
	// The default store lives under caddy's data dir, i.e. our XDG_DATA_HOME.
	if _, err := os.Stat(filepath.Join(in.dir, "data", "caddy", "llm_failover", "wallet.db")); err != nil {
		t.Errorf("the default SQLite wallet is not under XDG_DATA_HOME/caddy/llm_failover: %v", err)
	}
	cli := func(args ...string) string {
		t.Helper()
		out, err := runCaddy(t, in.env, append([]string{"llm-wallet", "--address", in.adminAddr()}, args...)...)
		if err != nil {
			t.Fatalf("caddy llm-wallet %s: %v\n%s", strings.Join(args, " "), err, out)
		}
		return out
	}
	gw := in.gatewayURL() + "/v1/chat/completions"

	out := cli("create-account", "acme")
	if f := cliFields(out); f["account"] != "acme" || f["balance"] != "$0.00" {
		t.Errorf("create-account output:\n%s", out)
	}
	// Creating it twice is refused.
	if _, err := runCaddy(t, in.env, "llm-wallet", "--address", in.adminAddr(), "create-account", "acme"); err == nil {
		t.Errorf("creating account acme twice succeeded")
	}
	out = cli("credit", "acme", "2.50", "top-up")
	if f := cliFields(out); f["balance"] != "$2.50" {
		t.Errorf("credit output:\n%s", out)
	}
	out = cli("create-key", "acme", "ci")
	f := cliFields(out)
	secret, keyID := f["key"], f["id"]
	if secret == "" || keyID == "" || f["account"] != "acme" || !strings.Contains(out, "cannot be shown again") {
		t.Fatalf("create-key output has no key/id:\n%s", out)
	}
	out = cli("balance", "acme")
	if f := cliFields(out); f["balance"] != "$2.50" || f["reserved"] != "$0.00" || f["available"] != "$2.50" {
		t.Errorf("balance output, want balance $2.50, nothing reserved:\n%s", out)
	}
	out = cli("keys", "acme")
	if !strings.Contains(out, keyID) || !strings.Contains(out, "ci") {
		t.Errorf("keys output does not list key %s labelled ci:\n%s", keyID, out)
	}

	// No key, a wrong key: 401, and the upstream is never called.
	if status, _, body := post(t, gw, fu.ChatRequest("gpt-paid", false)); status != 401 {
		t.Errorf("no key: status %d body %s, want 401", status, body)
	}
	if status, _, body := post(t, gw, fu.ChatRequest("gpt-paid", false), "Authorization", "Bearer "+secret+"x"); status != 401 {
		t.Errorf("wrong key: status %d body %s, want 401", status, body)
	}
	if up.Hits() != 0 {
		t.Fatalf("unauthenticated requests reached the upstream (%d hits)", up.Hits())
	}

	status, _, body := post(t, gw, fu.ChatRequest("gpt-paid", false), "Authorization", "Bearer "+secret)
	if status != 200 || !strings.Contains(string(body), "paid") {
		t.Fatalf("request with the key: status %d body %s, want 200", status, body)
	}
	// Settlement happens as the handler returns; give it a moment.
	var a account
	if !waitFor(5*time.Second, func() bool { a = in.account("acme"); return micros(t, a.Reserved) == 0 }) {
		t.Fatalf("reservation not settled: %+v", a)
	}
	// 11 input tokens at $1/M and 7 output tokens at $2/M = $0.000025.
	if want := micros(t, "2.5") - micros(t, "0.000025"); micros(t, a.Balance) != want {
		t.Errorf("balance after one request %s, want %s", a.Balance, want)
	}
	out = cli("usage", "acme")
	var charge string
	for _, line := range strings.Split(out, "\n") {
		if fs := strings.Fields(line); len(fs) >= 8 && fs[2] == "charge" {
			charge = line
			if fs[3] != "gpt-paid" || fs[4] != "paid" || fs[5] != "11" || fs[6] != "7" || fs[7] != "$0.000025" {
				t.Errorf("charge row %q, want model gpt-paid, channel paid, 11 in, 7 out, $0.000025", line)
			}
		}
	}
	if charge == "" || !strings.Contains(out, "credit") {
		t.Errorf("usage output has no charge row (or no credit row):\n%s", out)
	}

	// A stream whose client did not ask for usage: billed from the usage
	// the gateway asked for, and that extra chunk is hidden from the client.
	streamBody := `{"model":"gpt-paid","stream":true,"messages":[{"role":"user","content":"Say hello."}]}`
	req, _ := http.NewRequest(http.MethodPost, gw, strings.NewReader(streamBody))
	req.Header.Set("Authorization", "Bearer "+secret)
	resp, err := gatewayClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	events, err := readSSE(resp.Body, time.Now(), nil)
	resp.Body.Close()
	if text, sawErr := chatText(events); resp.StatusCode != 200 || err != nil || text != "Hello from paid" || sawErr {
		t.Fatalf("billed stream: status %d, err %v, text %q, error event %v", resp.StatusCode, err, text, sawErr)
	}
	for _, ev := range events {
		if strings.Contains(ev.Data, `"choices":[]`) || strings.Contains(ev.Data, `"prompt_tokens"`) {
			t.Errorf("the client got a usage chunk it did not ask for: %s", ev.Data)
		}
	}
	// The Anthropic API, with the key in x-api-key as that SDK sends it.
	status, _, body = post(t, in.gatewayURL()+"/v1/messages", fu.MessagesRequest("gpt-paid", false), "X-Api-Key", secret, "Anthropic-Version", "2023-06-01")
	if status != 200 || !strings.Contains(string(body), "Hello from paid") {
		t.Fatalf("messages request with x-api-key: status %d body %s", status, body)
	}
	if !waitFor(5*time.Second, func() bool { a = in.account("acme"); return micros(t, a.Reserved) == 0 }) {
		t.Fatalf("reservations not settled: %+v", a)
	}
	if want := micros(t, "2.5") - 3*micros(t, "0.000025"); micros(t, a.Balance) != want {
		t.Errorf("balance after three requests %s, want %s (each 11 in + 7 out)", a.Balance, want)
	}
	charges := 0
	for _, e := range in.ledger("acme") {
		if e.Kind == "charge" {
			charges++
			if e.TokensIn != 11 || e.TokensOut != 7 || e.Cost != "0.000025" {
				t.Errorf("charge %+v, want 11 in, 7 out, 0.000025", e)
			}
		}
	}
	if charges != 3 {
		t.Errorf("%d charge rows, want 3", charges)
	}

	out = cli("revoke-key", keyID)
	if !strings.Contains(out, keyID) {
		t.Errorf("revoke-key output:\n%s", out)
	}
	hits := up.Hits()
	status, _, body = post(t, gw, fu.ChatRequest("gpt-paid", false), "Authorization", "Bearer "+secret)
	if status != 401 || !strings.Contains(string(body), "revoked") {
		t.Errorf("revoked key: status %d body %s, want 401 saying revoked", status, body)
	}
	if up.Hits() != hits {
		t.Errorf("a revoked key's request reached the upstream")
	}
	out = cli("keys", "acme")
	revoked := false
	for _, line := range strings.Split(out, "\n") {
		if fs := strings.Fields(line); len(fs) > 0 && fs[0] == keyID {
			revoked = fs[len(fs)-1] != "-"
		}
	}
	if !revoked {
		t.Errorf("keys output does not show key %s as revoked:\n%s", keyID, out)
	}
	// A correction: the help says a negative amount corrects, so
	// "-0.50" must reach the admin API as an amount, not as a flag.
	before := micros(t, in.account("acme").Balance)
	out = cli("credit", "acme", "-0.50", "correction")
	if f := cliFields(out); f["balance"] != (before - micros(t, "0.5")).Human() {
		t.Errorf("credit acme -0.50: want balance %s, got:\n%s", (before - micros(t, "0.5")).Human(), out)
	}
	// The admin address can come from the config file instead of --address.
	out, err = runCaddy(t, in.env, "llm-wallet", "--config", in.cfgPath, "--adapter", "caddyfile", "balance", "acme")
	if f := cliFields(out); err != nil || f["balance"] != (before-micros(t, "0.5")).Human() {
		t.Errorf("llm-wallet --config <file> balance acme: err %v, output:\n%s", err, out)
	}
	// A flag after the subcommand is either honoured or refused, never
	// silently ignored (which would send the command to another admin).
	out, err = runCaddy(t, in.env, "llm-wallet", "balance", "acme", "--address", in.adminAddr())
	if f := cliFields(out); err == nil && f["balance"] != (before-micros(t, "0.5")).Human() || err != nil && !strings.Contains(out, "--address") {
		t.Errorf("llm-wallet balance acme --address ...: err %v, output:\n%s", err, out)
	}

	// The CLI reports admin errors (and exits non-zero).
	if out, err := runCaddy(t, in.env, "llm-wallet", "--address", in.adminAddr(), "balance", "nobody"); err == nil {
		t.Errorf("balance of an unknown account succeeded:\n%s", out)
	}
}

// TestBinaryKill9SweepsReservation kills caddy with SIGKILL while a stream
// holds a reservation, and checks that the restarted gateway's sweeper
// gives the money back: nothing is charged, nothing stays reserved, and the
// ledger says why.
func TestBinaryKill9SweepsReservation(t *testing.T) {
	stall := fu.New(fu.StallMidStream(30 * time.Second))
	defer stall.Close()
	p := portsKill9
	in := newInstance(t, "kill9", p, withWallet(globalOptions(p), "\t\treservation_ttl 2s\n\t\tlease_ttl 2s")+site(p, fmt.Sprintf(`
		channel stall %s
		model gpt-stall {
			route stall cost 1 2
			max_output_tokens 1000
		}
		wallet
`, stall.URL)))
	secret := in.newAccount("acme", "5")

	st := openStream(t, in, "gpt-stall", secret)
	admitted := st.sent
	held := in.account("acme")
	if micros(t, held.Reserved) <= 0 || held.Balance != "5" {
		t.Fatalf("during the stream the account is %+v, want balance 5 and a reservation", held)
	}

	in.kill9()
	st.close()
	// The reservation expires 2s after admission; restart after that so
	// the start-up sweep finds it expired.
	if wait := time.Until(admitted.Add(2500 * time.Millisecond)); wait > 0 {
		time.Sleep(wait)
	}
	restarted := time.Now()
	in.start()

	var a account
	if !waitFor(10*time.Second, func() bool { a = in.account("acme"); return micros(t, a.Reserved) == 0 }) {
		t.Fatalf("10s after restart the reservation is still held: %+v", a)
	}
	if a.Balance != "5" || a.Available != "5" {
		t.Errorf("after the sweep the account is %+v, want balance and available 5 (nothing charged)", a)
	}
	var expired []ledgerEntry
	for _, e := range in.ledger("acme") {
		switch e.Kind {
		case "expired":
			expired = append(expired, e)
		case "charge":
			if micros(t, e.Cost) != 0 {
				t.Errorf("the killed request was charged: %+v", e)
			}
		}
	}
	if len(expired) != 1 || micros(t, expired[0].Cost) != 0 {
		t.Errorf("ledger has expired rows %+v, want exactly one, with cost 0", expired)
	}
	// The restarted gateway serves, and the sweeper's heartbeat is recent.
	var status struct {
		Store     string    `json:"store"`
		Reachable bool      `json:"reachable"`
		LastSweep time.Time `json:"last_sweep"`
	}
	in.admin(http.MethodGet, "/llm_wallet/status", nil, 200, &status)
	if !status.Reachable || status.Store != "sqlite" || status.LastSweep.Before(restarted) {
		t.Errorf("wallet status %+v, want a reachable sqlite store swept since the restart at %v", status, restarted)
	}
}

// TestBinaryTwoInstancesSharePostgres fires many concurrent requests at two
// gateway processes sharing one PostgreSQL wallet, with money for exactly
// ten: neither instance may let an eleventh through, and the ledger must
// add up to the balance.
func TestBinaryTwoInstancesSharePostgres(t *testing.T) {
	instancesSharePostgres(t, []ports{portsPGA, portsPGB}, 300)
}

// TestBinaryFourInstancesSharePostgres is the same invariant at the scale
// of the wallet-at-scale issue: 1,000 concurrent requests spread over four
// instances, money for ten.
func TestBinaryFourInstancesSharePostgres(t *testing.T) {
	instancesSharePostgres(t, portsPG4[:], 1000)
}

// portsPG4: the four instances of TestBinaryFourInstancesSharePostgres.
var portsPG4 = [4]ports{{19391, 19392}, {19393, 19394}, {19395, 19396}, {19397, 19398}}

// instancesSharePostgres starts one gateway per ports on one fresh
// PostgreSQL database, sends total concurrent requests round-robin against
// a balance for exactly ten $1 requests, and checks: exactly ten admitted,
// every instance refused some, nothing left reserved, balance ≥ 0, the
// ledger agrees with the balance and every instance's audit is clean.
func instancesSharePostgres(t *testing.T, pp []ports, total int) {
	caddyBin(t)
	adminDSN := postgresDSN(t)
	dsn := createDatabase(t, adminDSN)

	// Each request reserves, and is then charged, exactly $1.
	up := fu.New(fu.SlowHeaders(300*time.Millisecond, fu.OKNamed("pg").WithUsage(11, 10)))
	defer up.Close()
	body := oneDollarModel("pg", "gpt-pg", up.URL)
	pg := "\t\tstore postgres {env.LLMF_E2E_DSN}"
	ins := make([]*instance, len(pp))
	for i, p := range pp {
		ins[i] = newInstance(t, fmt.Sprintf("pg-%c", 'a'+i), p, withWallet(globalOptions(p), pg)+site(p, body), "LLMF_E2E_DSN="+dsn)
	}
	a := ins[0]
	secret := a.newAccount("acme", "10")
	// The other instances see what a created: the store is shared.
	for _, b := range ins[1:] {
		if acct := b.account("acme"); acct.Balance != "10" {
			t.Fatalf("instance %s sees acme as %+v, want balance 10", b.gatewayURL(), acct)
		}
	}

	statuses := make([]int, total)
	bodies := make([]string, total)
	var wg sync.WaitGroup
	startGate := make(chan struct{})
	reqBody := fu.ChatRequest("gpt-pg", false)
	for i := 0; i < total; i++ {
		target := ins[i%len(ins)]
		wg.Add(1)
		go func(i int, gw string) {
			defer wg.Done()
			<-startGate
			req, _ := http.NewRequest(http.MethodPost, gw+"/v1/chat/completions", strings.NewReader(string(reqBody)))
			req.Header.Set("Authorization", "Bearer "+secret)
			resp, err := gatewayClient.Do(req)
			if err != nil {
				bodies[i] = err.Error()
				return
			}
			defer resp.Body.Close()
			bb, _ := io.ReadAll(resp.Body)
			statuses[i], bodies[i] = resp.StatusCode, string(bb)
		}(i, target.gatewayURL())
	}
	start := time.Now()
	close(startGate)
	wg.Wait()
	t.Logf("%d requests across %d instances in %v", total, len(ins), time.Since(start).Round(time.Millisecond))

	ok, refused := 0, 0
	perInstance := make([]int, len(ins))
	for i, s := range statuses {
		switch s {
		case 200:
			ok++
		case 402:
			refused++
			perInstance[i%len(ins)]++
			var e struct {
				Error struct {
					Code string `json:"code"`
				} `json:"error"`
			}
			if json.Unmarshal([]byte(bodies[i]), &e) != nil || e.Error.Code != "insufficient_quota" {
				t.Errorf("request %d: 402 body %s, want error.code insufficient_quota", i, bodies[i])
			}
		default:
			t.Errorf("request %d: status %d body %q, want 200 or 402", i, s, bodies[i])
		}
	}
	t.Logf("200: %d, 402: %d (per instance: %v)", ok, refused, perInstance)
	if ok > 10 {
		t.Errorf("%d requests succeeded with money for 10: the shared wallet was overdrawn", ok)
	}
	if ok != 10 {
		t.Errorf("%d requests succeeded, want exactly 10 (money for 10, each charged exactly its reservation)", ok)
	}
	if slices.Contains(perInstance, 0) {
		t.Errorf("an instance refused nothing (%v): it did not see the shared balance", perInstance)
	}
	if int(up.Hits()) != ok {
		t.Errorf("the upstream was called %d times for %d successes: refused requests must not reach it", up.Hits(), ok)
	}

	var acct account
	if !waitFor(10*time.Second, func() bool { acct = a.account("acme"); return micros(t, acct.Reserved) == 0 }) {
		t.Fatalf("reservations still held 10s after the last answer: %+v", acct)
	}
	for _, b := range ins[1:] {
		if acct2 := b.account("acme"); acct2 != acct {
			t.Errorf("the instances disagree: a %+v, %s %+v", acct, b.gatewayURL(), acct2)
		}
	}
	balance := micros(t, acct.Balance)
	if balance < 0 {
		t.Errorf("negative balance %s", acct.Balance)
	}
	spent := micros(t, "10") - balance
	var charged wallet.Micros
	charges := 0
	for _, e := range a.ledger("acme") {
		if e.Kind == "charge" {
			charges++
			charged += micros(t, e.Cost)
			if e.TokensOut != 10 || micros(t, e.Cost) != micros(t, "1") {
				t.Errorf("charge %+v, want 10 output tokens for $1", e)
			}
		}
	}
	if charged != spent || charges != ok {
		t.Errorf("ledger: %d charges summing to %s; balance went down by %s over %d successes", charges, charged, spent, ok)
	}
	// Every instance's audit agrees that the books balance.
	for _, in := range ins {
		var audit struct {
			Clean       bool  `json:"clean"`
			Accounts    int   `json:"accounts"`
			Differences []any `json:"differences"`
		}
		in.admin(http.MethodGet, "/llm_wallet/audit", nil, 200, &audit)
		if !audit.Clean || audit.Accounts == 0 {
			t.Errorf("audit after the load: %+v", audit)
		}
	}
}

// stream is a streamed chat request in progress.
type stream struct {
	sent   time.Time
	resp   *http.Response
	done   chan struct{} // closed when the body has ended
	events []sseEvent    // valid after done
	err    error         // the body's read error, valid after done
}

func (s *stream) close() { s.resp.Body.Close() }

// wait waits (up to d) for the stream to end.
func (s *stream) wait(t *testing.T, d time.Duration) {
	t.Helper()
	select {
	case <-s.done:
	case <-time.After(d):
		t.Fatalf("the stream did not end within %v", d)
	}
}

// openStream sends a streamed chat request and returns once content (the
// word " from") has arrived: the stream has committed and, with a stalling
// upstream, is now stalled with its reservation held.
func openStream(t *testing.T, in *instance, model, secret string) *stream {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, in.gatewayURL()+"/v1/chat/completions", strings.NewReader(string(fu.ChatRequest(model, true))))
	req.Header.Set("Authorization", "Bearer "+secret)
	s := &stream{sent: time.Now(), done: make(chan struct{})}
	resp, err := gatewayClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { resp.Body.Close() })
	if resp.StatusCode != 200 {
		b, _ := io.ReadAll(resp.Body)
		t.Fatalf("stream: status %d body %s", resp.StatusCode, b)
	}
	s.resp = resp
	got := make(chan struct{})
	var once sync.Once
	go func() {
		defer close(s.done)
		var sb strings.Builder
		s.events, s.err = readSSE(resp.Body, s.sent, func(ev sseEvent) {
			sb.WriteString(ev.Data)
			if strings.Contains(sb.String(), `" from"`) {
				once.Do(func() { close(got) })
			}
		})
	}()
	select {
	case <-got:
	case <-s.done:
		t.Fatalf("the stream ended before any content arrived (err %v): %+v", s.err, s.events)
	case <-time.After(15 * time.Second):
		t.Fatal("no content arrived from the stream within 15s")
	}
	return s
}

// createDatabase creates a fresh database on the server adminDSN points to
// and returns a DSN for it; the database is dropped when the test ends,
// after the gateways (started later) have stopped.
func createDatabase(t *testing.T, adminDSN string) string {
	t.Helper()
	u, err := url.Parse(adminDSN)
	if err != nil || u.Scheme == "" {
		t.Fatalf("LLMF_TEST_POSTGRES_DSN must be a postgres:// URL: %v", err)
	}
	db, err := sql.Open("pgx", adminDSN)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := db.PingContext(ctx); err != nil {
		db.Close()
		t.Fatalf("connecting to LLMF_TEST_POSTGRES_DSN: %v", err)
	}
	var rnd [6]byte
	_, _ = rand.Read(rnd[:])
	name := "llmf_e2e_" + hex.EncodeToString(rnd[:])
	if _, err := db.ExecContext(ctx, "CREATE DATABASE "+name); err != nil {
		db.Close()
		t.Fatalf("CREATE DATABASE %s: %v", name, err)
	}
	t.Cleanup(func() {
		defer db.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if _, err := db.ExecContext(ctx, "DROP DATABASE IF EXISTS "+name+" WITH (FORCE)"); err != nil {
			t.Errorf("DROP DATABASE %s: %v", name, err)
		}
	})
	u.Path = "/" + name
	return u.String()
}
