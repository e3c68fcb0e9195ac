package wallet

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"time"
	"unicode/utf8"
)

// Errors a Store returns, wrapped with context; test with errors.Is. Any
// other error means the store itself failed, and the gateway should refuse
// to serve rather than serve unbilled.
var (
	// ErrInsufficientFunds: the account's available balance (balance minus
	// reserved) cannot cover the amount. The gateway answers 402.
	ErrInsufficientFunds = errors.New("insufficient funds")
	ErrUnknownAccount    = errors.New("unknown account")
	ErrAccountExists     = errors.New("account already exists")
	ErrUnknownKey        = errors.New("unknown API key")
	ErrKeyRevoked        = errors.New("API key revoked")
	// ErrNotFound: the reservation was already settled, released or swept
	// (or never existed). Seeing it on a second Settle is expected.
	ErrNotFound = errors.New("reservation not found")
	// ErrInvalid: a malformed argument, rejected before touching the store.
	ErrInvalid = errors.New("invalid argument")
)

// Ledger entry kinds.
const (
	KindCharge        = "charge"         // settled with a non-zero charge
	KindRelease       = "release"        // settled with nothing to charge
	KindFailedAttempt = "failed_attempt" // an upstream attempt that failed; never charged
	KindCredit        = "credit"         // operator top-up (or, negative, a correction)
	KindExpired       = "expired"        // a reservation Sweep released after it expired
)

// DefaultReservationTTL is used when a Reservation has no ExpiresAt. It must
// outlast the longest request (long generations can stream for many minutes),
// since an expired reservation is released uncharged.
const DefaultReservationTTL = 15 * time.Minute

// Reservation holds back Amount of an account's balance for one request.
type Reservation struct {
	// ID must be unique; the handler uses the request ID.
	ID        string
	Account   string
	KeyID     string
	Model     string
	RequestID string
	Amount    Micros
	// ExpiresAt is when Sweep may release it; zero means now plus
	// DefaultReservationTTL.
	ExpiresAt time.Time
}

// Entry is one immutable ledger row. The balance of an account always equals
// the sum of its credit Costs minus the sum of its charge Costs.
type Entry struct {
	ID                                        int64
	Kind                                      string
	Account, KeyID, Model, Channel, RequestID string
	TokensIn, TokensOut                       int64
	// Cost is the amount charged for charge rows and the (signed) amount
	// added for credit rows; zero for every other kind.
	Cost Micros
	Note string
	Time time.Time

	// UpstreamModel is the name Channel knows Model by: a route's
	// upstream_model, else Model itself. Empty when no channel served and
	// in rows written before the column existed.
	UpstreamModel string
	// TokensCacheRead, TokensCacheWrite and TokensCacheWrite1h are the
	// parts of TokensIn read from the provider's prompt cache and written
	// to it (for 5 minutes, for an hour), each charged at its own price.
	TokensCacheRead, TokensCacheWrite, TokensCacheWrite1h int64
	// TraceID is the OpenTelemetry trace ID (32 hex digits) of the
	// request the row belongs to, when the request was traced; else
	// empty, as in rows written before the column existed.
	TraceID string
}

// Account is a prepaid balance. Balance never drops below Reserved.
type Account struct {
	ID                string
	Balance, Reserved Micros
	CreatedAt         time.Time
}

// Available is what new reservations can still take.
func (a Account) Available() Micros { return a.Balance - a.Reserved }

// Key is an API key's metadata. The key itself is stored only as a hash.
type Key struct {
	ID, Account string
	// Prefix is the key's first characters (e.g. "sk-llmf-Ab3dE9"), enough
	// to tell keys apart in a listing without revealing them.
	Prefix    string
	Label     string
	CreatedAt time.Time
	RevokedAt *time.Time
}

// Store is the persistent wallet: balances, keys, reservations and ledger.
// Implementations are safe for concurrent use, also by several processes
// sharing one database.
//
// The SQL stores group-commit their writes (see writer.go): concurrent
// calls share one transaction, but each call still returns only once its
// own write is committed, or failed alone. A call's context counts until
// its write starts: a call whose context ends while it waits its turn
// returns ctx.Err() and writes nothing; once its statements have run, it
// commits with its batch whatever its context. Close finishes the writes
// already submitted; later ones fail.
type Store interface {
	// Reserve holds back r.Amount of the account's available balance, or
	// fails with ErrInsufficientFunds or ErrUnknownAccount. The SQL stores
	// serve it from this instance's credit lease, in memory, and write
	// only when the lease must grow (see lease.go): the reservation lives
	// in this Store, and only this Store can Settle or Extend it.
	Reserve(ctx context.Context, r Reservation) error
	// Settle ends a reservation: it charges e's cost, then each of more's
	// in order, their total capped at the reserved amount, releases the
	// rest and writes one ledger row per entry (KindCharge, or KindRelease
	// when the row charges nothing). A row charged below its cost means the
	// usage exceeded the reservation; its Note says so. The account comes
	// from the reservation; an entry's KeyID, Model and RequestID default
	// to the reservation's. It returns the total charged, once committed.
	// A second Settle of the same reservation, one after Sweep released
	// it, or one on another Store changes nothing and returns ErrNotFound.
	// Pass a context that outlives the client (context.WithoutCancel): a
	// settlement abandoned because the client hung up leaves the
	// reservation to expire, and Sweep releases it uncharged.
	Settle(ctx context.Context, reservationID string, e Entry, more ...Entry) (charged Micros, err error)
	// SettleAsync is Settle without waiting, for a caller that needs only
	// the outcome: it returns at once (entries must not be empty), and
	// done gets what Settle would have returned once the settlement's
	// batch committed or failed, on the goroutine that ran the batch, so
	// it must not block. It needs no context: the settlement is written
	// whatever happens to the request. Close waits for it.
	SettleAsync(reservationID string, entries []Entry, done func(charged Micros, err error))
	// RecordAttempt writes a KindFailedAttempt row with zero cost.
	RecordAttempt(ctx context.Context, e Entry) error
	// RecordAttemptAsync is RecordAttempt in the background: it returns at
	// once and the row commits with the store's next group commit; done,
	// if not nil, gets the outcome. At most MaxBackgroundWrites wait at a
	// time; beyond that the call writes synchronously, so nothing is
	// dropped. Close waits for every row submitted before it.
	RecordAttemptAsync(e Entry, done func(error))
	// Extend keeps live reservations from expiring: it moves the expiry of
	// each of ids that is still reserved to until (never earlier), and
	// returns how many it moved. A settled or swept ID is skipped. It
	// writes nothing: reservations live in memory.
	Extend(ctx context.Context, ids []string, until time.Time) (int, error)
	// Renew keeps this instance's credit leases from expiring and gives
	// back the spare money of idle ones (see lease.go). Call it about
	// every second while the Store serves; most calls write nothing.
	Renew(ctx context.Context) error
	// Audit checks the ledger against the balances: per account (all
	// accounts when account is ""), balance must equal credits minus
	// charges, and reserved the sum of its leases (of every instance) and
	// of any reservation rows an older version left. It returns
	// every account checked, with the differences it found.
	Audit(ctx context.Context, account string) ([]AuditRow, error)
	// Sweep releases, uncharged, every reservation of this Store that
	// expired at or before now, and every other instance's lease that did
	// (a crashed gateway's), each with a KindExpired row; then it returns
	// this Store's spare lease money.
	Sweep(ctx context.Context, now time.Time) (released int, err error)
	CreateAccount(ctx context.Context, id string) (Account, error)
	// Credit adds amount to the balance with a KindCredit row. A negative
	// amount is a correction and fails with ErrInsufficientFunds if it would
	// take more than the available balance; zero is rejected. This Store
	// waits for the account's settlements not yet written and returns its
	// spare lease money first, but other instances' leases
	// count as reserved until they go idle (about a second).
	Credit(ctx context.Context, account string, amount Micros, note string) (Account, error)
	Account(ctx context.Context, id string) (Account, error)
	Accounts(ctx context.Context) ([]Account, error)
	// CreateKey returns the new key's plaintext, which is not stored and
	// cannot be shown again.
	CreateKey(ctx context.Context, account, label string) (plaintext string, k Key, err error)
	// RevokeKey fails with ErrUnknownKey, or ErrKeyRevoked if already revoked.
	RevokeKey(ctx context.Context, keyID string) error
	Keys(ctx context.Context, account string) ([]Key, error)
	// Authenticate finds a key by its plaintext. A revoked key is returned
	// together with ErrKeyRevoked. Successful lookups are cached in memory
	// for DefaultAuthCacheTTL (5 s): a RevokeKey on the same Store applies
	// at once, one made through another Store on the same database (another
	// gateway instance sharing PostgreSQL, another handle on the SQLite
	// file) within that TTL. Unknown and revoked keys are never cached.
	Authenticate(ctx context.Context, plaintext string) (Key, error)
	// KnownKey returns the key if this Store's Authenticate found it in the
	// database within KnownKeyTTL (1 h), from memory only: what a caller
	// may trust while the database cannot be asked, so that an outage
	// serves the clients it knows and nobody else. A revocation through
	// this Store forgets it at once, one through another Store when this
	// one next asks the database; at most authCacheMax keys are kept.
	KnownKey(plaintext string) (Key, bool)
	// Usage pages the account's ledger newest first: up to limit rows whose
	// ID is below before (0 = start at the newest). Pass the last row's ID
	// as before to get the next page. An account that does not exist is
	// ErrUnknownAccount, not an empty page.
	Usage(ctx context.Context, account string, before int64, limit int) ([]Entry, error)
	Ping(ctx context.Context) error
	Close() error
}

// AuditRow is one account's audit. Ledger is the sum of its credit rows
// minus the sum of its charge rows; Live the sum of its leases and
// reservation rows.
type AuditRow struct {
	Account                         string
	Balance, Ledger, Reserved, Live Micros
}

// Clean reports whether the account's books agree.
func (r AuditRow) Clean() bool { return r.Balance == r.Ledger && r.Reserved == r.Live }

// KeyPrefix starts every API key, so leaked keys are recognisable by secret
// scanners and Authenticate can reject garbage without a query.
const KeyPrefix = "sk-llmf-"

const (
	keyRandomLen     = 40 // base62 chars ≈ 238 bits: unguessable, so unsalted SHA-256 suffices
	keyListPrefixLen = 6  // random chars kept in Key.Prefix (≈36 of the 238 bits)
	maxIDLen         = 128
)

const base62 = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"

// randomBase62 draws n uniformly distributed base62 characters.
func randomBase62(n int) string {
	out := make([]byte, 0, n)
	var buf [64]byte
	for len(out) < n {
		if _, err := rand.Read(buf[:]); err != nil {
			// crypto/rand.Read does not fail on supported platforms.
			panic(fmt.Sprintf("crypto/rand: %v", err))
		}
		for _, b := range buf {
			// Rejecting bytes ≥ 248 (= 4×62) keeps the draw unbiased.
			if b < 248 && len(out) < n {
				out = append(out, base62[b%62])
			}
		}
	}
	return string(out)
}

func newKeyID() string { return "key_" + randomBase62(16) }

func newKeyPlaintext() string { return KeyPrefix + randomBase62(keyRandomLen) }

// keyHash is a key's SHA-256, what the database stores (hex-encoded, see
// String) and the Authenticate cache is keyed by: the plaintext is kept
// nowhere.
type keyHash [sha256.Size]byte

func hashKey(plaintext string) keyHash {
	// A []byte conversion of more than 32 bytes allocates, even on the
	// stack's behalf; every billed request hashes its key.
	var buf [maxKeyLen]byte
	if len(plaintext) <= len(buf) {
		return sha256.Sum256(buf[:copy(buf[:], plaintext)])
	}
	return sha256.Sum256([]byte(plaintext))
}

func (h keyHash) String() string { return hex.EncodeToString(h[:]) }

// plausibleKey rejects strings that cannot be keys before any query, so
// scanners and typos cost the database nothing.
func plausibleKey(s string) bool {
	if !strings.HasPrefix(s, KeyPrefix) || len(s) < len(KeyPrefix)+32 || len(s) > maxKeyLen {
		return false
	}
	for i := len(KeyPrefix); i < len(s); i++ {
		if !isBase62[s[i]] {
			return false
		}
	}
	return true
}

// maxKeyLen is the longest key plausibleKey lets through.
const maxKeyLen = len(KeyPrefix) + 128

// isBase62 marks the bytes of base62: a table, as plausibleKey runs on
// every billed request.
var isBase62 = func() (t [256]bool) {
	for i := 0; i < len(base62); i++ {
		t[base62[i]] = true
	}
	return t
}()

func validID(kind, id string) error {
	if id == "" || len(id) > maxIDLen {
		return fmt.Errorf("%w: %s ID must be 1-%d bytes", ErrInvalid, kind, maxIDLen)
	}
	for i := 0; i < len(id); i++ {
		c := id[i]
		if c <= ' ' || c == 0x7f {
			return fmt.Errorf("%w: %s ID %q contains whitespace or control characters", ErrInvalid, kind, id)
		}
	}
	// An ID is one segment of an admin API path (/llm_wallet/accounts/<id>/...):
	// a slash, or a dot segment, which routers resolve before the wallet
	// sees the path, would make it one that can be created and never
	// reached again.
	if strings.Contains(id, "/") || id == "." || id == ".." {
		return fmt.Errorf("%w: %s ID %q contains a slash or is a dot segment", ErrInvalid, kind, id)
	}
	return validText(kind+" ID", id)
}

// validText refuses what PostgreSQL's text refuses (a NUL byte, bytes
// that are not UTF-8), so that both stores answer such input with
// ErrInvalid rather than one of them with a database error.
func validText(what, s string) error {
	if !utf8.ValidString(s) || strings.IndexByte(s, 0) >= 0 {
		return fmt.Errorf("%w: %s %q is not UTF-8 text without NUL bytes", ErrInvalid, what, s)
	}
	return nil
}

// Times are stored as Unix microseconds: one integer type behaves the same
// in SQLite and PostgreSQL and compares cheaply in the expiry index.
func toDB(t time.Time) int64 { return t.UnixMicro() }

func fromDB(us int64) time.Time { return time.UnixMicro(us).UTC() }
