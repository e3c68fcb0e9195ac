package failoverapp

import (
	"encoding/json"
	"fmt"
	"io"
	"sort"
	"strings"

	caddycmd "github.com/caddyserver/caddy/v2/cmd"
	"github.com/spf13/cobra"
)

// subcommand is one `caddy llm-failover` subcommand. Each file that adds
// one registers it from its init function, so the command's help lists
// them all.
type subcommand struct {
	// usage is the arguments, e.g. "[--channel <name>]".
	usage string
	short string
	// run talks to the admin API at admin; args exclude the subcommand;
	// asJSON prints the admin API's answer instead of a table.
	run func(out io.Writer, admin string, args []string, asJSON bool) error
}

var subcommands = map[string]subcommand{}

func registerSubcommand(name string, s subcommand) {
	if _, dup := subcommands[name]; dup {
		panic("llm-failover subcommand registered twice: " + name)
	}
	subcommands[name] = s
}

func init() {
	caddycmd.RegisterCommand(caddycmd.Command{
		Name:  "llm-failover",
		Usage: "[--address <admin> | --config <file>] [--json] <subcommand> [args]",
		Short: "Inspects and operates llm_failover through Caddy's admin API",
		CobraFunc: func(cmd *cobra.Command) {
			cmd.Long = subcommandHelp()
			cmd.Flags().StringP("address", "a", "", "The address of Caddy's admin API (default: from the config, else localhost:2019)")
			cmd.Flags().StringP("config", "c", "", "Configuration file, to find the admin address")
			cmd.Flags().StringP("adapter", "", "", "Name of config adapter")
			cmd.Flags().Bool("json", false, "Print the admin API's JSON answer instead of a table")
			cmd.Args = cobra.MinimumNArgs(1)
			// Subcommands parse their own flags.
			cmd.Flags().SetInterspersed(false)
			cmd.RunE = func(cmd *cobra.Command, args []string) error {
				addr, _ := cmd.Flags().GetString("address")
				cfg, _ := cmd.Flags().GetString("config")
				adapter, _ := cmd.Flags().GetString("adapter")
				admin, err := caddycmd.DetermineAdminAPIAddress(addr, nil, cfg, adapter)
				if err != nil {
					return fmt.Errorf("finding the admin API: %w", err)
				}
				asJSON, _ := cmd.Flags().GetBool("json")
				return command(cmd.OutOrStdout(), admin, asJSON, args...)
			}
		},
	})
}

// Command runs `caddy llm-failover <args>` against the admin API at
// admin, writing a table to out.
func Command(out io.Writer, admin string, args ...string) error {
	return command(out, admin, false, args...)
}

func command(out io.Writer, admin string, asJSON bool, args ...string) error {
	if len(args) == 0 {
		return fmt.Errorf("no subcommand; see caddy help llm-failover")
	}
	sub, ok := subcommands[args[0]]
	if !ok {
		return fmt.Errorf("unknown subcommand %q; see caddy help llm-failover", args[0])
	}
	return sub.run(out, admin, args[1:], asJSON)
}

func subcommandHelp() string {
	names := make([]string, 0, len(subcommands))
	for n := range subcommands {
		names = append(names, n)
	}
	sort.Strings(names)
	var b strings.Builder
	b.WriteString("\nInspects and operates a running Caddy with llm_failover, through its admin API.\n\n")
	for _, n := range names {
		fmt.Fprintf(&b, "  caddy llm-failover %s %s\n      %s\n", n, subcommands[n].usage, subcommands[n].short)
	}
	return b.String()
}

// printJSON prints an admin API answer as the --json flag asks.
func printJSON(out io.Writer, v any) error {
	enc := json.NewEncoder(out)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}
