package failoverapp

import (
	"context"
	"fmt"
	"runtime/debug"
	"sync"
	"time"

	"github.com/caddyserver/caddy/v2"
	"go.uber.org/zap"

	"github.com/llmfailover/caddy-llm-failover/idempotency"
	"github.com/llmfailover/caddy-llm-failover/idempotency/store"
	"github.com/llmfailover/caddy-llm-failover/internal/caddykit"
	"github.com/llmfailover/caddy-llm-failover/jobs"
)

// The idempotency table is the process's, like the breakers: a call's
// duplicates find its flight or kept answer across `caddy reload`, and
// every handler of the process shares it (a key is scoped to a client,
// never to a handler). Behind it, an idempotency store (the wallet's
// PostgreSQL, which a fleet shares, or an embedded SQLite file) keeps
// which instance runs each call and the completed calls' answers, so a
// duplicate that reaches another instance, or this one after a restart,
// is answered once too.
var idempotencyTable = idempotency.NewTable()

// Idempotency is the process's idempotency table.
func (*App) Idempotency() *idempotency.Table { return idempotencyTable }

// IdempotencySweepJob is the sweeper's name in GET /llm_failover/jobs and
// for heartbeats.
const IdempotencySweepJob = "idempotency_sweep"

// idempotencySweepEvery is how often expired calls are deleted.
const idempotencySweepEvery = time.Minute

// idempotencyRetry is how long a store that failed to open is left alone
// before the next request tries again (requests meanwhile run as on one
// instance).
const idempotencyRetry = 10 * time.Second

// idempotencyStores are the open idempotency databases, shared by the
// configs that name them.
var idempotencyStores = caddy.NewUsagePool()

// IdempotencyStore is one idempotency database: opened on first use (a
// database that is down at start does not refuse the config), swept by
// its job while any config uses it.
type IdempotencyStore struct {
	open   func() (*store.Store, error)
	logger *zap.Logger
	job    *jobs.Job
	stop   chan struct{}
	done   chan struct{}

	mu       sync.Mutex
	st       *store.Store
	failedAt time.Time
	closed   bool
	// claims counts the runs that claimed a call in st and have not
	// recorded its end: a config released by a reload (onto another
	// database) leaves st open for them, and the last one closes it.
	claims int
}

// Hold keeps the store open until done is called, for a run that may
// claim a call in it: its end (the answer, or the abandon) is written
// there even after the config that opened the store was unloaded, or the
// fleet's other instances would see the call running and, once its lease
// passed, run it again.
func (s *IdempotencyStore) Hold() (done func()) {
	s.mu.Lock()
	s.claims++
	s.mu.Unlock()
	var once sync.Once
	return func() {
		once.Do(func() {
			s.mu.Lock()
			s.claims--
			var st *store.Store
			if s.claims == 0 && s.closed {
				st, s.st = s.st, nil
			}
			s.mu.Unlock()
			if st != nil {
				_ = st.Close()
			}
		})
	}
}

// IdempotencyStore returns the idempotency store on the wallet's
// PostgreSQL (dsn, when shared) or the embedded SQLite file, for this
// config; the app releases it at Cleanup.
func (a *App) IdempotencyStore(dsn string, shared bool) (*IdempotencyStore, error) {
	key, open := "sqlite", func() (*store.Store, error) {
		return store.OpenSQLite(caddy.AppDataDir() + "/llm_failover/idempotency.db")
	}
	if shared {
		key, open = "postgres:"+dsn, func() (*store.Store, error) {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			return store.OpenPostgres(ctx, dsn)
		}
	}
	v, _, err := idempotencyStores.LoadOrNew(key, func() (caddy.Destructor, error) {
		s := &IdempotencyStore{open: open, logger: a.logger.Named("idempotency"),
			job: caddykit.Jobs.Job(IdempotencySweepJob, idempotencySweepEvery), stop: make(chan struct{}), done: make(chan struct{})}
		s.job.Acquire()
		go s.sweeper()
		return s, nil
	})
	if err != nil {
		return nil, fmt.Errorf("idempotency store: %w", err)
	}
	a.mu.Lock()
	a.idempotencyKeys = append(a.idempotencyKeys, key)
	a.mu.Unlock()
	return v.(*IdempotencyStore), nil
}

// releaseIdempotency gives this config's store references back.
func (a *App) releaseIdempotency() {
	a.mu.Lock()
	keys := a.idempotencyKeys
	a.idempotencyKeys = nil
	a.mu.Unlock()
	for _, k := range keys {
		_, _ = idempotencyStores.Delete(k)
	}
}

// Store is the open store, opening it on first use; after a failure it
// errs at once for idempotencyRetry.
func (s *IdempotencyStore) Store() (*store.Store, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	switch {
	case s.closed:
		return nil, fmt.Errorf("the idempotency store is closed")
	case s.st != nil:
		return s.st, nil
	case time.Since(s.failedAt) < idempotencyRetry:
		return nil, fmt.Errorf("the idempotency store did not open; trying again soon")
	}
	st, err := s.open()
	if err != nil {
		s.failedAt = time.Now()
		s.logger.Error("the idempotency store cannot be opened; idempotent requests are answered once per instance until it can", zap.Error(err))
		return nil, err
	}
	s.st = st
	return st, nil
}

func (s *IdempotencyStore) sweeper() {
	defer close(s.done)
	t := time.NewTicker(idempotencySweepEvery)
	defer t.Stop()
	for {
		select {
		case <-s.stop:
			return
		case <-t.C:
			s.sweep()
		}
	}
}

func (s *IdempotencyStore) sweep() {
	defer func() {
		if r := recover(); r != nil {
			s.logger.Error("idempotency sweep panicked", zap.Any("panic", r), zap.ByteString("stack", debug.Stack()))
		}
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_ = s.job.Run(ctx, func(ctx context.Context) (jobs.Summary, error) {
		now := time.Now()
		local := idempotencyTable.Sweep(now)
		st, err := s.Store()
		if err != nil {
			return "", err
		}
		n, err := st.Sweep(ctx, now)
		if err != nil {
			return "", err
		}
		return jobs.Summary(fmt.Sprintf("deleted %d expired call(s), %d kept in memory", n, local)), nil
	})
}

// Destruct stops the sweeper and closes the store, when no config uses it;
// while runs still hold it (Hold), the last of them closes it.
func (s *IdempotencyStore) Destruct() error {
	close(s.stop)
	<-s.done
	s.job.Release()
	s.mu.Lock()
	defer s.mu.Unlock()
	s.closed = true
	if s.st == nil || s.claims > 0 {
		return nil
	}
	st := s.st
	s.st = nil
	return st.Close()
}
