package walletapp

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"runtime/debug"
	"slices"
	"sync"
	"time"

	"github.com/caddyserver/caddy/v2"
	"go.uber.org/zap"

	"github.com/llmfailover/caddy-llm-failover/internal/backoff"
	"github.com/llmfailover/caddy-llm-failover/internal/caddykit"
	"github.com/llmfailover/caddy-llm-failover/jobs"
	"github.com/llmfailover/caddy-llm-failover/wallet"
)

// SweepEvery is how often expired reservations are released.
const SweepEvery = time.Minute

// SweepJobPrefix names the sweeper's job, followed by the name of the
// wallet that opened the store: wallet_sweep.default. Heartbeats attach to
// it by that name.
const SweepJobPrefix = "wallet_sweep."

// LeaseJobPrefix names the credit lease renewer's job (every second),
// followed by the wallet's name.
const LeaseJobPrefix = "wallet_leases."

// JobNames are the background jobs of the wallet called name: its
// sweeper and its lease renewer.
func JobNames(name string) []string { return []string{SweepJobPrefix + name, LeaseJobPrefix + name} }

// drainLimit bounds how long a store no config uses waits for the
// requests that entered it before it closes.
const drainLimit = 10 * time.Minute

// settleDrainLimit bounds how long the release of a store (a reload onto
// another database, shutdown) waits for the settlements already decided
// (see SettleAsync). They take milliseconds; a store that does not
// answer for this long loses them as a crash would (their money is
// released uncharged after lease_ttl).
const settleDrainLimit = 10 * time.Second

// closeWait bounds how long the release of an idle store waits for it to
// close (returning its leases is one write).
const closeWait = 5 * time.Second

// ErrUnloaded is the error of a wallet whose config was unloaded before
// the request that uses it reached the store. It is not a store outage:
// such a request must be refused, never served unbilled.
var ErrUnloaded = errors.New("config unloaded")

// stores shares one open store per database across wallets and config
// generations.
var stores = caddy.NewUsagePool()

// Wallet is one named wallet of a config. Handlers keep it for the life of
// their config; nothing here changes what an in-flight request reads.
type Wallet struct {
	name             string
	backend          Backend
	ttl              time.Duration
	admissionTimeout time.Duration
	statementTimeout time.Duration
	leaseTTL         time.Duration
	logger           *zap.Logger

	// first makes the first attempt to open the store, at Start or at the
	// first request, whichever comes first.
	first sync.Once

	mu sync.Mutex
	// holder is the open store; nil until an attempt succeeds.
	holder *storeHolder
	// openErr is why the store is not open: the last attempt's error
	// (wrapping ErrUnavailable while a remote store is retried in the
	// background), or ErrUnloaded once the wallet was released.
	openErr error
	// retrying is closed to stop the background attempts.
	retrying chan struct{}
	released bool
}

// ErrUnavailable wraps the error of a remote store that could not be
// reached: the wallet keeps trying in the background, and a request meets
// on_store_error meanwhile.
var ErrUnavailable = errors.New("store unavailable")

// Name is the wallet's name.
func (w *Wallet) Name() string { return w.name }

// Kind is the store's backend, "sqlite" or "postgres".
func (w *Wallet) Kind() string { return w.backend.Kind() }

// SharedDSN is the DSN of the wallet's PostgreSQL database, which a fleet
// shares (other shared state, such as idempotent calls, goes there too);
// false for an SQLite wallet, one instance's. It is a secret: never log it.
func (w *Wallet) SharedDSN() (string, bool) {
	if p, ok := w.backend.(*Postgres); ok {
		return p.dsn, true
	}
	return "", false
}

// ReservationTTL is how long a reservation may stay unsettled.
func (w *Wallet) ReservationTTL() time.Duration { return w.ttl }

// AdmissionContext bounds a request's admission (Authenticate and
// Reserve) by the wallet's admission timeout.
func (w *Wallet) AdmissionContext(ctx context.Context) (context.Context, context.CancelFunc) {
	return withLazyDeadline(ctx, time.Now().Add(w.admissionTimeout))
}

// Store is the wallet's store: opened at Start (or by the first request),
// or shared with the one already open on the same database. A remote
// store that could not be reached is retried in the background; until it
// answers, Store returns an error wrapping ErrUnavailable.
func (w *Wallet) Store() (wallet.Store, error) {
	h, err := w.open()
	if err != nil {
		return nil, err
	}
	return h.store, nil
}

func (w *Wallet) open() (*storeHolder, error) {
	w.first.Do(w.attemptFirst)
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.holder != nil {
		return w.holder, nil
	}
	return nil, w.openErr
}

// startWait is how long the first attempt to open a remote store may
// hold up Start (or the first request) before the wallet starts without
// it and keeps trying in the background.
const startWait = 3 * time.Second

// attemptFirst makes the first attempt to open the store. A local store
// that fails is the config's error; a remote one is tried in the
// background with backoff until it answers.
func (w *Wallet) attemptFirst() {
	if !w.backend.Remote() {
		h, err := w.dial()
		w.mu.Lock()
		defer w.mu.Unlock()
		w.settle(h, err)
		return
	}
	w.mu.Lock()
	w.openErr = fmt.Errorf("%w: still connecting", ErrUnavailable)
	w.retrying = make(chan struct{})
	stop := w.retrying
	w.mu.Unlock()
	failures := 0
	backoff.Connect(stop, startWait, func() bool {
		h, err := w.dial()
		w.mu.Lock()
		defer w.mu.Unlock()
		if !w.settle(h, err) {
			w.openErr = fmt.Errorf("%w: %w", ErrUnavailable, err)
			if failures++; failures == 1 {
				w.logger.Error("the wallet's store cannot be reached; billed requests follow on_store_error until it answers, tried again in the background", zap.Error(err))
			}
			return false
		}
		if failures > 0 && h != nil && !w.released {
			w.logger.Warn("the wallet's store answers again; billing resumed", zap.Int("failed_attempts", failures))
		}
		return true
	})
}

// settle records an attempt's outcome under w.mu; it reports whether the
// attempts are over: the store opened, or the wallet was released (an
// attempt that opened it then gives it back).
func (w *Wallet) settle(h *storeHolder, err error) bool {
	switch {
	case w.released:
		if h != nil {
			h.removeName(w.name)
			_, _ = stores.Delete(w.backend.PoolKey())
		}
		return true
	case err != nil:
		w.openErr = err
		return false
	}
	w.holder, w.openErr = h, nil
	h.live.noteTTL(w.ttl)
	return true
}

// dial opens the store, or takes a reference on the one already open on
// the same database.
func (w *Wallet) dial() (*storeHolder, error) {
	key := w.backend.PoolKey()
	v, loaded, err := stores.LoadOrNew(key, func() (caddy.Destructor, error) {
		st, err := w.backend.Open(wallet.Options{StatementTimeout: w.statementTimeout, LeaseTTL: w.leaseTTL})
		if err != nil {
			return nil, err
		}
		wallet.SetObserver(st, storeObserver{logger: w.logger})
		// The holder's own records of its runs; the jobs view and the
		// heartbeats get them under the names of the wallets using the
		// store (addName), which a reload may change.
		own := jobs.NewRegistry(nil)
		h := &storeHolder{store: st, kind: w.backend.Kind(), logger: w.logger,
			job:      own.Job(SweepJobPrefix+w.name, SweepEvery),
			leaseJob: own.Job(LeaseJobPrefix+w.name, leaseRenewEvery), opened: time.Now(),
			stop: make(chan struct{}), done: make(chan struct{}), renewed: make(chan struct{}), drained: make(chan struct{})}
		h.exitFunc = h.exit // made once: a method value per request allocates
		h.endSettleFunc = h.endSettle
		h.live.noteTTL(w.ttl) // before the sweeper reads its tick
		// Released when the wallet is: a job no config runs is
		// retired, never overdue (see jobs.Job.Acquire).
		h.addName(w.name)
		go h.sweeper()
		go h.renewer()
		return h, nil
	})
	if err != nil {
		return nil, fmt.Errorf("opening %s store: %w", w.backend.Kind(), err)
	}
	h := v.(*storeHolder)
	if loaded {
		h.addName(w.name)
		// The store outlives the config that opened it: this config's
		// lease_ttl applies to it from now on.
		wallet.SetLeaseTTL(h.store, w.leaseTTL)
	}
	return h, nil
}

// addName records that the wallet called name uses the store: the
// store's sweeper and lease renewer run as its jobs (wallet_sweep.<name>,
// wallet_leases.<name>) until removeName, so that a reload renaming a
// wallet on the same database renames its jobs, and heartbeats attached
// by the new name are pinged.
func (h *storeHolder) addName(name string) {
	h.namesMu.Lock()
	defer h.namesMu.Unlock()
	if h.names == nil {
		h.names = map[string]int{}
	}
	if h.names[name]++; h.names[name] == 1 {
		caddykit.Jobs.Job(SweepJobPrefix+name, h.live.tick()).Acquire()
		caddykit.Jobs.Job(LeaseJobPrefix+name, leaseRenewEvery).Acquire()
	}
}

// removeName ends an addName.
func (h *storeHolder) removeName(name string) {
	h.namesMu.Lock()
	defer h.namesMu.Unlock()
	if h.names[name] == 0 {
		return
	}
	if h.names[name]--; h.names[name] == 0 {
		delete(h.names, name)
		caddykit.Jobs.Job(SweepJobPrefix+name, 0).Release()
		caddykit.Jobs.Job(LeaseJobPrefix+name, 0).Release()
	}
}

// namedJobs are the jobs named prefix + the name of each wallet using
// the store, after the holder's own record.
func (h *storeHolder) namedJobs(own *jobs.Job, prefix string) []*jobs.Job {
	h.namesMu.Lock()
	defer h.namesMu.Unlock()
	out := []*jobs.Job{own}
	for _, name := range slices.Sorted(maps.Keys(h.names)) {
		out = append(out, caddykit.Jobs.Job(prefix+name, 0))
	}
	return out
}

// runJobs runs fn once, as a run of every job of js.
func runJobs(ctx context.Context, js []*jobs.Job, fn func(context.Context) (jobs.Summary, error)) (jobs.Summary, error) {
	if len(js) == 0 {
		return fn(ctx)
	}
	var summary jobs.Summary
	err := js[0].Run(ctx, func(ctx context.Context) (jobs.Summary, error) {
		var err error
		summary, err = runJobs(ctx, js[1:], fn)
		return summary, err
	})
	return summary, err
}

// release gives the pooled store back and stops the background attempts.
// A request arriving after Cleanup cannot open the store any more; one of
// this config still in flight keeps the store it has (its holder waits
// for it before closing).
func (w *Wallet) release() {
	w.first.Do(func() {}) // no first attempt after release
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.released {
		return
	}
	w.released = true
	if w.retrying != nil {
		close(w.retrying)
	}
	if w.holder != nil {
		w.holder.removeName(w.name)
		_, _ = stores.Delete(w.backend.PoolKey())
		return
	}
	w.openErr = fmt.Errorf("wallet %q: %w", w.name, ErrUnloaded)
}

// Enter counts a request in flight on the wallet's store, from the moment
// it reaches the handler, so that the store is never closed under it. The
// request must call exit when it has settled. A store that cannot be
// opened counts nothing; the admission that follows reports the error.
func (w *Wallet) Enter() (exit func()) {
	h, err := w.open()
	if err != nil {
		return func() {}
	}
	h.enter()
	return h.exitFunc
}

// SettleAsync charges a reservation's usage and releases the rest, one
// ledger row per entry (see wallet.Store.SettleAsync), for a request whose
// handler has returned: done gets the outcome, and must not block. Like
// Enter it keeps the store open until done has returned, and the release
// of the store waits for it, so that a shutdown (Caddy exits right after
// its modules are cleaned up) does not lose charges already decided.
func (w *Wallet) SettleAsync(reservationID string, entries []wallet.Entry, done func(charged wallet.Micros, err error)) {
	h, end, err := w.beginSettle()
	if err != nil {
		done(0, err)
		return
	}
	h.store.SettleAsync(reservationID, entries, func(charged wallet.Micros, err error) {
		defer end()
		done(charged, err)
	})
}

// beginSettle counts a settlement until end is called.
func (w *Wallet) beginSettle() (h *storeHolder, end func(), _ error) {
	h, err := w.open()
	if err != nil {
		return nil, nil, err
	}
	h.mu.Lock()
	h.inflight++
	h.settling++
	h.mu.Unlock()
	settlementsPending.Inc()
	return h, h.endSettleFunc, nil
}

// Authenticate finds the key a client presented.
func (w *Wallet) Authenticate(ctx context.Context, secret string) (wallet.Key, error) {
	st, err := w.Store()
	if err != nil {
		return wallet.Key{}, err
	}
	return st.Authenticate(ctx, secret)
}

// KnownKey returns the key if this instance verified it against the
// database within the last hour (wallet.Store.KnownKey): the clients
// on_store_error allow may serve while the store cannot be asked. A store
// that never opened knows no key.
func (w *Wallet) KnownKey(secret string) (wallet.Key, bool) {
	w.mu.Lock()
	h := w.holder
	w.mu.Unlock()
	if h == nil {
		return wallet.Key{}, false
	}
	return h.store.KnownKey(secret)
}

// SweepEvery is how often the sweeper runs: SweepEvery, or a third of the
// shortest reservation TTL of the configs sharing the store.
func (w *Wallet) SweepEvery() time.Duration {
	w.mu.Lock()
	h := w.holder
	w.mu.Unlock()
	if h == nil {
		return min(SweepEvery, max(w.ttl/3, 10*time.Millisecond))
	}
	return h.live.tick()
}

// Remote reports whether the store is reached over the network, shared
// by every instance, and may be down for a while (see Backend.Remote).
func (w *Wallet) Remote() bool { return w.backend.Remote() }

// Reserve holds back the request's largest cost.
func (w *Wallet) Reserve(ctx context.Context, r wallet.Reservation) error {
	st, err := w.Store()
	if err != nil {
		return err
	}
	return st.Reserve(ctx, r)
}

// RecordAttemptAsync writes a zero-charge row for a failed upstream
// attempt in the background (see wallet.Store); a failure is logged.
func (w *Wallet) RecordAttemptAsync(e wallet.Entry) {
	st, err := w.Store()
	if err == nil {
		st.RecordAttemptAsync(e, func(err error) {
			if err != nil {
				w.logger.Error("recording a failed attempt", zap.String("request_id", e.RequestID), zap.Error(err))
			}
		})
		return
	}
	w.logger.Error("recording a failed attempt", zap.String("request_id", e.RequestID), zap.Error(err))
}

// KeepAlive keeps a reserved request's reservation from expiring until
// the returned func is called (after its settlement).
func (w *Wallet) KeepAlive(reservationID string) (done func()) {
	h, err := w.open()
	if err != nil {
		return func() {}
	}
	h.live.add(reservationID, w.ttl)
	return func() { h.live.remove(reservationID) }
}

// Heartbeat reports when the sweeper last ran and its last error.
func (w *Wallet) Heartbeat() (time.Time, string) {
	h, err := w.open()
	if err != nil {
		return time.Time{}, err.Error()
	}
	st := h.job.Status(time.Now())
	last, lastErr := st.LastSuccess, ""
	if st.LastErrorAt.After(st.LastSuccess) {
		last, lastErr = st.LastErrorAt, st.LastError
	}
	return last, lastErr
}

// storeHolder owns an open store, its sweeper and the requests in flight.
type storeHolder struct {
	store wallet.Store
	job   *jobs.Job // the sweeper's record and heartbeats
	// leaseJob is the lease renewer's (keepalive.go); opened is when the
	// store opened, the renewer's grace before its first success.
	leaseJob *jobs.Job
	opened   time.Time
	kind     string
	logger   *zap.Logger
	stop     chan struct{}
	done     chan struct{}
	// renewed is closed when the lease renewer has stopped.
	renewed chan struct{}
	live    liveSet
	// names counts the wallets using the store, by name (addName).
	namesMu sync.Mutex
	names   map[string]int

	exitFunc      func() // exit, for Enter
	endSettleFunc func() // endSettle, for beginSettle

	mu       sync.Mutex
	inflight int // requests in flight, settling or not
	settling int // of which settling after their handler returned
	// settled, when not nil, is closed when settling reaches 0.
	settled  chan struct{}
	draining bool
	drained  chan struct{} // closed when draining and nothing is in flight
}

func (h *storeHolder) enter() {
	h.mu.Lock()
	h.inflight++
	h.mu.Unlock()
}

// endSettle ends a beginSettle. Under one lock, so that a release woken
// by the last settlement already sees drained closed when nothing else is
// in flight.
func (h *storeHolder) endSettle() {
	settlementsPending.Dec()
	h.mu.Lock()
	defer h.mu.Unlock()
	h.leaveLocked()
	h.settling--
	if h.settling == 0 && h.settled != nil {
		close(h.settled)
		h.settled = nil
	}
}

func (h *storeHolder) exit() {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.leaveLocked()
}

func (h *storeHolder) leaveLocked() {
	h.inflight--
	if h.inflight == 0 && h.draining {
		close(h.drained)
	}
}

// sweeper extends the live requests' reservations (see keepalive.go) and
// releases expired ones, on start and then every tick: SweepEvery, or a
// third of the shortest reservation TTL when that is shorter. It extends
// first, so that a live reservation never reaches the sweep expired. A
// panic is logged and the sweeper goes on.
func (h *storeHolder) sweeper() {
	defer close(h.done)
	for {
		tick := h.live.tick()
		for _, j := range h.namedJobs(h.job, SweepJobPrefix) {
			j.SetEvery(tick) // the period it keeps, for the jobs view and overdue
		}
		h.sweepRecovering()
		select {
		case <-h.stop:
			return
		case <-time.After(tick):
		}
	}
}

func (h *storeHolder) sweepRecovering() {
	defer func() {
		if r := recover(); r != nil {
			h.logger.Error("wallet sweeper panicked; it runs again at the next tick",
				zap.Any("panic", r), zap.ByteString("stack", debug.Stack()))
		}
	}()
	// Keeping live reservations alive comes first: a reservation the
	// sweep would release while its request still streams is the bug
	// the extension exists for.
	h.extend()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_, _ = runJobs(ctx, h.namedJobs(h.job, SweepJobPrefix), h.sweep)
}

// sweep is one run of the sweeper job.
func (h *storeHolder) sweep(ctx context.Context) (jobs.Summary, error) {
	n, err := h.store.Sweep(ctx, time.Now())
	switch {
	case err != nil:
		sweepTotal.WithLabelValues("error").Inc()
		h.logger.Error("wallet sweep failed", zap.Error(err))
	case n > 0:
		sweepTotal.WithLabelValues("released").Add(float64(n))
		h.logger.Warn("released expired wallet reservations", zap.Int("count", n))
	}
	if err != nil {
		return "", err
	}
	if err := h.renewerStalled(time.Now()); err != nil {
		h.logger.Error("wallet sweep reports a stalled lease renewer", zap.Error(err))
		return "", err
	}
	sweepHeartbeat.SetToCurrentTime()
	return jobs.Summary(fmt.Sprintf("released %d expired reservation(s)", n)), nil
}

// Destruct runs when no config uses the store any more. Caddy cleans the
// old config up while its requests may still run, so the store closes
// only once every request that entered has exited (bounded), and in the
// background: a reload must not block on the longest open stream.
func (h *storeHolder) Destruct() error {
	h.mu.Lock()
	h.draining = true
	if h.inflight == 0 {
		close(h.drained)
	}
	var settled chan struct{}
	if h.settling > 0 {
		settled = make(chan struct{})
		h.settled = settled
	}
	h.mu.Unlock()
	if settled != nil {
		// Settlements already decided are written before this returns:
		// at shutdown Caddy exits right after its cleanups.
		if !waitAtMost(settled, settleDrainLimit) {
			h.logger.Error("releasing the wallet store with settlements still unwritten; if the process exits now they are lost (their money is released uncharged after lease_ttl)")
		}
	}
	select {
	case <-h.drained:
		// Nothing in flight (a shutdown, once the server has finished its
		// requests): close now, so that the leases' spare money goes back
		// before the process exits instead of after lease_ttl. A database
		// that does not answer holds a reload for at most closeWait.
		closed := make(chan struct{})
		go func() { h.close(); close(closed) }()
		if !waitAtMost(closed, closeWait) {
			h.logger.Warn("closing the wallet store is slow; finishing in the background (if the process exits first, its leases are released after lease_ttl)")
		}
	default:
		go func() {
			select {
			case <-h.drained:
			case <-time.After(drainLimit):
				h.logger.Error("closing wallet store with requests still unsettled; their reservations expire and are released by the sweeper")
			}
			h.close()
		}()
	}
	return nil
}

// waitAtMost waits until ch is closed or d has passed, and reports
// whether ch was closed.
func waitAtMost(ch <-chan struct{}, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ch:
		return true
	case <-t.C:
		return false
	}
}

// close stops the sweeper and the renewer and closes the store. The
// sweeper, which also keeps draining requests' reservations alive, stops
// only once they have left.
func (h *storeHolder) close() {
	close(h.stop)
	<-h.done
	<-h.renewed
	if err := h.store.Close(); err != nil {
		h.logger.Error("closing wallet store", zap.Error(err))
	}
	// Every wallet gave its name back before the store was destructed;
	// whatever is left is retired with the store.
	h.namesMu.Lock()
	defer h.namesMu.Unlock()
	for name := range h.names {
		caddykit.Jobs.Job(SweepJobPrefix+name, 0).Release()
		caddykit.Jobs.Job(LeaseJobPrefix+name, 0).Release()
	}
	h.names = nil
}
