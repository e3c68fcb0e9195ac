package store

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"
)

// A fleet's instances share the cache-affinity table here: which channel
// served each conversation last, so that a conversation's next turn finds
// its warm cache whichever instance the load balancer sends it to. Rows
// expire with the provider's cache; Prune deletes them.

// affinitySchema is both dialects'.
const affinitySchema = `CREATE TABLE IF NOT EXISTS llmf_affinity (
		model TEXT NOT NULL,
		conversation TEXT NOT NULL,
		channel TEXT NOT NULL,
		cached_tokens BIGINT NOT NULL DEFAULT 0,
		output_tokens BIGINT NOT NULL DEFAULT 0,
		expires BIGINT NOT NULL,
		PRIMARY KEY (model, conversation)
	)`

// Pin is one conversation's row: the channel that served its last turn,
// the prompt tokens that turn left in the channel's cache and its output
// tokens, until Expires.
type Pin struct {
	Model, Conversation, Channel string
	Cached, Output               int64
	Expires                      time.Time
}

// SavePins writes pins, in one transaction. A row only moves forward: a
// pin that expires before the stored one (an older turn's, written late)
// leaves it be.
func (s *Store) SavePins(ctx context.Context, pins []Pin) error {
	if len(pins) == 0 {
		return nil
	}
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("saving affinity: %w", err)
	}
	defer func() { _ = tx.Rollback() }()
	st, err := tx.PrepareContext(ctx, "INSERT INTO llmf_affinity (model, conversation, channel, cached_tokens, output_tokens, expires) VALUES ("+
		s.placeholders(6)+") ON CONFLICT (model, conversation) DO UPDATE SET channel = excluded.channel, "+
		"cached_tokens = excluded.cached_tokens, output_tokens = excluded.output_tokens, expires = excluded.expires "+
		"WHERE llmf_affinity.expires <= excluded.expires")
	if err != nil {
		return fmt.Errorf("saving affinity: %w", err)
	}
	defer st.Close()
	for _, p := range pins {
		if _, err := st.ExecContext(ctx, p.Model, p.Conversation, p.Channel, p.Cached, p.Output, p.Expires.UnixNano()); err != nil {
			return fmt.Errorf("saving affinity: %w", err)
		}
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("saving affinity: %w", err)
	}
	return nil
}

// PinOf reads conversation's pin of model; ok is false when there is none
// unexpired at now.
func (s *Store) PinOf(ctx context.Context, model, conversation string, now time.Time) (p Pin, ok bool, err error) {
	var expires int64
	err = s.db.QueryRowContext(ctx, "SELECT channel, cached_tokens, output_tokens, expires FROM llmf_affinity WHERE model = "+
		s.arg(1)+" AND conversation = "+s.arg(2)+" AND expires > "+s.arg(3), model, conversation, now.UnixNano()).
		Scan(&p.Channel, &p.Cached, &p.Output, &expires)
	switch {
	case errors.Is(err, sql.ErrNoRows):
		return Pin{}, false, nil
	case err != nil:
		return Pin{}, false, fmt.Errorf("reading affinity: %w", err)
	}
	p.Model, p.Conversation, p.Expires = model, conversation, time.Unix(0, expires)
	return p, true, nil
}

// pruneAffinity deletes the pins expired at now.
func (s *Store) pruneAffinity(ctx context.Context, now time.Time) error {
	if _, err := s.db.ExecContext(ctx, "DELETE FROM llmf_affinity WHERE expires <= "+s.arg(1), now.UnixNano()); err != nil {
		return fmt.Errorf("pruning affinity: %w", err)
	}
	return nil
}
