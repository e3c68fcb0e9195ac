package failoverapp

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"runtime/debug"
	"sync"
	"time"

	"github.com/caddyserver/caddy/v2"
	"go.uber.org/zap"

	"github.com/llmfailover/caddy-llm-failover/history"
	"github.com/llmfailover/caddy-llm-failover/history/store"
	"github.com/llmfailover/caddy-llm-failover/internal/backoff"
	"github.com/llmfailover/caddy-llm-failover/internal/caddykit"
	"github.com/llmfailover/caddy-llm-failover/internal/pgconf"
	"github.com/llmfailover/caddy-llm-failover/jobs"
	"github.com/llmfailover/caddy-llm-failover/journal"
)

func init() {
	caddy.RegisterModule(HistorySQLite{})
	caddy.RegisterModule(HistoryPostgres{})
}

// HistoryBackend is a history store module (namespace
// llm_failover.history_stores): it names a database and opens it.
// Provision only resolves the configuration; Open is what touches the
// database.
type HistoryBackend interface {
	// Kind is "sqlite" or "postgres".
	Kind() string
	// PoolKey identifies the database, so that configs naming the same
	// one share one open store across reloads. It may hold secrets: never
	// log it.
	PoolKey() string
	// Open opens (creating or migrating) the database.
	Open() (*store.Store, error)
	// Remote reports whether the database is reached over the network
	// and may be down for a while: the history then starts in memory and
	// the store connects in the background, instead of refusing the
	// config.
	Remote() bool
}

// HistorySQLite keeps the history in an SQLite file: one instance's.
type HistorySQLite struct {
	// Path is the database file. Default: llm_failover/history.db under
	// Caddy's data directory.
	Path string `json:"path,omitempty"`

	abs string
}

// CaddyModule returns the Caddy module information.
func (HistorySQLite) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "llm_failover.history_stores.sqlite",
		New: func() caddy.Module { return new(HistorySQLite) },
	}
}

// Provision resolves the path; it creates nothing.
func (s *HistorySQLite) Provision(caddy.Context) error {
	path := s.Path
	if path == "" {
		path = filepath.Join(caddy.AppDataDir(), "llm_failover", "history.db")
	}
	// Resolved like a DSN: an unset {env.*} is an error naming it, never
	// a path with a hole (/history.db at the root).
	resolved, err := caddykit.Resolve(path)
	if err != nil {
		return fmt.Errorf("history sqlite path: %w", err)
	}
	abs, err := filepath.Abs(resolved)
	if err != nil {
		return fmt.Errorf("history sqlite path %q: %w", s.Path, err)
	}
	s.abs = abs
	return nil
}

// Kind implements HistoryBackend.
func (*HistorySQLite) Kind() string { return "sqlite" }

// Remote implements HistoryBackend: a file cannot be down, so failing to
// open it is the config's mistake.
func (*HistorySQLite) Remote() bool { return false }

// PoolKey implements HistoryBackend.
func (s *HistorySQLite) PoolKey() string { return "sqlite:" + s.abs }

// Open implements HistoryBackend.
func (s *HistorySQLite) Open() (*store.Store, error) { return store.OpenSQLite(s.abs) }

// HistoryPostgres keeps the history in PostgreSQL, shared by a fleet:
// every instance's page shows the fleet's totals.
type HistoryPostgres struct {
	// DSN is the connection string; it may be a placeholder such as
	// {env.HISTORY_DSN}, resolved at Provision and never shown.
	DSN string `json:"dsn"`

	dsn string
}

// CaddyModule returns the Caddy module information.
func (HistoryPostgres) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "llm_failover.history_stores.postgres",
		New: func() caddy.Module { return new(HistoryPostgres) },
	}
}

// Provision resolves the DSN; it connects to nothing.
func (p *HistoryPostgres) Provision(caddy.Context) error {
	dsn, err := caddykit.Resolve(p.DSN)
	if err != nil {
		return fmt.Errorf("history postgres DSN: %w", err)
	}
	if err := pgconf.Validate(dsn); err != nil {
		return fmt.Errorf("history postgres: %w", err)
	}
	p.dsn = dsn
	return nil
}

// Kind implements HistoryBackend.
func (*HistoryPostgres) Kind() string { return "postgres" }

// Remote implements HistoryBackend.
func (*HistoryPostgres) Remote() bool { return true }

// PoolKey implements HistoryBackend.
func (p *HistoryPostgres) PoolKey() string { return "postgres:" + p.dsn }

// historyOpenTimeout bounds connecting and migrating.
const historyOpenTimeout = 15 * time.Second

// Open implements HistoryBackend.
func (p *HistoryPostgres) Open() (*store.Store, error) {
	ctx, cancel := context.WithTimeout(context.Background(), historyOpenTimeout)
	defer cancel()
	return store.OpenPostgres(ctx, p.dsn)
}

// historyFlushEvery is how often the flush job writes what the buckets
// gained: one upsert per touched bucket, not one per attempt.
const historyFlushEvery = 5 * time.Second

// historyReadCache is how long a page render reuses the fleet's history
// read from the store.
const historyReadCache = 2 * time.Second

// HistoryFlushJob is the flush job's name in GET /llm_failover/jobs and
// for heartbeats.
const HistoryFlushJob = "history_flush"

// historyStores are the open history databases, shared by the configs
// that name them; the flush job lives in the pooled holder, so that a
// reload keeping the database keeps its flusher.
var historyStores = caddy.NewUsagePool()

// historyHolder is one history store and its flush job.
type historyHolder struct {
	// mu guards store: nil while a remote store is being connected in the
	// background (the history stays in memory meanwhile).
	mu      sync.Mutex
	store   *store.Store
	openErr error
	closed  bool
	state   *statusState
	logger  *zap.Logger
	job     *jobs.Job
	// remote: the store is the fleet's, and so is the cache-affinity
	// table in it (affinity.go); pins are what waits to be written there.
	remote bool
	pins   pinQueue
	stop   chan struct{}
	done   chan struct{}
	runs   int
}

// startHistory opens the config's history store (in Start, so that
// `caddy validate` touches no disk) and makes it the one the history
// flushes to and the page reads from; with none, the history stays in
// memory.
func (a *App) startHistory() error {
	if a.history == nil {
		// The store of the config this one replaces, if any, stays
		// attached until that config releases it (its last flush then
		// writes what it recorded): this config may yet be refused by an
		// app that starts after this one, and then that config runs on.
		return nil
	}
	key := a.history.PoolKey()
	v, _, err := historyStores.LoadOrNew(key, func() (caddy.Destructor, error) {
		h := &historyHolder{state: a.status, logger: a.logger.Named("history"),
			job:    caddykit.Jobs.Job(HistoryFlushJob, historyFlushEvery),
			remote: a.history.Remote(), pins: newPinQueue(),
			stop: make(chan struct{}), done: make(chan struct{})}
		if err := h.connect(a.history); err != nil {
			return nil, err
		}
		// The job is this holder's while it runs: once the last config
		// using the store lets it go, the job leaves the jobs view and
		// readiness with it.
		h.job.Acquire()
		go h.flusher()
		return h, nil
	})
	if err != nil {
		return fmt.Errorf("opening the %s history store: %w", a.history.Kind(), err)
	}
	a.historyKey = key
	a.holder = v.(*historyHolder)
	a.status.attach(a.holder)
	return nil
}

// restoreHistory gives the history back to the running config's store
// when this config attached its own and is not the one running: an app
// that started after this one failed, Caddy stopped this one, and the
// config it was to replace runs on. Without it that config's history
// flushed nowhere (or into the refused config's store) from then on.
func (a *App) restoreHistory() {
	a.mu.Lock()
	mine := a.holder
	a.mu.Unlock()
	if mine == nil || a.status.attached() != mine {
		return
	}
	act := active()
	if act == nil || act == a {
		return
	}
	act.mu.Lock()
	theirs := act.holder
	act.mu.Unlock()
	a.status.attach(theirs)
}

// connect opens the store. A remote one that does not answer within
// backoff's start wait is connected in the background until Destruct,
// while the history stays in memory and flushes wait for it: a database
// outage at start must not refuse the config (every site of this Caddy
// would go down with it).
func (h *historyHolder) connect(b HistoryBackend) error {
	if !b.Remote() {
		st, err := b.Open()
		h.store = st
		return err
	}
	failures := 0
	backoff.Connect(h.stop, historyStartWait, func() bool {
		st, err := b.Open()
		h.mu.Lock()
		defer h.mu.Unlock()
		switch {
		case err != nil:
			if failures++; failures == 1 {
				h.logger.Error("the history store cannot be reached; the history is kept in memory and the store tried again in the background", zap.Error(err))
			}
			h.openErr = err
			return false
		case h.closed:
			_ = st.Close()
		default:
			h.store = st
			if failures > 0 {
				h.logger.Warn("the history store answers again", zap.Int("failed_attempts", failures))
			}
		}
		return true
	})
	return nil
}

// opened is the store, or nil and why while it is not connected.
func (h *historyHolder) opened() (*store.Store, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.store == nil {
		return nil, fmt.Errorf("the history store is not connected yet: %w", cmp.Or(h.openErr, errConnecting))
	}
	return h.store, nil
}

// errConnecting is why a store whose first attempt has not ended yet is
// not there.
var errConnecting = errors.New("connecting")

// historyStartWait is how long a remote history store may hold up Start.
const historyStartWait = 3 * time.Second

// releaseHistory gives this config's store reference back.
func (a *App) releaseHistory() {
	a.restoreHistory()
	a.mu.Lock()
	key := a.historyKey
	a.historyKey = ""
	a.mu.Unlock()
	if key != "" {
		_, _ = historyStores.Delete(key)
	}
}

// flusher runs the flush job every historyFlushEvery until Destruct, and
// writes cache-affinity pins as they come: a conversation's next turn may
// reach another instance within a second.
func (h *historyHolder) flusher() {
	defer close(h.done)
	t := time.NewTicker(historyFlushEvery)
	defer t.Stop()
	for {
		select {
		case <-h.stop:
			return
		case <-t.C:
			h.flushRecovering()
		case <-h.pins.wake:
			h.writePinsNow()
		}
	}
}

func (h *historyHolder) flushRecovering() {
	defer func() {
		if r := recover(); r != nil {
			h.logger.Error("history flush panicked; it runs again at the next tick",
				zap.Any("panic", r), zap.ByteString("stack", debug.Stack()))
		}
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := h.job.Run(ctx, h.flush); err != nil {
		h.logger.Error("history flush failed; the changes are kept for the next one", zap.Error(err))
	}
}

// pruneEvery is how many flushes pass between two prunes of the store.
const pruneEvery = 60

// flush is one run of the flush job: what the buckets gained and the new
// decisions since the last run, in one transaction; on failure they go
// back to be flushed with the next run.
func (h *historyHolder) flush(ctx context.Context) (jobs.Summary, error) {
	st := h.state
	if st.attached() != h {
		return "detached", nil
	}
	db, err := h.opened()
	if err != nil {
		return "", err // the changes wait in memory
	}
	now := time.Now()
	deltas, decisions := st.history.TakeChanges(), st.journal.TakeChanges()
	if err := db.Flush(ctx, deltas, decisions); err != nil {
		st.history.PutBack(deltas, now)
		st.journal.PutBack(decisions)
		return "", err
	}
	pins, err := h.writePins(ctx)
	if err != nil {
		return "", err
	}
	if h.runs++; h.runs%pruneEvery == 1 {
		if err := db.Prune(ctx, now); err != nil {
			return "", err
		}
	}
	summary := fmt.Sprintf("flushed %d bucket(s), %d decision(s)", len(deltas), len(decisions))
	if pins > 0 {
		summary += fmt.Sprintf(", %d affinity pin(s)", pins)
	}
	return jobs.Summary(summary), nil
}

// Destruct stops the flush job, flushes once more and closes the store,
// when no config uses it any more.
func (h *historyHolder) Destruct() error {
	close(h.stop)
	<-h.done
	h.flushRecovering()
	h.job.Release()
	h.state.detach(h)
	h.mu.Lock()
	defer h.mu.Unlock()
	h.closed = true
	if h.store == nil {
		return nil
	}
	return h.store.Close()
}

// historyReader is what the page and the admin API read: the fleet's
// history from the store plus this instance's changes not yet flushed,
// cached for historyReadCache.
type historyReader struct {
	mu      sync.Mutex
	read    time.Time
	history *history.Recorder
	journal *journal.Journal
	// reading is set while one page view reads the store; failed is when
	// the last read failed (zero after a success).
	reading bool
	failed  time.Time
}

// attach makes h the store the history flushes to (nil: none).
func (s *statusState) attach(h *historyHolder) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.holder == h {
		return
	}
	s.holder = h
	s.reader = new(historyReader)
	s.history.Track(h != nil)
	s.journal.Track(h != nil)
}

// detach forgets h if it is still the attached store.
func (s *statusState) detach(h *historyHolder) {
	s.mu.Lock()
	attached := s.holder == h
	s.mu.Unlock()
	if attached {
		s.attach(nil)
	}
}

func (s *statusState) attached() *historyHolder {
	h, _ := s.store()
	return h
}

func (s *statusState) store() (*historyHolder, *historyReader) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.holder, s.reader
}

// History read bounds: one read at a time, each bounded; after a failed
// one the page shows this instance's history for a while without asking,
// so that a store that hangs costs one bounded wait per retry interval,
// not one per page view.
const (
	historyReadTimeout = 2 * time.Second
	historyReadRetry   = 10 * time.Second
)

// sources returns the history and journal to show: the fleet's from the
// store, or this process's own when there is no store or it cannot be
// read (logged). A page view never waits behind another's read: while one
// is under way the others get the last one read, or this process's own.
func (s *statusState) sources(now time.Time) (*history.Recorder, *journal.Journal) {
	h, r := s.store()
	if h == nil {
		return s.history, s.journal
	}
	r.mu.Lock()
	fresh := r.history != nil && now.Sub(r.read) < historyReadCache && !now.Before(r.read)
	resting := !r.failed.IsZero() && now.Sub(r.failed) < historyReadRetry && !now.Before(r.failed)
	if fresh || resting || r.reading {
		rec, jr := r.history, r.journal
		r.mu.Unlock()
		if rec == nil || resting {
			return s.history, s.journal
		}
		return rec, jr
	}
	r.reading = true
	r.mu.Unlock()

	ctx, cancel := context.WithTimeout(context.Background(), historyReadTimeout)
	defer cancel()
	rec, jr, err := h.fleet(ctx, now, s)
	r.mu.Lock()
	defer r.mu.Unlock()
	r.reading = false
	if err != nil {
		h.logger.Error("reading the history store; showing this instance's history", zap.Error(err),
			zap.Duration("next_try_in", historyReadRetry))
		r.failed = now
		return s.history, s.journal
	}
	r.failed = time.Time{}
	r.read, r.history, r.journal = now, rec, jr
	return rec, jr
}

// fleet reads every instance's flushed history and decisions and adds
// this one's pending changes.
func (h *historyHolder) fleet(ctx context.Context, now time.Time, s *statusState) (*history.Recorder, *journal.Journal, error) {
	db, err := h.opened()
	if err != nil {
		return nil, nil, err
	}
	ds, err := db.Buckets(ctx, now)
	if err != nil {
		return nil, nil, err
	}
	decisions, err := db.Decisions(ctx, journal.DefaultSize)
	if err != nil {
		return nil, nil, err
	}
	rec := history.NewRecorder()
	for _, d := range append(ds, s.history.Changes()...) {
		rec.AddDelta(d)
	}
	jr := journal.New(journal.DefaultSize)
	for _, d := range append(decisions, s.journal.Changes()...) {
		jr.Add(d)
	}
	return rec, jr, nil
}

// Interface guards
var (
	_ HistoryBackend    = (*HistorySQLite)(nil)
	_ HistoryBackend    = (*HistoryPostgres)(nil)
	_ caddy.Provisioner = (*HistorySQLite)(nil)
	_ caddy.Provisioner = (*HistoryPostgres)(nil)
	_ caddy.Destructor  = (*historyHolder)(nil)
)
