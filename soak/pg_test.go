//go:build linux

package soak

import (
	"context"
	"database/sql"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	_ "github.com/jackc/pgx/v5/stdlib"
)

// pgCluster is the soak's own PostgreSQL cluster. It is not the shared
// test server of LLMF_TEST_POSTGRES_DSN: the soak restarts it and
// terminates its connections, which would break the other packages' tests
// running at the same time against the shared one. It is started with
// scripts/pg-test-server.sh (its own PGTEST_DIR and PGTEST_PORT), so it is
// set up exactly as the shared one is.
type pgCluster struct {
	dir  string // PGTEST_DIR: data/, sock/, postgres.log
	port int
	bin  string // the PostgreSQL binaries' directory
	dsn  string // the database the gateways use
}

// startPG starts a fresh cluster on port. A cluster a killed run left on
// the same port (its directory is named after the port) is stopped and
// removed first.
func startPG(t *testing.T, port int) *pgCluster {
	t.Helper()
	c := &pgCluster{dir: fmt.Sprintf("/tmp/llmf-soak-pg-%d", port), port: port}
	if _, err := os.Stat(c.dir); err == nil {
		_, _ = c.script("stop")
		if err := os.RemoveAll(c.dir); err != nil {
			t.Fatalf("removing the leftover cluster %s: %v", c.dir, err)
		}
	}
	if err := os.MkdirAll(c.dir, 0o755); err != nil {
		t.Fatal(err)
	}
	out, err := c.script("start")
	if err != nil {
		t.Fatalf("pg-test-server.sh start (PGTEST_DIR=%s PGTEST_PORT=%d): %v\n%s", c.dir, port, err, out)
	}
	for _, line := range strings.Split(out, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "export LLMF_TEST_POSTGRES_DSN="); ok {
			c.dsn = v
		}
	}
	if c.dsn == "" {
		t.Fatalf("pg-test-server.sh printed no DSN:\n%s", out)
	}
	if c.bin = pgBinDir(); c.bin == "" {
		t.Fatal("pg-test-server.sh started a cluster, but there is no pg_ctl under /usr/lib/postgresql/*/bin")
	}
	t.Cleanup(func() {
		if out, err := c.script("stop"); err != nil {
			t.Logf("stopping the soak's PostgreSQL: %v\n%s", err, out)
		}
		if t.Failed() || keepOutput() {
			copyFile(filepath.Join(c.dir, "postgres.log"), filepath.Join(outDir(t), "postgres.log"))
		}
		_ = os.RemoveAll(c.dir)
	})
	return c
}

// script runs scripts/pg-test-server.sh for this cluster.
func (c *pgCluster) script(verb string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "bash", "../scripts/pg-test-server.sh", verb)
	cmd.Env = append(os.Environ(), "PGTEST_DIR="+c.dir, fmt.Sprintf("PGTEST_PORT=%d", c.port))
	cmd.WaitDelay = 5 * time.Second
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// restart restarts the server (pg_ctl restart -m fast: every connection
// is dropped, the server is down until it has started again) and returns
// when it accepts connections again.
func (c *pgCluster) restart() error {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	// -l: without it the new postmaster writes to pg_ctl's output, our
	// pipe, and holds it open for as long as it runs.
	cmd := asPostgres(ctx, filepath.Join(c.bin, "pg_ctl"), "-D", filepath.Join(c.dir, "data"), "-l", filepath.Join(c.dir, "postgres.log"),
		"-m", "fast", "-w", "-t", "60", "restart")
	cmd.WaitDelay = 5 * time.Second
	out, err := cmd.CombinedOutput()
	if err != nil {
		return fmt.Errorf("pg_ctl restart: %v: %s", err, out)
	}
	return nil
}

// terminate ends every other session on the gateways' database
// (pg_terminate_backend), as an operator, a failover of a managed
// database or a connection pooler's restart would, and returns how many
// it ended.
func (c *pgCluster) terminate() (int, error) {
	db, err := sql.Open("pgx", c.dsn)
	if err != nil {
		return 0, err
	}
	defer db.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var n int
	err = db.QueryRowContext(ctx, `SELECT count(*) FROM (
		SELECT pg_terminate_backend(pid) FROM pg_stat_activity
		WHERE datname = current_database() AND pid <> pg_backend_pid()) AS t`).Scan(&n)
	return n, err
}

// sessions counts the sessions on the gateways' database.
func (c *pgCluster) sessions() (int, error) {
	db, err := sql.Open("pgx", c.dsn)
	if err != nil {
		return 0, err
	}
	defer db.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var n int
	err = db.QueryRowContext(ctx, `SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()`).Scan(&n)
	return n, err
}

// asPostgres runs a PostgreSQL binary as the postgres user when we are
// root (PostgreSQL refuses to run as root), as ourselves otherwise.
func asPostgres(ctx context.Context, name string, args ...string) *exec.Cmd {
	if os.Geteuid() == 0 {
		return exec.CommandContext(ctx, "runuser", append([]string{"-u", "postgres", "--", name}, args...)...)
	}
	return exec.CommandContext(ctx, name, args...)
}

// pgBinDir is the newest /usr/lib/postgresql/<major>/bin, as
// pg-test-server.sh picks it.
func pgBinDir() string {
	dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	sort.Slice(dirs, func(i, j int) bool {
		var a, b int
		fmt.Sscanf(filepath.Base(filepath.Dir(dirs[i])), "%d", &a)
		fmt.Sscanf(filepath.Base(filepath.Dir(dirs[j])), "%d", &b)
		return a < b
	})
	for i := len(dirs) - 1; i >= 0; i-- {
		if _, err := os.Stat(filepath.Join(dirs[i], "pg_ctl")); err == nil {
			return dirs[i]
		}
	}
	return ""
}
