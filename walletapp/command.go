package walletapp

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"sort"
	"strings"
	"text/tabwriter"

	caddycmd "github.com/caddyserver/caddy/v2/cmd"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/llmfailover/caddy-llm-failover/internal/caddykit"
	"github.com/llmfailover/caddy-llm-failover/wallet"
)

func init() {
	caddycmd.RegisterCommand(caddycmd.Command{
		Name:  "llm-wallet",
		Usage: "[--address <admin> | --config <file>] [--wallet <name>] [--json] <status|accounts|create-account|balance|credit|keys|create-key|revoke-key|usage|audit> [args]",
		Short: "Administers the llm_wallet wallets through Caddy's admin API",
		Long: `
Administers a prepaid wallet of a running Caddy (the llm_wallet app),
without touching the database: every subcommand calls the admin API.
--wallet names the wallet; it may be left out when there is only one.

  caddy llm-wallet status
  caddy llm-wallet accounts
  caddy llm-wallet create-account <account>
  caddy llm-wallet balance <account>
  caddy llm-wallet credit <account> <amount> [note]     amount in dollars, e.g. 25 or 0.50 (negative corrects)
  caddy llm-wallet keys <account>
  caddy llm-wallet create-key <account> [label]         prints the key once; it cannot be shown again
  caddy llm-wallet revoke-key <key_id>
  caddy llm-wallet usage <account> [limit [before]]      newest first; before: the next_before of the last page
  caddy llm-wallet audit [<wallet>]                      checks every account's books; exits non-zero on a difference
`,
		CobraFunc: func(cmd *cobra.Command) {
			cmd.Flags().StringP("address", "a", "", "The address of Caddy's admin API (default: from the config, else localhost:2019)")
			cmd.Flags().StringP("wallet", "w", "", "The wallet's name (needed when several are configured)")
			cmd.Flags().StringP("config", "c", "", "Configuration file, to find the admin address")
			cmd.Flags().StringP("adapter", "", "", "Name of config adapter")
			cmd.Flags().Bool("json", false, "Print the admin API's JSON answer instead of a table")
			cmd.Args = cobra.MinimumNArgs(1)
			// Flags go before the subcommand (see Usage). Parsing stops at
			// the subcommand so that a negative amount ("credit acme -0.50")
			// is an argument, not an unknown shorthand flag.
			cmd.Flags().SetInterspersed(false)
			cmd.RunE = func(cmd *cobra.Command, args []string) error {
				for _, a := range args[1:] {
					if misplacedFlag(cmd.Flags(), a) {
						return fmt.Errorf("%s: flags go before the subcommand: caddy llm-wallet [--address <admin>] [--wallet <name>] %s ...", a, args[0])
					}
				}
				addr, _ := cmd.Flags().GetString("address")
				name, _ := cmd.Flags().GetString("wallet")
				cfg, _ := cmd.Flags().GetString("config")
				adapter, _ := cmd.Flags().GetString("adapter")
				admin, err := caddycmd.DetermineAdminAPIAddress(addr, nil, cfg, adapter)
				if err != nil {
					return fmt.Errorf("finding the admin API: %w", err)
				}
				asJSON, _ := cmd.Flags().GetBool("json")
				return runCommand(cmd.OutOrStdout(), admin, name, args, asJSON)
			}
		},
	})
}

// RunCommand runs one `caddy llm-wallet` subcommand against the wallet called name
// (empty: the only one), printing a table.
func RunCommand(out io.Writer, admin, name string, args []string) error {
	return runCommand(out, admin, name, args, false)
}

// errPrinted ends a subcommand whose answer was printed as JSON.
var errPrinted = errors.New("printed")

// runCommand is RunCommand; asJSON prints the admin API's answer as it
// is instead of a table (an audit that finds differences still fails).
func runCommand(out io.Writer, admin, name string, args []string, asJSON bool) (err error) {
	defer func() {
		if errors.Is(err, errPrinted) {
			err = nil
		}
	}()
	if args[0] == "audit" && len(args) > 1 {
		name = args[1]
	}
	prefix := "/llm_wallet/"
	if name != "" {
		prefix += url.PathEscape(name) + "/"
	}
	adminCall := func(method, path string, body, answer any) error {
		if err := caddykit.AdminCall(admin, method, prefix+path, body, answer); err != nil || !asJSON || answer == nil {
			return err
		}
		enc := json.NewEncoder(out)
		enc.SetIndent("", "  ")
		if err := enc.Encode(answer); err != nil {
			return err
		}
		if a, ok := answer.(*AuditView); ok && !a.Clean {
			return fmt.Errorf("audit: %d of %d account(s) disagree with the ledger", len(a.Differences), a.Accounts)
		}
		if st, ok := answer.(*map[string]any); ok && path == "status" {
			if err := storeUnreachable(*st); err != nil {
				return err
			}
		}
		return errPrinted
	}
	need := func(n int) error {
		if len(args) < n+1 {
			return fmt.Errorf("%s needs %d argument(s); see caddy help llm-wallet", args[0], n)
		}
		return nil
	}
	// An argument the subcommand would not use is refused before anything
	// is written: "revoke-key key_a key_b" must not revoke key_a alone,
	// nor "credit acme 25 refund for outage" write the note "refund".
	if most, ok := maxArgs[args[0]]; ok && len(args) > most+1 {
		return fmt.Errorf("%s takes at most %d argument(s), got %d (quote a note or label with spaces; revoke one key at a time); see caddy help llm-wallet",
			args[0], most, len(args)-1)
	}
	tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	defer tw.Flush()
	switch args[0] {
	case "status":
		var st map[string]any
		if err := adminCall(http.MethodGet, "status", nil, &st); err != nil {
			return err
		}
		keys := make([]string, 0, len(st))
		for k := range st {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		for _, k := range keys {
			v := st[k]
			if m, ok := v.(map[string]any); ok {
				b, _ := json.Marshal(m)
				v = string(b)
			}
			fmt.Fprintf(tw, "%s\t%v\n", k, v)
		}
		return storeUnreachable(st)
	case "accounts":
		var accts []AccountView
		if err := adminCall(http.MethodGet, "accounts", nil, &accts); err != nil {
			return err
		}
		fmt.Fprintln(tw, "ACCOUNT\tBALANCE\tRESERVED\tAVAILABLE")
		for _, a := range accts {
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", a.ID, human(a.Balance), human(a.Reserved), human(a.Available))
		}
		return nil
	case "create-account", "balance":
		if err := need(1); err != nil {
			return err
		}
		var a AccountView
		var err error
		if args[0] == "create-account" {
			err = adminCall(http.MethodPost, "accounts", map[string]string{"id": args[1]}, &a)
		} else {
			err = adminCall(http.MethodGet, "accounts/"+url.PathEscape(args[1]), nil, &a)
		}
		if err != nil {
			return err
		}
		fmt.Fprintf(tw, "account\t%s\nbalance\t%s\nreserved\t%s\navailable\t%s\n", a.ID, human(a.Balance), human(a.Reserved), human(a.Available))
		return nil
	case "credit":
		if err := need(2); err != nil {
			return err
		}
		body := map[string]string{"amount": args[2]}
		if len(args) > 3 {
			body["note"] = args[3]
		}
		var a AccountView
		if err := adminCall(http.MethodPost, "accounts/"+url.PathEscape(args[1])+"/credit", body, &a); err != nil {
			return err
		}
		fmt.Fprintf(tw, "account\t%s\nbalance\t%s\navailable\t%s\n", a.ID, human(a.Balance), human(a.Available))
		return nil
	case "keys":
		if err := need(1); err != nil {
			return err
		}
		var keys []KeyView
		if err := adminCall(http.MethodGet, "accounts/"+url.PathEscape(args[1])+"/keys", nil, &keys); err != nil {
			return err
		}
		fmt.Fprintln(tw, "KEY ID\tPREFIX\tLABEL\tCREATED\tREVOKED")
		for _, k := range keys {
			revoked := "-"
			if k.RevokedAt != nil {
				revoked = k.RevokedAt.Format("2006-01-02 15:04")
			}
			fmt.Fprintf(tw, "%s\t%s…\t%s\t%s\t%s\n", k.ID, k.Prefix, k.Label, k.CreatedAt.Format("2006-01-02 15:04"), revoked)
		}
		return nil
	case "create-key":
		if err := need(1); err != nil {
			return err
		}
		body := map[string]string{"label": ""}
		if len(args) > 2 {
			body["label"] = args[2]
		}
		var k map[string]any
		if err := adminCall(http.MethodPost, "accounts/"+url.PathEscape(args[1])+"/keys", body, &k); err != nil {
			return err
		}
		fmt.Fprintf(tw, "key\t%v\nid\t%v\naccount\t%v\n", k["key"], k["id"], k["account"])
		fmt.Fprintln(tw, "\nStore this key now: it is not kept and cannot be shown again.")
		return nil
	case "revoke-key":
		if err := need(1); err != nil {
			return err
		}
		var ans map[string]any
		if err := adminCall(http.MethodPost, "keys/"+url.PathEscape(args[1])+"/revoke", map[string]string{}, &ans); err != nil {
			return err
		}
		fmt.Fprintf(tw, "revoked\t%s\n", args[1])
		return nil
	case "usage":
		if err := need(1); err != nil {
			return err
		}
		// Query parameters in the order the admin API documents them;
		// the cursor is the last page's next_before.
		q := ""
		if len(args) > 2 {
			q = "?limit=" + url.QueryEscape(args[2])
		}
		if len(args) > 3 {
			q += "&before=" + url.QueryEscape(args[3])
		}
		var page struct {
			Entries []EntryView `json:"entries"`
			// Next is the cursor of the next page (--json prints the
			// admin API's answer, cursor included).
			Next int64 `json:"next_before,omitempty"`
		}
		if err := adminCall(http.MethodGet, "accounts/"+url.PathEscape(args[1])+"/usage"+q, nil, &page); err != nil {
			return err
		}
		fmt.Fprintln(tw, "TIME\tKIND\tMODEL\tCHANNEL\tIN\tOUT\tCOST\tCACHED\tNOTE")
		for _, e := range page.Entries {
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d\t%d\t%s\t%s\t%s\n", e.Time.Format("2006-01-02 15:04:05"), e.Kind, e.Model, e.Channel, e.TokensIn, e.TokensOut, human(e.Cost), cached(e), e.Note)
		}
		if page.Next != 0 {
			fmt.Fprintf(tw, "\nmore: caddy llm-wallet usage %s %d %d\n", args[1], len(page.Entries), page.Next)
		}
		return nil
	case "audit":
		var a AuditView
		if err := adminCall(http.MethodGet, "audit", nil, &a); err != nil {
			return err
		}
		if a.Clean {
			fmt.Fprintf(tw, "clean: %d account(s); every balance equals credits minus charges, every reserved amount its live reservations\n", a.Accounts)
			return nil
		}
		fmt.Fprintln(tw, "ACCOUNT\tBALANCE\tCREDITS-CHARGES\tRESERVED\tLIVE RESERVATIONS")
		for _, d := range a.Differences {
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", d.Account, d.Balance, d.Ledger, d.Reserved, d.Live)
		}
		return fmt.Errorf("audit: %d of %d account(s) disagree with the ledger", len(a.Differences), a.Accounts)
	}
	return fmt.Errorf("unknown subcommand %q; see caddy help llm-wallet", args[0])
}

// maxArgs is the most arguments each subcommand takes.
var maxArgs = map[string]int{"status": 0, "accounts": 0, "create-account": 1, "balance": 1, "credit": 3,
	"keys": 1, "create-key": 2, "revoke-key": 1, "usage": 3, "audit": 1}

// storeUnreachable is the status subcommand's failure: a store that does
// not answer (printed all the same) makes the command exit non-zero, for
// scripts and health checks.
func storeUnreachable(st map[string]any) error {
	if st["reachable"] == false {
		return fmt.Errorf("the wallet's store does not answer: %v", st["error"])
	}
	return nil
}

// misplacedFlag tells one of the command's own flags written after the
// subcommand (--json, --address=..., -a) from an argument that merely
// starts with a dash: a negative amount (-0.50), a note ("-refund for
// outage 123"), an account named -acme.
func misplacedFlag(fs *pflag.FlagSet, a string) bool {
	if name, ok := strings.CutPrefix(a, "--"); ok {
		name, _, _ = strings.Cut(name, "=")
		return fs.Lookup(name) != nil
	}
	return len(a) == 2 && a[0] == '-' && fs.ShorthandLookup(a[1:]) != nil
}

// human renders an exact decimal amount the way people read money.
func human(s string) string {
	m, err := wallet.ParseSignedMicros(s)
	if err != nil {
		return s
	}
	return m.Human()
}

// cached is the usage table's CACHED cell: the parts of IN read from and
// written to the provider's prompt cache, or "-".
func cached(e EntryView) string {
	var parts []string
	for _, c := range []struct {
		name string
		n    int64
	}{{"read", e.TokensCacheRead}, {"write", e.TokensCacheWrite}, {"write_1h", e.TokensCacheWrite1h}} {
		if c.n > 0 {
			parts = append(parts, fmt.Sprintf("%s=%d", c.name, c.n))
		}
	}
	if len(parts) == 0 {
		return "-"
	}
	return strings.Join(parts, ",")
}
