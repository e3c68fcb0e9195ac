package wallet

import (
	"context"
	"fmt"
)

// auditQuery reads, in one statement (one snapshot on either database),
// each account's balance and reserved amount next to what its ledger and
// its leases (plus reservation rows an older version left) say they must
// be.
const auditQuery = `SELECT a.id, a.balance, a.reserved,
	CAST(COALESCE((SELECT SUM(l.cost) FROM ledger l WHERE l.account_id = a.id AND l.kind = '` + KindCredit + `'), 0)
	   - COALESCE((SELECT SUM(l.cost) FROM ledger l WHERE l.account_id = a.id AND l.kind = '` + KindCharge + `'), 0) AS BIGINT),
	CAST(COALESCE((SELECT SUM(r.amount) FROM reservations r WHERE r.account_id = a.id), 0)
	   + COALESCE((SELECT SUM(l.amount) FROM leases l WHERE l.account_id = a.id), 0) AS BIGINT)
FROM accounts a`

func (s *sqlStore) Audit(ctx context.Context, account string) ([]AuditRow, error) {
	query, args := auditQuery+` ORDER BY a.id`, []any(nil)
	if account != "" {
		query, args = auditQuery+` WHERE a.id = ?`, []any{account}
	}
	rows, err := s.db.QueryContext(ctx, s.q(query), args...)
	if err != nil {
		return nil, fmt.Errorf("auditing: %w", err)
	}
	defer rows.Close()
	var out []AuditRow
	for rows.Next() {
		var (
			r                               AuditRow
			balance, reserved, ledger, live int64
		)
		if err := rows.Scan(&r.Account, &balance, &reserved, &ledger, &live); err != nil {
			return nil, fmt.Errorf("auditing: %w", err)
		}
		r.Balance, r.Reserved, r.Ledger, r.Live = Micros(balance), Micros(reserved), Micros(ledger), Micros(live)
		out = append(out, r)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("auditing: %w", err)
	}
	if account != "" && len(out) == 0 {
		return nil, fmt.Errorf("auditing %q: %w", account, ErrUnknownAccount)
	}
	return out, nil
}
