package llmfailover

import (
	"context"
	"fmt"
	"path/filepath"
	"runtime/debug"
	"sync"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"go.uber.org/zap"

	"github.com/llmfailover/caddy-llm-failover/history"
	"github.com/llmfailover/caddy-llm-failover/history/store"
	"github.com/llmfailover/caddy-llm-failover/internal/caddykit"
	"github.com/llmfailover/caddy-llm-failover/jobs"
	"github.com/llmfailover/caddy-llm-failover/journal"
)

// HistoryStoreConfig keeps the status history and the decision journal in
// a database, so that they survive restarts; on PostgreSQL several
// instances share it and every instance's page shows the fleet's totals.
type HistoryStoreConfig struct {
	// Store is sqlite or postgres.
	Store string `json:"store"`
	// Path is the SQLite file. Default: llm_failover/history.db in
	// Caddy's data directory.
	Path string `json:"path,omitempty"`
	// DSN is the PostgreSQL connection string; placeholders such as
	// {env.HISTORY_DSN} are resolved when the config starts. It may hold
	// a password: it appears in no log line.
	DSN string `json:"dsn,omitempty"`
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

// unmarshalHistory reads `history sqlite [<path>]` or `history postgres <dsn>`.
func unmarshalHistory(d *caddyfile.Dispenser) (*HistoryStoreConfig, error) {
	c := new(HistoryStoreConfig)
	if !d.NextArg() {
		return nil, d.ArgErr()
	}
	c.Store = d.Val()
	switch c.Store {
	case "sqlite":
		if d.NextArg() {
			c.Path = d.Val()
		}
	case "postgres":
		if !d.NextArg() {
			return nil, d.Errf("history postgres needs a <dsn>")
		}
		c.DSN = d.Val()
	default:
		return nil, d.Errf("history: unknown store %q (use sqlite or postgres)", c.Store)
	}
	return c, caddykit.NoMoreArgs(d)
}

func (c *HistoryStoreConfig) check() error {
	switch {
	case c.Store == "sqlite" && c.DSN != "":
		return fmt.Errorf("history: sqlite takes a path, not a dsn")
	case c.Store == "postgres" && (c.DSN == "" || c.Path != ""):
		return fmt.Errorf("history: postgres needs a dsn and takes no path")
	case c.Store != "sqlite" && c.Store != "postgres":
		return fmt.Errorf("history: unknown store %q (use sqlite or postgres)", c.Store)
	}
	return nil
}

// poolKey names the database, so that configs naming the same one share
// one open store across reloads.
func (c *HistoryStoreConfig) poolKey() string {
	if c.Store == "sqlite" {
		return "sqlite:" + c.sqlitePath()
	}
	return "postgres:" + c.DSN
}

func (c *HistoryStoreConfig) sqlitePath() string {
	if c.Path == "" {
		return filepath.Join(caddy.AppDataDir(), "llm_failover", "history.db")
	}
	return c.Path
}

func (c *HistoryStoreConfig) open() (*store.Store, error) {
	if c.Store == "sqlite" {
		return store.OpenSQLite(c.sqlitePath())
	}
	dsn, err := caddy.NewReplacer().ReplaceOrErr(c.DSN, true, true)
	if err != nil {
		return nil, fmt.Errorf("history dsn: %w", err)
	}
	return store.OpenPostgres(context.Background(), dsn)
}

// historyStores are the open history databases, shared by the configs
// that name them; the flush job lives in the pooled holder.
var historyStores = caddy.NewUsagePool()

// historyHolder is one open history store and its flush job.
type historyHolder struct {
	store  *store.Store
	state  *statusState
	logger *zap.Logger
	job    *jobs.Job
	stop   chan struct{}
	done   chan struct{}
	runs   int
}

// useHistory records the history store a handler asks for; every handler
// of a config must name the same one (or none).
func (a *App) useHistory(c *HistoryStoreConfig) error {
	if c == nil {
		return nil
	}
	if err := c.check(); err != nil {
		return err
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.historyCfg != nil && a.historyCfg.poolKey() != c.poolKey() {
		return fmt.Errorf("history: every llm_failover handler of a config must name the same store")
	}
	a.historyCfg = c
	return nil
}

// startHistory opens the config's history store (in Start, so `caddy
// validate` touches no disk) and makes it the one the history flushes to
// and the page reads from; with none, the history stays in memory.
func (a *App) startHistory() error {
	if a.status == nil {
		return nil
	}
	if a.historyCfg == nil {
		a.status.attach(nil)
		return nil
	}
	key := a.historyCfg.poolKey()
	v, _, err := historyStores.LoadOrNew(key, func() (caddy.Destructor, error) {
		st, err := a.historyCfg.open()
		if err != nil {
			return nil, err
		}
		h := &historyHolder{store: st, state: a.status, logger: a.logger.Named("history"),
			job:  caddykit.Jobs.Job(HistoryFlushJob, historyFlushEvery),
			stop: make(chan struct{}), done: make(chan struct{})}
		go h.flusher()
		return h, nil
	})
	if err != nil {
		return fmt.Errorf("opening the %s history store: %w", a.historyCfg.Store, err)
	}
	a.historyKey = key
	a.status.attach(v.(*historyHolder))
	return nil
}

// releaseHistory gives this config's store reference back.
func (a *App) releaseHistory() {
	if a.historyKey != "" {
		_, _ = historyStores.Delete(a.historyKey)
		a.historyKey = ""
	}
}

// flusher runs the flush job every historyFlushEvery until Destruct.
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
	now := time.Now()
	deltas, decisions := st.history.TakeChanges(), st.journal.TakeChanges()
	if err := h.store.Flush(ctx, deltas, decisions); err != nil {
		st.history.PutBack(deltas, now)
		st.journal.PutBack(decisions)
		return "", err
	}
	if h.runs++; h.runs%pruneEvery == 1 {
		if err := h.store.Prune(ctx, now); err != nil {
			return "", err
		}
	}
	return jobs.Summary(fmt.Sprintf("flushed %d bucket(s), %d decision(s)", len(deltas), len(decisions))), nil
}

// Destruct stops the flush job, flushes once more and closes the store,
// when no config uses it any more.
func (h *historyHolder) Destruct() error {
	close(h.stop)
	<-h.done
	h.flushRecovering()
	h.state.detach(h)
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

// sources returns the history and journal to show: this process's own
// when there is no store, or when the store cannot be read (logged);
// otherwise the fleet's.
func (s *statusState) sources(now time.Time) (*history.Recorder, *journal.Journal) {
	h, r := s.store()
	if h == nil {
		return s.history, s.journal
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.history != nil && now.Sub(r.read) < historyReadCache && !now.Before(r.read) {
		return r.history, r.journal
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	rec, jr, err := h.fleet(ctx, now, s)
	if err != nil {
		h.logger.Error("reading the history store; showing this instance's history", zap.Error(err))
		return s.history, s.journal
	}
	r.read, r.history, r.journal = now, rec, jr
	return rec, jr
}

// fleet reads every instance's flushed history and decisions and adds
// this one's pending changes.
func (h *historyHolder) fleet(ctx context.Context, now time.Time, s *statusState) (*history.Recorder, *journal.Journal, error) {
	ds, err := h.store.Buckets(ctx, now)
	if err != nil {
		return nil, nil, err
	}
	decisions, err := h.store.Decisions(ctx, journal.DefaultSize)
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
	_ caddy.Destructor = (*historyHolder)(nil)
)
